"""Kernel layers: each replaces the ``forward`` of a tagged module and keeps its signature.

A kernel layer has no state and no ``__init__``: ``kernelize`` binds ``forward`` to the original
module instance. The element-wise layers replace transformers' activation modules (parameter
``input``); the gated ones replace vLLM-style ``SiluAndMul``-like modules (parameter ``x``);
``SwiGLUMLP`` and ``GeGLUMLP`` replace the whole gated MLP of Llama- and Gemma-family models
(parameter ``x``).
"""

import types

import torch
from torch import Tensor

from ._library import use_autograd_function
from .decode_mlp import gated_mlp_decode, takes_decode_kernels
from .elementwise import fast_gelu, gelu, gelu_tanh, new_gelu, quick_gelu, silu
from .gated import gelu_and_mul, gelu_tanh_and_mul, gelu_tanh_mul, silu_and_mul, silu_mul
from .mlp import swiglu_mlp


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
    return (
        cls is torch.nn.SiLU or _is_transformers_activation(cls, "SiLUActivation")
    ) and _runs_own_or(act, SiLU)


def _is_plain_gelu_tanh(act: torch.nn.Module) -> bool:
    """Whether calling ``act`` is the tanh-approximated GELU: transformers' ``GELUTanh`` (what
    ``ACT2FN["gelu_pytorch_tanh"]`` gives, Gemma's activation) or ``torch.nn.GELU("tanh")``,
    not a subclass, with no hooks, running its own ``forward`` or our ``GeluTanh`` layer's."""
    cls = type(act)
    return (
        (cls is torch.nn.GELU and act.approximate == "tanh")
        or _is_transformers_activation(cls, "GELUTanh")
    ) and _runs_own_or(act, GeluTanh)


def _is_transformers_activation(cls: type, name: str) -> bool:
    return cls.__name__ == name and cls.__module__ == "transformers.activations"


def _runs_own_or(act: torch.nn.Module, kernel_layer: type) -> bool:
    """No hooks, and ``act`` runs its class's ``forward`` or `kernel_layer`'s."""
    if _has_hooks(act):
        return False
    if "forward" not in act.__dict__:
        return True
    # Spelled as attribute reads, not ``__dict__.get`` or ``getattr`` with a default: this is
    # the form torch.compile (dynamo, torch 2.11 and 2.13 tried) evaluates as Python does.
    # ``kernels`` binds the kernel layer's forward itself or its DTensor-aware wrapper, whose
    # ``__wrapped__`` it is (a function's attribute, read with a default: dynamo traces that;
    # torch 2.13, fullgraph, tests/distributed/test_shard_rules.py).
    forward = act.forward
    if not isinstance(forward, types.MethodType):
        return False
    func = forward.__func__
    return (
        func is kernel_layer.forward or getattr(func, "__wrapped__", None) is kernel_layer.forward
    )


def _has_hooks(module: torch.nn.Module) -> bool:
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or module._backward_hooks
        or module._backward_pre_hooks
    )


