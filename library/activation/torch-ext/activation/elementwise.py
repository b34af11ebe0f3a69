"""Element-wise activations ``[...] -> [...]``: SiLU and the GELU family.

Read top to bottom: the Triton kernels, the launchers that pick block sizes, then the autograd
wiring (a ``torch.autograd.Function`` for eager calls, and ``torch.library`` custom ops with fake
implementations and registered autograd, for graphs that hold them as nodes; under
``torch.compile`` the public functions hand inductor the formula in PyTorch ops instead).

Both directions are single streaming passes: forward reads x and writes y; backward reads x
and dy and writes dx. All arithmetic is fp32.
"""

import functools

import torch
import triton
import triton.language as tl

from ._compile_rule import OP, compile_side, sizes
from ._functions import (
    FAST_GELU,
    GELU,
    GELU_TANH,
    QUICK_GELU,
    SILU,
    activation,
    activation_and_grad,
    torch_activation,
)
from ._library import cdiv, check_dtype, launch, next_power_of_2, op_name, use_autograd_function

# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------


@triton.jit
def _activation_fwd_kernel(X, Y, n_elements, ACT: tl.constexpr, BLOCK: tl.constexpr):
    # int64 offsets: inputs past 2**31 elements (a 32768 x 65536 activation) stay addressable.
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    y = activation(x, ACT)
    tl.store(Y + offsets, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _activation_bwd_kernel(DY, X, DX, n_elements, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + offsets, mask=mask, other=0.0).to(tl.float32)
    _, dydx = activation_and_grad(x, ACT)
    tl.store(DX + offsets, (dy * dydx).to(DX.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------


# Elements per program and per thread of both passes. 2048 elements a program, 16 a thread (two
# 16-byte vectors of bf16 per load), 4 warps: with two loads in flight while a thread computes,
# the arithmetic (tanh GELU's above all) hides behind memory and the forward runs as fast as a
# copy of the same bytes, which 8 elements a thread did not reach; the backward gains too. The
# A/B that chose it is summed up in benchmarks/results/h200/NOTES.md.
BLOCK = 2048
ELEMENTS_PER_THREAD = 16


@functools.lru_cache(maxsize=1024)
def _launch_config(n_elements: int) -> tuple[int, int]:
    # Small inputs shrink the block (to a power of two, at least 128) and keep 16 elements a
    # thread while there is a warp's worth.
    block = min(BLOCK, max(128, next_power_of_2(n_elements)))
    return block, max(1, block // (32 * ELEMENTS_PER_THREAD))


def _flat(t: torch.Tensor) -> torch.Tensor:
    # Element-wise, so any contiguous buffer works; a strided input costs one copy here, which is
    # what a stride-aware kernel would spend on uncoalesced reads anyway.
    return t if t.is_contiguous() else t.contiguous()


def activation_forward(x: torch.Tensor, act: int) -> torch.Tensor:
    """The element-wise activation ``act`` (``SILU``, ``GELU``, ``GELU_TANH``, ``FAST_GELU``,
    ``QUICK_GELU``) of ``x``, without autograd: the launcher for callers below autograd (an
    operator override), where `silu` and the others would record a second backward."""
    check_dtype("activation", x)
    x = _flat(x)
    # empty_like: contiguous, as x is, and the cheapest allocation call (torch.empty with dtype
    # and device keywords parses more arguments on the host).
    y = torch.empty_like(x)
    n_elements = x.numel()
    if n_elements == 0:
        return y
    block, num_warps = _launch_config(n_elements)
    grid = (cdiv(n_elements, block),)
    # The kernel's arguments, each named as its parameter (``_library``'s "by name").
    launch(_activation_fwd_kernel, grid, (x, y, n_elements, act, block), num_warps, x.device)
    return y


def activation_backward(dy: torch.Tensor, x: torch.Tensor, act: int) -> torch.Tensor:
    """The gradient of `activation_forward` with respect to ``x``, given ``dy`` of ``x``'s shape,
    without autograd."""
    x = _flat(x)
    dy = _flat(dy)
    dx = torch.empty_like(x)
    n_elements = x.numel()
    if n_elements == 0:
        return dx
    block, num_warps = _launch_config(n_elements)
    grid = (cdiv(n_elements, block),)
    launch(_activation_bwd_kernel, grid, (dy, x, dx, n_elements, act, block), num_warps, x.device)
    return dx


# --------------------------------------------------------------------------------------------
# Autograd: eager path
# --------------------------------------------------------------------------------------------


class _ActivationFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, act):
        ctx.save_for_backward(x)
        ctx.act = act
        return activation_forward(x, act)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return activation_backward(dy, x, ctx.act), None


# --------------------------------------------------------------------------------------------
# Autograd: torch.library ops (graph nodes, opcheck'd)
# --------------------------------------------------------------------------------------------


@torch.library.custom_op(op_name("activation"), mutates_args=())
def activation_op(x: torch.Tensor, act: int) -> torch.Tensor:
    return activation_forward(x, act)


@activation_op.register_fake
def _(x, act):
    return x.new_empty(x.shape)


@torch.library.custom_op(op_name("activation_backward"), mutates_args=())
def activation_backward_op(dy: torch.Tensor, x: torch.Tensor, act: int) -> torch.Tensor:
    return activation_backward(dy, x, act)


@activation_backward_op.register_fake
def _(dy, x, act):
    return x.new_empty(x.shape)


def _setup_context(ctx, inputs, output):
    x, act = inputs
    ctx.save_for_backward(x)
    ctx.act = act


def _backward(ctx, dy):
    (x,) = ctx.saved_tensors
    return activation_backward_op(dy, x, ctx.act), None


activation_op.register_autograd(_backward, setup_context=_setup_context)


# --------------------------------------------------------------------------------------------
# Public functions
# --------------------------------------------------------------------------------------------


def _torch_activation(x: torch.Tensor, act: int) -> torch.Tensor:
    """The kernel's formula in PyTorch ops, for inductor to fuse (computed in fp32, as the
    kernel does, and rounded once)."""
    check_dtype("activation", x)
    return torch_activation(x.float(), act).to(x.dtype)


def _apply(x: torch.Tensor, act: int) -> torch.Tensor:
    # Under torch.compile the rule (_compile_rule.py) picks the op or the formula; an
    # element-wise activation is left to inductor as PyTorch ops by default: it fuses them into
    # the neighbouring ops (the multiply of a gated MLP, a bias add), which no standalone kernel
    # can match, as each costs a round trip of the tensor through memory. Eagerly, the op's
    # dispatcher round trip costs more than the kernel at small sizes, so a plain
    # autograd.Function (or the bare launcher, when no backward is needed) runs it.
    if torch.compiler.is_compiling():
        if compile_side("activation", *sizes(x), use_autograd_function(x)) == OP:
            return activation_op(x, act)
        return _torch_activation(x, act)
    if use_autograd_function(x):
        return _ActivationFunction.apply(x, act)
    return activation_forward(x, act)


def silu(x: torch.Tensor) -> torch.Tensor:
    """``F.silu(x)``: ``x * sigmoid(x)``."""
    return _apply(x, SILU)


def gelu(x: torch.Tensor) -> torch.Tensor:
    """``F.gelu(x)`` (exact, with erf)."""
    return _apply(x, GELU)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """``F.gelu(x, approximate="tanh")``; also transformers' ``NewGELUActivation``."""
    return _apply(x, GELU_TANH)


def new_gelu(x: torch.Tensor) -> torch.Tensor:
    """transformers' ``NewGELUActivation``: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""
    return _apply(x, GELU_TANH)


def fast_gelu(x: torch.Tensor) -> torch.Tensor:
    """transformers' ``FastGELUActivation``: ``0.5 x (1 + tanh(0.7978845608 x (1 + 0.044715 x^2)))``."""
    return _apply(x, FAST_GELU)


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """transformers' ``QuickGELUActivation``: ``x * sigmoid(1.702 x)``."""
    return _apply(x, QUICK_GELU)
