"""The norms' weight-gradient reduction: the backward kernels leave one fp32 row of partial sums
per program, summed here in one launch."""

import torch
import triton
import triton.language as tl

from ._library import cdiv, launch


@triton.jit
def _sum_partials_kernel(
    P, OUT, n_partials, n_cols, stride_p, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr
):
    # OUT[c] = sum over p of P[p, c], in fp32, cast to OUT's dtype. Each program owns BLOCK_N
    # columns and walks the partial rows (stride_p apart) BLOCK_P at a time.
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    for first in range(0, n_partials, BLOCK_P):
        rows = first + tl.arange(0, BLOCK_P)
        mask = (rows < n_partials)[:, None] & col_mask[None, :]
        acc += tl.load(P + rows[:, None] * stride_p + cols[None, :], mask=mask, other=0.0)
    tl.store(OUT + cols, tl.sum(acc, axis=0).to(OUT.dtype.element_ty), mask=col_mask)


def sum_partials(partials: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``partials.sum(0).to(dtype)`` for an fp32 [programs, n_cols] tensor with contiguous rows,
    in one launch. 64 columns a program (256-byte row segments) gives 64 programs for 4096
    columns; 64 x 64 tiles (16 fp32 a thread with 4 warps) keep several rows' loads in flight."""
    n_partials, n_cols = partials.shape
    out = partials.new_empty(n_cols, dtype=dtype)
    grid = (cdiv(n_cols, 64),)
    # The kernel's arguments, each named as its parameter (``_library``'s "by name").
    P, stride_p = partials, partials.stride(0)
    BLOCK_P = BLOCK_N = 64
    args = (P, out, n_partials, n_cols, stride_p, BLOCK_P, BLOCK_N)
    launch(_sum_partials_kernel, grid, args, 4, partials.device)
    return out
