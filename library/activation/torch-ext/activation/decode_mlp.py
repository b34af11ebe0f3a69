"""The gated MLP at decode sizes: ``down(act(gate(x)) * up(x))`` for at most ``DECODE_ROWS``
tokens, as two matrix-vector kernels instead of three cuBLAS GEMMs and an activation kernel.

At batch 1 to 8 a decoding step's MLP is three matrix-vector products: every weight element is
read once and used for 1 to 8 multiply-adds, so the time is the time to read the weights. cuBLAS
reached about 60% of an H100's memory bandwidth there, plus a separate ``act(gate) * up``
launch. Here:

1. ``gated_gemv``: ``h[m, j] = act(x[m] . Wg[j] + bg[j]) * (x[m] . Wu[j] + bu[j])`` for every
   row ``m`` of ``x`` (``M <= 8``) and feature ``j < I``, reading each row of ``Wg`` and ``Wu``
   once for all ``M`` rows, fp32 accumulation, ``h`` rounded once to the input's dtype.
2. ``gemv``: ``out[m, n] = h[m] . Wd[n] + bd[n]``.

Both are one kernel (``_gemv_kernel``, specialised by ``GATED``). Weights are ``[N, K]`` in
``nn.Linear``'s layout, rows contiguous along ``K``. A program owns ``BLOCK_N`` output features
and walks ``K`` in ``BLOCK_K`` tiles (16-byte loads along the contiguous ``K``), keeping ``M``
accumulators per feature. Two ways to multiply a tile (``DOT``):

- multiply-adds (``DOT=False``): the products accumulate element-wise in an fp32 tile of
  ``BLOCK_N x BLOCK_M x BLOCK_K`` that is summed over ``K`` once, after the loop (no reduction
  across threads in the loop); its registers grow with ``M``, so it serves 1 or 2 rows;
- ``tl.dot`` (``DOT=True``): the tile times ``x``'s rows, padded to 16 (the smallest MMA), on the
  tensor cores, which keep up with the memory at any ``M <= 8``.

Where ``cdiv(N, BLOCK_N)`` programs are too few to keep every SM's loads in flight (the down
projection at 8 rows: 2048 outputs are 32 blocks of 64 on 132 SMs), ``K`` is split over ``SPLIT_K``
programs per block: each writes fp32 partial sums to a ``[SPLIT_K, parts, M, N]`` buffer
(``parts`` = 2 for gate and up) and ``_split_sum_kernel`` adds them in a fixed order, adds the
biases, applies ``act(gate) * up`` where gated, and rounds once. No atomics: results are the
same bits on every run. Everything is allocated with ``torch.empty`` and nothing waits for the
host, so a call can be captured in a CUDA graph.

Numerics: the module computes ``gate`` and ``up`` with two ``F.linear`` calls, each rounded to
the input's dtype, then ``act(gate) * up``; here ``gate`` and ``up`` stay fp32 up to the product,
which is rounded once (closer to the exact result; it can differ from the module's by a rounding
of the product). The down projection is rounded once, as ``F.linear`` rounds it.

A decoder layer's decode step (``kernels.generation``) folds its norms and residual adds in:
``norm_weight=`` and ``eps=`` (``gemv``, ``gated_gemv``, ``grouped_linear_decode``) take the
un-normalised residual stream as ``x`` and put its rows through Llama's RMSNorm in the kernel:
each program first sums its rows' squares over all of K (a pre-pass over a few KB of x from L2,
where a norm kernel would cost a launch), then normalises each x tile once as it is loaded,
rounded where ``LlamaRMSNorm`` and the norm library's kernel round (the normalised row to x's
dtype, then its product with the weight). ``residual=`` (``gemv``) adds a residual in the
epilogue (the split-K reduction's): the projection rounded, then the sum in fp32 rounded, the
bits of ``residual + F.linear(...)`` in x's dtype. Without them the kernels compile as before
(constexpr branches).

Configurations (``GemvConfig``) come from ``gemv_config``'s rule; ``candidate_configs`` lists
what ``benchmarks/decode_mlp.py --sweep`` times at each shape, to fix that rule from a GPU run.
"""

import functools
import os
from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ._compile_rule import OP, compile_side, sizes
from ._functions import GELU_TANH, SILU, activation
from ._library import (
    as_rows,
    cdiv,
    check_dtype,
    launch,
    multiprocessors,
    next_power_of_2,
    op_name,
    use_autograd_function,
)
from .gated import _torch_gated_pair

# The most tokens (rows of ``x``) the decode path takes; larger calls are GEMMs (cuBLAS).
DECODE_ROWS = 8

ACTIVATIONS = {"silu": SILU, "gelu_tanh": GELU_TANH}

# Without a GPU the kernels run through Triton's interpreter when TRITON_INTERPRET=1 is set
# (tests); otherwise CPU tensors take the PyTorch formula.
_CPU_RUNS_KERNELS = os.environ.get("TRITON_INTERPRET") == "1"

# Rows of x in a DOT tile: the smallest MMA's M (x's rows past M are masked off, never read).
_DOT_ROWS = 16

# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------