def _is_plain_linear(module: torch.nn.Module, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether calling ``module`` is exactly ``F.linear(x, weight, bias)`` with plain tensors of
    ``dtype`` on ``device``: a ``torch.nn.Linear`` (not a subclass, LoRA or quantized wrapper),
    with no hooks and its own ``forward``."""
    if type(module) is not torch.nn.Linear or _has_hooks(module) or "forward" in module.__dict__:
        return False
    return all(
        t is None or (type(t) is torch.nn.Parameter and t.dtype == dtype and t.device == device)
        for t in (module.weight, module.bias)
    )


def _calls_are_plain(mlp: torch.nn.Module, x: torch.Tensor) -> bool:
    """Whether reading the projections' weights computes exactly what calling them would: a
    plain tensor input, no autocast (which would cast inside the matmuls), no global module
    hooks, and plain Linear projections of ``x``'s dtype and device (`_is_plain_linear`)."""
    if type(x) is not torch.Tensor or torch.is_autocast_enabled(x.device.type):
        return False
    module = torch.nn.modules.module
    if (
        module._global_forward_hooks
        or module._global_forward_pre_hooks
        or module._global_backward_hooks
        or module._global_backward_pre_hooks
    ):
        return False
    projections = (mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    return all(_is_plain_linear(p, x.dtype, x.device) for p in projections)


def _weights(mlp: torch.nn.Module) -> tuple:
    """(gate weight, gate bias, up weight, up bias, down weight, down bias)."""
    gate, up, down = mlp.gate_proj, mlp.up_proj, mlp.down_proj
    return gate.weight, gate.bias, up.weight, up.bias, down.weight, down.bias


def _takes_fused_mlp(mlp: torch.nn.Module, x: torch.Tensor) -> bool:
    """Whether ``swiglu_mlp`` computes exactly what the module calls would, and is worth it:
    a call that records a backward (``swiglu_mlp`` saves less for it, eagerly and compiled)
    with plain calls (`_calls_are_plain`). Compiled, "records" means that an input or weight
    needs a gradient: otherwise the module calls are the same graph."""
    if torch.compiler.is_compiling():
        return _calls_are_plain(mlp, x) and use_autograd_function(x, *_weights(mlp))
    return torch.is_grad_enabled() and _calls_are_plain(mlp, x)


def _takes_decode_mlp(mlp: torch.nn.Module, x: torch.Tensor) -> bool:
    """Whether ``gated_mlp_decode``'s kernels compute what the module calls would: a call that
    needs no backward, with plain calls (`_calls_are_plain`), on input its kernels take (fp16
    or bf16, at most ``DECODE_ROWS`` tokens, a device they run on; under ``torch.compile`` the
    kernels are an op that inductor leaves alone)."""
    if not takes_decode_kernels(x):
        return False
    return _calls_are_plain(mlp, x) and not use_autograd_function(x, *_weights(mlp))


def decode_activation(mlp: torch.nn.Module, x: torch.Tensor) -> str | None:
    """The activation (``"silu"`` or ``"gelu_tanh"``) with which `SwiGLUMLP` would run
    ``mlp``'s call on ``x`` as ``gated_mlp_decode``'s two kernels, or None if it would not
    (another activation, a backward, a size or dtype left to cuBLAS, projections that are not
    plain): for callers that run those kernels on the MLP's weights themselves
    (``kernels.generation``'s folded decoder layers)."""
    if _is_plain_silu(mlp.act_fn):
        act = "silu"
    elif _is_plain_gelu_tanh(mlp.act_fn):
        act = "gelu_tanh"
    else:
        return None
    return act if _takes_decode_mlp(mlp, x) else None


def _gated_mlp(mlp: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))``, with ``act(gate) * up``
    fused into one kernel when ``act_fn`` is plain SiLU or tanh GELU (at decode sizes, the whole
    MLP in two kernels); the module's own formula for any other ``act_fn``."""
    if _is_plain_silu(mlp.act_fn):
        if _takes_decode_mlp(mlp, x):
            return gated_mlp_decode(x, *_weights(mlp), "silu")
        if _takes_fused_mlp(mlp, x):
            return swiglu_mlp(x, *_weights(mlp))
        fused = silu_mul
    elif _is_plain_gelu_tanh(mlp.act_fn):
        if _takes_decode_mlp(mlp, x):
            return gated_mlp_decode(x, *_weights(mlp), "gelu_tanh")
        fused = gelu_tanh_mul
    else:
        return mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))
    gate, up = mlp.gate_proj(x), mlp.up_proj(x)
    # DTensors (from projections parallelised with use_local_output=False) take the module's
    # formula, whose act_fn runs our activation kernel on their local shards. Compiled, the fused
    # functions are PyTorch ops, which take any tensor.
    if torch.compiler.is_compiling() or (type(gate) is torch.Tensor and type(up) is torch.Tensor):
        return mlp.down_proj(fused(gate, up))
    return mlp.down_proj(mlp.act_fn(gate) * up)


class SwiGLUMLP(torch.nn.Module):
    """The gated MLP of transformers' Llama, Mistral, Qwen2, Qwen3 (``LlamaMLP`` & co.), and of
    Gemma (``GemmaMLP``, the same ``forward``): ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``,
    with ``act_fn(gate) * up`` fused into one kernel when ``act_fn`` is SiLU (``silu_mul``) or
    tanh GELU (``gelu_tanh_mul``, Gemma's). Any other ``act_fn`` (or an activation module with
    hooks) is called as the module would call it, so the result never changes.

    When training with SiLU and plain ``torch.nn.Linear`` projections, eagerly or under
    ``torch.compile``, the whole MLP runs as ``swiglu_mlp``, which keeps ``gate`` and ``up`` for
    backward but not their product (the backward recomputes it): a third less of the MLP's
    activation memory. At decode
    sizes (at most ``DECODE_ROWS`` tokens of fp16 or bf16, no backward needed, the same plain
    projections), with SiLU or tanh GELU, it runs as ``gated_mlp_decode``: two matrix-vector
    kernels. Otherwise the projections are called as modules (their hooks, LoRA wrappers etc.
    still run)."""

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _gated_mlp(self, x)


class GeGLUMLP(torch.nn.Module):
    """The GELU-gated MLP (transformers 5.x lists ``"GeGLUMLP"`` in its default mapping):
    the same computation as `SwiGLUMLP`, fused for tanh GELU (Gemma's ``act_fn``) and SiLU."""

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _gated_mlp(self, x)


# How ``kernels`` runs each layer when tensor parallelism hands it DTensors (its shard rule, an
# attribute of the forward function so the classes keep only the members kernel layers may
# have): on each rank's shard where that computes the same thing. ``"dtensor"``: the gated MLPs
# call the module's own (parallelised) projections and take DTensors themselves.
for _layer, _rule in (
    (SiLU, "elementwise"),
    (GeLU, "elementwise"),
    (GeluTanh, "elementwise"),
    (NewGELU, "elementwise"),
    (FastGELU, "elementwise"),
    (QuickGELU, "elementwise"),
    (SiluAndMul, "gated"),
    (GeluAndMul, "gated"),
    (GeluTanhAndMul, "gated"),
    (SwiGLUMLP, "dtensor"),
    (GeGLUMLP, "dtensor"),
):
    _layer.forward.shard_rule = _rule
del _layer, _rule
