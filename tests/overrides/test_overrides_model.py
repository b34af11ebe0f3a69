"""An untagged, hand-written Llama block (``nn.RMSNorm``, ``F.scaled_dot_product_attention``,
``F.silu(gate) * up``; benchmarks/overrides.py's ``LlamaBlock``) runs our kernels unchanged under
the overrides, and gives PyTorch's output and gradients within the dtype's rounding."""

import torch

from benchmarks import overrides as benchmark
from kernels.overrides import aten_override_calls, use_aten_overrides
from tests.support.overrides import DEVICE, ON_GPU, paths, randn

SMALL = dict(hidden=64, heads=4, kv_heads=2, intermediate=96, layers=2)


def _step(block, x):
    y = block(x)
    return (y, *torch.autograd.grad(y.float().square().mean(), [x, *block.parameters()]))


def test_an_untagged_llama_block_runs_our_kernels_and_matches_pytorch():
    block = benchmark.build_block(SMALL, DEVICE, dtype=torch.float32)
    x = randn(2, 9, SMALL["hidden"]).requires_grad_()
    reference = _step(block, x)
    with use_aten_overrides(ops=["rms_norm", "silu"]) as overridden:
        got = _step(block, x)
    # Two layers: SiLU forward and backward once each a layer.
    assert paths("silu") == {"ours": 2} and paths("silu_backward") == {"ours": 2}
    if ON_GPU:  # F.rms_norm reaches _fused_rms_norm on CUDA: 5 norms
        assert "_fused_rms_norm" in overridden
        assert paths("_fused_rms_norm") == {"ours": 5}
        assert paths("_fused_rms_norm_backward") == {"ours": 5}
    else:  # on the CPU PyTorch decomposes rms_norm itself (docs/overrides.md)
        assert "_fused_rms_norm" not in overridden
        assert not paths("_fused_rms_norm")
    for r, g in zip(reference, got, strict=True):
        torch.testing.assert_close(g, r, rtol=2e-4, atol=2e-5)
    assert set(op for op, _ in aten_override_calls()) <= set(overridden)
