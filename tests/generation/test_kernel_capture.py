"""Every kernel of our library is safe inside a CUDA graph: each layer, kernelized from
`library_mapping()` in INFERENCE mode (forward) and TRAINING mode (forward and backward), is
captured in a graph, replayed on new inputs twice, and matches an eager call on the same inputs.

A kernel that synchronises with the host fails the capture; one that allocates with a size it
reads from the device, caches pointers, or picks its launch from the data gives wrong results
on the second replay. GPU only: capture needs CUDA.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kernels import (
    Mode,
    kernelize,
    library_mapping,
    use_kernel_forward_from_hub,
    use_kernel_mapping,
)
from kernels.layer.swap import kernel_layer_of
from kernels.library import KERNELS, load_library_package
from tests.support.library import (
    FusedAddRMSNorm,
    GeluAndMul,
    GeluTanhAndMul,
    SiluAndMul,
    transformers_activation,
)
from tests.support.models import llama_config

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def side_stream():
    """Each test makes its modules, inputs and gradient seeds on a side stream, not on the
    legacy default stream: from torch 2.11, a backward captured in a graph that reaches leaf
    tensors made on the legacy stream makes that stream wait on the capturing one, which CUDA
    refuses (``cudaErrorStreamCaptureImplicit``) whatever the ops are. Measured on an H100
    (2026-11-24): plain ``nn.SiLU`` and ``nn.LayerNorm`` failed this test's capture exactly as
    our layers did with their tensors on the default stream, and passed on a side stream
    (test_the_harness_captures_plain_torch keeps that control)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        yield
    torch.cuda.current_stream().wait_stream(stream)


DEVICE = "cuda"
HIDDEN = 256
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def reference(layer_name: str) -> tuple[nn.Module, list[tuple[int, ...]]]:
    """A module the layer named ``layer_name`` replaces, and the shapes of its inputs."""
    from transformers import GemmaConfig
    from transformers.models.gemma.modeling_gemma import GemmaMLP, GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

    rows = (3, 37)  # 111 rows: not a multiple of any block
    activations = {
        "SiLU": "SiLUActivation",
        "GeLU": "GELUActivation",
        "GeluTanh": "GELUTanh",
        "NewGELU": "NewGELUActivation",
        "FastGELU": "FastGELUActivation",
        "QuickGELU": "QuickGELUActivation",
    }
    if layer_name in activations:
        cls = transformers_activation(activations[layer_name], torch.relu)
        return cls(), [(*rows, HIDDEN)]
    gated = {"SiluAndMul": SiluAndMul, "GeluAndMul": GeluAndMul, "GeluTanhAndMul": GeluTanhAndMul}
    if layer_name in gated:
        return gated[layer_name](), [(*rows, 2 * HIDDEN)]
    if layer_name == "SwiGLUMLP":
        config = llama_config(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, hidden_act="silu")
        return LlamaMLP(config), [(*rows, HIDDEN)]
    if layer_name == "GeGLUMLP":
        config = GemmaConfig(
            hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, hidden_activation="gelu_pytorch_tanh"
        )
        return GemmaMLP(config), [(*rows, HIDDEN)]
    norms = {
        "RMSNorm": lambda: LlamaRMSNorm(HIDDEN),
        "GemmaRMSNorm": lambda: GemmaRMSNorm(HIDDEN),
        "RMSNormZeroCentered": lambda: GemmaRMSNorm(HIDDEN),  # the same formula, 1 + weight
        "LayerNorm": lambda: nn.LayerNorm(HIDDEN),
    }
    if layer_name in norms:
        return norms[layer_name](), [(*rows, HIDDEN)]
    if layer_name == "FusedAddRMSNorm":
        return FusedAddRMSNorm(HIDDEN), [(*rows, HIDDEN), (*rows, HIDDEN)]
    raise AssertionError(f"no reference module for {layer_name}: add one to this test")


def kernelized(layer_name: str, mode: Mode, dtype: torch.dtype) -> tuple[nn.Module, list]:
    """The reference module, tagged and kernelized with our kernel for ``layer_name``."""
    module, shapes = reference(layer_name)
    tagged = use_kernel_forward_from_hub(layer_name)(
        type(type(module).__name__, (type(module),), {})
    )
    module.__class__ = tagged
    module = module.to(DEVICE, dtype)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.normal_(
                1.0 if parameter.dim() == 1 else 0.0, 0.3 if parameter.dim() == 1 else 0.05
            )
    # The whole mapping: the MLPs' act_fn is tagged too; an act_fn our library does not serve
    # keeps its own forward (fallback), which the MLP's kernel layer then calls.
    with use_kernel_mapping(library_mapping(devices=[DEVICE])):
        kernelize(module, mode=mode, device=DEVICE)
    # kernelize gives a kernelized layer a class of its own over the original (since 0.19's
    # layer API; an instance forward only where a hook library set one first).
    assert kernel_layer_of(module) is not None, f"{layer_name} kept its own forward"
    return module, shapes


