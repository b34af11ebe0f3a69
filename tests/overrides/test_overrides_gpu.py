"""The overrides on CUDA through the dispatcher (marked ``gpu``): ``F.rms_norm`` / ``nn.RMSNorm``
reach ``aten::_fused_rms_norm`` there (on the CPU PyTorch decomposes them), model-sized shapes,
the statistics' layout PyTorch's CUDA kernels give, fall-through bitwise, exact restoration,
CUDA graphs and autocast."""

import pytest
import torch
import torch.nn.functional as F

from kernels.overrides import aten_override_calls, use_aten_overrides
from tests.support.overrides import (
    DTYPES,
    assert_close,
    dispatch_tables,
    grads,
    kernel_source,
    paths,
    randn,
)

pytestmark = pytest.mark.gpu

EPS = 1e-6


def _rms64(x64, w64, eps):
    out = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    return out if w64 is None else out * w64


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "lead,hidden,layout",
    [((3, 5), 37, None), ((4,), 4096, "slice"), ((2, 512), 2048, None), ((64,), 5120, "transpose")],
)
def test_rms_norm_through_the_dispatcher(lead, hidden, layout, dtype):
    module = torch.nn.RMSNorm(hidden, eps=EPS).to("cuda", dtype)
    with torch.no_grad():
        module.weight.copy_(randn(hidden, dtype=dtype, scale=0.2, shift=1.0))
    if layout == "slice":
        x = randn(*lead, hidden + 8, dtype=dtype, scale=2.0)[..., 4 : 4 + hidden]
    elif layout == "transpose":
        x = randn(hidden, *lead, dtype=dtype, scale=2.0).t()
    else:
        x = randn(*lead, hidden, dtype=dtype, scale=2.0)
    x.requires_grad_()
    dy = randn(*x.shape, dtype=dtype)
    with use_aten_overrides(ops=["rms_norm"]):
        y = module(x)
        dx, dw = grads(y, (x, module.weight), dy)
    assert paths("_fused_rms_norm") == {"ours": 1}
    assert paths("_fused_rms_norm_backward") == {"ours": 1}
    x64 = x.detach().double().requires_grad_()
    w64 = module.weight.detach().double().requires_grad_()
    y64 = _rms64(x64, w64, EPS)
    dx64, dw64 = grads(y64, (x64, w64), dy.double())
    assert_close(y, y64, dtype, "forward")
    assert_close(dx, dx64, dtype, "input gradient")
    assert_close(dw, dw64, dtype, "weight gradient")


def test_statistics_have_the_layout_of_pytorchs_cuda_kernels():
    x = randn(2, 3, 256, dtype=torch.bfloat16)
    w = randn(256, dtype=torch.bfloat16)
    for call, family in (
        (lambda: torch.ops.aten._fused_rms_norm(x, [256], w, EPS), "rms_norm"),
        (lambda: torch.ops.aten.native_layer_norm(x, [256], w, w, 1e-5), "layer_norm"),
    ):
        pytorch = call()
        with use_aten_overrides(ops=family):
            ours = call()
        for p, o in zip(pytorch, ours, strict=True):
            assert (o.shape, o.dtype, o.stride()) == (p.shape, p.dtype, p.stride())
            torch.testing.assert_close(o.float(), p.float(), rtol=2e-2, atol=2e-2)
    assert paths("_fused_rms_norm") == {"ours": 1} and paths("native_layer_norm") == {"ours": 1}


@pytest.mark.parametrize(
    "reason,make",
    [
        ("no weight", lambda: (torch.nn.RMSNorm(64, elementwise_affine=False), randn(5, 64))),
        (
            "normalized over several dimensions",
            lambda: (torch.nn.RMSNorm((4, 16)), randn(5, 4, 16)),
        ),
        (
            "dtype float64",
            lambda: (torch.nn.RMSNorm(64).double(), randn(5, 64, dtype=torch.float64)),
        ),
    ],
)
def test_rms_norm_falls_through_bitwise(reason, make):
    module, x = make()
    module = module.cuda()
    x.requires_grad_()

    def step():
        y = module(x)
        return (y, *torch.autograd.grad(y.square().sum(), [x, *module.parameters()]))

    reference = step()
    with use_aten_overrides(ops="rms_norm"):
        overridden = step()
    for r, o in zip(reference, overridden, strict=True):
        assert torch.equal(r, o) and r.stride() == o.stride()
    assert paths("_fused_rms_norm") == {reason: 1}
    assert paths("_fused_rms_norm_backward") == {reason: 1}


def test_mixed_dtypes_get_pytorchs_error():
    x, w = randn(4, 64, dtype=torch.bfloat16), randn(64)
    with use_aten_overrides(ops=["rms_norm", "layer_norm"]):
        with pytest.raises(RuntimeError, match="scalar type"):
            torch.ops.aten._fused_rms_norm(x, [64], w, EPS)
        with pytest.raises(RuntimeError, match="scalar type"):
            torch.ops.aten.native_layer_norm(x, [64], w, None, EPS)
    assert aten_override_calls() == {
        ("_fused_rms_norm", "weight dtype float32"): 1,
        ("native_layer_norm", "weight dtype float32"): 1,
    }


def test_leaving_restores_pytorchs_cuda_kernels_bitwise():
    x = randn(64, 1024, dtype=torch.bfloat16)
    w = randn(1024, dtype=torch.bfloat16, shift=1.0)

    def outputs():
        return (
            F.rms_norm(x, (1024,), w, EPS),
            F.layer_norm(x, (1024,), w, w),
            F.silu(x),
            F.gelu(x),
        )

    before, tables = outputs(), dispatch_tables()
    cuda_kernel = kernel_source("_fused_rms_norm", "CUDA")
    with use_aten_overrides(ops=["rms_norm", "layer_norm", "silu", "gelu"]):
        assert "kernels/overrides" in kernel_source("_fused_rms_norm", "CUDA")
        during = outputs()
    assert kernel_source("_fused_rms_norm", "CUDA") == cuda_kernel
    assert dispatch_tables() == tables
    for b, a, d in zip(before, outputs(), during, strict=True):
        assert torch.equal(b, a)
        torch.testing.assert_close(d, b, rtol=2e-2, atol=2e-2)


def test_cuda_graphs_capture_our_kernels():
    x = randn(32, 512, dtype=torch.bfloat16)
    w = randn(512, dtype=torch.bfloat16, shift=1.0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with use_aten_overrides(ops=["rms_norm", "silu"]), torch.cuda.stream(stream):
        for _ in range(2):
            eager = F.silu(F.rms_norm(x, (512,), w, EPS))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            captured = F.silu(F.rms_norm(x, (512,), w, EPS))
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()  # the override is gone; the graph replays our kernels
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


def test_autocast_reaches_the_overrides_in_float32():
    ln = torch.nn.LayerNorm(256).cuda()
    x = randn(8, 256).requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16), use_aten_overrides(ops="layer_norm"):
        y = ln(x)
        y.sum().backward()
    assert y.dtype == torch.float32  # autocast runs layer_norm in fp32
    assert paths("native_layer_norm") == {"ours": 1}
