"""kernelize(..., verify=...): kernels are checked against their layers on real inputs."""

import copy
import logging

import pytest
import torch
import torch.nn as nn

from kernels import (
    KernelizeFallback,
    KernelVerificationError,
    LocalLayerRepository,
    Mode,
    kernelize,
    register_kernel_mapping,
    use_kernel_forward_from_hub,
    use_kernel_mapping,
)
from kernels.layer.swap import kernel_layer_of

RMSNORM_KERNELS = """
import torch


def _normed(h, eps):
    h32 = h.float()
    return (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)


class RMSNorm(torch.nn.Module):
    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states):
        return self.weight * _normed(hidden_states, self.variance_epsilon)


class _WrongBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class WrongGradient(torch.nn.Module):
    def forward(self, hidden_states):
        return self.weight * _normed(_WrongBackward.apply(hidden_states), self.variance_epsilon)


class DetachedWeight(torch.nn.Module):
    def forward(self, hidden_states):
        return self.weight.detach() * _normed(hidden_states, self.variance_epsilon)
"""


@use_kernel_forward_from_hub("RMSNorm")
class LlamaStyleNorm(nn.Module):
    def __init__(self, size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        h = hidden_states.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(hidden_states.dtype)


@use_kernel_forward_from_hub("RMSNorm")
class GemmaStyleNorm(LlamaStyleNorm):
    """Tagged like Llama's norm, but scales by (1 + weight): an RMSNorm kernel is wrong here."""

    def forward(self, hidden_states):
        h = hidden_states.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (h * (1.0 + self.weight.float())).to(hidden_states.dtype)


class Model(nn.Module):
    def __init__(self, norm_class=LlamaStyleNorm, dtype=torch.float32):
        super().__init__()
        self.proj = nn.Linear(8, 8).to(dtype)
        self.norm = norm_class(8).to(dtype)
        self.unused = LlamaStyleNorm(8).to(dtype)

    def forward(self, x, scale=1.0):
        return self.norm(self.proj(x) * scale)


@pytest.fixture(autouse=True)
def clean_mapping():
    register_kernel_mapping({}, inherit_mapping=False)
    yield
    register_kernel_mapping({}, inherit_mapping=False)


@pytest.fixture
def norm_kernels(kernel_repo):
    path = kernel_repo("norm", package="norm", layers_source=RMSNORM_KERNELS)

    def mapping(layer_name):
        return {"RMSNorm": {"cpu": LocalLayerRepository(path, layer_name=layer_name)}}

    return mapping


@pytest.mark.parametrize("mode", [Mode.INFERENCE, Mode.TRAINING])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_correct_kernel_passes(norm_kernels, mode, dtype):
    model = Model(dtype=dtype)
    x = torch.randn(3, 5, 8, dtype=dtype)
    with use_kernel_mapping(norm_kernels("RMSNorm")):
        kernelize(model, mode=mode, verify=x)
    assert kernel_layer_of(model.norm) is not None


@pytest.mark.parametrize("mode", [Mode.INFERENCE, Mode.TRAINING])
def test_kernel_with_other_semantics_is_refused(norm_kernels, caplog, mode):
    model = Model(norm_class=GemmaStyleNorm)
    x = torch.randn(4, 8)
    with use_kernel_mapping(norm_kernels("RMSNorm")):
        with caplog.at_level(logging.WARNING, logger="kernels"):
            # A kernel that fails verification raises unless VERIFICATION_FAILURE (in ALL, not
            # in the default) is given.
            kernelize(model, mode=mode, verify=(x,), use_fallback=KernelizeFallback.ALL)
        assert kernel_layer_of(model.norm) is None
        assert (
            kernel_layer_of(model.unused) is not None
        )  # not reached by the example: kept, with a warning
        messages = "\n".join(r.getMessage() for r in caplog.records)
        assert (
            "norm (GemmaStyleNorm, 'RMSNorm') keeps its original forward: kernel layer RMSNorm from local"
            in messages
        )
        assert "failed verification: output differs from the layer's by" in messages
        assert "unused: not verified, the example inputs never reached this layer" in messages
        with pytest.raises(
            KernelVerificationError,
            match=r"norm \(GemmaStyleNorm\): kernel layer RMSNorm .* failed",
        ):
            kernelize(model, mode=mode, verify={"x": x, "scale": 2.0}, use_fallback=False)


def test_wrong_gradients_are_caught_in_training_only(norm_kernels):
    x = torch.randn(4, 8)
    with use_kernel_mapping(norm_kernels("WrongGradient")):
        model = Model()
        kernelize(model, mode=Mode.INFERENCE, verify=x)
        assert kernel_layer_of(model.norm) is not None
        with pytest.raises(KernelVerificationError, match="gradient of input 0 differs"):
            kernelize(model, mode=Mode.TRAINING, verify=x, use_fallback=False)


def test_missing_weight_gradient_is_caught(norm_kernels):
    with use_kernel_mapping(norm_kernels("DetachedWeight")):
        with pytest.raises(
            KernelVerificationError, match="the kernel gives no gradient for weight"
        ):
            kernelize(Model(), mode=Mode.TRAINING, verify=torch.randn(2, 8), use_fallback=False)


def test_verification_uses_the_layers_own_forward_and_restores_kernels(norm_kernels):
    model = Model(norm_class=GemmaStyleNorm)
    x = torch.randn(4, 8)
    with use_kernel_mapping(norm_kernels("RMSNorm")):
        kernelize(model, mode=Mode.INFERENCE)  # unverified: the wrong kernel is in place
        before = {name: kernel_layer_of(m) for name, m in model.named_modules()}
        with pytest.raises(KernelVerificationError):
            kernelize(model, mode=Mode.INFERENCE, verify=x, use_fallback=False)
    # All or nothing, also for verification: the model is as it was.
    assert {name: kernel_layer_of(m) for name, m in model.named_modules()} == before


def test_the_model_is_not_changed_by_the_capture_run(norm_kernels):
    model = Model()
    x = torch.randn(4, 8)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with use_kernel_mapping(norm_kernels("RMSNorm")):
        kernelize(model, mode=Mode.TRAINING, verify=x)
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_bad_example_type(norm_kernels):
    with use_kernel_mapping(norm_kernels("RMSNorm")):
        with pytest.raises(KernelVerificationError, match="verify= takes a tensor"):
            kernelize(Model(), mode=Mode.INFERENCE, verify=3)


# verify= leaves the model exactly as it was: state, gradients, RNG, hooks and global flags.

STATEFUL_KERNELS = (
    RMSNORM_KERNELS
    + """

class Raising(torch.nn.Module):
    def forward(self, hidden_states):
        raise RuntimeError("no kernel for this shape")
"""
)


class StatefulModel(nn.Module):
    """Everything a forward changes besides its output: BatchNorm statistics, the RNG (dropout)."""

    def __init__(self, norm_class=LlamaStyleNorm, fail=False):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.5)
        self.norm = norm_class(8)
        self.fail = fail

    def forward(self, x):
        h = self.drop(self.bn(self.proj(x)))
        if self.fail:
            raise RuntimeError("the model cannot take this input")
        return self.norm(h)


