"""Kernel layers: each replaces the ``forward`` of a tagged module and keeps its signature.

A kernel layer has no state and no ``__init__``: ``kernelize`` binds ``forward`` to the original
module instance. The element-wise layers replace transformers' activation modules (parameter
``input``); the gated ones replace vLLM-style ``SiluAndMul``-like modules (parameter ``x``);
``SwiGLUMLP`` replaces the whole gated MLP of Llama-family models (parameter ``x``).
"""

import types

import torch
from torch import Tensor

from .elementwise import fast_gelu, gelu, gelu_tanh, new_gelu, quick_gelu, silu
from .gated import gelu_and_mul, gelu_tanh_and_mul, silu_and_mul, silu_mul


class SiLU(torch.nn.Module):
    """transformers ``SiLUActivation``: ``F.silu(input)``."""

    has_backward = True
    can_torch_compile = True

    def forward(self, input: Tensor) -> Tensor:
        return silu(input)


class GeLU(torch.nn.Module):
    """transformers ``GELUActivation``: ``F.gelu(input)`` (exact, erf)."""

    has_backward = True
    can_torch_compile = True

    def forward(self, input: Tensor) -> Tensor:
        return gelu(input)


class GeluTanh(torch.nn.Module):
    """transformers ``GELUTanh``: ``F.gelu(input, approximate="tanh")``."""

    has_backward = True
    can_torch_compile = True

    def forward(self, input: Tensor) -> Tensor:
        return gelu_tanh(input)


class NewGELU(torch.nn.Module):
    """transformers ``NewGELUActivation``: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""

    has_backward = True
    can_torch_compile = True

    def forward(self, input: Tensor) -> Tensor:
        return new_gelu(input)


class FastGELU(torch.nn.Module):
    """transformers ``FastGELUActivation``: ``0.5 x (1 + tanh(0.7978845608 x (1 + 0.044715 x^2)))``."""

    has_backward = True
    can_torch_compile = True

    def forward(self, input: Tensor) -> Tensor:
        return fast_gelu(input)


class QuickGELU(torch.nn.Module):
    """transformers ``QuickGELUActivation``: ``input * sigmoid(1.702 * input)``."""

    has_backward = True
    can_torch_compile = True

    def forward(self, input: Tensor) -> Tensor:
        return quick_gelu(input)


class SiluAndMul(torch.nn.Module):
    """vLLM ``SiluAndMul``: ``F.silu(x[..., :d]) * x[..., d:]``, ``[..., 2d] -> [..., d]``."""

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(x)


class GeluAndMul(torch.nn.Module):
    """vLLM ``GeluAndMul`` (exact gelu): ``F.gelu(x[..., :d]) * x[..., d:]``."""

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu_and_mul(x)


class GeluTanhAndMul(torch.nn.Module):
    """vLLM ``GeluAndMul(approximate="tanh")``: ``F.gelu(x[..., :d], approximate="tanh") * x[..., d:]``."""

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu_tanh_and_mul(x)


def _is_plain_silu(act: torch.nn.Module) -> bool:
    """Whether calling ``act`` is exactly ``F.silu``: a ``torch.nn.SiLU`` or transformers'
    ``SiLUActivation`` (what ``ACT2FN["silu"]`` gives; ``"swish"`` gives ``nn.SiLU``), not a
    subclass, with no hooks, and running its own ``forward`` or our ``SiLU`` kernel layer's
    (which ``kernelize`` binds to it when it serves the ``"SiLU"`` layer too)."""
    cls = type(act)
    if not (
        cls is torch.nn.SiLU
        or (cls.__name__ == "SiLUActivation" and cls.__module__ == "transformers.activations")
    ):
        return False
    if (
        act._forward_hooks
        or act._forward_pre_hooks
        or act._backward_hooks
        or act._backward_pre_hooks
    ):
        return False
    if "forward" not in act.__dict__:
        return True
    # Spelled as attribute reads, not ``__dict__.get`` or ``getattr`` with a default: this is
    # the form torch.compile (dynamo, torch 2.11 and 2.13 tried) evaluates as Python does.
    forward = act.forward
    return isinstance(forward, types.MethodType) and forward.__func__ is SiLU.forward


class SwiGLUMLP(torch.nn.Module):
    """The gated MLP of transformers' Llama, Mistral, Qwen2, Qwen3 (``LlamaMLP`` & co.):
    ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``, with ``act_fn(gate) * up`` fused into
    one kernel (``silu_mul``) when ``act_fn`` is SiLU. Any other ``act_fn`` (or a SiLU module
    with hooks) is called as the module would call it, so the result never changes; the
    projections are always called as modules (their hooks, LoRA wrappers etc. still run)."""

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _is_plain_silu(self.act_fn):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(silu_mul(self.gate_proj(x), self.up_proj(x)))