@triton.jit
def _zeros(BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr):
    """An accumulator: [BLOCK_N, BLOCK_M] for tl.dot, [BLOCK_N, BLOCK_M, BLOCK_K] products to be
    summed over K after the loop for multiply-adds (one row: [BLOCK_N, BLOCK_K])."""
    if DOT:
        acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    elif BLOCK_M == 1:
        acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    else:
        acc = tl.zeros((BLOCK_N, BLOCK_M, BLOCK_K), tl.float32)
    return acc


@triton.jit
def _accumulate(acc, w, x, BLOCK_M: tl.constexpr, DOT: tl.constexpr, INTERPRETED: tl.constexpr):
    """``acc`` plus the products of a weight tile ``w`` [BLOCK_N, BLOCK_K] and ``x``'s rows
    [BLOCK_M, BLOCK_K]."""
    if DOT and INTERPRETED:
        # Triton's interpreter (3.9) multiplies bf16 tiles as their raw 16-bit integers, so
        # there the tiles go in as fp32: products of 16-bit floats are exact in fp32 either
        # way, as in the GPU's MMA.
        acc = tl.dot(w.to(tl.float32), tl.trans(x.to(tl.float32)), acc, input_precision="ieee")
    elif DOT:
        acc = tl.dot(w, tl.trans(x), acc)
    elif BLOCK_M == 1:
        # One row: a 2-D tile, so that the loads' layout is the arithmetic's (no shuffles).
        acc += w.to(tl.float32) * x.to(tl.float32)
    else:
        acc += w.to(tl.float32)[:, None, :] * x.to(tl.float32)[None, :, :]
    return acc


@triton.jit
def _dot_products(acc, BLOCK_M: tl.constexpr, DOT: tl.constexpr):
    """The [BLOCK_N, BLOCK_M] dot products an accumulator holds."""
    if DOT:
        out = acc
    elif BLOCK_M == 1:
        out = tl.sum(acc, axis=1)[:, None]
    else:
        out = tl.sum(acc, axis=2)
    return out


