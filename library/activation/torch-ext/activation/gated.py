"""Gated activations: ``act(a) * b`` with ``a`` and ``b`` read from one ``[..., 2d]`` tensor
(vLLM style, ``act(x[..., :d]) * x[..., d:]``) or from two tensors of equal shape (the gate and
up projections of a Llama-style MLP, ``act(gate) * up``).

Read top to bottom: the Triton kernels, the launchers that pick block sizes, then the autograd
wiring (``torch.autograd.Function``s for eager calls, and ``torch.library`` custom ops with fake
implementations and registered autograd, for graphs that hold them as nodes; under
``torch.compile`` the public functions hand inductor the formula in PyTorch ops instead).

Eagerly, both forms run the same two kernels, which take ``a``, ``b`` and the outputs as
separate row pointers with their own row strides; for the ``[..., 2d]`` form (``HALVES``) they
read a and b as the two halves of each row of one tensor, and write da and db likewise.
Forward reads a and b once and writes y; backward reads a, b and dy and writes
``da = dy * b * act'(a)`` and ``db = dy * act(a)``, recomputing ``act(a)`` (nothing but the
inputs is saved). Rows are addressed through their stride, so a row-strided input (a slice of a
wider buffer, such as one half of a fused gate-up projection) is read in place. Under
``torch.compile`` the public functions return the same formula in PyTorch ops (see ``_apply``).
"""

import functools

import torch
import triton
import triton.language as tl

from ._compile_rule import OP, compile_side, sizes
from ._functions import GELU, GELU_TANH, SILU, activation, activation_and_grad, torch_activation
from ._library import (
    as_rows,
    cdiv,
    check_dtype,
    launch,
    next_power_of_2,
    op_name,
    use_autograd_function,
)

# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------


