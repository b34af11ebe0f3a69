"""LayerNorm over the trailing ``normalized_shape`` dimensions, with or without weight and bias.

``y = (x - mean) * rstd * weight + bias`` computed in fp32 and cast to the input dtype, as
``torch.nn.functional.layer_norm`` does.

Read top to bottom: the Triton kernels, the launchers that pick block sizes (once per shape,
dtype and layout of their arguments: launch plans), then the autograd wiring
(``torch.autograd.Function`` for eager calls; ``torch.library`` custom ops with fake
implementations and registered autograd for ``torch.compile``).

Forward: reads x, writes y and fp32 mean and rstd per row; rows in registers (one pass) or in
chunks (two passes, the second from L2), as swept. Backward: a persistent
grid; each program walks a contiguous run of rows, writes dx and keeps its share of the weight
and bias gradients in fp32 registers; the per-program partials are summed at the end.
"""

import functools
import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ._compile_rule import OP, compile_side, sizes
from ._library import (
    cdiv,
    check_dtype,
    constexprs,
    launch,
    op_name,
    use_autograd_function,
)
from ._partials import sum_partials
from ._tuning import (
    CHUNK,
    FWD_NARROW_ELEMENTS,
    MAX_ONE_PASS,
    WIDE_ROW_WARPS,
    bwd_block,
    persistent_grid,
    previous_power_of_2,
    row_block,
)
from .rms_norm import PlanCache, rows_of

# Forward launch configuration, from interleaved A/Bs of configurations at ~64M elements (CUDA
# graphs; benchmarks/diagnose/norm_forward.py, the outcome in benchmarks/results/h200/NOTES.md):
# - rows up to FWD_NARROW_ELEMENTS as both norms (``_tuning``);
# - wider rows up to 16384 in chunks, two passes: chunks of the largest power of two up to
#   FWD_MAX_CHUNK that divides the row into two or more (at least FWD_MIN_CHUNK); 8 warps up
#   to rows of 8192 elements, 16 past that and for fp32 (at most chunk / 128). Faster than the
#   row in registers at every such width, most where the row is not a power of two;
# - bf16 rows of 4096 only from FWD_CHUNK_MIN_ROWS rows; fewer rows share blocks of
#   FWD_BLOCK_ELEMENTS, at most FWD_MAX_WARPS warps, which is faster there than chunks; so do
#   rows whose width no chunk divides;
# - rows past MAX_ONE_PASS in chunks of ``_tuning``'s CHUNK (chunks of 8192 gained little in
#   bf16 and lost in fp32).
FWD_MAX_WARPS = 8
FWD_BLOCK_ELEMENTS = 8192
FWD_MIN_CHUNK = 1024
FWD_MAX_CHUNK = 4096
FWD_CHUNK_MIN_ROWS = 16384