@pytest.fixture
def stateful_kernels(kernel_repo):
    path = kernel_repo("stateful", package="stateful", layers_source=STATEFUL_KERNELS)

    def mapping(layer_name):
        return {"RMSNorm": {"cpu": LocalLayerRepository(path, layer_name=layer_name)}}

    return mapping


def _global_flags():
    return (
        torch.is_grad_enabled(),
        torch.is_autocast_enabled("cpu"),
        torch.get_default_dtype(),
        torch.get_float32_matmul_precision(),
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.benchmark,
        torch.backends.cuda.matmul.allow_tf32,
    )


def _hooks(model):
    return [
        (name, attr, dict(value))
        for name, module in model.named_modules()
        for attr, value in vars(module).items()
        if attr.endswith("_hooks") or attr.endswith("_hooks_with_kwargs")
    ]


class _Observed:
    """What the test can see of a model before kernelize: objects, values, grads, RNG, flags."""

    def __init__(self, model):
        self.buffers = dict(model.named_buffers())
        self.buffer_values = {k: v.clone() for k, v in self.buffers.items()}
        self.buffer_pointers = {k: v.data_ptr() for k, v in self.buffers.items()}
        self.params = dict(model.named_parameters())
        self.param_values = {k: v.detach().clone() for k, v in self.params.items()}
        self.grads = {k: v.grad for k, v in self.params.items()}
        self.grad_values = {k: None if g is None else g.clone() for k, g in self.grads.items()}
        self.training = {k: m.training for k, m in model.named_modules()}
        self.attributes = {
            k: set(vars(m)) - {"forward", "_kernel_repo"} for k, m in model.named_modules()
        }
        self.hooks = _hooks(model)
        self.rng = torch.get_rng_state()
        self.flags = _global_flags()

    def assert_unchanged(self, model):
        buffers = dict(model.named_buffers())
        assert buffers.keys() == self.buffers.keys()
        for name, buffer in buffers.items():
            assert buffer is self.buffers[name], name
            assert buffer.data_ptr() == self.buffer_pointers[name], name
            assert torch.equal(buffer, self.buffer_values[name]), name
        assert int(buffers["bn.num_batches_tracked"]) == int(
            self.buffer_values["bn.num_batches_tracked"]
        )
        params = dict(model.named_parameters())
        assert params.keys() == self.params.keys()
        for name, param in params.items():
            assert param is self.params[name], name
            assert torch.equal(param, self.param_values[name]), name
            assert param.grad is self.grads[name], name
            if param.grad is not None:
                assert torch.equal(param.grad, self.grad_values[name]), name
        assert {k: m.training for k, m in model.named_modules()} == self.training
        assert {
            k: set(vars(m)) - {"forward", "_kernel_repo"} for k, m in model.named_modules()
        } == self.attributes
        assert _hooks(model) == self.hooks
        assert torch.equal(torch.get_rng_state(), self.rng)
        assert _global_flags() == self.flags