@triton.jit
def _gated_fwd_kernel(
    A,
    B,
    Y,
    n_rows,
    d,
    stride_a,
    stride_b,
    stride_y,
    col_blocks,
    ACT: tl.constexpr,
    HALVES: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # With HALVES, b is the second half of each row of A (B is A): passing the halves as two
    # sliced views instead costs two view ops a call on the host, more than the launch itself
    # at small sizes. Program p covers rows [i*ROWS, (i+1)*ROWS) and output columns
    # [j*BLOCK_D, ...) with (i, j) = divmod(p, col_blocks): programs launched together read
    # neighbouring parts of the same rows, which was faster than a grid with rows on its first
    # axis at the widths of common models (benchmarks/results/<device>/NOTES.md).
    pid = tl.program_id(0)
    rows = (pid // col_blocks).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = (pid % col_blocks) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = (rows < n_rows)[:, None] & (cols < d)[None, :]
    if HALVES:
        B += d
    a = tl.load(A + rows[:, None] * stride_a + cols[None, :], mask=mask, other=0.0)
    b = tl.load(B + rows[:, None] * stride_b + cols[None, :], mask=mask, other=0.0)
    y = activation(a.to(tl.float32), ACT) * b.to(tl.float32)
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _gated_bwd_kernel(
    DY,
    A,
    B,
    DA,
    DB,
    Y,
    n_rows,
    d,
    stride_dy,
    stride_a,
    stride_b,
    stride_da,
    stride_db,
    stride_y,
    col_blocks,
    ACT: tl.constexpr,
    STORE_Y: tl.constexpr,
    HALVES: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # With STORE_Y it also writes the forward's output act(a) * b, computed as the forward
    # kernel computes it (the same bits), for a caller that did not keep it (``mlp.py``). With
    # HALVES, a and b are the halves of A's rows and da and db those of DA's (as in forward).
    pid = tl.program_id(0)
    rows = (pid // col_blocks).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = (pid % col_blocks) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = (rows < n_rows)[:, None] & (cols < d)[None, :]
    if HALVES:
        B += d
        DB += d
    a = tl.load(A + rows[:, None] * stride_a + cols[None, :], mask=mask, other=0.0)
    b = tl.load(B + rows[:, None] * stride_b + cols[None, :], mask=mask, other=0.0)
    dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0)
    dy = dy.to(tl.float32)
    act_a, dact_a = activation_and_grad(a.to(tl.float32), ACT)
    da = dy * b.to(tl.float32) * dact_a
    tl.store(DA + rows[:, None] * stride_da + cols[None, :], da.to(DA.dtype.element_ty), mask=mask)
    db = dy * act_a
    tl.store(DB + rows[:, None] * stride_db + cols[None, :], db.to(DB.dtype.element_ty), mask=mask)
    if STORE_Y:
        y = act_a * b.to(tl.float32)
        tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------


# Each program handles 2048 output elements (4096 loaded input elements in forward). SiLU runs
# them with 8 warps, 8 output elements a thread (one 16-byte bf16 vector per tensor), as
# inductor's kernels do: that is level with torch.compile's, where 4 warps (16 a thread) were
# behind at every shape swept, forward and backward (benchmarks/results/h200/NOTES.md).
# The GELUs keep 4 warps: their arithmetic is heavier, and for the element-wise tanh GELU 16
# elements a thread beat 8 (``elementwise.py``). Narrow rows (d < 2048) are packed several to a
# program so that programs stay that size.
@functools.lru_cache(maxsize=1024)
def _launch_config(n_rows: int, d: int, act: int) -> tuple[int, int, int]:
    block_d = min(2048, next_power_of_2(d))
    rows = max(1, min(2048 // block_d, next_power_of_2(n_rows)))
    if act == SILU:
        return rows, block_d, max(1, min(8, rows * block_d // 256))
    return rows, block_d, 4


def _grid(n_rows: int, d: int, act: int) -> tuple[tuple[int], int, int, int, int]:
    """(grid, col_blocks, ROWS, BLOCK_D, num_warps) for an ``n_rows`` x ``d`` output of ``act``."""
    rows, block_d, num_warps = _launch_config(n_rows, d, act)
    col_blocks = cdiv(d, block_d)
    return (cdiv(n_rows, rows) * col_blocks,), col_blocks, rows, block_d, num_warps


def _forward_rows(a, stride_a, b, stride_b, y, stride_y, n_rows, d, act, halves=False) -> None:
    """``y = act(a) * b`` over ``n_rows`` rows of ``d`` (row strides given; the last dimension
    contiguous); with ``halves``, ``b`` is ``a``'s rows' second half (``b`` is ``a``)."""
    grid, col_blocks, rows, block_d, num_warps = _grid(n_rows, d, act)
    args = (
        a, b, y, n_rows, d, stride_a, stride_b, stride_y, col_blocks, act, halves, rows, block_d,
    )  # fmt: skip
    launch(_gated_fwd_kernel, grid, args, num_warps, y.device)


def _backward_rows(dy, a, b, da, db, strides, n_rows, d, act, halves=False, y=None) -> None:
    """``da = dy * b * act'(a)``, ``db = dy * act(a)`` as in `_forward_rows`, with ``strides``
    the row strides of ``(dy, a, b, da, db)``; also ``y = act(a) * b`` (rows of ``d``) when
    ``y`` is given. With ``halves``, ``b`` and ``db`` are the second halves of ``a``'s and
    ``da``'s rows."""
    grid, col_blocks, rows, block_d, num_warps = _grid(n_rows, d, act)
    # The kernel's arguments, each named as its parameter (``_library``'s "by name").
    stride_dy, stride_a, stride_b, stride_da, stride_db = strides
    Y, stride_y = (da, d) if y is None else (y, d)  # da: never written without STORE_Y
    STORE_Y = y is not None
    args = (
        dy, a, b, da, db, Y, n_rows, d, stride_dy, stride_a, stride_b, stride_da, stride_db,
        stride_y, col_blocks, act, STORE_Y, halves, rows, block_d,
    )  # fmt: skip
    launch(_gated_bwd_kernel, grid, args, num_warps, dy.device)


# ---- one [..., 2d] input -------------------------------------------------------------------


def _check(x: torch.Tensor) -> int:
    check_dtype("gated activation", x)
    if x.dim() == 0 or x.shape[-1] % 2 != 0:
        raise ValueError(
            f"gated activation: the last dimension must be even ([..., 2d] -> [..., d]); got shape "
            f"{tuple(x.shape)}"
        )
    return x.shape[-1] // 2


def gated_forward(x: torch.Tensor, act: int) -> torch.Tensor:
    d = _check(x)
    y = x.new_empty((*x.shape[:-1], d))
    if y.numel() == 0:
        return y
    x2, n_rows, stride_x = as_rows(x, 2 * d)
    _forward_rows(x2, stride_x, x2, stride_x, y, d, n_rows, d, act, halves=True)
    return y


def gated_backward(dy: torch.Tensor, x: torch.Tensor, act: int) -> torch.Tensor:
    d = x.shape[-1] // 2
    dx = x.new_empty(x.shape)
    if dx.numel() == 0:
        return dx
    x2, n_rows, stride_x = as_rows(x, 2 * d)
    dy2, _, stride_dy = as_rows(dy, d)
    strides = (stride_dy, stride_x, stride_x, 2 * d, 2 * d)
    _backward_rows(dy2, x2, x2, dx, dx, strides, n_rows, d, act, halves=True)
    return dx


# ---- two inputs of equal shape -------------------------------------------------------------


def _check_pair(gate: torch.Tensor, up: torch.Tensor) -> None:
    check_dtype("gated activation (gate)", gate)
    check_dtype("gated activation (up)", up)
    if gate.dtype != up.dtype:
        raise TypeError(
            f"gated activation: gate and up must have one dtype; got {gate.dtype} and {up.dtype}"
        )
    if gate.shape != up.shape:
        raise ValueError(
            f"gated activation: gate and up must have the same shape (no broadcasting); got "
            f"{tuple(gate.shape)} and {tuple(up.shape)}"
        )
    if gate.device != up.device:
        raise ValueError(
            f"gated activation: gate and up must be on one device; got {gate.device} and "
            f"{up.device}"
        )


def gated_pair_forward(gate: torch.Tensor, up: torch.Tensor, act: int) -> torch.Tensor:
    _check_pair(gate, up)
    y = gate.new_empty(gate.shape)
    if y.numel() == 0:
        return y
    d = y.shape[-1] if y.dim() else 1
    gate2, n_rows, stride_gate = as_rows(gate, d)
    up2, _, stride_up = as_rows(up, d)
    _forward_rows(gate2, stride_gate, up2, stride_up, y, d, n_rows, d, act)
    return y


def gated_pair_backward(dy, gate, up, act: int, recompute_output: bool = False):
    """``(d_gate, d_up)``, or with ``recompute_output`` ``(d_gate, d_up, act(gate) * up)``:
    the forward's output again, from the same pass over gate and up."""
    d_gate = gate.new_empty(gate.shape)
    d_up = up.new_empty(up.shape)
    y = gate.new_empty(gate.shape) if recompute_output else None
    if d_gate.numel() != 0:
        d = gate.shape[-1] if gate.dim() else 1
        dy2, n_rows, stride_dy = as_rows(dy, d)
        gate2, _, stride_gate = as_rows(gate, d)
        up2, _, stride_up = as_rows(up, d)
        strides = (stride_dy, stride_gate, stride_up, d, d)
        _backward_rows(dy2, gate2, up2, d_gate, d_up, strides, n_rows, d, act, y=y)
    return (d_gate, d_up) if y is None else (d_gate, d_up, y)


# --------------------------------------------------------------------------------------------
# Autograd: eager path
# --------------------------------------------------------------------------------------------


class _GatedFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, act):
        ctx.save_for_backward(x)
        ctx.act = act
        return gated_forward(x, act)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return gated_backward(dy, x, ctx.act), None


class _GatedPairFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up, act):
        ctx.save_for_backward(gate, up)
        ctx.act = act
        return gated_pair_forward(gate, up, act)

    @staticmethod
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        return *gated_pair_backward(dy, gate, up, ctx.act), None


# --------------------------------------------------------------------------------------------
# Autograd: torch.library ops (graph nodes, opcheck'd)
# --------------------------------------------------------------------------------------------


@torch.library.custom_op(op_name("gated_activation"), mutates_args=())
def gated_op(x: torch.Tensor, act: int) -> torch.Tensor:
    return gated_forward(x, act)


@gated_op.register_fake
def _(x, act):
    d = _check(x)
    return x.new_empty((*x.shape[:-1], d))


@torch.library.custom_op(op_name("gated_activation_backward"), mutates_args=())
def gated_backward_op(dy: torch.Tensor, x: torch.Tensor, act: int) -> torch.Tensor:
    return gated_backward(dy, x, act)


@gated_backward_op.register_fake
def _(dy, x, act):
    return x.new_empty(x.shape)


def _setup_context(ctx, inputs, output):
    x, act = inputs
    ctx.save_for_backward(x)
    ctx.act = act


def _backward(ctx, dy):
    (x,) = ctx.saved_tensors
    return gated_backward_op(dy, x, ctx.act), None


gated_op.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op(op_name("gated_pair_activation"), mutates_args=())
def gated_pair_op(gate: torch.Tensor, up: torch.Tensor, act: int) -> torch.Tensor:
    return gated_pair_forward(gate, up, act)


@gated_pair_op.register_fake
def _(gate, up, act):
    _check_pair(gate, up)
    return gate.new_empty(gate.shape)


@torch.library.custom_op(op_name("gated_pair_activation_backward"), mutates_args=())
def gated_pair_backward_op(
    dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, act: int
) -> tuple[torch.Tensor, torch.Tensor]:
    return gated_pair_backward(dy, gate, up, act)


@gated_pair_backward_op.register_fake
def _(dy, gate, up, act):
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


def _setup_pair_context(ctx, inputs, output):
    gate, up, act = inputs
    ctx.save_for_backward(gate, up)
    ctx.act = act


def _pair_backward(ctx, dy):
    gate, up = ctx.saved_tensors
    return *gated_pair_backward_op(dy, gate, up, ctx.act), None


gated_pair_op.register_autograd(_pair_backward, setup_context=_setup_pair_context)


@torch.library.custom_op(op_name("gated_pair_activation_backward_output"), mutates_args=())
def gated_pair_backward_output_op(
    dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, act: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(d_gate, d_up, act(gate) * up)``: `gated_pair_backward_op` that also writes the
    forward's output again (the same bits), for a compiled ``swiglu_mlp`` that did not save it
    (``mlp.py``). It has no backward of its own, as no backward op has."""
    return gated_pair_backward(dy, gate, up, act, recompute_output=True)


@gated_pair_backward_output_op.register_fake
def _(dy, gate, up, act):
    return gate.new_empty(gate.shape), up.new_empty(up.shape), gate.new_empty(gate.shape)


# --------------------------------------------------------------------------------------------
# Public functions
# --------------------------------------------------------------------------------------------


def _torch_gated_pair(gate: torch.Tensor, up: torch.Tensor, act: int) -> torch.Tensor:
    """The kernel's formula in PyTorch ops, for inductor to fuse: fp32, rounded once."""
    _check_pair(gate, up)
    return (torch_activation(gate.float(), act) * up.float()).to(gate.dtype)


def _torch_gated(x: torch.Tensor, act: int) -> torch.Tensor:
    d = _check(x)
    return _torch_gated_pair(x[..., :d], x[..., d:], act)


def _apply(x: torch.Tensor, act: int) -> torch.Tensor:
    # Under torch.compile the rule (_compile_rule.py) picks the op or the formula. The formula
    # lets inductor fuse the activation and multiply into the projections' neighbours, forward
    # and backward, and its partitioner choose what to save, which an opaque op prevents.
    # Eagerly, a plain autograd.Function, or the bare launcher when no backward is needed,
    # skips the op's dispatcher round trip.
    if torch.compiler.is_compiling():
        hidden, tokens = sizes(x)
        if compile_side("gated_activation", hidden // 2, tokens, use_autograd_function(x)) == OP:
            return gated_op(x, act)
        return _torch_gated(x, act)
    if use_autograd_function(x):
        return _GatedFunction.apply(x, act)
    return gated_forward(x, act)


def _apply_pair(gate: torch.Tensor, up: torch.Tensor, act: int) -> torch.Tensor:
    if torch.compiler.is_compiling():
        training = use_autograd_function(gate, up)
        if compile_side("gated_mlp", *sizes(gate), training) == OP:
            return gated_pair_op(gate, up, act)
        return _torch_gated_pair(gate, up, act)
    if use_autograd_function(gate, up):
        return _GatedPairFunction.apply(gate, up, act)
    return gated_pair_forward(gate, up, act)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``F.silu(x[..., :d]) * x[..., d:]`` for ``x`` of shape ``[..., 2d]``."""
    return _apply(x, SILU)


def gelu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``F.gelu(x[..., :d]) * x[..., d:]`` (exact gelu) for ``x`` of shape ``[..., 2d]``."""
    return _apply(x, GELU)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``F.gelu(x[..., :d], approximate="tanh") * x[..., d:]`` for ``x`` of shape ``[..., 2d]``."""
    return _apply(x, GELU_TANH)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``F.silu(gate) * up`` for ``gate`` and ``up`` of one shape and dtype (any strides)."""
    return _apply_pair(gate, up, SILU)


def gelu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``F.gelu(gate) * up`` (exact gelu) for ``gate`` and ``up`` of one shape and dtype."""
    return _apply_pair(gate, up, GELU)


def gelu_tanh_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``F.gelu(gate, approximate="tanh") * up`` for ``gate`` and ``up`` of one shape and dtype."""
    return _apply_pair(gate, up, GELU_TANH)