def graphed(fn):
    """``fn`` captured in a CUDA graph after warm-up on a side stream (as torch's docs ask, so
    that autograd's first-call set-up is not captured): (graph, the captured outputs)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()
    return graph, outputs


def check_replays(fn, inputs: list[torch.Tensor], dtype: torch.dtype, what: str) -> None:
    graph, captured = graphed(fn)
    for seed in (1, 2):
        generator = torch.Generator(device=DEVICE).manual_seed(seed)
        with torch.no_grad():
            for tensor in inputs:
                tensor.copy_(torch.randn(tensor.shape, generator=generator, device=DEVICE))
        graph.replay()
        replayed = [t.clone() for t in captured]
        expected = fn()
        for i, (got, want) in enumerate(zip(replayed, expected, strict=True)):
            torch.testing.assert_close(
                got, want, **TOLERANCE[dtype], msg=lambda m, i=i: f"{what}, output {i}: {m}"
            )


# The loss layers (library/loss) replace a whole *ForCausalLM forward or transformers' loss
# function, not a layer a decode step calls; their capture is not covered here yet.
LOSS_LAYERS = {
    "ForCausalLMLoss",
    "CausalLMFusedLoss",
    "GemmaCausalLMFusedLoss",
    "MoeCausalLMFusedLoss",
    "MoeRouterCausalLMFusedLoss",
}
LAYERS = sorted(
    k.layer_name for k in KERNELS if not k.is_function and k.layer_name not in LOSS_LAYERS
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layer_name", LAYERS)
def test_inference_forward_replays_in_a_cuda_graph(layer_name, dtype):
    module, shapes = kernelized(layer_name, Mode.INFERENCE, dtype)
    inputs = [torch.randn(s, device=DEVICE, dtype=dtype) for s in shapes]

    def forward():
        with torch.no_grad():
            out = module(*inputs)
        return out if isinstance(out, tuple) else (out,)

    check_replays(forward, inputs, dtype, f"{layer_name} forward")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layer_name", LAYERS)
def test_training_forward_and_backward_replay_in_a_cuda_graph(layer_name, dtype):
    module, shapes = kernelized(layer_name, Mode.TRAINING, dtype)
    check_training_replays(module, shapes, dtype, f"{layer_name} forward+backward")


@pytest.mark.parametrize(
    "module", [nn.SiLU, lambda: nn.LayerNorm(HIDDEN)], ids=["SiLU", "LayerNorm"]
)
def test_the_harness_captures_plain_torch(module):
    # The control: PyTorch's own ops through the same harness. Were this to fail, the test
    # above would fail for reasons that are not our kernels'.
    check_training_replays(
        module().to(DEVICE), [(3, 37, HIDDEN)], torch.float32, "torch forward+backward"
    )


def check_training_replays(module: nn.Module, shapes, dtype: torch.dtype, what: str) -> None:
    """Forward and backward (input and parameter gradients) of ``module`` replayed."""
    inputs = [torch.randn(s, device=DEVICE, dtype=dtype, requires_grad=True) for s in shapes]
    parameters = list(module.parameters())
    out = module(*inputs)
    seeds = [torch.randn_like(o) for o in (out if isinstance(out, tuple) else (out,))]

    def forward_backward():
        out = module(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        grads = torch.autograd.grad(
            _seeded_loss(outs, seeds), [*inputs, *parameters], allow_unused=True
        )
        return (*[o.detach() for o in outs], *[g for g in grads if g is not None])

    check_replays(forward_backward, inputs, dtype, what)


def _seeded_loss(outputs, seeds) -> torch.Tensor:
    """A scalar whose gradient with respect to each output is its seed."""
    return sum((o.float() * s.float()).sum() for o, s in zip(outputs, seeds, strict=True))


def _rotary_inputs(dtype, requires_grad=False):
    batch, seq, dim = 2, 37, 64
    q = torch.randn(batch, 8, seq, dim, device=DEVICE, dtype=dtype, requires_grad=requires_grad)
    k = torch.randn(batch, 2, seq, dim, device=DEVICE, dtype=dtype, requires_grad=requires_grad)
    angles = torch.randn(batch, seq, dim // 2, device=DEVICE)
    angles = torch.cat([angles, angles], dim=-1)
    return q, k, angles.cos().to(dtype), angles.sin().to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "forward+backward"])
def test_rotary_replays_in_a_cuda_graph(dtype, backward):
    rotary = load_library_package("rotary")
    q, k, cos, sin = _rotary_inputs(dtype, requires_grad=backward)
    seeds = [torch.randn_like(q), torch.randn_like(k)]

    def call():
        if not backward:
            with torch.no_grad():
                return rotary.apply_rotary_pos_emb(q, k, cos, sin)
        q_out, k_out = rotary.apply_rotary_pos_emb(q, k, cos, sin)
        grads = torch.autograd.grad(_seeded_loss((q_out, k_out), seeds), (q, k))
        return (q_out.detach(), k_out.detach(), *grads)

    check_replays(call, [q, k], dtype, "rotary_pos_emb")
