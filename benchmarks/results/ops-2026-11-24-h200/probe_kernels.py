"""The two probe kernels behind backward-ab.txt and forward-ab-4.txt's "shift" rows (H200,
2026-11-24), kept as they ran: each replaced one of LayerNorm's kernels inside
``benchmarks/diagnose.py`` through a stand-in for the module's ``launch`` (swapped with
``diagnose._swapped``), in CUDA graphs replayed in interleaved rounds.

- ``layer_norm_bwd_prefetch``: the backward loading the next step's rows before reducing its
  own. It won (16384x4096 138.7 -> 119.2 us, 8192x8192 147.9 -> 118.8 us, 32768x8192
  540.7 -> 429.8 us) and became the library's backward loop for both norms (a425ecb).
- ``layer_norm_fwd_shifted``: the forward's variance from two independent sums of the row
  shifted by its first element (CHECK: rows whose shift is far from the mean recomputed
  two-pass). No faster than the two-pass forward (16384x4096 65.5-65.6 against 65.8 us, 8192
  wide even), so not kept.

Not imported by anything; a record of what ran.
"""

import triton
import triton.language as tl


@triton.jit
def layer_norm_bwd_prefetch(DY, X, W, MEAN, RSTD, C, DX, DW_PARTIAL, DB_PARTIAL, n_rows, n_cols,
                            rows_per_program, stride_dy, stride_x, HAS_WEIGHT: tl.constexpr,
                            COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
                            SPLIT_COLS: tl.constexpr, ROWS: tl.constexpr,
                            BLOCK_N: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    rows = row_start + tl.arange(0, ROWS)
    row_mask = rows < row_end
    mask = row_mask[:, None] & col_mask[None, :]
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0)
    mean = tl.load(MEAN + rows, mask=row_mask, other=0.0)
    rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
    for first in range(row_start, row_end, ROWS):
        n_rows_ = first + ROWS + tl.arange(0, ROWS)
        n_row_mask = n_rows_ < row_end
        n_mask = n_row_mask[:, None] & col_mask[None, :]
        x_next = tl.load(X + n_rows_[:, None] * stride_x + cols[None, :], mask=n_mask, other=0.0)
        dy_next = tl.load(DY + n_rows_[:, None] * stride_dy + cols[None, :], mask=n_mask, other=0.0)
        mean_next = tl.load(MEAN + n_rows_, mask=n_row_mask, other=0.0)
        rstd_next = tl.load(RSTD + n_rows_, mask=n_row_mask, other=0.0)
        xf = x.to(tl.float32)
        dyf = dy.to(tl.float32)
        xhat = tl.where(mask, (xf - mean[:, None]) * rstd[:, None], 0.0)
        g = dyf
        if HAS_WEIGHT:
            g = dyf * w[None, :]
        c1 = tl.sum(g * xhat, axis=1) / n_cols
        c2 = tl.sum(g, axis=1) / n_cols
        dx = (g - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
        tl.store(DX + rows[:, None] * n_cols + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        if COMPUTE_DW:
            dw_acc += tl.sum(dyf * xhat, axis=0)
        if COMPUTE_DB:
            db_acc += tl.sum(dyf, axis=0)
        x, dy, mean, rstd = x_next, dy_next, mean_next, rstd_next
        rows, row_mask, mask = n_rows_, n_row_mask, n_mask
    if COMPUTE_DW:
        tl.store(DW_PARTIAL + pid.to(tl.int64) * n_cols + cols, dw_acc, mask=col_mask)
    if COMPUTE_DB:
        tl.store(DB_PARTIAL + pid.to(tl.int64) * n_cols + cols, db_acc, mask=col_mask)


@triton.jit
def layer_norm_fwd_shifted(X, W, B, Y, MEAN, RSTD, n_rows, n_cols, stride_x, eps,
                           HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
                           ONE_PASS: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                           CHECK: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < n_rows
    col_mask = cols < n_cols
    mask = row_mask[:, None] & col_mask[None, :]
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    k = tl.load(X + rows * stride_x, mask=row_mask, other=0.0).to(tl.float32)
    xs = tl.where(mask, x - k[:, None], 0.0)
    d = tl.sum(xs, axis=1) / n_cols
    var = tl.maximum(tl.sum(xs * xs, axis=1) / n_cols - d * d, 0.0)
    mean = k + d
    if CHECK:  # noqa: SIM102 (a constexpr cannot join a tensor condition with `and`)
        if tl.max((d * d > 16.0 * var).to(tl.int32), axis=0) > 0:
            xc = tl.where(mask, x - mean[:, None], 0.0)
            var = tl.sum(xc * xc, axis=1) / n_cols
    rstd = tl.rsqrt(var + eps)
    tl.store(MEAN + rows, mean, mask=row_mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)
    y = (x - mean[:, None]) * rstd[:, None]
    if HAS_WEIGHT:
        y = y * tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        y = y + tl.load(B + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + rows[:, None] * n_cols + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