@functools.cache
def _fwd_block(n_cols: int, itemsize: int, many_rows: bool = True) -> tuple[bool, int, int, int]:
    """(one_pass, block_n or chunk, rows, num_warps) for the forward of rows of ``n_cols``
    elements of ``itemsize`` bytes, as swept; ``many_rows``: at least FWD_CHUNK_MIN_ROWS rows."""
    if n_cols <= FWD_NARROW_ELEMENTS:
        return row_block(n_cols, FWD_NARROW_ELEMENTS)
    if n_cols > MAX_ONE_PASS:
        return row_block(n_cols)
    chunk = min(FWD_MAX_CHUNK, previous_power_of_2(n_cols // 2))
    while n_cols % chunk:
        chunk //= 2
    if chunk >= FWD_MIN_CHUNK and (many_rows or n_cols > 4096 or itemsize == 4):
        warps = 8 if n_cols <= 8192 and itemsize < 4 else 16
        return False, chunk, 1, min(warps, chunk // 128)  # 4 elements a thread or more
    elements = FWD_BLOCK_ELEMENTS if n_cols <= 4096 else n_cols
    one_pass, block_n, rows, num_warps = row_block(n_cols, elements)
    return one_pass, block_n, rows, min(FWD_MAX_WARPS, num_warps)


# The backward's look-ahead holds a step's rows twice over, beside the weight and both gradient
# accumulators; ``_tuning``'s steps are sized for bf16. fp32 rows of 4096 go one to a step
# (16 KB), and wider fp32 rows, which do not fit a thread's registers twice, load the next row
# after their step instead, with FP32_NO_LOOKAHEAD_WARPS warps: against the bf16 configuration
# that brings the wide fp32 backward level with Liger's, where it lagged by a third. Narrower
# fp32 rows were not swept and keep the bf16 configuration.
FP32_NO_LOOKAHEAD_WARPS = 16


def _bwd_config(n_cols: int, itemsize: int) -> tuple[bool, int, int, int, int, bool]:
    """(one_pass, block_n, rows, num_warps, programs_per_sm, lookahead) for the backward:
    ``_tuning.bwd_block``, with fp32 rows of 4096 and wider as swept."""
    one_pass, block_n, rows, num_warps, per_sm = bwd_block(n_cols)
    if one_pass and itemsize == 4 and block_n > 4096:
        return one_pass, block_n, 1, FP32_NO_LOOKAHEAD_WARPS, per_sm, False
    if one_pass and itemsize == 4 and block_n == 4096:
        return one_pass, block_n, 1, num_warps, per_sm, True
    return one_pass, block_n, rows, num_warps, per_sm, True


# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------


FWD_UNROLL_CHUNKS = tl.constexpr(8)


@triton.jit
def _normalize_chunk(X_ROW, W, B, Y_ROW, c, n_cols, mean, rstd, HAS_WEIGHT: tl.constexpr,
                     HAS_BIAS: tl.constexpr):  # fmt: skip
    # One chunk (columns c) of the chunked forward's normalising pass: x from L2, where the
    # first pass left it (and lets it go now: evict_first), y to memory.
    mask = c < n_cols
    x = tl.load(X_ROW + c, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    y = (x - mean) * rstd
    if HAS_WEIGHT:
        y = y * tl.load(W + c, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    if HAS_BIAS:
        y = y + tl.load(B + c, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    tl.store(Y_ROW + c, y.to(Y_ROW.dtype.element_ty), mask=mask)


@triton.jit
def _layer_norm_fwd_kernel(
    X,
    W,
    B,
    Y,
    MEAN,
    RSTD,
    n_rows,
    n_cols,
    stride_x,
    eps,
    HAS_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ONE_PASS: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CHUNKED_COLS: tl.constexpr,
    STORE_STATS: tl.constexpr,
):
    # Y is contiguous (row stride n_cols); X rows are strided. CHUNKED_COLS is n_cols when not
    # ONE_PASS (else 0): the chunked loops then have a static trip count. STORE_STATS: mean and
    # rstd are kept for a backward (else MEAN and RSTD are placeholders, never written).
    if ONE_PASS:
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_N)
        row_mask = rows < n_rows
        col_mask = cols < n_cols
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
        x = x.to(tl.float32)
        mean = tl.sum(x, axis=1) / n_cols
        # Centre before squaring (two-pass variance, from registers): no cancellation when the
        # mean is large next to the spread.
        xc = tl.where(mask, x - mean[:, None], 0.0)
        rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / n_cols + eps)
        if STORE_STATS:
            tl.store(MEAN + rows, mean, mask=row_mask)
            tl.store(RSTD + rows, rstd, mask=row_mask)
        y = xc * rstd[:, None]
        if HAS_WEIGHT:
            y = y * tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
        if HAS_BIAS:
            y = y + tl.load(B + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(Y + rows[:, None] * n_cols + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    else:
        # Rows read in chunks: two passes, as RMSNorm's chunked forward. The first keeps, for
        # each position in the chunk, the mean and the sum of squared deviations of the row's
        # elements there (Welford's update, chunk by chunk; a last, partial chunk updates only
        # the positions it covers). The row's mean is the count-weighted mean of those means,
        # its sum of squared deviations theirs plus each position's count times its mean's
        # squared distance from the row's: the centred two-pass formula over positions, so no
        # cancellation however far the mean is from zero, and one reduction after the mean's.
        # The first pass keeps its reads in L2 (evict_last) for the normalising pass, which
        # lets them go (evict_first).
        WHOLE: tl.constexpr = CHUNKED_COLS // BLOCK_N  # at least 1: rows of a chunk or more
        TAIL: tl.constexpr = CHUNKED_COLS - WHOLE * BLOCK_N
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK_N)
        x_row = X + row * stride_x
        lane_mean = tl.load(x_row + cols, eviction_policy="evict_last").to(tl.float32)
        lane_m2 = tl.zeros([BLOCK_N], dtype=tl.float32)
        for chunk in range(1, WHOLE):
            # x is fp32 wherever it is assigned: a loop may not change a variable's type.
            x = tl.load(x_row + chunk * BLOCK_N + cols, eviction_policy="evict_last")
            x = x.to(tl.float32)
            delta = x - lane_mean
            lane_mean += delta / (chunk + 1.0)
            lane_m2 += delta * (x - lane_mean)
        in_tail = cols < TAIL
        if TAIL > 0:
            x = tl.load(
                x_row + WHOLE * BLOCK_N + cols,
                mask=in_tail,
                other=0.0,
                eviction_policy="evict_last",
            )
            x = x.to(tl.float32)
            delta = tl.where(in_tail, x - lane_mean, 0.0)
            lane_mean += delta / (WHOLE + 1.0)
            lane_m2 += delta * (x - lane_mean)
        lane_count = WHOLE + in_tail.to(tl.float32)
        mean = tl.sum(lane_mean * lane_count, axis=0) / CHUNKED_COLS
        spread = lane_mean - mean
        m2 = tl.sum(lane_m2 + lane_count * spread * spread, axis=0)
        rstd = tl.rsqrt(m2 / CHUNKED_COLS + eps)
        if STORE_STATS:
            tl.store(MEAN + row, mean)
            tl.store(RSTD + row, rstd)
        # The normalising pass unrolled (static trip count, up to FWD_UNROLL_CHUNKS chunks), so
        # that every chunk's loads are issued before the first chunk's arithmetic waits on them
        # (a small gain, largest where the rows are fewest).
        y_row = Y + row * CHUNKED_COLS
        if (CHUNKED_COLS + BLOCK_N - 1) // BLOCK_N <= FWD_UNROLL_CHUNKS:
            for start in tl.static_range(0, CHUNKED_COLS, BLOCK_N):
                _normalize_chunk(x_row, W, B, y_row, start + cols, CHUNKED_COLS, mean, rstd,
                                 HAS_WEIGHT, HAS_BIAS)  # fmt: skip
        else:
            for start in range(0, CHUNKED_COLS, BLOCK_N):
                _normalize_chunk(x_row, W, B, y_row, start + cols, CHUNKED_COLS, mean, rstd,
                                 HAS_WEIGHT, HAS_BIAS)  # fmt: skip


@triton.jit
def _layer_norm_row_dot_kernel(
    DY, X, W, MEAN, RSTD, C, n_rows, n_cols, stride_dy, stride_x,
    HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # Rows too wide for one program's registers: c1 = mean(g * xhat) and c2 = mean(g) of each
    # row (C[0] and C[1]), which the column-split backward needs before any block of the row.
    # One program a row, in chunks.
    row = tl.program_id(0).to(tl.int64)
    mean = tl.load(MEAN + row)
    rstd = tl.load(RSTD + row)
    acc1 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_WEIGHT:
            g = g * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        acc1 += g * tl.where(mask, (x - mean) * rstd, 0.0)
        acc2 += g
    tl.store(C + row, tl.sum(acc1, axis=0) / n_cols)
    tl.store(C + n_rows + row, tl.sum(acc2, axis=0) / n_cols)


@triton.jit
def _layer_norm_bwd_loads(DY, X, MEAN, RSTD, C, rows, row_end, n_rows, cols, col_mask, stride_dy,
                          stride_x, SPLIT_COLS: tl.constexpr):  # fmt: skip
    # One backward step's inputs, x and dy in their stored dtypes: x, dy, mean, rstd and the
    # two row means (SPLIT_COLS; else rstd as placeholders). Rows past row_end are masked off:
    # no memory is read for them.
    row_mask = rows < row_end
    mask = row_mask[:, None] & col_mask[None, :]
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0)
    mean = tl.load(MEAN + rows, mask=row_mask, other=0.0)
    rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
    c1 = rstd
    c2 = rstd
    if SPLIT_COLS:
        c1 = tl.load(C + rows, mask=row_mask, other=0.0)
        c2 = tl.load(C + n_rows + rows, mask=row_mask, other=0.0)
    return x, dy, mean, rstd, c1, c2


@triton.jit
def _layer_norm_bwd_kernel(
    DY,
    X,
    W,
    MEAN,
    RSTD,
    C,
    DX,
    PARTIAL,
    n_rows,
    n_cols,
    rows_per_program,
    stride_dy,
    stride_x,
    HAS_WEIGHT: tl.constexpr,
    COMPUTE_DW: tl.constexpr,
    COMPUTE_DB: tl.constexpr,
    SPLIT_COLS: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    LOOKAHEAD: tl.constexpr,
):
    # dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w; dw = sum dy * xhat and
    # db = sum dy over rows, each program's share stored in its row of PARTIAL: dw's (when
    # COMPUTE_DW), then db's (when COMPUTE_DB). A program walks a contiguous run of rows, ROWS at a time, over one
    # block of columns: the whole row, or with SPLIT_COLS (rows too wide for registers) block
    # program_id(1) of BLOCK_N columns, the two means then coming from C (the row dot kernel).
    # With LOOKAHEAD each step loads the next step's rows before it reduces its own, so the
    # program keeps loads in flight while it reduces (a large share of the backward's time at
    # 4096 and 8192 wide); without, after it is done with its own (``_bwd_config``).
    pid = tl.program_id(0)
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    if HAS_WEIGHT:
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    rows = row_start + tl.arange(0, ROWS)
    x, dy, mean, rstd, c1, c2 = _layer_norm_bwd_loads(
        DY, X, MEAN, RSTD, C, rows, row_end, n_rows, cols, col_mask, stride_dy, stride_x,
        SPLIT_COLS,
    )  # fmt: skip
    for first in range(row_start, row_end, ROWS):
        rows = first + tl.arange(0, ROWS)
        next_rows = rows + ROWS
        if LOOKAHEAD:
            next_x, next_dy, next_mean, next_rstd, next_c1, next_c2 = _layer_norm_bwd_loads(
                DY, X, MEAN, RSTD, C, next_rows, row_end, n_rows, cols, col_mask, stride_dy,
                stride_x, SPLIT_COLS,
            )  # fmt: skip
        mask = (rows < row_end)[:, None] & col_mask[None, :]
        x = x.to(tl.float32)
        dy = dy.to(tl.float32)
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        g = dy
        if HAS_WEIGHT:
            g = dy * w[None, :]
        if not SPLIT_COLS:
            c1 = tl.sum(g * xhat, axis=1) / n_cols
            c2 = tl.sum(g, axis=1) / n_cols
        dx = (g - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
        tl.store(DX + rows[:, None] * n_cols + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        if COMPUTE_DW:
            dw_acc += tl.sum(dy * xhat, axis=0)
        if COMPUTE_DB:
            db_acc += tl.sum(dy, axis=0)
        if LOOKAHEAD:
            x, dy, mean, rstd = next_x, next_dy, next_mean, next_rstd
            c1, c2 = next_c1, next_c2
        else:
            x, dy, mean, rstd, c1, c2 = _layer_norm_bwd_loads(
                DY, X, MEAN, RSTD, C, next_rows, row_end, n_rows, cols, col_mask, stride_dy,
                stride_x, SPLIT_COLS,
            )  # fmt: skip
    partial = PARTIAL + pid.to(tl.int64) * ((COMPUTE_DW + COMPUTE_DB) * n_cols) + cols
    if COMPUTE_DW:
        tl.store(partial, dw_acc, mask=col_mask)
    if COMPUTE_DB:
        tl.store(partial + COMPUTE_DW * n_cols, db_acc, mask=col_mask)


# --------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------


def _n_cols(x: torch.Tensor, normalized_shape) -> int:
    shape = tuple(normalized_shape)
    if len(shape) == 0 or tuple(x.shape[-len(shape) :]) != shape or x.dim() < len(shape):
        raise ValueError(
            f"layer_norm: normalized_shape {shape} does not match the trailing dimensions of the "
            f"input, shape {tuple(x.shape)}"
        )
    return math.prod(shape)


def _check(x, normalized_shape, weight, bias) -> int:
    check_dtype("layer_norm", x)
    n_cols = _n_cols(x, normalized_shape)
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            check_dtype(f"layer_norm {name}", t)
            if t.numel() != n_cols:
                raise ValueError(
                    f"layer_norm: {name} of shape {tuple(t.shape)} does not match normalized_shape "
                    f"{tuple(normalized_shape)}"
                )
    return n_cols


def _flat(param: torch.Tensor) -> torch.Tensor:
    """A weight or bias as the contiguous vector the kernels read (a normalized_shape of several
    dimensions gives parameters of several; reshaping a vector would only cost a view op)."""
    return param.contiguous() if param.dim() == 1 else param.reshape(-1).contiguous()


def _is_flat(param: torch.Tensor) -> bool:
    """Whether ``_flat(param)`` is ``param`` itself (a contiguous vector)."""
    return param.dim() == 1 and param.is_contiguous()


def _stats_shape(x: torch.Tensor, normalized_shape) -> tuple[int, ...]:
    return tuple(x.shape[: x.dim() - len(tuple(normalized_shape))])


# The launchers work from plans, as RMSNorm's do (``rms_norm``: ``PlanCache`` and the notes
# above it): the first call with a key (shapes, dtypes, contiguity, the parameters present, the
# device) runs every check and rule and keeps what they derive; later ones only allocate and
# launch.


class _FwdPlan(NamedTuple):
    """A forward's plan (``_fwd_plan``): all but the tensors and eps. Shapes are plain tuples,
    which ``new_empty`` parses faster than a ``torch.Size``."""

    shape: tuple  # y's: x's
    stats_shape: tuple  # mean's and rstd's: x's without the normalised dimensions
    grid: tuple | None = None  # None: no elements, nothing to launch
    n_rows: int = 0
    n_cols: int = 0
    num_warps: int = 0
    constexprs: tuple = ()  # the kernel's constexpr arguments, in order
    x_rows: bool = True  # x is contiguous: its rows are read in place (``rows_of``)
    w_ready: bool = True  # the weight is a contiguous vector, or there is none (``_is_flat``)
    b_ready: bool = True  # likewise the bias


_FWD_PLANS = PlanCache()  # _FwdPlan by key


def _fwd_plan(x, normalized_shape, weight, bias, keep_stats: bool) -> _FwdPlan:
    """The plan of a forward of these arguments: kept, or made (``_make_fwd_plan``)."""
    try:
        key = (
            x.shape, x.dtype, x.is_contiguous(), tuple(normalized_shape),
            None if weight is None else (weight.shape, weight.dtype, weight.is_contiguous()),
            None if bias is None else (bias.shape, bias.dtype, bias.is_contiguous()),
            keep_stats,
        )  # fmt: skip
    except (AttributeError, TypeError):  # an argument of the wrong kind: the checks say which
        return _make_fwd_plan(x, normalized_shape, weight, bias, keep_stats)
    plan = _FWD_PLANS.get(key)
    if plan is None:
        plan = _FWD_PLANS.add(key, _make_fwd_plan(x, normalized_shape, weight, bias, keep_stats))
    return plan


def _make_fwd_plan(x, normalized_shape, weight, bias, keep_stats: bool) -> _FwdPlan:
    """A forward's checks and launch configuration (a plan cache miss); raises for bad arguments."""
    n_cols = _check(x, normalized_shape, weight, bias)
    outputs = (tuple(x.shape), _stats_shape(x, normalized_shape))
    if x.numel() == 0:
        return _FwdPlan(*outputs)
    n_rows = x.numel() // n_cols
    many_rows = n_rows >= FWD_CHUNK_MIN_ROWS
    one_pass, block_n, rows, num_warps = _fwd_block(n_cols, x.element_size(), many_rows)
    return _FwdPlan(
        *outputs,
        grid=(cdiv(n_rows, rows),) if one_pass else (n_rows,),
        n_rows=n_rows,
        n_cols=n_cols,
        num_warps=num_warps,
        constexprs=constexprs(
            _layer_norm_fwd_kernel,
            HAS_WEIGHT=weight is not None,
            HAS_BIAS=bias is not None,
            ONE_PASS=one_pass,
            ROWS=rows,
            BLOCK_N=block_n,
            CHUNKED_COLS=0 if one_pass else n_cols,
            STORE_STATS=keep_stats,
        ),
        x_rows=x.is_contiguous(),
        w_ready=weight is None or _is_flat(weight),
        b_ready=bias is None or _is_flat(bias),
    )


def layer_norm_forward(x, normalized_shape, weight, bias, eps, keep_stats: bool = True):
    """LayerNorm's forward launcher, without autograd: ``(y, mean, rstd)``.

    Part of the repository's public surface for callers that run below autograd (an operator
    override, whose backward the dispatcher records), where `layer_norm` would record a second
    backward. mean and rstd are fp32, shaped as x's leading dimensions, or None unless
    ``keep_stats`` (for a backward): two allocations less, a third of an inference call's
    host time."""
    plan = _fwd_plan(x, normalized_shape, weight, bias, keep_stats)
    y = x.new_empty(plan.shape)
    mean = rstd = None
    if keep_stats:
        mean = x.new_empty(plan.stats_shape, dtype=torch.float32)
        rstd = x.new_empty(plan.stats_shape, dtype=torch.float32)
    if plan.grid is None:
        return y, mean, rstd
    # The kernel's arguments, each named as its parameter (``_library``'s "by name").
    n_rows, n_cols = plan.n_rows, plan.n_cols
    X, stride_x = rows_of(x, n_cols, plan.x_rows)
    # Placeholders are never read: HAS_WEIGHT / HAS_BIAS are False.
    w = X if weight is None else (weight if plan.w_ready else _flat(weight))
    b = X if bias is None else (bias if plan.b_ready else _flat(bias))
    # y: a placeholder, never written without STORE_STATS
    MEAN, RSTD = (y, y) if mean is None else (mean, rstd)
    args = (X, w, b, y, MEAN, RSTD, n_rows, n_cols, stride_x, eps) + plan.constexprs
    launch(_layer_norm_fwd_kernel, plan.grid, args, plan.num_warps, x.device)
    return y, mean, rstd


class _BwdPlan(NamedTuple):
    """A backward's plan (``_bwd_plan``): all but the tensors and the parameter gradients'
    reduction."""

    shape: tuple  # dx's: x's
    grid: tuple | None = None  # (programs, column blocks); None: no elements, nothing to launch
    n_rows: int = 0
    n_cols: int = 0
    rows_per_program: int = 0
    num_warps: int = 0
    constexprs: tuple = ()  # the backward kernel's constexpr arguments, in order
    row_dot: bool = False  # rows too wide for registers: the row dot kernel runs first
    partials_shape: tuple = ()  # the parameter gradients' fp32 partials: a row a program
    x_rows: bool = True  # x is contiguous: its rows are read in place (``rows_of``)
    dy_rows: bool = True  # so is dy
    w_ready: bool = True  # the weight is a contiguous vector, or there is none (``_is_flat``)


_BWD_PLANS = PlanCache()  # _BwdPlan by key


def _bwd_plan(dy, x, normalized_shape, weight, compute_dw, compute_db, device) -> _BwdPlan:
    """The plan of a backward of these arguments: kept, or made (``_make_bwd_plan``)."""
    key = (x.shape, x.dtype, x.is_contiguous(), dy.is_contiguous(), tuple(normalized_shape),
           None if weight is None else _is_flat(weight), compute_dw, compute_db, device)  # fmt: skip
    plan = _BWD_PLANS.get(key)
    if plan is None:
        plan = _make_bwd_plan(dy, x, normalized_shape, weight, compute_dw, compute_db, device)
        _BWD_PLANS.add(key, plan)
    return plan


def _make_bwd_plan(dy, x, normalized_shape, weight, compute_dw, compute_db, device) -> _BwdPlan:
    """A backward's launch configuration (a plan cache miss)."""
    n_cols = math.prod(tuple(normalized_shape))
    shape = tuple(x.shape)
    if x.numel() == 0:
        return _BwdPlan(shape)
    n_rows = x.numel() // n_cols
    one_pass, block_n, rows, num_warps, per_sm, lookahead = _bwd_config(n_cols, x.element_size())
    col_blocks = 1 if one_pass else cdiv(n_cols, block_n)
    programs, rows_per_program = persistent_grid(n_rows, rows, device, per_sm, col_blocks)
    parts = compute_dw + compute_db  # gradients wanted: rows of partials a program
    return _BwdPlan(
        shape,
        grid=(programs, col_blocks),
        n_rows=n_rows,
        n_cols=n_cols,
        rows_per_program=rows_per_program,
        num_warps=num_warps,
        constexprs=constexprs(
            _layer_norm_bwd_kernel,
            HAS_WEIGHT=weight is not None,
            COMPUTE_DW=compute_dw,
            COMPUTE_DB=compute_db,
            SPLIT_COLS=not one_pass,
            ROWS=rows,
            BLOCK_N=block_n,
            LOOKAHEAD=lookahead,
        ),
        row_dot=not one_pass,
        partials_shape=(programs, parts * n_cols),
        x_rows=x.is_contiguous(),
        dy_rows=dy.is_contiguous(),
        w_ready=weight is None or _is_flat(weight),
    )


def layer_norm_backward(
    dy, x, normalized_shape, weight, mean, rstd, compute_dw, compute_db, db_dtype, views=False
):
    """LayerNorm's backward launcher, without autograd: ``(dx, dw, db)``, from the mean and rstd
    that `layer_norm_forward` returned.

    dw/db are empty tensors when not asked for (``compute_dw``, ``compute_db``); db is of
    ``db_dtype``. ``views``: dw and db may be views of one tensor (one launch less: the eager
    path; a custom op's outputs must not alias)."""
    device = x.device
    plan = _bwd_plan(dy, x, normalized_shape, weight, compute_dw, compute_db, device)
    dx = x.new_empty(plan.shape)
    param = weight if weight is not None else x  # dtype/device template when there is no weight
    if plan.grid is None:
        dw = torch.zeros_like(weight) if compute_dw else param.new_empty((0,))
        db = (
            x.new_zeros(tuple(normalized_shape), dtype=db_dtype)
            if compute_db
            else param.new_empty((0,))
        )
        return dx, dw, db
    # The kernels' arguments, each named as its parameter (``_library``'s "by name").
    n_rows, n_cols, rows_per_program = plan.n_rows, plan.n_cols, plan.rows_per_program
    X, stride_x = rows_of(x, n_cols, plan.x_rows)
    DY, stride_dy = rows_of(dy, n_cols, plan.dy_rows)
    # X where there is no weight: a placeholder, never read (HAS_WEIGHT is False)
    w = X if weight is None else (weight if plan.w_ready else _flat(weight))
    c = rstd  # a placeholder for C, never read in one pass
    if plan.row_dot:
        c = rstd.new_empty((2, n_rows))
        HAS_WEIGHT, BLOCK_N = weight is not None, CHUNK
        args = (DY, X, w, mean, rstd, c, n_rows, n_cols, stride_dy, stride_x, HAS_WEIGHT,
                BLOCK_N)  # fmt: skip
        launch(_layer_norm_row_dot_kernel, (n_rows,), args, WIDE_ROW_WARPS, device)
    # One fp32 buffer for the partial sums, a row a program: the weight's, then the bias's. Both
    # are summed in one launch where their dtypes agree: each launch and allocation is host time.
    parts = compute_dw + compute_db
    partial = rstd  # a placeholder, never touched when no parameter gradient is wanted
    if parts:
        partial = x.new_empty(plan.partials_shape, dtype=torch.float32)
    args = (
        DY, X, w, mean, rstd, c, dx, partial, n_rows, n_cols, rows_per_program, stride_dy,
        stride_x,
    ) + plan.constexprs  # fmt: skip
    launch(_layer_norm_bwd_kernel, plan.grid, args, plan.num_warps, device)
    if parts == 2 and views and weight.dtype == db_dtype:
        dw, db = sum_partials(partial, db_dtype).split(n_cols)
    elif parts == 2:
        dw, db = partial.split(n_cols, dim=1)
        dw, db = sum_partials(dw, weight.dtype), sum_partials(db, db_dtype)
    else:  # placeholders for the gradients not asked for: the custom op returns tensors
        dw = sum_partials(partial, weight.dtype) if compute_dw else param.new_empty((0,))
        db = sum_partials(partial, db_dtype) if compute_db else param.new_empty((0,))
    if compute_dw and weight.dim() != 1:
        dw = dw.view(weight.shape)
    if compute_db and len(normalized_shape) != 1:
        db = db.view(tuple(normalized_shape))
    return dx, dw, db


# --------------------------------------------------------------------------------------------
# Autograd: eager path
# --------------------------------------------------------------------------------------------


class _LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, normalized_shape, weight, bias, eps):
        y, mean, rstd = layer_norm_forward(x, normalized_shape, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.normalized_shape = normalized_shape
        ctx.bias_dtype = x.dtype if bias is None else bias.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        compute_dw = ctx.needs_input_grad[2]
        compute_db = ctx.needs_input_grad[3]
        dx, dw, db = layer_norm_backward(
            dy, x, ctx.normalized_shape, weight, mean, rstd, compute_dw, compute_db,
            ctx.bias_dtype, views=True,
        )  # fmt: skip
        return dx, None, dw if compute_dw else None, db if compute_db else None, None


# --------------------------------------------------------------------------------------------
# Autograd: torch.library ops (what torch.compile sees)
# --------------------------------------------------------------------------------------------


@torch.library.custom_op(op_name("layer_norm"), mutates_args=())
def layer_norm_op(
    x: torch.Tensor,
    normalized_shape: list[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return layer_norm_forward(x, normalized_shape, weight, bias, eps)


@layer_norm_op.register_fake
def _(x, normalized_shape, weight, bias, eps):
    _check(x, normalized_shape, weight, bias)
    stats = _stats_shape(x, normalized_shape)
    return (
        x.new_empty(x.shape),
        x.new_empty(stats, dtype=torch.float32),
        x.new_empty(stats, dtype=torch.float32),
    )


@torch.library.custom_op(op_name("layer_norm_backward"), mutates_args=())
def layer_norm_backward_op(
    dy: torch.Tensor,
    x: torch.Tensor,
    normalized_shape: list[int],
    weight: torch.Tensor | None,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    compute_dw: bool,
    compute_db: bool,
    db_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return layer_norm_backward(
        dy, x, normalized_shape, weight, mean, rstd, compute_dw, compute_db, db_dtype
    )


@layer_norm_backward_op.register_fake
def _(dy, x, normalized_shape, weight, mean, rstd, compute_dw, compute_db, db_dtype):
    param = weight if weight is not None else x
    dw = weight.new_empty(weight.shape) if compute_dw else param.new_empty((0,))
    db = (
        x.new_empty(tuple(normalized_shape), dtype=db_dtype)
        if compute_db
        else param.new_empty((0,))
    )
    return x.new_empty(x.shape), dw, db


def _setup_context(ctx, inputs, output):
    x, normalized_shape, weight, bias, eps = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, weight, mean, rstd)
    ctx.normalized_shape = normalized_shape
    ctx.bias_dtype = x.dtype if bias is None else bias.dtype
    ctx.mark_non_differentiable(mean, rstd)


def _backward_formula(ctx, dy, _dmean, _drstd):
    x, weight, mean, rstd = ctx.saved_tensors
    compute_dw = ctx.needs_input_grad[2]
    compute_db = ctx.needs_input_grad[3]
    dx, dw, db = layer_norm_backward_op(
        dy, x, ctx.normalized_shape, weight, mean, rstd, compute_dw, compute_db, ctx.bias_dtype
    )
    return dx, None, dw if compute_dw else None, db if compute_db else None, None


layer_norm_op.register_autograd(_backward_formula, setup_context=_setup_context)


# --------------------------------------------------------------------------------------------
# Public function
# --------------------------------------------------------------------------------------------


def _torch_layer_norm(x, normalized_shape, weight, bias, eps) -> torch.Tensor:
    """The kernel's formula in PyTorch ops, for inductor to fuse: fp32 math, rounded once to
    the input's dtype (as the kernel does, whatever the parameters' dtypes)."""
    _check(x, normalized_shape, weight, bias)
    weight = None if weight is None else weight.float()
    bias = None if bias is None else bias.float()
    y = torch.nn.functional.layer_norm(x.float(), normalized_shape, weight, bias, eps)
    return y.to(x.dtype)


def layer_norm(
    x: torch.Tensor,
    normalized_shape,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """``torch.nn.functional.layer_norm(x, normalized_shape, weight, bias, eps)``."""
    normalized_shape = [int(n) for n in normalized_shape]
    eps = float(eps)
    # Under torch.compile the rule (_compile_rule.py) picks the custom op (one opaque node) or
    # PyTorch's layer_norm for inductor to fuse; eagerly, a plain autograd.Function (or the
    # bare launcher when no backward is needed) is cheaper to call.
    if torch.compiler.is_compiling():
        training = use_autograd_function(x, weight, bias)
        if compile_side("layer_norm", *sizes(x, len(normalized_shape)), training) == OP:
            return layer_norm_op(x, normalized_shape, weight, bias, eps)[0]
        return _torch_layer_norm(x, normalized_shape, weight, bias, eps)
    if use_autograd_function(x, weight, bias):
        return _LayerNormFunction.apply(x, normalized_shape, weight, bias, eps)
    return layer_norm_forward(x, normalized_shape, weight, bias, eps, keep_stats=False)[0]