def _stateful_model(norm_class, training, fail=False):
    model = StatefulModel(norm_class, fail=fail)
    model.train(training)
    model.proj.weight.grad = torch.randn(8, 8)  # mid-training: one gradient exists, others None
    return model


def _assert_next_forward_matches(model, twin, x, rng):
    """The next forward (and the state it leaves) is bit for bit the twin's from the same RNG."""
    out = model(x)
    after = torch.get_rng_state()
    torch.set_rng_state(rng)
    expected = twin(x)
    assert torch.equal(out, expected)
    assert torch.equal(torch.get_rng_state(), after)
    for (name, got), (_, want) in zip(model.named_buffers(), twin.named_buffers(), strict=True):
        assert torch.equal(got, want), name


STATE_CASES = [
    pytest.param(Mode.TRAINING, True, id="training-train"),
    pytest.param(Mode.INFERENCE, False, id="inference-eval"),
    pytest.param(Mode.INFERENCE, True, id="inference-train"),
]


@pytest.mark.parametrize("mode, training", STATE_CASES)
def test_verification_that_passes_leaves_the_model_as_it_was(stateful_kernels, mode, training):
    model = _stateful_model(LlamaStyleNorm, training)
    twin = copy.deepcopy(model)
    x = torch.randn(6, 8)
    observed = _Observed(model)
    with use_kernel_mapping(stateful_kernels("RMSNorm")):
        kernelize(model, mode=mode, verify=x)
        kernelize(twin, mode=mode)
    assert kernel_layer_of(model.norm) is not None
    observed.assert_unchanged(model)
    _assert_next_forward_matches(model, twin, x, observed.rng)


@pytest.mark.parametrize("mode, training", STATE_CASES)
@pytest.mark.parametrize("kernel", ["RMSNorm", "Raising"])
def test_verification_that_falls_back_leaves_the_model_as_it_was(
    stateful_kernels, caplog, mode, training, kernel
):
    model = _stateful_model(GemmaStyleNorm, training)
    twin = copy.deepcopy(model)
    x = torch.randn(6, 8)
    observed = _Observed(model)
    with use_kernel_mapping(stateful_kernels(kernel)):
        with caplog.at_level(logging.WARNING, logger="kernels"):
            kernelize(model, mode=mode, verify=x, use_fallback=KernelizeFallback.ALL)
    assert kernel_layer_of(model.norm) is None
    messages = "\n".join(r.getMessage() for r in caplog.records)
    assert f"kernel layer {kernel} from local" in messages
    if kernel == "Raising":
        assert "it raised RuntimeError: no kernel for this shape" in messages
    observed.assert_unchanged(model)
    _assert_next_forward_matches(model, twin, x, observed.rng)


@pytest.mark.parametrize("mode, training", STATE_CASES)
@pytest.mark.parametrize("kernel", ["RMSNorm", "Raising"])
def test_verification_that_raises_leaves_the_model_as_it_was(
    stateful_kernels, mode, training, kernel
):
    model = _stateful_model(GemmaStyleNorm, training)
    twin = copy.deepcopy(model)
    x = torch.randn(6, 8)
    observed = _Observed(model)
    with use_kernel_mapping(stateful_kernels(kernel)):
        with pytest.raises(
            KernelVerificationError, match=rf"norm \(GemmaStyleNorm\): kernel layer {kernel}"
        ):
            kernelize(model, mode=mode, verify=x, use_fallback=False)
    observed.assert_unchanged(model)
    _assert_next_forward_matches(model, twin, x, observed.rng)


