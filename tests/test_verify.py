"""kernelize(..., verify=...): kernels are checked against their layers on real inputs."""

import logging

import pytest
import torch
import torch.nn as nn

from kernels import (
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
            kernelize(model, mode=mode, verify=(x,))
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