@triton.jit
def _row_rstd(X, rows, M, K, stride_x, eps, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """rsqrt(mean(x * x) + eps) in fp32 of each of x's rows over all of K, [BLOCK_M] (0 for the
    padding rows past M, whose tiles are then zeros rather than 0 * inf)."""
    cols = tl.arange(0, BLOCK_K)
    x_rows = X + rows[:, None] * stride_x
    squares = tl.zeros((BLOCK_M, BLOCK_K), tl.float32)
    for k in tl.range(0, K, BLOCK_K):
        ks = k + cols
        mask = (rows < M)[:, None] & (ks < K)[None, :]
        x = tl.load(x_rows + ks[None, :], mask=mask, other=0.0).to(tl.float32)
        squares += x * x
    rstd = tl.rsqrt(tl.sum(squares, axis=1) / K + eps)
    return tl.where(rows < M, rstd, 0.0)


@triton.jit
def _normalized(x, rstd, nw):
    """Llama's RMSNorm of an x tile [BLOCK_M, BLOCK_K] as the norm library stores it (its
    ``_scale``, MODE _LLAMA, then the cast to the output): the normalised row rounded to x's
    dtype, times the weight ``nw`` (fp32, [BLOCK_K]) in fp32, rounded to x's dtype."""
    xhat = (x.to(tl.float32) * rstd[:, None]).to(x.dtype)
    return (xhat.to(tl.float32) * nw[None, :]).to(x.dtype)


@triton.jit
def _products(
    X,
    NW,
    wa_rows,
    wb_rows,
    n_mask,
    M,
    K,
    stride_x,
    k_start,
    k_end,
    eps,
    GATED: tl.constexpr,
    NORM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    DOT: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """The [BLOCK_N, BLOCK_M] dot products of the weight rows ``wa_rows`` (and ``wb_rows`` when
    GATED; else the second result is the first) with x's rows over K in [k_start, k_end); with
    NORM, with the rows of Llama's RMSNorm of x (weight ``NW`` [K], ``eps``) instead."""
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_K)
    x_rows = X + rows[:, None] * stride_x
    acc_a = _zeros(BLOCK_N, BLOCK_M, BLOCK_K, DOT)
    acc_b = _zeros(BLOCK_N, BLOCK_M, BLOCK_K, DOT)
    if NORM:
        # Each program sums its rows' squares over all of K itself (split-K programs too): a
        # pre-pass over x from L2 (M <= 8 rows of K: a few KB) before its first weight tile.
        # A norm kernel writing the normalised rows for this one to read would cost a launch
        # more a projection, and launch latency is what a decode step's small kernels pay.
        rstd = _row_rstd(X, rows, M, K, stride_x, eps, BLOCK_M, BLOCK_K)
    # k_per_split is a multiple of BLOCK_K, so a tile never straddles two splits and the masks
    # compare with K alone: K divisible by 16 (Triton specialises on it) keeps them constant
    # over 16 elements, and the loads 16-byte vectors.
    for k in tl.range(k_start, k_end, BLOCK_K, num_stages=NUM_STAGES):
        ks = k + cols
        k_mask = (ks < K)[None, :]
        x = tl.load(x_rows + ks[None, :], mask=(rows < M)[:, None] & k_mask, other=0.0)
        if NORM:
            # Once a loaded tile, for both weights when GATED.
            nw = tl.load(NW + ks, mask=ks < K, other=0.0).to(tl.float32)
            x = _normalized(x, rstd, nw)
        # The weights are read once: evict them first, keeping x (and what else shares L2).
        w_mask = n_mask[:, None] & k_mask
        wa = tl.load(wa_rows + ks[None, :], mask=w_mask, other=0.0, eviction_policy="evict_first")
        acc_a = _accumulate(acc_a, wa, x, BLOCK_M, DOT, INTERPRETED)
        if GATED:
            wb = tl.load(
                wb_rows + ks[None, :], mask=w_mask, other=0.0, eviction_policy="evict_first"
            )
            acc_b = _accumulate(acc_b, wb, x, BLOCK_M, DOT, INTERPRETED)
    a = _dot_products(acc_a, BLOCK_M, DOT)
    b = _dot_products(acc_b, BLOCK_M, DOT) if GATED else a
    return a, b


@triton.jit
def _projection_block(
    X,
    W,
    B,
    NW,
    OUT,
    block,
    M,
    N,
    K,
    stride_x,
    stride_w,
    eps,
    HAS_BIAS: tl.constexpr,
    NORM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    DOT: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """OUT[:, block's features] = x @ W[block's features].T (+ B), rounded once, over all K
    (x: its RMSNorm with weight NW when NORM)."""
    n = block * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    rows = tl.arange(0, BLOCK_M)
    w_rows = W + n.to(tl.int64)[:, None] * stride_w
    a, _ = _products(
        X, NW, w_rows, w_rows, n_mask, M, K, stride_x, 0, K, eps, False, NORM, BLOCK_M, BLOCK_N,
        BLOCK_K, NUM_STAGES, DOT, INTERPRETED,
    )  # fmt: skip
    if HAS_BIAS:
        a += tl.load(B + n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
    out = OUT + rows[None, :] * N + n[:, None]
    tl.store(out, a.to(OUT.dtype.element_ty), mask=n_mask[:, None] & (rows < M)[None, :])


@triton.jit
def _grouped_gemv_kernel(
    X,
    W0,
    W1,
    W2,
    B0,
    B1,
    B2,
    NW,
    O0,
    O1,
    O2,
    M,
    N0,
    N1,
    N2,
    K,
    stride_x,
    stride_w0,
    stride_w1,
    stride_w2,
    eps,
    HAS_BIAS: tl.constexpr,
    NORM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    DOT: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    # Three projections of one input (an attention's q, k and v) in one launch: programs
    # [0, blocks of N0) compute O0 = x @ W0.T (+ B0), the next cdiv(N1, BLOCK_N) O1, the rest
    # O2. Each program reads one block of one weight, as the plain kernel does; the launch is
    # what is saved (k and v of a grouped-query attention are small enough that their own
    # launches would cost latency rather than bandwidth). NORM: x's rows through Llama's RMSNorm
    # (weight NW) first, in each program (see _products).
    pid = tl.program_id(0)
    blocks0 = tl.cdiv(N0, BLOCK_N)
    blocks1 = tl.cdiv(N1, BLOCK_N)
    if pid < blocks0:
        _projection_block(
            X, W0, B0, NW, O0, pid, M, N0, K, stride_x, stride_w0, eps, HAS_BIAS, NORM, BLOCK_M,
            BLOCK_N, BLOCK_K, NUM_STAGES, DOT, INTERPRETED,
        )  # fmt: skip
    elif pid < blocks0 + blocks1:
        _projection_block(
            X, W1, B1, NW, O1, pid - blocks0, M, N1, K, stride_x, stride_w1, eps, HAS_BIAS, NORM,
            BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES, DOT, INTERPRETED,
        )  # fmt: skip
    else:
        _projection_block(
            X, W2, B2, NW, O2, pid - blocks0 - blocks1, M, N2, K, stride_x, stride_w2, eps,
            HAS_BIAS, NORM, BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES, DOT, INTERPRETED,
        )  # fmt: skip


@triton.jit
def _gemv_kernel(
    X,
    WA,
    WB,
    BA,
    BB,
    NW,
    R,
    OUT,
    M,
    N,
    K,
    stride_x,
    stride_wa,
    stride_wb,
    stride_r,
    k_per_split,
    eps,
    ACT: tl.constexpr,
    GATED: tl.constexpr,
    HAS_BA: tl.constexpr,
    HAS_BB: tl.constexpr,
    NORM: tl.constexpr,
    RESIDUAL: tl.constexpr,
    PARTIAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    DOT: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    # Program (i, s) computes output features [i*BLOCK_N, (i+1)*BLOCK_N) over K range
    # [s*k_per_split, (s+1)*k_per_split) for all M rows of x. A = the weight (the gate's when
    # GATED), B = the up projection's weight (GATED only). Without PARTIAL (one split) it writes
    # the result, act(a + ba) * (b + bb) or a + ba, in OUT's dtype; with PARTIAL it writes the
    # fp32 sums a (and b) to OUT[s, part, m, n] for _split_sum_kernel. NORM: x's rows through
    # Llama's RMSNorm (weight NW) first (see _products). RESIDUAL (not PARTIAL): the result
    # rounded, plus R's row m (row stride stride_r) in fp32, rounded again, which is what
    # ``residual + F.linear(...)`` stores.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    rows = tl.arange(0, BLOCK_M)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    # Row offsets in int64: a weight past 2^31 elements (a wide MLP) stays addressable.
    wa_rows = WA + n.to(tl.int64)[:, None] * stride_wa
    wb_rows = WB + n.to(tl.int64)[:, None] * stride_wb
    a, b = _products(
        X, NW, wa_rows, wb_rows, n_mask, M, K, stride_x, k_start, k_end, eps, GATED, NORM,
        BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES, DOT, INTERPRETED,
    )  # fmt: skip
    mask = n_mask[:, None] & (rows < M)[None, :]
    if PARTIAL:
        out = OUT + ((pid_k * (2 if GATED else 1)) * M + rows[None, :]) * N + n[:, None]
        tl.store(out, a, mask=mask)
        if GATED:
            tl.store(out + M * N, b, mask=mask)
    else:
        if HAS_BA:
            a += tl.load(BA + n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
        if GATED:
            if HAS_BB:
                b += tl.load(BB + n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
            a = activation(a, ACT) * b
        if RESIDUAL:
            r = tl.load(R + rows[None, :] * stride_r + n[:, None], mask=mask, other=0.0)
            a = a.to(OUT.dtype.element_ty).to(tl.float32) + r.to(tl.float32)
        out = OUT + rows[None, :] * N + n[:, None]
        tl.store(out, a.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _split_sum_kernel(
    P,
    BA,
    BB,
    R,
    OUT,
    M,
    N,
    stride_r,
    ACT: tl.constexpr,
    GATED: tl.constexpr,
    HAS_BA: tl.constexpr,
    HAS_BB: tl.constexpr,
    RESIDUAL: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # OUT[m, n] from the partial sums P[s, part, m, n], added in the order s = 0, 1, ... (the
    # same bits on every run), then the biases, act(a) * b where GATED, rounded once; with
    # RESIDUAL, plus R's row m (row stride stride_r) in fp32 and rounded again.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    n = offs % N
    parts: tl.constexpr = 2 if GATED else 1
    a = tl.load(P + offs, mask=mask, other=0.0)
    b = tl.load(P + M * N + offs, mask=mask, other=0.0) if GATED else a  # (b unused: a)
    for s in tl.static_range(1, SPLIT):
        a += tl.load(P + s * parts * M * N + offs, mask=mask, other=0.0)
        if GATED:
            b += tl.load(P + (s * parts + 1) * M * N + offs, mask=mask, other=0.0)
    if HAS_BA:
        a += tl.load(BA + n, mask=mask, other=0.0).to(tl.float32)
    if GATED:
        if HAS_BB:
            b += tl.load(BB + n, mask=mask, other=0.0).to(tl.float32)
        a = activation(a, ACT) * b
    if RESIDUAL:
        r = tl.load(R + (offs // N) * stride_r + n, mask=mask, other=0.0)
        a = a.to(OUT.dtype.element_ty).to(tl.float32) + r.to(tl.float32)
    tl.store(OUT + offs, a.to(OUT.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------------
# Configurations
# --------------------------------------------------------------------------------------------


class GemvConfig(NamedTuple):
    """How ``_gemv_kernel`` runs: ``block_n`` output features a program, ``block_k`` elements
    of K a loop step, ``split_k`` programs along K (more than 1: fp32 partial sums and
    ``_split_sum_kernel``), ``num_warps``, ``num_stages`` (software pipelining of the loop's
    loads; 1: none), ``dot`` (tl.dot on the tensor cores, else multiply-adds)."""

    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    dot: bool


# The rule's constants (see ``gemv_config``), from the sweep of every candidate
# (``candidate_configs``; benchmarks/decode_mlp.py, its results in benchmarks/results/h100/):
# at the Llama sizes swept the picks are close to the fastest candidate of each kernel. K is
# split only where a kernel has fewer weight tiles in flight than half the SMs (the tl.dot down
# projections): elsewhere the split's extra reduction cost more than it gained.
WEIGHT_BLOCKS_PER_SM = 0.5  # split K until blocks x weights x splits reach this many per SM
MAX_SPLIT_K = 8
FMA_ROWS = 1  # rows up to which multiply-adds are used; tl.dot above
FMA_TILE = (16, 512, 8, 3)  # (block_n, block_k, num_warps, num_stages): 32 elements a thread
DOT_TILE = (64, 128, 4, 4)

# Candidates for the sweep: (block_n, block_k, num_warps) tiles, each with these stages, and
# the split_k values between the rule's neighbours (``candidate_configs``).
FMA_TILES = ((8, 256, 4), (16, 256, 4), (32, 128, 4), (16, 512, 8), (32, 256, 8))
DOT_TILES = ((16, 128, 4), (32, 128, 4), (64, 128, 4), (32, 256, 4), (64, 64, 4), (64, 128, 8))
FMA_MAX_ROWS = 2  # multiply-add candidates up to this many rows (their registers grow with M)
FMA_STAGES = (1, 2, 3)
DOT_STAGES = (2, 3, 4)
SPLITS = (1, 2, 4, 8, 16)
# Registers for multiply-add accumulators, fp32 a thread (the kernel has 255 in all).
FMA_REGISTERS = 128
# Shared memory for the pipelined tl.dot tiles, below the 228 KB of a Hopper SM.
DOT_SHARED_BYTES = 160 * 1024


def _split_for(blocks: int, k: int, block_k: int, sms: int) -> int:
    """The fewest splits of K (a power of two up to MAX_SPLIT_K, each at least two tiles long)
    that give ``WEIGHT_BLOCKS_PER_SM * sms`` weight blocks in flight, ``blocks`` of them (blocks
    of output features times the weights each reads) unsplit."""
    split = 1
    while (
        blocks * split < WEIGHT_BLOCKS_PER_SM * sms
        and split < MAX_SPLIT_K
        and cdiv(k, 2 * split) >= 2 * block_k
    ):
        split *= 2
    return split


@functools.lru_cache(maxsize=1024)
def gemv_config(m: int, n: int, k: int, gated: bool, sms: int) -> GemvConfig:
    """The configuration for ``m`` rows of ``K = k`` into ``n`` outputs (``gated``: the gate and
    up projections together) on a GPU of ``sms`` SMs.

    The rule: multiply-adds for one row (no 16-row MMA padding, no shared-memory staging), tl.dot
    above (2-8 multiply-adds per loaded element would compete with the loads for issue slots);
    the tile ``FMA_TILE`` or ``DOT_TILE``; then split K in two until the weight blocks in flight
    (blocks of output features, twice for gate and up) reach ``WEIGHT_BLOCKS_PER_SM`` per SM, at
    most ``MAX_SPLIT_K`` splits of at least two tiles. On an H100 (132 SMs), bf16: one row, no
    split at any of the benchmarked shapes (2048/5632's down: 128 blocks of 16 features); eight
    rows, 2048/5632's down 32 blocks of 64, split 4; 4096/14336's down 64, split 2.
    """
    dot = m > FMA_ROWS
    block_n, block_k, num_warps, num_stages = DOT_TILE if dot else FMA_TILE
    split = _split_for(cdiv(n, block_n) * (2 if gated else 1), k, block_k, sms)
    return GemvConfig(block_n, block_k, split, num_warps, num_stages, dot)


def _fits(config: GemvConfig, m: int, gated: bool) -> bool:
    """Whether ``config``'s accumulators fit the registers (multiply-adds) or its pipelined
    tiles the shared memory (tl.dot)."""
    parts = 2 if gated else 1
    block_n, block_k, _, num_warps, num_stages, dot = config
    if dot:
        tile = (parts * block_n + _DOT_ROWS) * block_k * 2
        return num_stages * tile <= DOT_SHARED_BYTES
    per_thread = parts * next_power_of_2(m) * block_n * block_k // (32 * num_warps)
    return per_thread <= FMA_REGISTERS


def candidate_configs(m: int, n: int, k: int, gated: bool, sms: int) -> list[GemvConfig]:
    """Every configuration ``benchmarks/decode_mlp.py --sweep`` times at this shape: the tiles
    ``FMA_TILES`` (up to ``FMA_MAX_ROWS`` rows) and ``DOT_TILES``, each with its ``*_STAGES``, and each
    ``SPLITS`` value that gives between ``sms / 2`` and ``8 * sms`` programs (one split when
    even that is too many) with at least one tile of K per split; ``gemv_config``'s pick among
    them. Configurations whose accumulators or pipelined tiles do not fit are left out."""
    found = []
    kinds = [(False, FMA_TILES, FMA_STAGES)] if m <= FMA_MAX_ROWS else []
    kinds.append((True, DOT_TILES, DOT_STAGES))
    for dot, tiles, stages in kinds:
        for block_n, block_k, num_warps in tiles:
            blocks = cdiv(n, block_n)
            splits = [
                s
                for s in SPLITS
                if sms <= 2 * blocks * s <= 16 * sms and cdiv(k, s) >= block_k
                and cdiv(k, _k_per_split(k, s, block_k)) == s
            ]  # fmt: skip
            for split in splits or [1]:
                for num_stages in stages:
                    config = GemvConfig(block_n, block_k, split, num_warps, num_stages, dot)
                    if _fits(config, m, gated):
                        found.append(config)
    rule = gemv_config(m, n, k, gated, sms)
    return found if rule in found else [rule, *found]


def _k_per_split(k: int, split: int, block_k: int) -> int:
    """K elements a split covers: a whole number of tiles."""
    return cdiv(cdiv(k, split), block_k) * block_k


# --------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------


def _weight_rows(w: torch.Tensor) -> torch.Tensor:
    # nn.Linear's weights are contiguous; a weight whose rows are not is copied.
    return w if w.stride(-1) == 1 else w.contiguous()


def _norm_weight(what: str, x: torch.Tensor, k: int, norm_weight) -> torch.Tensor | None:
    """``norm_weight`` as the kernels read it (K contiguous elements), once checked against x."""
    if norm_weight is None:
        return None
    if tuple(norm_weight.shape) != (k,):
        raise ValueError(
            f"{what}: norm_weight has shape {tuple(norm_weight.shape)}; the RMSNorm of x's rows of "
            f"{k} takes a weight of shape ({k},) (the norm module's weight, not a projection's)"
        )
    if norm_weight.dtype != x.dtype or norm_weight.device != x.device:
        raise TypeError(
            f"{what}: norm_weight is {norm_weight.dtype} on {norm_weight.device}; it must have "
            f"x's dtype and device, {x.dtype} on {x.device} (pass norm_weight.to(x))"
        )
    return norm_weight if norm_weight.stride(0) == 1 else norm_weight.contiguous()


def _check_residual(what: str, residual: torch.Tensor, out: torch.Tensor) -> None:
    if tuple(residual.shape) != tuple(out.shape):
        raise ValueError(
            f"{what}: residual has shape {tuple(residual.shape)}; it is added to the output, of "
            f"shape {tuple(out.shape)} (x's leading dimensions, then the weight's rows)"
        )
    if residual.dtype != out.dtype or residual.device != out.device:
        raise TypeError(
            f"{what}: residual is {residual.dtype} on {residual.device}; it must have x's dtype "
            f"and device, {out.dtype} on {out.device} (pass residual.to(x))"
        )


def _launch_gemv(
    x,
    m,
    stride_x,
    wa,
    ba,
    wb,
    bb,
    act,
    out,
    config: GemvConfig | None,
    nw=None,
    eps=0.0,
    r=None,
    stride_r=0,
) -> None:
    """``out`` [m, N] = act(x @ wa.T + ba) * (x @ wb.T + bb) (``wb`` given) or
    x @ wa.T + ba, for ``x`` ``m`` rows of K, ``stride_x`` apart; with ``nw``, x's rows through
    Llama's RMSNorm of weight ``nw`` and ``eps`` first; with ``r`` (rows ``stride_r`` apart),
    the result rounded plus ``r``, rounded again."""
    gated = wb is not None
    n, k = wa.shape
    if config is None:
        config = gemv_config(m, n, k, gated, multiprocessors(out.device))
    block_n, block_k, split, num_warps, num_stages, dot = config
    k_per_split = _k_per_split(k, split, block_k)
    split = cdiv(k, k_per_split) if k else 1
    block_m = _DOT_ROWS if dot else next_power_of_2(m)
    # The kernels' arguments, each named as its parameter (``_library``'s "by name").
    wa = _weight_rows(wa)
    wb = _weight_rows(wb) if gated else wa
    stride_wa, stride_wb = wa.stride(0), wb.stride(0)
    PARTIAL = split > 1
    if PARTIAL:
        OUT = torch.empty((split, 2 if gated else 1, m, n), device=out.device, dtype=torch.float32)
    else:
        OUT = out
    HAS_BA, HAS_BB = ba is not None, bb is not None
    # wa: a placeholder for a bias that is not there (never read without HAS_BA / HAS_BB); x and
    # out, of the dtypes of a norm weight and a residual, for those (never read either).
    BA, BB = (ba if HAS_BA else wa), (bb if HAS_BB else wa)
    NORM = nw is not None
    NW = nw if NORM else x
    R = out if r is None else r
    RESIDUAL = r is not None and not PARTIAL  # split: _split_sum_kernel adds it
    eps = float(eps)
    INTERPRETED = _CPU_RUNS_KERNELS  # TRITON_INTERPRET=1: every launch runs in the interpreter
    args = (
        x, wa, wb, BA, BB, NW, R, OUT, m, n, k, stride_x, stride_wa, stride_wb, stride_r,
        k_per_split, eps, act, gated, HAS_BA, HAS_BB, NORM, RESIDUAL, PARTIAL, block_m, block_n,
        block_k, num_stages, dot, INTERPRETED,
    )  # fmt: skip
    launch(_gemv_kernel, (cdiv(n, block_n), split), args, num_warps, out.device)
    if PARTIAL:
        P, BLOCK = OUT, min(1024, next_power_of_2(m * n))
        BA, BB = (ba if HAS_BA else P), (bb if HAS_BB else P)  # P: placeholders, as above
        RESIDUAL = r is not None
        args = (
            P, BA, BB, R, out, m, n, stride_r, act, gated, HAS_BA, HAS_BB, RESIDUAL, split, BLOCK,
        )  # fmt: skip
        launch(_split_sum_kernel, (cdiv(m * n, BLOCK),), args, 4, out.device)


def gated_gemv(
    x,
    gate_weight,
    gate_bias,
    up_weight,
    up_bias,
    act: int,
    config=None,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
):
    """``act(F.linear(x, gate_weight, gate_bias)) * F.linear(x, up_weight, up_bias)`` for ``x``
    of at most ``DECODE_ROWS`` rows, gate and up in fp32 and the product rounded once, through
    the kernel (no checks of the weights: see ``gated_mlp_decode``); ``config`` overrides
    ``gemv_config``.

    ``norm_weight`` ([K], x's dtype and device): x is first put through Llama's RMSNorm
    (``LlamaRMSNorm(K, eps)`` with this weight, rounded as the norm library's kernel stores it)
    inside the kernel, which reads the un-normalised ``x`` (a decoder layer's residual stream)."""
    k = gate_weight.shape[1]
    nw = _norm_weight("gated_gemv", x, k, norm_weight)
    x2, m, stride_x = as_rows(x, k)
    out = x.new_empty((*x.shape[:-1], gate_weight.shape[0]))
    if out.numel():
        _launch_gemv(
            x2, m, stride_x, gate_weight, gate_bias, up_weight, up_bias, act, out, config, nw, eps
        )
    return out


def gemv(
    x,
    weight,
    bias,
    config=None,
    *,
    residual: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
):
    """``F.linear(x, weight, bias)`` for ``x`` of at most ``DECODE_ROWS`` rows, through the
    kernel (no checks of the weights: see ``gated_mlp_decode``); ``config`` overrides
    ``gemv_config``.

    ``residual`` (the output's shape, x's dtype and device; rows may be strided):
    ``residual + F.linear(x, weight, bias)``, the same bits as those two ops in x's dtype (the
    product rounded, then the sum in fp32 rounded), as one kernel (or the split-K reduction).
    ``norm_weight`` and ``eps``: x through Llama's RMSNorm first, as in ``gated_gemv``."""
    n, k = weight.shape
    nw = _norm_weight("gemv", x, k, norm_weight)
    x2, m, stride_x = as_rows(x, k)
    out = x.new_empty((*x.shape[:-1], n))
    r, stride_r = None, 0
    if residual is not None:
        _check_residual("gemv", residual, out)
        if out.numel():
            r, _, stride_r = as_rows(residual, n)
    if out.numel():
        _launch_gemv(
            x2, m, stride_x, weight, bias, None, None, SILU, out, config, nw, eps, r, stride_r
        )
    return out


def grouped_linear_decode(
    x, weights, biases, config=None, *, norm_weight: torch.Tensor | None = None, eps: float = 0.0
) -> tuple[torch.Tensor, ...]:
    """``tuple(F.linear(x, w, b) for w, b in zip(weights, biases))`` for three weights of one
    input (an attention's q, k and v projections) in one launch, for ``x`` of at most
    ``DECODE_ROWS`` rows: each output rounded once from fp32 sums, as ``F.linear`` rounds.

    ``weights``: three ``[N_i, K]`` tensors in ``nn.Linear``'s layout, of ``x``'s dtype (fp16
    or bf16) and device; ``biases``: three of shape ``[N_i]``, or None for none. ``config``
    overrides ``gemv_config``'s (split-K is not used: every program covers all of K). No checks
    beyond these shapes: the caller (``kernels.generation``) decides which calls take it.

    ``norm_weight`` ([K], x's dtype and device) and ``eps``: the three project Llama's RMSNorm
    of x (a decoder layer's input norm, computed in the kernel as in ``gated_gemv``) instead."""
    if len(weights) != 3 or (biases is not None and len(biases) != 3):
        raise ValueError("grouped_linear_decode: three weights (and three biases, or None)")
    k = x.shape[-1]
    for w in weights:
        if w.dim() != 2 or w.shape[1] != k or w.dtype != x.dtype or w.device != x.device:
            raise ValueError(
                f"grouped_linear_decode: a weight of shape {tuple(w.shape)}, {w.dtype} on "
                f"{w.device} does not take x of shape {tuple(x.shape)}, {x.dtype} on {x.device}"
            )
    nw = _norm_weight("grouped_linear_decode", x, k, norm_weight)
    X, m, stride_x = as_rows(x, k)
    outs = tuple(x.new_empty((*x.shape[:-1], w.shape[0])) for w in weights)
    if not X.numel():
        return outs
    ns = [w.shape[0] for w in weights]
    if config is None:
        config = gemv_config(m, sum(ns), k, False, multiprocessors(x.device))
    block_n, block_k, _, num_warps, num_stages, dot = config
    blocks = sum(cdiv(n, block_n) for n in ns)
    # The kernel's arguments, each named as its parameter (``_library``'s "by name").
    w0, w1, w2 = (_weight_rows(w) for w in weights)
    HAS_BIAS = biases is not None
    b0, b1, b2 = biases if HAS_BIAS else (w0, w0, w0)  # w0: placeholders, never read
    o0, o1, o2 = outs
    n0, n1, n2 = ns
    stride_w0, stride_w1, stride_w2 = w0.stride(0), w1.stride(0), w2.stride(0)
    NORM = nw is not None
    NW = nw if NORM else X  # X: a placeholder of a norm weight's dtype, never read
    eps = float(eps)
    BLOCK_M = _DOT_ROWS if dot else next_power_of_2(m)
    INTERPRETED = _CPU_RUNS_KERNELS  # TRITON_INTERPRET=1: every launch runs in the interpreter
    args = (
        X, w0, w1, w2, b0, b1, b2, NW, o0, o1, o2, m, n0, n1, n2, k, stride_x, stride_w0,
        stride_w1, stride_w2, eps, HAS_BIAS, NORM, BLOCK_M, block_n, block_k, num_stages, dot,
        INTERPRETED,
    )  # fmt: skip
    launch(_grouped_gemv_kernel, (blocks,), args, num_warps, x.device)
    return outs


# --------------------------------------------------------------------------------------------
# The MLP: checks, formula, op
# --------------------------------------------------------------------------------------------


def kernels_run_on(device: torch.device) -> bool:
    """Whether the kernels run on ``device``: CUDA, or the CPU through Triton's interpreter."""
    return device.type == "cuda" or (device.type == "cpu" and _CPU_RUNS_KERNELS)


def takes_decode_kernels(x: torch.Tensor) -> bool:
    """Whether ``x`` is one the decode kernels take: fp16 or bf16, at most ``DECODE_ROWS``
    rows, on a device they run on (fp32 and larger calls are left to cuBLAS). Under
    ``torch.compile`` with dynamic shapes the size test becomes a guard of the graph."""
    if x.dtype not in (torch.float16, torch.bfloat16) or x.dim() == 0:
        return False
    hidden = x.shape[-1]
    return hidden > 0 and x.numel() // hidden <= DECODE_ROWS and kernels_run_on(x.device)


def _check(x, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias) -> None:
    tensors = (x, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias)
    for t in tensors:
        if t is not None:
            check_dtype("gated_mlp_decode", t)
            if t.dtype != x.dtype or t.device != x.device:
                raise TypeError(
                    "gated_mlp_decode: every tensor must have x's dtype and device; got "
                    f"{t.dtype} on {t.device} beside x's {x.dtype} on {x.device}"
                )
    hidden, inter = x.shape[-1], gate_weight.shape[0]
    shapes = {
        "gate_weight": (gate_weight.shape, (inter, hidden)),
        "up_weight": (up_weight.shape, (inter, hidden)),
        "down_weight": (down_weight.shape, (down_weight.shape[0], inter)),
        "gate_bias": (None if gate_bias is None else gate_bias.shape, (inter,)),
        "up_bias": (None if up_bias is None else up_bias.shape, (inter,)),
        "down_bias": (None if down_bias is None else down_bias.shape, (down_weight.shape[0],)),
    }
    for name, (shape, want) in shapes.items():
        if shape is not None and tuple(shape) != want:
            raise ValueError(
                f"gated_mlp_decode: {name} has shape {tuple(shape)}; x's last dimension {hidden} "
                f"and gate_weight {tuple(gate_weight.shape)} need {want}"
            )


def _decode_mlp(x, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias, act):
    """The two kernels (``takes_decode_kernels(x)`` holds)."""
    _check(x, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias)
    h = gated_gemv(x, gate_weight, gate_bias, up_weight, up_bias, act)
    return gemv(h, down_weight, down_bias)


def _torch_mlp(x, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias, act):
    """The formula in PyTorch ops (``swiglu_mlp``'s under compile): the projections rounded to
    the input's dtype, ``act(gate) * up`` in fp32 rounded once."""
    gate = F.linear(x, gate_weight, gate_bias)
    up = F.linear(x, up_weight, up_bias)
    return F.linear(_torch_gated_pair(gate, up, act), down_weight, down_bias)


def _forward(x, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias, act):
    """The kernels where they take ``x``, else the formula."""
    tensors = (x, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias)
    if takes_decode_kernels(x):
        return _decode_mlp(*tensors, act)
    return _torch_mlp(*tensors, act)


@torch.library.custom_op(op_name("gated_mlp_decode"), mutates_args=())
def decode_mlp_op(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    gate_bias: torch.Tensor | None,
    up_weight: torch.Tensor,
    up_bias: torch.Tensor | None,
    down_weight: torch.Tensor,
    down_bias: torch.Tensor | None,
    act: int,
) -> torch.Tensor:
    return _forward(x, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias, act)


@decode_mlp_op.register_fake
def _(x, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias, act):
    return x.new_empty((*x.shape[:-1], down_weight.shape[0]))


def gated_mlp_decode(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    gate_bias: torch.Tensor | None,
    up_weight: torch.Tensor,
    up_bias: torch.Tensor | None,
    down_weight: torch.Tensor,
    down_bias: torch.Tensor | None,
    activation: str = "silu",
) -> torch.Tensor:
    """``F.linear(act(F.linear(x, gate_weight, gate_bias)) * F.linear(x, up_weight, up_bias),
    down_weight, down_bias)`` with ``act`` = ``activation``: ``"silu"`` or ``"gelu_tanh"``
    (``F.gelu(approximate="tanh")``), through two matrix-vector kernels when ``x`` has at most
    ``DECODE_ROWS`` (8) rows (``x.numel() // x.shape[-1]``, any leading shape).

    The kernels take float16 and bfloat16 on a CUDA device (or the CPU under
    ``TRITON_INTERPRET=1``), every tensor of ``x``'s dtype and device, weights in
    ``nn.Linear``'s ``[out, in]`` layout; biases may be None. ``gate`` and ``up`` stay fp32 up to
    ``act(gate) * up``, which is rounded once to ``x``'s dtype (the module calls round each
    projection first: results can differ by a rounding there); the output is rounded once.
    Results are the same bits on every run (no atomics), and a call can be captured in a CUDA
    graph.

    Under ``torch.compile`` (transformers' compiled static-cache decode, for one) a call of
    decode size that needs no backward is the op ``gated_mlp_decode``, which inductor
    leaves to these kernels: for this shape inductor would make the three cuBLAS matmuls, which
    the kernels beat (1.05-1.20x on an H100, `benchmarks/decode_mlp.py`).

    Other inputs (float32, more rows, a CPU without the interpreter) and calls that need a backward (gradients enabled and a tensor that requires
    them) take the same formula in PyTorch ops (the projections rounded to the input's dtype,
    then ``act(gate) * up`` in fp32 rounded once, as ``swiglu_mlp`` under compile).
    """
    act = ACTIVATIONS.get(activation)
    if act is None:
        raise ValueError(
            f"gated_mlp_decode: activation must be one of {sorted(ACTIVATIONS)}; got {activation!r}"
        )
    tensors = (x, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias)
    if use_autograd_function(*tensors):
        return _torch_mlp(*tensors, act)
    if torch.compiler.is_compiling():
        if takes_decode_kernels(x) and compile_side("gated_mlp_decode", *sizes(x), False) == OP:
            return decode_mlp_op(*tensors, act)
        return _torch_mlp(*tensors, act)
    return _forward(*tensors, act)
