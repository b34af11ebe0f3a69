"""Kernels users register: OpenDeepKernel's Triton ReLU through the decorator, forward and
training (the reference's gradient, or a registered backward), and the errors a kernel that
breaks its pattern's contract raises."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kernels.compile import KernelOutputError, KernelRegistry, kernels_backend
from kernels.compile.patterns import PATTERNS
from kernels.compile.user_ops import user_kernel_op
from tests.support.compile import DEVICE, check_against_float64, randn, relu_kernel


def seed_registry(calls):
    """A registry with OpenDeepKernel's ReLU, registered the way its README does (a decorator
    on a registry object), counting its calls."""
    import triton

    registry = KernelRegistry()

    @registry.register("relu")
    def triton_relu(x):
        calls.append(tuple(x.shape))
        y = torch.empty_like(x)
        n = x.numel()
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)  # noqa: E731  (the seed's)
        relu_kernel[grid](x, y, n, BLOCK_SIZE=64)
        return y

    return registry


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)) + torch.relu(x).sum(-1, keepdim=True))


@pytest.mark.parametrize("downstream", ["eager", "aot_eager"])
def test_triton_relu_forward_and_training(downstream):
    calls = []
    backend = kernels_backend(seed_registry(calls), downstream=downstream)
    model = TwoLayers()
    compiled = torch.compile(model, backend=backend)
    check_against_float64(model, compiled, randn(5, 8), what=downstream)
    assert backend.count("relu") == 2
    assert calls, "the Triton kernel never ran"


def test_a_registered_backward_is_used():
    backward_calls = []
    registry = KernelRegistry()

    def relu_backward(grad, x):
        backward_calls.append(1)
        return grad * (x > 0)

    registry.register("relu", lambda x: x.clamp_min(0), backward=relu_backward)
    model = TwoLayers()
    for downstream in ("eager", "aot_eager"):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=kernels_backend(registry, downstream=downstream))
        check_against_float64(model, compiled, randn(5, 8), what=downstream)
    assert len(backward_calls) == 4  # two ReLUs, two downstreams


def test_user_rms_norm_gets_the_captured_arguments():
    seen = []
    registry = KernelRegistry()

    @registry.register("rms_norm")
    def my_rms_norm(x, weight, eps):
        seen.append((tuple(x.shape), tuple(weight.shape), eps, x.is_contiguous()))
        return F.rms_norm(x, (x.shape[-1],), weight, eps)

    norm = nn.RMSNorm(12, eps=3e-4)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    model = nn.Sequential(norm)
    backend = kernels_backend(registry, downstream="aot_eager")
    # A transposed input: the kernel receives a contiguous copy.
    x = randn(12, 3).t()
    check_against_float64(model, torch.compile(model, backend=backend), x)
    assert seen[0] == ((3, 12), (12,), 3e-4, True)


def test_a_kernel_returning_the_wrong_dtype_is_named():
    registry = KernelRegistry()

    @registry.register("silu")
    def sloppy_silu(x):
        return F.silu(x).half()

    compiled = torch.compile(F.silu, backend=kernels_backend(registry, downstream="eager"))
    with pytest.raises(
        KernelOutputError, match=r"sloppy_silu registered for 'silu' returned float16 \[4\]"
    ):
        compiled(randn(4))


def test_a_kernel_returning_its_input_is_refused():
    registry = KernelRegistry()
    registry.register("relu", lambda x: x.clamp_min_(0))
    compiled = torch.compile(
        lambda x: F.relu(x * 1), backend=kernels_backend(registry, downstream="eager")
    )
    with pytest.raises(KernelOutputError, match="returned its input .* must write a new tensor"):
        compiled(randn(4))


def test_a_backward_returning_too_few_gradients_is_named():
    registry = KernelRegistry()
    registry.register("silu_mul", lambda g, u: F.silu(g) * u, backward=lambda grad, g, u: grad)
    compiled = torch.compile(
        lambda g, u: F.silu(g) * u, backend=kernels_backend(registry, downstream="eager")
    )
    out = compiled(randn(4, requires_grad=True), randn(4, requires_grad=True))
    with pytest.raises(KernelOutputError, match="must return the gradient of each of its 2 tensor"):
        out.sum().backward()


def test_user_op_passes_opcheck():
    op = user_kernel_op(PATTERNS["silu_mul"], lambda g, u: F.silu(g) * u, "plain_silu_mul")
    gate, up = randn(3, 8, requires_grad=True), randn(3, 8, seed=1, requires_grad=True)
    torch.library.opcheck(op, (gate, up))
    op = user_kernel_op(
        PATTERNS["layer_norm"], lambda x, s, w, b, eps: F.layer_norm(x, s, w, b, eps), "plain_ln"
    )
    weight = randn(8, requires_grad=True)
    torch.library.opcheck(op, (randn(3, 8, requires_grad=True), [8], weight, None, 1e-5))


def test_on_the_device_the_tests_run_on():
    # The default devices: cuda, and cpu under the Triton interpreter (set by conftest).
    registry = seed_registry([])
    assert DEVICE in registry.entry("relu").resolved_device_types()
