"""RMSNorm in transformers' two flavours, and a fused residual-add + RMSNorm.

- Llama (``LlamaRMSNorm``): ``weight * (x.float() * rstd).to(x.dtype)``; the product is taken in
  the promoted dtype of weight and input (so an fp32 weight gives an fp32 output).
- Gemma (``GemmaRMSNorm``): ``(x.float() * rstd * (1 + weight.float())).type_as(x)``.
- Fused add (Llama semantics): ``s = hidden_states + residual`` (rounded to its dtype, as
  PyTorch does), returns ``(rmsnorm(s), s)``.

Read top to bottom: the Triton kernels, the launchers that pick block sizes (once per shape,
dtype and layout of their arguments: launch plans), then the autograd wiring
(``torch.autograd.Function`` for eager calls; ``torch.library`` custom ops with fake
implementations and registered autograd: under ``torch.compile`` the fused add is traced as its
op, while the plain norms hand inductor their formula in PyTorch ops).

Forward: one pass, reads x (and the residual), writes y (and the sum) and one fp32 rstd per row.
Backward: a persistent grid; each program walks a contiguous run of rows, writes dx, and keeps
its share of the weight gradient in fp32 registers; the per-program partials are summed at the
end (deterministic: no atomics).
"""

import collections
import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ._compile_rule import OP, compile_side, sizes
from ._library import (
    as_rows,
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

# Semantics: plain ints for Python (the custom ops take an int), constexpr copies for kernels.
LLAMA = 0
GEMMA = 1
_LLAMA = tl.constexpr(LLAMA)
_GEMMA = tl.constexpr(GEMMA)


# Forward launch configuration, from an interleaved A/B of configurations at ~64M elements
# (benchmarks/diagnose/norm_forward.py; the outcome in benchmarks/results/h200/NOTES.md):
# - rows of two or more whole chunks of FWD_CHUNK_BYTES (bf16 8192 and 12288 wide, fp32 4096
#   and 8192) are read in those chunks by 16 warps, twice (the second read from L2), as inductor
#   does: faster than holding the row in registers; rows of 16384 are as fast in one block;
# - other rows past 4096 stay in registers with 32 elements a thread, which beat 16;
# - rows up to FWD_NARROW_ELEMENTS as both norms (``_tuning``).
# The chunked loops take the row width as a constexpr (CHUNKED_COLS), as inductor's do, which
# brought GemmaRMSNorm level with torch.compile and left Llama rows and fp32 unchanged.
# One-pass rows keep a runtime width: a constexpr one was slower there.
FWD_CHUNK_BYTES = 8192
FWD_CHUNK_WARPS = 16


@functools.cache
def _fwd_block(n_cols: int, itemsize: int) -> tuple[bool, int, int, int]:
    """(one_pass, block_n or chunk, rows, num_warps) for the forward of rows of ``n_cols``
    elements of ``itemsize`` bytes, as swept."""
    chunk = FWD_CHUNK_BYTES // itemsize
    if 2 * chunk <= n_cols < MAX_ONE_PASS and n_cols % chunk == 0:
        return False, chunk, 1, FWD_CHUNK_WARPS
    if n_cols <= FWD_NARROW_ELEMENTS:
        return row_block(n_cols, FWD_NARROW_ELEMENTS)
    one_pass, block_n, rows, num_warps = row_block(n_cols)
    if one_pass and n_cols > 4096:
        num_warps = max(4, previous_power_of_2(n_cols // 1024))
    return one_pass, block_n, rows, num_warps


# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------


@triton.jit
def _scale(xhat, w, MODE: tl.constexpr, IN_DTYPE: tl.constexpr):
    # y before the final cast. Llama rounds the normalised row to the input dtype before the
    # weight multiply (which PyTorch computes in fp32 and rounds once, as here); Gemma stays fp32.
    if MODE == _LLAMA:  # noqa: SIM108 (a constexpr branch: one side is compiled, not a select)
        y = xhat.to(IN_DTYPE).to(tl.float32) * w
    else:
        y = xhat * (w + 1.0)
    return y


@triton.jit
def _load_row_input(
    X,
    R,
    S,
    x_offsets,
    r_offsets,
    s_offsets,
    mask,
    HAS_RESIDUAL: tl.constexpr,
    STORE_SUM: tl.constexpr,
    EVICT: tl.constexpr,
):
    # The row to normalise in fp32: x, or the sum x + r rounded to the sum's dtype (which the
    # fused layer returns, and stores here when STORE_SUM). EVICT: the loads' L2 eviction policy.
    x = tl.load(X + x_offsets, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(R + r_offsets, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
        s = (x + r).to(S.dtype.element_ty)
        if STORE_SUM:
            tl.store(S + s_offsets, s, mask=mask)
        x = s.to(tl.float32)
    return x


@triton.jit
def _rms_norm_fwd_kernel(
    X,
    R,
    W,
    Y,
    S,
    RSTD,
    n_rows,
    n_cols,
    stride_x,
    stride_r,
    eps,
    MODE: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    ONE_PASS: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CHUNKED_COLS: tl.constexpr,
    STORE_RSTD: tl.constexpr,
):
    # Y and S are contiguous (row stride n_cols); X and R rows are strided. S is X when there is
    # no residual, so S.dtype is always the dtype of the row being normalised. CHUNKED_COLS is
    # n_cols when not ONE_PASS (else 0): the chunked loops then have a static trip count.
    # STORE_RSTD: rstd is kept for a backward (else RSTD is a placeholder, never written).
    IN_DTYPE: tl.constexpr = S.dtype.element_ty
    if ONE_PASS:
        # ROWS whole rows in registers: one read of x, one write of y.
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_N)
        row_mask = rows < n_rows
        col_mask = cols < n_cols
        mask = row_mask[:, None] & col_mask[None, :]
        offsets = rows[:, None] * n_cols + cols[None, :]
        x = _load_row_input(
            X,
            R,
            S,
            rows[:, None] * stride_x + cols[None, :],
            rows[:, None] * stride_r + cols[None, :],
            offsets,
            mask,
            HAS_RESIDUAL,
            True,
            "",
        )
        # Gemma's single rows in blocks of 4096 (2049-4096 wide) load the weight beside the row, so
        # that its latency overlaps the row's (a small gain at 3072-4096 wide). Llama rows gain
        # nothing, and rows in larger blocks lose, as the weight then holds registers through the
        # sum.
        W_EARLY: tl.constexpr = (MODE == _GEMMA) and (ROWS == 1) and (BLOCK_N == 4096)
        if W_EARLY:
            w = tl.load(W + cols, mask=col_mask, other=0.0)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
        if STORE_RSTD:
            tl.store(RSTD + rows, rstd, mask=row_mask)
        if not W_EARLY:
            w = tl.load(W + cols, mask=col_mask, other=0.0)
        w = w.to(tl.float32)
        y = _scale(x * rstd[:, None], w[None, :], MODE, IN_DTYPE)
        tl.store(Y + offsets, y.to(Y.dtype.element_ty), mask=mask)
    else:
        # A row too wide for registers (or chunked, where that is faster): sum of squares over
        # chunks, then normalise chunk by chunk. The first pass keeps its reads in L2
        # (evict_last), so that the second read hits L2; the second lets them go (evict_first).
        row = tl.program_id(0).to(tl.int64)
        base = row * CHUNKED_COLS
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, CHUNKED_COLS, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < CHUNKED_COLS
            x = _load_row_input(
                X,
                R,
                S,
                row * stride_x + cols,
                row * stride_r + cols,
                base + cols,
                mask,
                HAS_RESIDUAL,
                True,
                "evict_last",
            )
            acc += x * x
        rstd = tl.rsqrt(tl.sum(acc, axis=0) / CHUNKED_COLS + eps)
        if STORE_RSTD:
            tl.store(RSTD + row, rstd)
        for start in range(0, CHUNKED_COLS, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < CHUNKED_COLS
            # Recompute the sum from x and r rather than reading S back: no dependence on this
            # program's own earlier stores.
            x = _load_row_input(
                X,
                R,
                S,
                row * stride_x + cols,
                row * stride_r + cols,
                base + cols,
                mask,
                HAS_RESIDUAL,
                False,
                "evict_first",
            )
            w = tl.load(W + cols, mask=mask, other=0.0, eviction_policy="evict_last")
            w = w.to(tl.float32)
            y = _scale(x * rstd, w, MODE, IN_DTYPE)
            tl.store(Y + base + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_row_dot_kernel(
    DY, X, W, RSTD, C, n_cols, stride_dy, stride_x, MODE: tl.constexpr, BLOCK_N: tl.constexpr
):
    # Rows too wide for one program's registers: c = mean(g * xhat) of each row, which the
    # column-split backward needs before any block of the row. One program a row, in chunks.
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        if MODE == _GEMMA:
            w = w + 1.0
        acc += dy * w * x
    tl.store(C + row, tl.sum(acc, axis=0) * tl.load(RSTD + row) / n_cols)


@triton.jit
def _rms_norm_bwd_loads(DY, DS, X, RSTD, C, rows, row_end, cols, col_mask, stride_dy, stride_ds,
                        stride_x, HAS_DSUM: tl.constexpr, SPLIT_COLS: tl.constexpr):  # fmt: skip
    # One backward step's inputs, in their stored dtypes: x, dy, rstd, c (SPLIT_COLS; else rstd
    # as a placeholder) and the sum's gradient (HAS_DSUM; else dy as a placeholder). Rows past
    # row_end are masked off: no memory is read for them.
    row_mask = rows < row_end
    mask = row_mask[:, None] & col_mask[None, :]
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0)
    rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
    c = rstd
    if SPLIT_COLS:
        c = tl.load(C + rows, mask=row_mask, other=0.0)
    ds = dy
    if HAS_DSUM:
        ds = tl.load(DS + rows[:, None] * stride_ds + cols[None, :], mask=mask, other=0.0)
    return x, dy, rstd, c, ds


@triton.jit
def _rms_norm_bwd_kernel(
    DY,
    DS,
    X,
    W,
    RSTD,
    C,
    DX,
    DW_PARTIAL,
    n_rows,
    n_cols,
    rows_per_program,
    stride_dy,
    stride_ds,
    stride_x,
    stride_dx,
    MODE: tl.constexpr,
    HAS_DSUM: tl.constexpr,
    COMPUTE_DW: tl.constexpr,
    SPLIT_COLS: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # dx = rstd * (g - xhat * c), c = mean(g * xhat), g = dy * w (Gemma: dy * (1 + w)); plus, for
    # the fused add, the gradient of the sum output. dw = sum over rows of dy * xhat (Llama: xhat
    # rounded to the input dtype, as the forward used it).
    # A program walks a contiguous run of rows, ROWS at a time, over one block of columns: the
    # whole row, or with SPLIT_COLS (rows too wide for registers) block program_id(1) of
    # BLOCK_N columns, c then coming from C (the row dot kernel). Each step loads the next
    # step's rows before it reduces its own, so the program keeps loads in flight while it
    # reduces (a large share of the backward's time at 4096 and 8192 wide).
    pid = tl.program_id(0)
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    if MODE == _GEMMA:
        w = w + 1.0
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    rows = row_start + tl.arange(0, ROWS)
    x, dy, rstd, c, ds = _rms_norm_bwd_loads(
        DY, DS, X, RSTD, C, rows, row_end, cols, col_mask, stride_dy, stride_ds, stride_x,
        HAS_DSUM, SPLIT_COLS,
    )  # fmt: skip
    for first in range(row_start, row_end, ROWS):
        rows = first + tl.arange(0, ROWS)
        next_rows = rows + ROWS
        next_x, next_dy, next_rstd, next_c, next_ds = _rms_norm_bwd_loads(
            DY, DS, X, RSTD, C, next_rows, row_end, cols, col_mask, stride_dy, stride_ds,
            stride_x, HAS_DSUM, SPLIT_COLS,
        )  # fmt: skip
        mask = (rows < row_end)[:, None] & col_mask[None, :]
        x = x.to(tl.float32)
        dy = dy.to(tl.float32)
        xhat = x * rstd[:, None]
        g = dy * w[None, :]
        if not SPLIT_COLS:
            c = tl.sum(g * xhat, axis=1) / n_cols
        dx = (g - xhat * c[:, None]) * rstd[:, None]
        if HAS_DSUM:
            dx += ds.to(tl.float32)
        tl.store(
            DX + rows[:, None] * stride_dx + cols[None, :],
            dx.to(DX.dtype.element_ty),
            mask=mask,
        )
        if COMPUTE_DW:
            if MODE == _LLAMA:
                xhat = xhat.to(X.dtype.element_ty).to(tl.float32)
            dw_acc += tl.sum(dy * xhat, axis=0)
        x, dy, rstd, c, ds = next_x, next_dy, next_rstd, next_c, next_ds
    if COMPUTE_DW:
        tl.store(DW_PARTIAL + pid.to(tl.int64) * n_cols + cols, dw_acc, mask=col_mask)


# --------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------
#
# Each launcher works from a plan: what its checks, row views, block-size rules and persistent
# grid derive from the arguments. That work is Python-level torch calls and arithmetic, on the
# host at every call, and it follows from a few properties of the arguments only:
# dtypes, shapes, contiguity, the mode, the device. Plans are kept by exactly those (the key).
# The first call with a key (a miss) runs every check and rule, as before, and keeps the plan;
# later calls with the key only allocate their outputs and launch. A plan holds no tensor. A
# call that fails its checks keeps no plan, so the next one with that key fails the same way.
# Inputs that are not contiguous are planned too, but read through ``as_rows`` on every call (a
# row view, or a copy, of that tensor). Plans cut about a third off the host time of a forward
# under no_grad, and most of what a forward+backward spends beyond the autograd.Function's own
# cost (an interleaved A/B on the CPU with the launches stubbed).
PLAN_CACHE_SIZE = 256


class PlanCache(collections.OrderedDict):
    """A launcher's plans by key: at most ``maxsize``, the oldest dropped first. A model calls a
    norm with a handful of keys; inputs of ever new shapes (varying sequence lengths) only cycle
    through."""

    def __init__(self, maxsize: int = PLAN_CACHE_SIZE):
        super().__init__()
        self.maxsize = maxsize

    def add(self, key: tuple, plan):
        """Keeps ``plan`` under ``key``, dropping the oldest plans past ``maxsize``; returns it."""
        while self and len(self) >= self.maxsize:
            self.popitem(last=False)
        self[key] = plan
        return plan


def rows_of(t: torch.Tensor, n_cols: int, contiguous: bool) -> tuple[torch.Tensor, int]:
    """``(t, row stride)``: ``t`` read as rows of ``n_cols`` elements. ``t`` itself where the plan
    says it is contiguous (its key holds that), else ``as_rows``'s row view of it, or copy."""
    if contiguous:
        return t, n_cols
    t2, _, stride = as_rows(t, n_cols)
    return t2, stride


def _output_dtype(in_dtype: torch.dtype, weight: torch.Tensor, mode: int) -> torch.dtype:
    # Llama multiplies in the promoted dtype of weight and input; Gemma casts back to the input's.
    return torch.promote_types(weight.dtype, in_dtype) if mode == LLAMA else in_dtype


def _check(what: str, x: torch.Tensor, weight: torch.Tensor) -> int:
    check_dtype(what, x)
    check_dtype(f"{what} weight", weight)
    n_cols = x.shape[-1] if x.dim() > 0 else 0
    if weight.dim() != 1 or weight.shape[0] != n_cols:
        raise ValueError(
            f"{what}: weight of shape {tuple(weight.shape)} does not match the last dimension of "
            f"the input, shape {tuple(x.shape)}"
        )
    return n_cols


class _FwdPlan(NamedTuple):
    """A forward's plan (``_fwd_plan``): all but the tensors and eps. Shapes are plain tuples,
    which ``new_empty`` parses faster than a ``torch.Size``."""

    shape: tuple  # y's and the sum's: x's
    stats_shape: tuple  # rstd's: x's without the last dimension
    out_dtype: torch.dtype
    sum_dtype: torch.dtype  # the promoted dtype of x and the residual
    grid: tuple | None = None  # None: no elements, nothing to launch
    n_rows: int = 0
    n_cols: int = 0
    num_warps: int = 0
    constexprs: tuple = ()  # the kernel's constexpr arguments, in order
    x_rows: bool = True  # x is contiguous: its rows are read in place (``rows_of``)
    r_rows: bool = True  # so is the residual, or there is none
    w_ready: bool = True  # the weight is contiguous (else a contiguous copy is passed)


_FWD_PLANS = PlanCache()  # _FwdPlan by key


def _fwd_plan(x, residual, weight, mode: int, keep_rstd: bool) -> _FwdPlan:
    """The plan of a forward of these arguments: kept, or made (``_make_fwd_plan``)."""
    try:
        key = (x.shape, x.dtype, x.is_contiguous(), weight.shape, weight.dtype,
               weight.is_contiguous(), mode, keep_rstd)  # fmt: skip
        if residual is not None:
            key += (residual.shape, residual.dtype, residual.is_contiguous())
    except AttributeError:  # an argument that is no tensor: the checks say which, as before
        return _make_fwd_plan(x, residual, weight, mode, keep_rstd)
    plan = _FWD_PLANS.get(key)
    if plan is None:
        plan = _FWD_PLANS.add(key, _make_fwd_plan(x, residual, weight, mode, keep_rstd))
    return plan


def _make_fwd_plan(x, residual, weight, mode: int, keep_rstd: bool) -> _FwdPlan:
    """A forward's checks and launch configuration (a plan cache miss); raises for bad arguments."""
    what = "rms_norm" if residual is None else "fused_add_rms_norm"
    n_cols = _check(what, x, weight)
    if residual is not None:
        check_dtype(f"{what} residual", residual)
    if residual is not None and residual.shape != x.shape:
        raise ValueError(
            f"{what}: hidden_states {tuple(x.shape)} and residual {tuple(residual.shape)} must "
            "have the same shape"
        )
    in_dtype = x.dtype if residual is None else torch.promote_types(x.dtype, residual.dtype)
    shape = tuple(x.shape)
    outputs = (shape, shape[:-1], _output_dtype(in_dtype, weight, mode), in_dtype)
    if x.numel() == 0:
        return _FwdPlan(*outputs)
    n_rows = x.numel() // n_cols
    one_pass, block_n, rows, num_warps = _fwd_block(n_cols, x.element_size())
    return _FwdPlan(
        *outputs,
        grid=(cdiv(n_rows, rows),) if one_pass else (n_rows,),
        n_rows=n_rows,
        n_cols=n_cols,
        num_warps=num_warps,
        constexprs=constexprs(
            _rms_norm_fwd_kernel,
            MODE=mode,
            HAS_RESIDUAL=residual is not None,
            ONE_PASS=one_pass,
            ROWS=rows,
            BLOCK_N=block_n,
            CHUNKED_COLS=0 if one_pass else n_cols,
            STORE_RSTD=keep_rstd,
        ),
        x_rows=x.is_contiguous(),
        r_rows=residual is None or residual.is_contiguous(),
        w_ready=weight.is_contiguous(),
    )


def rms_norm_forward(x, residual, weight, eps, mode, keep_rstd: bool = True):
    """RMSNorm's forward launcher, without autograd: ``(y, sum or None, rstd)``.

    Part of the repository's public surface for callers that run below autograd (an operator
    override), where `rms_norm` would record a second backward. ``mode`` is `LLAMA`
    (``weight * normalize(x)``) or `GEMMA` (``(1 + weight) * normalize(x)``). The sum
    ``x + residual`` is computed and returned only when residual is given, rstd (fp32) only
    when ``keep_rstd`` (for a backward; else None: one allocation less, which is a tenth of an
    inference call's host time)."""
    plan = _fwd_plan(x, residual, weight, mode, keep_rstd)
    # new_empty: the cheapest allocation call that takes a dtype (torch.empty with dtype and
    # device keywords parses more arguments on the host).
    y = x.new_empty(plan.shape, dtype=plan.out_dtype)
    s = None if residual is None else x.new_empty(plan.shape, dtype=plan.sum_dtype)
    rstd = x.new_empty(plan.stats_shape, dtype=torch.float32) if keep_rstd else None
    if plan.grid is None:
        return y, s, rstd
    n_rows, n_cols = plan.n_rows, plan.n_cols
    # The kernel's arguments, each named as its parameter (``_library``'s "by name").
    X, stride_x = rows_of(x, n_cols, plan.x_rows)
    R, stride_r = (X, stride_x) if residual is None else rows_of(residual, n_cols, plan.r_rows)
    w = weight if plan.w_ready else weight.contiguous()
    S = X if s is None else s  # X: a placeholder, never written without HAS_RESIDUAL
    RSTD = y if rstd is None else rstd  # y: a placeholder, never written without STORE_RSTD
    args = (X, R, w, y, S, RSTD, n_rows, n_cols, stride_x, stride_r, eps) + plan.constexprs
    launch(_rms_norm_fwd_kernel, plan.grid, args, plan.num_warps, x.device)
    return y, s, rstd


class _BwdPlan(NamedTuple):
    """A backward's plan (``_bwd_plan``): all but the tensors."""

    shape: tuple  # dx's: x's
    grid: tuple | None = None  # (programs, column blocks); None: no elements, nothing to launch
    n_rows: int = 0
    n_cols: int = 0
    rows_per_program: int = 0
    num_warps: int = 0
    constexprs: tuple = ()  # the backward kernel's constexpr arguments, in order
    row_dot: bool = False  # rows too wide for registers: the row dot kernel runs first
    partial_shape: tuple = ()  # the weight gradient's fp32 partials: a row a program
    x_rows: bool = True  # x is contiguous: its rows are read in place (``rows_of``)
    dy_rows: bool = True  # so is dy
    ds_rows: bool = True  # so is the sum's gradient, or there is none
    w_ready: bool = True  # the weight is contiguous (else a contiguous copy is passed)


_BWD_PLANS = PlanCache()  # _BwdPlan by key


def _bwd_plan(dy, dsum, x, weight, mode: int, compute_dw: bool, device) -> _BwdPlan:
    """The plan of a backward of these arguments: kept, or made (``_make_bwd_plan``)."""
    key = (x.shape, x.is_contiguous(), dy.is_contiguous(),
           None if dsum is None else dsum.is_contiguous(), weight.is_contiguous(), mode,
           compute_dw, device)  # fmt: skip
    plan = _BWD_PLANS.get(key)
    if plan is None:
        plan = _BWD_PLANS.add(key, _make_bwd_plan(dy, dsum, x, weight, mode, compute_dw, device))
    return plan


def _make_bwd_plan(dy, dsum, x, weight, mode: int, compute_dw: bool, device) -> _BwdPlan:
    """A backward's launch configuration (a plan cache miss)."""
    n_cols = x.shape[-1]
    shape = tuple(x.shape)
    if x.numel() == 0:
        return _BwdPlan(shape)
    n_rows = x.numel() // n_cols
    one_pass, block_n, rows, num_warps, per_sm = bwd_block(n_cols)
    col_blocks = 1 if one_pass else cdiv(n_cols, block_n)
    programs, rows_per_program = persistent_grid(n_rows, rows, device, per_sm, col_blocks)
    return _BwdPlan(
        shape,
        grid=(programs, col_blocks),
        n_rows=n_rows,
        n_cols=n_cols,
        rows_per_program=rows_per_program,
        num_warps=num_warps,
        constexprs=constexprs(
            _rms_norm_bwd_kernel,
            MODE=mode,
            HAS_DSUM=dsum is not None,
            COMPUTE_DW=compute_dw,
            SPLIT_COLS=not one_pass,
            ROWS=rows,
            BLOCK_N=block_n,
        ),
        row_dot=not one_pass,
        partial_shape=(programs, n_cols),
        x_rows=x.is_contiguous(),
        dy_rows=dy.is_contiguous(),
        ds_rows=dsum is None or dsum.is_contiguous(),
        w_ready=weight.is_contiguous(),
    )


def rms_norm_backward(dy, dsum, x, weight, rstd, mode, compute_dw):
    """RMSNorm's backward launcher, without autograd: ``(dx, dw)``, from the rstd that
    `rms_norm_forward` returned.

    dw is an empty tensor when not ``compute_dw``. ``x`` is the normalised input (the sum, for
    the fused add) and ``dsum`` the gradient of the sum output, or None."""
    device = x.device
    plan = _bwd_plan(dy, dsum, x, weight, mode, compute_dw, device)
    dx = x.new_empty(plan.shape)
    if plan.grid is None:
        return dx, (torch.zeros_like(weight) if compute_dw else weight.new_empty((0,)))
    # The kernels' arguments, each named as its parameter (``_library``'s "by name").
    n_rows, n_cols, rows_per_program = plan.n_rows, plan.n_cols, plan.rows_per_program
    X, stride_x = rows_of(x, n_cols, plan.x_rows)
    DY, stride_dy = rows_of(dy, n_cols, plan.dy_rows)
    DS, stride_ds = (DY, stride_dy) if dsum is None else rows_of(dsum, n_cols, plan.ds_rows)
    w = weight if plan.w_ready else weight.contiguous()
    c = rstd  # a placeholder for C, never read in one pass
    if plan.row_dot:
        c = rstd.new_empty((n_rows,))
        MODE, BLOCK_N = mode, CHUNK
        args = (DY, X, w, rstd, c, n_cols, stride_dy, stride_x, MODE, BLOCK_N)
        launch(_rms_norm_row_dot_kernel, (n_rows,), args, WIDE_ROW_WARPS, device)
    dw_partial = rstd  # a placeholder, never read or written when COMPUTE_DW is False
    if compute_dw:
        dw_partial = x.new_empty(plan.partial_shape, dtype=torch.float32)
    stride_dx = n_cols
    args = (
        DY, DS, X, w, rstd, c, dx, dw_partial,
        n_rows, n_cols, rows_per_program, stride_dy, stride_ds, stride_x, stride_dx,
    ) + plan.constexprs  # fmt: skip
    launch(_rms_norm_bwd_kernel, plan.grid, args, plan.num_warps, device)
    dw = sum_partials(dw_partial, weight.dtype) if compute_dw else weight.new_empty((0,))
    return dx, dw


# --------------------------------------------------------------------------------------------
# Autograd: eager path
# --------------------------------------------------------------------------------------------


class _RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, mode):
        y, _, rstd = rms_norm_forward(x, None, weight, eps, mode)
        ctx.save_for_backward(x, weight, rstd)
        ctx.mode = mode
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        dx, dw = rms_norm_backward(dy, None, x, weight, rstd, ctx.mode, ctx.needs_input_grad[1])
        return dx, (dw if ctx.needs_input_grad[1] else None), None, None


class _FusedAddRMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, eps):
        y, s, rstd = rms_norm_forward(x, residual, weight, eps, LLAMA)
        ctx.save_for_backward(s, weight, rstd)
        ctx.dtypes = (x.dtype, residual.dtype)
        return y, s

    @staticmethod
    def backward(ctx, dy, dsum):
        s, weight, rstd = ctx.saved_tensors
        ds, dw = rms_norm_backward(dy, dsum, s, weight, rstd, LLAMA, ctx.needs_input_grad[2])
        # d(x + r)/dx = d(x + r)/dr = 1: both get the same gradient, as torch.add's backward
        # gives (the same tensor when the dtypes agree).
        x_dtype, r_dtype = ctx.dtypes
        return ds.to(x_dtype), ds.to(r_dtype), (dw if ctx.needs_input_grad[2] else None), None


# --------------------------------------------------------------------------------------------
# Autograd: torch.library ops (what torch.compile sees)
# --------------------------------------------------------------------------------------------


@torch.library.custom_op(op_name("rms_norm"), mutates_args=())
def rms_norm_op(
    x: torch.Tensor, weight: torch.Tensor, eps: float, mode: int
) -> tuple[torch.Tensor, torch.Tensor]:
    y, _, rstd = rms_norm_forward(x, None, weight, eps, mode)
    return y, rstd


@rms_norm_op.register_fake
def _(x, weight, eps, mode):
    _check("rms_norm", x, weight)
    y = x.new_empty(x.shape, dtype=_output_dtype(x.dtype, weight, mode))
    return y, x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.custom_op(op_name("rms_norm_backward"), mutates_args=())
def rms_norm_backward_op(
    dy: torch.Tensor,
    dsum: torch.Tensor | None,
    x: torch.Tensor,
    weight: torch.Tensor,
    rstd: torch.Tensor,
    mode: int,
    compute_dw: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    return rms_norm_backward(dy, dsum, x, weight, rstd, mode, compute_dw)


@rms_norm_backward_op.register_fake
def _(dy, dsum, x, weight, rstd, mode, compute_dw):
    dw = weight.new_empty(weight.shape if compute_dw else (0,))
    return x.new_empty(x.shape), dw


def _rms_norm_setup_context(ctx, inputs, output):
    x, weight, eps, mode = inputs
    _, rstd = output
    ctx.save_for_backward(x, weight, rstd)
    ctx.mode = mode
    ctx.mark_non_differentiable(rstd)


def _rms_norm_backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    compute_dw = ctx.needs_input_grad[1]
    dx, dw = rms_norm_backward_op(dy, None, x, weight, rstd, ctx.mode, compute_dw)
    return dx, (dw if compute_dw else None), None, None


rms_norm_op.register_autograd(_rms_norm_backward, setup_context=_rms_norm_setup_context)


@torch.library.custom_op(op_name("fused_add_rms_norm"), mutates_args=())
def fused_add_rms_norm_op(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return rms_norm_forward(x, residual, weight, eps, LLAMA)


@fused_add_rms_norm_op.register_fake
def _(x, residual, weight, eps):
    _check("fused_add_rms_norm", x, weight)
    check_dtype("fused_add_rms_norm residual", residual)
    s = x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, residual.dtype))
    y = x.new_empty(x.shape, dtype=_output_dtype(s.dtype, weight, LLAMA))
    return y, s, x.new_empty(x.shape[:-1], dtype=torch.float32)


def _fused_setup_context(ctx, inputs, output):
    x, residual, weight, eps = inputs
    _, s, rstd = output
    ctx.save_for_backward(s, weight, rstd)
    ctx.dtypes = (x.dtype, residual.dtype)
    ctx.mark_non_differentiable(rstd)


def _fused_backward(ctx, dy, dsum, _drstd):
    s, weight, rstd = ctx.saved_tensors
    compute_dw = ctx.needs_input_grad[2]
    ds, dw = rms_norm_backward_op(dy, dsum, s, weight, rstd, LLAMA, compute_dw)
    x_dtype, r_dtype = ctx.dtypes
    return ds.to(x_dtype), ds.to(r_dtype), (dw if compute_dw else None), None


fused_add_rms_norm_op.register_autograd(_fused_backward, setup_context=_fused_setup_context)


# --------------------------------------------------------------------------------------------
# Public functions
# --------------------------------------------------------------------------------------------


def _torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, mode: int) -> torch.Tensor:
    """The kernel's formula in PyTorch ops (transformers' own), for inductor to fuse."""
    _check("rms_norm", x, weight)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if mode == LLAMA:
        return weight * h.to(x.dtype)
    return (h * (1.0 + weight.float())).to(x.dtype)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, mode: int) -> torch.Tensor:
    # Under torch.compile the rule (_compile_rule.py) picks the op or the formula. The formula
    # lets inductor fuse the norm with the residual add before it and the casts around it,
    # forward and backward, which an opaque op prevents; the op is our kernel. Eagerly, the
    # op's dispatcher round trip costs more than the kernel at small sizes, so a plain
    # autograd.Function (or the bare launcher, when no backward is needed) runs the same
    # launchers.
    if torch.compiler.is_compiling():
        training = use_autograd_function(x, weight)
        layer = "rms_norm" if mode == LLAMA else "gemma_rms_norm"
        if compile_side(layer, *sizes(x), training) == OP:
            return rms_norm_op(x, weight, eps, mode)[0]
        return _torch_rms_norm(x, weight, eps, mode)
    if use_autograd_function(x, weight):
        return _RMSNormFunction.apply(x, weight, eps, mode)
    return rms_norm_forward(x, None, weight, eps, mode, keep_rstd=False)[0]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' ``LlamaRMSNorm``: ``weight * (x.float() * rsqrt(mean(x^2) + eps)).to(x.dtype)``."""
    return _rms_norm(x, weight, float(eps), LLAMA)


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' ``GemmaRMSNorm``: ``(x.float() * rsqrt(mean(x^2) + eps) * (1 + weight.float())).type_as(x)``."""
    return _rms_norm(x, weight, float(eps), GEMMA)


def fused_add_rms_norm(
    hidden_states: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``s = hidden_states + residual``; returns ``(rms_norm(s, weight, eps), s)`` (Llama semantics)."""
    eps = float(eps)
    if torch.compiler.is_compiling():
        training = use_autograd_function(hidden_states, residual, weight)
        if compile_side("fused_add_rms_norm", *sizes(hidden_states), training) == OP:
            y, s, _ = fused_add_rms_norm_op(hidden_states, residual, weight, eps)
            return y, s
        s = hidden_states + residual
        return _torch_rms_norm(s, weight, eps, LLAMA), s
    if use_autograd_function(hidden_states, residual, weight):
        return _FusedAddRMSNormFunction.apply(hidden_states, residual, weight, eps)
    y, s, _ = rms_norm_forward(hidden_states, residual, weight, eps, LLAMA, keep_rstd=False)
    return y, s