@pytest.mark.parametrize("mode, training", STATE_CASES)
def test_a_model_that_raises_during_verification_is_left_as_it_was(
    stateful_kernels, mode, training
):
    model = _stateful_model(LlamaStyleNorm, training, fail=True)
    x = torch.randn(6, 8)
    observed = _Observed(model)
    with use_kernel_mapping(stateful_kernels("RMSNorm")):
        with pytest.raises(
            KernelVerificationError,
            match=r"verify=: the model raised RuntimeError on the example inputs: the model cannot "
            r"take this input",
        ) as raised:
            kernelize(model, mode=mode, verify=x)
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert kernel_layer_of(model.norm) is None
    observed.assert_unchanged(model)


class _Meddling(nn.Module):
    """A forward that leaves traces beyond its buffers: a hook, rebound tensors, gradients, flags."""

    def __init__(self):
        super().__init__()
        self.norm = LlamaStyleNorm(8)
        self.shift = nn.Parameter(torch.zeros(8))
        self.shift.grad = torch.zeros(8)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.register_buffer("signed", torch.zeros(2))

    def forward(self, x):
        self.calls = self.calls + 1  # rebinds the buffer to a new tensor
        self.signed.neg_()  # 0.0 -> -0.0: equal by torch.equal, not bit for bit
        with torch.no_grad():
            self.shift.add_(1)
        self.shift.grad.add_(1)
        self.norm.weight.grad = torch.ones(8)
        self.seen = x.shape  # a new attribute
        self.norm.register_forward_hook(lambda *args: None)
        self.norm.train(not self.norm.training)
        torch.set_grad_enabled(not torch.is_grad_enabled())
        torch.set_default_dtype(torch.float64)
        torch.use_deterministic_algorithms(True)
        torch.rand(3)
        return self.norm(x.float())


@pytest.mark.parametrize("mode", [Mode.INFERENCE, Mode.TRAINING])
def test_a_forward_that_meddles_leaves_no_trace(stateful_kernels, mode):
    model = _Meddling()
    x = torch.randn(2, 8)
    buffer, grad = model.calls, model.shift.grad
    flags = _global_flags()
    hooks = _hooks(model)
    rng = torch.get_rng_state()
    try:
        with use_kernel_mapping(stateful_kernels("RMSNorm")):
            kernelize(model, mode=mode, verify=x)
    finally:
        observed_flags = _global_flags()
        torch.set_default_dtype(torch.float32)
        torch.use_deterministic_algorithms(False)
        torch.set_grad_enabled(True)
    assert observed_flags == flags
    assert model.calls is buffer and int(buffer) == 0
    assert model.shift.grad is grad and not grad.any() and not model.shift.any()
    assert model.norm.weight.grad is None
    assert not model.signed.signbit().any()
    assert not hasattr(model, "seen")
    assert model.norm.training
    assert _hooks(model) == hooks
    assert torch.equal(torch.get_rng_state(), rng)
    assert kernel_layer_of(model.norm) is not None


def test_lazy_modules_are_refused_before_running(stateful_kernels):
    model = nn.Sequential(nn.LazyLinear(8), LlamaStyleNorm(8))
    with use_kernel_mapping(stateful_kernels("RMSNorm")):
        with pytest.raises(KernelVerificationError, match="LazyLinear"):
            kernelize(model, mode=Mode.INFERENCE, verify=torch.randn(2, 4))
    assert isinstance(model[0], nn.LazyLinear)
    assert nn.parameter.is_lazy(model[0].weight)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["RMSNorm", "Raising"])
def test_cuda_generators_and_state_are_left_as_they_were(kernel_repo, kernel):
    path = kernel_repo("stateful", package="stateful", layers_source=STATEFUL_KERNELS)
    mapping = {"RMSNorm": {"cuda": LocalLayerRepository(path, layer_name=kernel)}}
    model = _stateful_model(LlamaStyleNorm, True).cuda()
    twin = copy.deepcopy(model)
    x = torch.randn(6, 8, device="cuda")
    observed = _Observed(model)
    cuda_rng = torch.cuda.get_rng_state_all()
    with use_kernel_mapping(mapping):
        # A kernel that fails verification raises unless VERIFICATION_FAILURE (in ALL) falls back.
        kernelize(model, mode=Mode.TRAINING, verify=x, use_fallback=KernelizeFallback.ALL)
        if kernel == "RMSNorm":
            kernelize(twin, mode=Mode.TRAINING)
    assert (kernel_layer_of(model.norm) is None) == (kernel == "Raising")
    observed.assert_unchanged(model)
    after = torch.cuda.get_rng_state_all()
    assert all(torch.equal(a, b) for a, b in zip(after, cuda_rng, strict=True))
    out = model(x)
    torch.cuda.set_rng_state_all(cuda_rng)
    assert torch.equal(out, twin(x))
