"""Cross-entropy over a vocabulary, fused with the ``lm_head`` projection that makes the logits.

``fused_linear_cross_entropy(hidden, weight, labels)`` is ``F.cross_entropy(hidden @ weight.T,
labels)`` (with a bias, soft-capping, label smoothing, ``ignore_index`` and a given denominator)
without ever holding the logits of every token. The tokens are taken in chunks; for each chunk:

1. ``logits = hidden_chunk @ weight.T (+ bias)``, one cuBLAS matmul in the input dtype into a
   buffer reused by every chunk;
2. Triton reduces each row to its log-sum-exp and loss and overwrites the row, in place, with
   d(loss)/d(logits) (softmax minus the smoothed one-hot, times the reduction's scale, times
   the soft-cap's derivative): one kernel, a program a row, where the chunk has rows enough to
   fill the GPU; else two, statistics then gradient, with each row split between programs;
3. ``grad_hidden_chunk = grad_logits @ weight`` and ``grad_weight += grad_logits.T @
   hidden_chunk`` (``grad_bias += grad_logits.sum(0)``), matmuls again.

Where the weight's gradient is wanted, the first chunk (as many tokens as the hidden size) is
the *resident* one: its logits are held in the weight gradient's own buffer, before that
gradient is written, so that these tokens cost what torch.compile's three whole matmuls cost,
without memory beyond Liger's. The chunks after it hold up to the weight gradient's size in
logits (as many tokens as the hidden size), less where free memory is short: the loss's
transient memory is at most about twice the weight gradient, where torch.compile holds every
token's logits ("the chunk plan" below).

The gradients are made in the forward (the loss is the last op of a training step, so its
backward follows at once) and only scaled by the loss's gradient in the backward, as
Liger-Kernel's fused linear cross-entropy does. ``cross_entropy(logits, labels)`` runs the same
row kernels on logits that already exist (step 2 alone), writing the gradient to a new tensor
of the logits' dtype rather than into them.

The file reads top to bottom: the Triton kernels, then the launchers (chunk size, the chunk
loop), then the eager autograd functions, then the ``torch.library`` ops torch.compile sees,
then the public functions.
"""

import functools
import os

import torch
import triton
import triton.language as tl

from ._compile_rule import OP, compile_side, sizes
from ._library import (
    cdiv,
    check_dtype,
    launch,
    multiprocessors,
    next_power_of_2,
    op_name,
    use_autograd_function,
)

MEAN, SUM, NONE = 0, 1, 2
REDUCTIONS = {"mean": MEAN, "sum": SUM, "none": NONE}

# Without a GPU the kernels run through Triton's interpreter when TRITON_INTERPRET=1 is set
# (tests); otherwise CPU tensors take the PyTorch formula.
_CPU_RUNS_KERNELS = os.environ.get("TRITON_INTERPRET") == "1"

# ---- the chunk plan -----------------------------------------------------------------------
#
# A chunk's logits are the loss's only large transient (the gradient overwrites them). Their
# budget is the size of the weight's gradient (vocab x hidden elements of the gradient's dtype,
# CHUNK_WEIGHT_SHARE of it): with the gradient itself, which every fused loss holds, the loss's
# transient memory is at most about twice the weight gradient. That is one-pass chunks of as
# many tokens as the hidden size (twice that many half-precision tokens with an fp32 gradient
# buffer): long enough that each chunk's weight-gradient update (a matmul over the chunk's
# tokens) is bound by compute rather than by its read-modify-write of the gradient. The budget
# is never below Liger-Kernel's (logits no larger than the hidden states: chunks of
# next_power_of_2(ceil(tokens / ceil(vocab / hidden))) tokens, the larger budget where there
# are more tokens than vocabulary entries) and is capped by FREE_MEMORY_SHARE of the device
# memory still free (torch.cuda.mem_get_info, plus what PyTorch's allocator holds unused;
# CPU_CHUNK_BYTES on the CPU, where the interpreter runs tiny shapes), so that where memory is
# short the plan falls back towards Liger's. CHUNK_WEIGHT_SHARE = 0 keeps to Liger's budget
# outright (the loss's peak memory then never above Liger's). The budget is spent in one of
# two ways:
#
# - one pass: chunks of that many tokens over the whole vocabulary. Each chunk's three matmuls
#   read the whole weight (and the weight's gradient is read and written), so where the chunks
#   are short (Liger's budget at a large vocabulary over a small hidden size: 32 tokens a chunk
#   at 4096 x 2048 -> 262144) the loss is bound by memory bandwidth, far from the matmuls' peak;
# - two passes: chunks of many tokens (up to 4096) over tiles of the vocabulary (at least
#   MIN_TILE columns) that fit the same budget, with an fp32 accumulator for the chunk's
#   hidden-state gradient (at most half the budget). A first pass over the tiles reduces each
#   row to its log-sum-exp (logits computed and dropped), a second recomputes each tile's
#   logits (but the last tile's, still in the buffer) and turns them into gradients. A third
#   more matmul work, but each chunk reads the weight three times for thousands of tokens, and
#   the weight's gradient is accumulated over few chunks (each rounding once to the weight's
#   dtype). With the whole budget one pass wins at every shape of benchmarks/loss.py; two
#   passes are for a budget that free memory (or CHUNK_WEIGHT_SHARE) has cut short.
#
# Before either, where the weight's gradient is wanted and the plan is not forced, the resident
# plan takes the first tokens: the gradient's own buffer (vocab x hidden, in the weight's dtype)
# is free until the gradient is written, and holds the logits of as many tokens as the hidden
# size (`resident_rows`; twice that many in an fp32 buffer). Those tokens get torch.compile's
# program inside that buffer: one projection over the whole vocabulary (their logits held
# transposed, vocabulary-major, so that the weight's gradient can later be written over logits
# already used), the row statistics and gradient by two kernels that read the logits a tile
# of tokens at a time, one matmul for the hidden states' gradient, and the weight's gradient a
# tile of vocabulary entries at a time, each written once, in place, summed over every token in
# fp32 inside the matmul. No logits are computed twice and the weight's gradient is not read
# back; nothing beyond Liger's budget is allocated (the last tile's logits sit in a temporary
# of that size), so with at most hidden-size tokens (4096 x 4096 -> 262144) the loss is three
# matmuls and three memory-bound passes, as compile's is, within Liger's memory. With more,
# the chunks above take the rest and accumulate into the gradient the resident chunk wrote.
#
# The plan with the lower cost, matmul FLOPs + FLOPS_PER_BYTE x bytes of weight traffic, is
# taken; FLOPS_PER_BYTE is the ratio of bf16 matmul throughput to memory bandwidth of the GPUs
# we target (the achieved matmul TFLOP/s over the memory TB/s of Hopper GPUs). The two add up
# rather than overlap: the weight-gradient update of a short chunk is a matmul bound by memory,
# run between matmuls bound by compute, which is why one pass in short chunks (Liger's plan)
# is much slower than torch.compile's three whole matmuls at a large vocabulary, though its
# matmuls alone would take about as long. The chunks are evened out (17 chunks of 242 tokens
# rather than 16 of 256 and one of 4). ``chunk_size=`` (tokens) and ``vocab_chunk=`` (columns;
# the vocabulary size or more is one pass) override the plan, for less memory or more.
#
# The chunk budget as a share of the weight gradient's bytes; 0 keeps to Liger's (the README
# shows how to set it). Read at every call.
CHUNK_WEIGHT_SHARE = 1.0
FREE_MEMORY_SHARE = 0.5
CPU_CHUNK_BYTES = 64 * 2**20
FLOPS_PER_BYTE = 200
TWO_PASS_ROWS = (4096, 2048, 1024, 512, 256)
MIN_TILE = 1024
TILE_ALIGN = 256
TWO_PASS_MARGIN = 0.9  # two passes only where the model expects them 10% faster or more

# ---- the row kernels ----------------------------------------------------------------------
#
# A row of logits is split between several programs (SPLIT_PROGRAMS_PER_SM programs a
# multiprocessor over the chunk), so that a chunk of few rows (a large vocabulary) still keeps
# every multiprocessor streaming. Each program walks its span of the row in BLOCK columns.
BLOCK = 4096
BLOCK_WARPS = 8  # 16 elements a thread: two 16-byte loads of bf16
SPLIT_PROGRAMS_PER_SM = 4
# Chunks of at least FUSED_ROWS_PER_SM whole rows a multiprocessor take one kernel, a program
# a row, rather than the two above (statistics, then gradient).
FUSED_ROWS_PER_SM = 1
CPU_BLOCK = 256  # the interpreter: small blocks, so that odd vocabularies span several
CPU_BLOCK_WARPS = 4
# The transposed kernels of the resident plan: [COL_BLOCK_V, COL_BLOCK_N] tiles (vocabulary
# entries x tokens, tokens contiguous), split over the vocabulary like the row kernels.
COL_BLOCK_V = 64
COL_BLOCK_N = 64
COL_WARPS = 8
CPU_COL_BLOCK = 16
SCALE_BLOCK = 4096
SCALE_PROGRAMS_PER_SM = 8

# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------


@triton.jit
def _tanh(u):
    # tanh(u) = 1 - 2 / (exp(2u) + 1): exact at both ends (exp overflows to inf: 1; underflows
    # to 0: -1); near 0 its absolute error is an fp32 rounding, which is what soft-capped
    # logits (cap * tanh(x / cap)) need.
    return 1.0 - 2.0 / (tl.exp(2.0 * u) + 1.0)


@triton.jit
def _softcapped(z, softcap, HAS_SOFTCAP: tl.constexpr):
    # The logit the loss sees: softcap * tanh(z / softcap) with soft-capping, else z itself.
    if HAS_SOFTCAP:
        z = softcap * _tanh(z / softcap)
    return z


@triton.jit
def _stats_logits(z, mask, total, softcap, HAS_SOFTCAP: tl.constexpr, SMOOTHING: tl.constexpr):
    # A loaded block of logits made ready for the softmax statistics, in either layout:
    # soft-capped, added to the smoothing sums ``total`` (masked lanes add 0), and -inf where
    # masked, so that they add nothing to the maximum or the sums of exponentials.
    z = _softcapped(z, softcap, HAS_SOFTCAP)
    if SMOOTHING:
        total += tl.where(mask, z, 0.0)
    return tl.where(mask, z, float("-inf")), total


@triton.jit
def _token_loss(lse, zy, z_sum, y, vocab, label_smoothing, SMOOTHING: tl.constexpr):
    # loss = lse - (1 - eps) z[y] - eps / V sum_j z_j (z_sum: the sum of a token's z, read
    # only with label smoothing); NaN for a label outside [0, V) that is not ignore_index.
    loss = lse - (1.0 - label_smoothing) * zy
    if SMOOTHING:
        loss -= label_smoothing / vocab * z_sum
    return tl.where((y < 0) | (y >= vocab), float("nan"), loss)


@triton.jit
def _stats_step(
    x_row,
    first,
    end,
    m,
    s,
    total,
    softcap,
    HAS_SOFTCAP: tl.constexpr,
    SMOOTHING: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # One block of a row's online softmax statistics: columns [first, first + BLOCK) below end
    # of the (soft-capped) logits z fold into the running maximum m, the per-lane sums s of
    # exp(z - m) (rescaled when m grows: one cross-lane maximum and one exp an element) and,
    # with label smoothing, the per-lane sums of z.
    cols = first + tl.arange(0, BLOCK)
    mask = cols < end
    z = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    z, total = _stats_logits(z, mask, total, softcap, HAS_SOFTCAP, SMOOTHING)
    m_new = tl.maximum(m, tl.max(z, axis=0))
    s = s * tl.exp(m - m_new) + tl.exp(z - m_new)
    return m_new, s, total


@triton.jit
def _grad_step(
    x_row,
    dx_row,
    cols,
    end,
    label_col,
    lse,
    eps,
    label_smoothing,
    scale,
    softcap,
    HAS_SOFTCAP: tl.constexpr,
):
    # One block of a row's gradient, written over columns ``cols`` below end:
    # (softmax - eps / V - (1 - eps) [j == y]) * scale * dz/dx.
    mask = cols < end
    z = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_SOFTCAP:
        t = _tanh(z / softcap)
        z = softcap * t
    g = tl.exp(z - lse) - eps
    g = tl.where(cols == label_col, g - (1.0 - label_smoothing), g) * scale
    if HAS_SOFTCAP:
        g = g * (1.0 - t * t)
    tl.store(dx_row + cols, g.to(dx_row.dtype.element_ty), mask=mask)


@triton.jit
def _zero_span(dx_row, start, end, BLOCK: tl.constexpr):
    # An ignored row's gradient: zeros over columns [start, end).
    for first in range(start, end, BLOCK):
        cols = first + tl.arange(0, BLOCK)
        tl.store(dx_row + cols, tl.zeros([BLOCK], dx_row.dtype.element_ty), mask=cols < end)


@triton.jit
def _row_stats_kernel(
    X,
    LABELS,
    M_PART,
    S_PART,
    SUM_PART,
    ZY,
    row_start,
    col_start,
    n_cols,
    stride_x,
    span,
    part_offset,
    parts_stride,
    ignore_index,
    softcap,
    HAS_SOFTCAP: tl.constexpr,
    SMOOTHING: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # X holds columns [col_start, col_start + n_cols) of the vocabulary (all of it, or one
    # tile of a two-pass chunk). Program (row, split) reduces the columns [split * span,
    # (split + 1) * span) of its row of (soft-capped) logits z to their maximum m and the sum
    # of exp(z - m), online: each block takes one cross-lane maximum and one exp an element
    # (the sum is kept per lane and reduced once at the end), so the exponentials stay under
    # the bandwidth of the loads. With label smoothing it also sums z. The results go to slot
    # part_offset + split of the row's parts_stride slots; a split past the end of a narrower
    # tile stores the neutral (-1e30, 0, 0). The program whose columns hold the row's label
    # stores z[label]. Rows whose label is ignore_index are skipped: their loss and gradient
    # are zero.
    row = tl.program_id(0)
    split = tl.program_id(1)
    y = tl.load(LABELS + row_start + row)
    if y == ignore_index:
        return
    start = split * span
    end = tl.minimum(start + span, n_cols)
    x_row = X + row.to(tl.int64) * stride_x
    # A large finite floor rather than -inf, so that the first block's rescaling
    # exp(m - m_new) is exp(-huge) = 0, never exp(-inf - -inf).
    m = -1.0e30
    s = tl.zeros([BLOCK], tl.float32)
    total = tl.zeros([BLOCK], tl.float32)
    for first in range(start, end, BLOCK):
        m, s, total = _stats_step(
            x_row, first, end, m, s, total, softcap, HAS_SOFTCAP, SMOOTHING, BLOCK
        )
    part = row * parts_stride + part_offset + split
    tl.store(M_PART + part, m)
    tl.store(S_PART + part, tl.sum(s, axis=0))
    if SMOOTHING:
        tl.store(SUM_PART + part, tl.sum(total, axis=0))
    label_col = y - col_start
    if (label_col >= start) & (label_col < end):
        zy = _softcapped(tl.load(x_row + label_col).to(tl.float32), softcap, HAS_SOFTCAP)
        tl.store(ZY + row, zy)


@triton.jit
def _loss_grad_kernel(
    X,
    DX,
    LABELS,
    M_PART,
    S_PART,
    SUM_PART,
    ZY,
    LOSS,
    SCALE,
    row_start,
    col_start,
    n_cols,
    vocab,
    stride_x,
    stride_dx,
    span,
    parts_stride,
    scale_stride,
    ignore_index,
    label_smoothing,
    softcap,
    HAS_SOFTCAP: tl.constexpr,
    SMOOTHING: tl.constexpr,
    WRITE_LOSS: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # With lse the row's log-sum-exp (from the parts_stride partial sums _row_stats_kernel
    # left for the row), eps the smoothing and V the vocabulary:
    #   loss = lse - (1 - eps) z[y] - eps / V sum_j z_j
    #   dloss/dx_j = (softmax_j - eps / V - (1 - eps) [j == y]) * scale * dz_j/dx_j
    # with dz/dx = 1 - tanh^2(x / cap) under soft-capping, 1 otherwise. ``scale`` is the
    # reduction's (1 / number of items for a mean, 1 for a sum) or, recomputing for
    # reduction="none", the row's own gradient. With WRITE_LOSS split 0 of each row writes
    # the loss; with COMPUTE_GRAD every split overwrites its span of the columns X holds
    # ([col_start, col_start + n_cols) of the vocabulary) with their gradient (X and DX may be
    # the same memory: each element is read, then written, by one program). A label outside
    # [0, V) that is not ignore_index gives a NaN loss.
    row = tl.program_id(0)
    split = tl.program_id(1)
    y = tl.load(LABELS + row_start + row)
    start = split * span
    end = tl.minimum(start + span, n_cols)
    dx_row = DX + row.to(tl.int64) * stride_dx
    if y == ignore_index:
        if WRITE_LOSS:  # noqa: SIM102  (compiled in or out; then a test at run time)
            if split == 0:
                tl.store(LOSS + row_start + row, 0.0)
        if COMPUTE_GRAD:
            _zero_span(dx_row, start, end, BLOCK)
        return
    parts = tl.arange(0, SPLITS)
    part_mask = parts < parts_stride
    row_parts = row * parts_stride + parts
    part_max = tl.load(M_PART + row_parts, mask=part_mask, other=float("-inf"))
    part_sum = tl.load(S_PART + row_parts, mask=part_mask, other=0.0)
    row_max = tl.max(part_max, axis=0)
    lse = row_max + tl.log(tl.sum(part_sum * tl.exp(part_max - row_max), axis=0))
    eps = label_smoothing / vocab
    if WRITE_LOSS:  # noqa: SIM102  (compiled in or out; then a test at run time)
        if split == 0:
            z_sum = 0.0
            if SMOOTHING:
                z_sum = tl.sum(tl.load(SUM_PART + row_parts, mask=part_mask, other=0.0), axis=0)
            loss = _token_loss(lse, tl.load(ZY + row), z_sum, y, vocab, label_smoothing, SMOOTHING)
            tl.store(LOSS + row_start + row, loss)
    if COMPUTE_GRAD:
        scale = tl.load(SCALE + (row_start + row).to(tl.int64) * scale_stride).to(tl.float32)
        x_row = X + row.to(tl.int64) * stride_x
        label_col = y - col_start
        for first in range(start, end, BLOCK):
            cols = first + tl.arange(0, BLOCK)
            _grad_step(
                x_row, dx_row, cols, end, label_col, lse, eps, label_smoothing, scale, softcap,
                HAS_SOFTCAP,
            )  # fmt: skip


@triton.jit
def _row_loss_grad_kernel(
    X,
    DX,
    LABELS,
    LOSS,
    SCALE,
    row_start,
    n_cols,
    stride_x,
    stride_dx,
    scale_stride,
    ignore_index,
    label_smoothing,
    softcap,
    HAS_SOFTCAP: tl.constexpr,
    SMOOTHING: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # _row_stats_kernel and _loss_grad_kernel in one program a row, for chunks of whole rows
    # (the vocabulary) with enough rows to fill the GPU without splitting them: the row is
    # reduced to its log-sum-exp, then walked again backwards for the gradient, so that the
    # blocks read last in the first walk, the likeliest still in L2, are read first in the
    # second. One launch, no partial sums, and part of the second read from L2 rather than
    # memory. Same formulas and the same fp32 arithmetic as the two kernels.
    row = tl.program_id(0)
    y = tl.load(LABELS + row_start + row)
    x_row = X + row.to(tl.int64) * stride_x
    dx_row = DX + row.to(tl.int64) * stride_dx
    if y == ignore_index:
        tl.store(LOSS + row_start + row, 0.0)
        if COMPUTE_GRAD:
            _zero_span(dx_row, 0, n_cols, BLOCK)
        return
    m = -1.0e30  # as in _row_stats_kernel: the first rescaling is exp(-huge) = 0
    s = tl.zeros([BLOCK], tl.float32)
    total = tl.zeros([BLOCK], tl.float32)
    for first in range(0, n_cols, BLOCK):
        m, s, total = _stats_step(
            x_row, first, n_cols, m, s, total, softcap, HAS_SOFTCAP, SMOOTHING, BLOCK
        )
    lse = m + tl.log(tl.sum(s, axis=0))
    in_range = (y >= 0) & (y < n_cols)
    zy = tl.load(x_row + tl.where(in_range, y, 0)).to(tl.float32)
    zy = _softcapped(zy, softcap, HAS_SOFTCAP)
    z_sum = tl.sum(total, axis=0) if SMOOTHING else 0.0
    loss = _token_loss(lse, zy, z_sum, y, n_cols, label_smoothing, SMOOTHING)
    tl.store(LOSS + row_start + row, loss)
    eps = label_smoothing / n_cols
    if COMPUTE_GRAD:
        scale = tl.load(SCALE + (row_start + row).to(tl.int64) * scale_stride).to(tl.float32)
        last = (n_cols - 1) // BLOCK * BLOCK
        for back in range(0, n_cols, BLOCK):
            cols = last - back + tl.arange(0, BLOCK)
            _grad_step(
                x_row, dx_row, cols, n_cols, y, lse, eps, label_smoothing, scale, softcap,
                HAS_SOFTCAP,
            )  # fmt: skip


@triton.jit
def _token_block(LABELS, row_start, n_rows, ignore_index, BLOCK_N: tl.constexpr):
    # The BLOCK_N tokens of program (block, split) of the transposed kernels, their labels,
    # and which of them count (in range, label not ignore_index).
    tokens = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    in_rows = tokens < n_rows
    y = tl.load(LABELS + row_start + tokens, mask=in_rows, other=ignore_index)
    return tokens, in_rows, y, in_rows & (y != ignore_index)


@triton.jit
def _col_stats_kernel(
    ZT,
    LABELS,
    M_PART,
    S_PART,
    SUM_PART,
    ZY,
    row_start,
    n_rows,
    v_start,
    n_vocab,
    stride_z,
    span,
    part_offset,
    parts_stride,
    ignore_index,
    softcap,
    HAS_SOFTCAP: tl.constexpr,
    SMOOTHING: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # _row_stats_kernel for logits held transposed (the resident plan): ZT[v, n] is token n's
    # logit of vocabulary entry v_start + v (ZT holds n_vocab entries), tokens contiguous.
    # Program (block, split) reduces the entries [split * span, (split + 1) * span) of BLOCK_N
    # tokens, loading [BLOCK_V, BLOCK_N] tiles whose rows are contiguous tokens (coalesced; a
    # walk down one token's column would read a sector per element). Every lane keeps its own
    # running maximum and sum, updated with one exponential an element and no exchange
    # between threads until the end. Same partial sums, in slots token * parts_stride +
    # part_offset + split, and z[label] from the split that holds the label.
    tokens, in_rows, y, live = _token_block(LABELS, row_start, n_rows, ignore_index, BLOCK_N)
    split = tl.program_id(1)
    start = split * span
    end = tl.minimum(start + span, n_vocab)
    m = tl.full([BLOCK_V, BLOCK_N], -1.0e30, tl.float32)
    s = tl.zeros([BLOCK_V, BLOCK_N], tl.float32)
    total = tl.zeros([BLOCK_V, BLOCK_N], tl.float32)
    for first in range(start, end, BLOCK_V):
        v = first + tl.arange(0, BLOCK_V)
        mask = (v < end)[:, None] & live[None, :]
        offsets = v[:, None].to(tl.int64) * stride_z + tokens[None, :]
        z = tl.load(ZT + offsets, mask=mask, other=0.0).to(tl.float32)
        z, total = _stats_logits(z, mask, total, softcap, HAS_SOFTCAP, SMOOTHING)
        # A new maximum rescales the sum by exp(m - z) and adds 1; otherwise exp(z - m) is
        # added: either way the one exponential is exp(-|z - m|).
        e = tl.exp(-tl.abs(z - m))
        s = tl.where(z > m, s * e + 1.0, s + e)
        m = tl.maximum(m, z)
    m_row = tl.max(m, axis=0)
    s_row = tl.sum(s * tl.exp(m - m_row[None, :]), axis=0)
    part = tokens * parts_stride + part_offset + split
    tl.store(M_PART + part, m_row, mask=live)
    tl.store(S_PART + part, s_row, mask=live)
    if SMOOTHING:
        tl.store(SUM_PART + part, tl.sum(total, axis=0), mask=live)
    label = y - v_start
    has_label = live & (label >= start) & (label < end)
    zy = tl.load(ZT + label.to(tl.int64) * stride_z + tokens, mask=has_label, other=0.0)
    zy = _softcapped(zy.to(tl.float32), softcap, HAS_SOFTCAP)
    tl.store(ZY + tokens, zy, mask=has_label)


@triton.jit
def _col_loss_grad_kernel(
    ZT,
    LABELS,
    M_PART,
    S_PART,
    SUM_PART,
    ZY,
    LOSS,
    SCALE,
    row_start,
    n_rows,
    v_start,
    n_vocab,
    vocab,
    stride_z,
    span,
    parts_stride,
    scale_stride,
    ignore_index,
    label_smoothing,
    softcap,
    HAS_SOFTCAP: tl.constexpr,
    SMOOTHING: tl.constexpr,
    WRITE_LOSS: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # _loss_grad_kernel for transposed logits (ZT: entries [v_start, v_start + n_vocab) of
    # a vocabulary of ``vocab``), in place: the same formula, each token's log-sum-exp
    # combined from all its parts by every program of its block; with WRITE_LOSS split 0
    # writes the loss. Ignored tokens get loss 0 and a zero gradient column.
    tokens, in_rows, y, live = _token_block(LABELS, row_start, n_rows, ignore_index, BLOCK_N)
    split = tl.program_id(1)
    parts = tl.arange(0, SPLITS)
    part_mask = live[:, None] & (parts < parts_stride)[None, :]
    slots = tokens[:, None] * parts_stride + parts[None, :]
    part_max = tl.load(M_PART + slots, mask=part_mask, other=float("-inf"))
    part_sum = tl.load(S_PART + slots, mask=part_mask, other=0.0)
    # Tokens not live have no parts: a neutral lse of 0 keeps their (discarded) values finite.
    row_max = tl.where(live, tl.max(part_max, axis=1), 0.0)
    row_sum = tl.sum(part_sum * tl.exp(part_max - row_max[:, None]), axis=1)
    lse = row_max + tl.log(tl.where(live, row_sum, 1.0))
    eps = label_smoothing / vocab
    if WRITE_LOSS:  # noqa: SIM102  (compiled in or out; then a test at run time)
        if split == 0:
            zy = tl.load(ZY + tokens, mask=live, other=0.0)
            z_sum = 0.0
            if SMOOTHING:
                z_sum = tl.sum(tl.load(SUM_PART + slots, mask=part_mask, other=0.0), axis=1)
            loss = _token_loss(lse, zy, z_sum, y, vocab, label_smoothing, SMOOTHING)
            tl.store(LOSS + row_start + tokens, tl.where(live, loss, 0.0), mask=in_rows)
    scale = tl.load(SCALE + (row_start + tokens).to(tl.int64) * scale_stride, mask=in_rows)
    scale = scale.to(tl.float32)
    label = y - v_start
    start = split * span
    end = tl.minimum(start + span, n_vocab)
    for first in range(start, end, BLOCK_V):
        v = first + tl.arange(0, BLOCK_V)
        mask = (v < end)[:, None] & in_rows[None, :]
        offsets = v[:, None].to(tl.int64) * stride_z + tokens[None, :]
        z = tl.load(ZT + offsets, mask=mask & live[None, :], other=0.0).to(tl.float32)
        if HAS_SOFTCAP:
            t = _tanh(z / softcap)
            z = softcap * t
        g = tl.exp(z - lse[None, :]) - eps
        g = tl.where(v[:, None] == label[None, :], g - (1.0 - label_smoothing), g)
        g = g * scale[None, :]
        if HAS_SOFTCAP:
            g = g * (1.0 - t * t)
        g = tl.where(live[None, :], g, 0.0)
        tl.store(ZT + offsets, g.to(ZT.dtype.element_ty), mask=mask)


@triton.jit
def _scale_kernel(X, G, n, BLOCK: tl.constexpr):
    # X *= G[0] in place, unless G[0] is 1 (the usual gradient of a loss): then every program
    # returns at once, without the host having to read G (no synchronisation). Programs walk
    # the tensor in strides of the grid.
    g = tl.load(G).to(tl.float32)
    if g != 1.0:
        step = tl.num_programs(0).to(tl.int64) * BLOCK
        for first in range(tl.program_id(0).to(tl.int64) * BLOCK, n, step):
            offsets = first + tl.arange(0, BLOCK)
            mask = offsets < n
            x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
            tl.store(X + offsets, (x * g).to(X.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------


def _runs_kernels(device: torch.device) -> bool:
    return device.type == "cuda" or (device.type == "cpu" and _CPU_RUNS_KERNELS)


def _free_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return CPU_CHUNK_BYTES
    free, _ = torch.cuda.mem_get_info(device)
    # One nested read: memory_reserved and memory_allocated each flatten the allocator's whole
    # statistics tree in Python, host time that each training step would pay twice.
    stats = torch.cuda.memory_stats_as_nested_dict(device)
    unused = stats["reserved_bytes"]["all"]["current"] - stats["allocated_bytes"]["all"]["current"]
    return int(FREE_MEMORY_SHARE * (free + unused))


def _even(n_rows: int, rows: int) -> int:
    """``rows`` lowered so that the chunks of ``n_rows`` are as equal as their count allows."""
    return cdiv(n_rows, cdiv(n_rows, rows))


def _liger_rows(n_rows: int, hidden_size: int, vocab_size: int) -> int:
    """Tokens of Liger-Kernel's one-pass chunk (logits no larger than the hidden states):
    the floor of the chunk budget."""
    return min(next_power_of_2(cdiv(n_rows, cdiv(vocab_size, hidden_size))), n_rows)


def chunk_rows(
    n_rows: int,
    hidden_size: int,
    vocab_size: int,
    element_size: int,
    device: torch.device,
    chunk_size: int | None = None,
    *,
    weight_grad_element_size: int | None = None,
    lean: bool = False,
) -> int:
    """Tokens a one-pass chunk takes, evened out; ``chunk_size`` if given.

    Logits (``element_size`` bytes each) of as many bytes as CHUNK_WEIGHT_SHARE of the weight's
    gradient (``hidden_size`` x ``vocab_size`` elements of ``weight_grad_element_size`` bytes,
    by default ``element_size``), never fewer tokens than Liger's chunk (`_liger_rows`), capped
    by free device memory. ``lean`` keeps to Liger's chunk (the resident chunk's temporary).

    Example: ``chunk_rows(4096, 2048, 128256, 2, torch.device("cuda"))`` is 2048 where half
    the free memory holds their 0.5 GiB of logits (Liger's chunk: 128 tokens).
    """
    if n_rows == 0:
        return 1
    if chunk_size:
        return max(1, min(int(chunk_size), n_rows))
    rows = _liger_rows(n_rows, hidden_size, vocab_size)
    if not lean:
        grad_bytes = hidden_size * vocab_size * (weight_grad_element_size or element_size)
        weight_rows = int(CHUNK_WEIGHT_SHARE * grad_bytes) // max(vocab_size * element_size, 1)
        rows = max(rows, min(weight_rows, n_rows))
    rows = min(rows, max(1, _free_bytes(device) // max(vocab_size * element_size, 1)))
    return _even(n_rows, rows)


def _two_pass_rows(budget: int, n_rows: int, tile: int, element_size: int, row_bytes: int):
    """The most tokens (a power of two up to TWO_PASS_ROWS[0], or all) whose tile of
    ``tile`` columns and ``row_bytes`` a token of accumulator fit ``budget``; None if none."""
    for rows in TWO_PASS_ROWS:
        rows = min(rows, n_rows)
        if rows * (tile * element_size + row_bytes) <= budget:
            return rows
    return None


def _plan_cost(n_rows, hidden, vocab, element_size, rows, tile, grads: bool) -> float:
    """Matmul FLOPs + FLOPS_PER_BYTE x bytes of weight traffic of a plan."""
    chunks, tiles, work = cdiv(n_rows, rows), cdiv(vocab, tile), n_rows * hidden * vocab
    weight = vocab * hidden * element_size
    if not grads:  # one projection; the weight read once a chunk
        return 2 * work + FLOPS_PER_BYTE * chunks * weight
    if tiles == 1:  # projection, two gradient matmuls; weight read twice, its gradient updated
        return 6 * work + FLOPS_PER_BYTE * chunks * 4 * weight
    # one more projection, but the last tile's; the weight read three times a chunk
    return (8 - 2 / tiles) * work + FLOPS_PER_BYTE * chunks * 5 * weight


def chunk_plan(
    n_rows: int,
    hidden_size: int,
    vocab_size: int,
    element_size: int,
    device: torch.device,
    chunk_size: int | None = None,
    vocab_chunk: int | None = None,
    grads: bool = True,
    fp32_rows: bool = False,
    weight_grad_element_size: int | None = None,
) -> tuple[int, int]:
    """``(tokens, columns)`` of a chunk of ``fused_linear_cross_entropy``: columns equal to the
    vocabulary is one pass, fewer two passes over tiles of that many columns (see "the chunk
    plan" above), within the budget of `chunk_rows`' one-pass chunk. ``fp32_rows``: the
    two-pass plan keeps an fp32 hidden-state gradient a token (half-precision inputs,
    gradients wanted). ``weight_grad_element_size``: bytes an element of the weight gradient's
    buffer (4 with ``fp32_weight_grad=True``), by default ``element_size``."""
    if n_rows == 0:
        return 1, vocab_size
    single = chunk_rows(
        n_rows, hidden_size, vocab_size, element_size, device, chunk_size,
        weight_grad_element_size=weight_grad_element_size,
    )  # fmt: skip
    if vocab_chunk:
        tile = max(1, min(int(vocab_chunk), vocab_size))
        if chunk_size or tile == vocab_size:
            return single, tile
        rows = _two_pass_rows(
            max(single * vocab_size * element_size, tile * element_size),
            n_rows, tile, element_size, 4 * hidden_size if fp32_rows else 0,
        )  # fmt: skip
        return _even(n_rows, rows or 1), tile
    if chunk_size:
        return single, vocab_size
    # The one-pass chunk's budget, less 1/32 for the partial sums of the tiles.
    budget = single * vocab_size * element_size * 31 // 32
    accumulator = 4 * hidden_size if fp32_rows else 0
    for rows in TWO_PASS_ROWS:  # the most tokens whose accumulator leaves half the budget
        rows = min(rows, n_rows)
        if rows * accumulator > budget // 2:
            continue
        tile = (budget // rows - accumulator) // element_size // TILE_ALIGN * TILE_ALIGN
        if tile >= MIN_TILE:
            break
    else:
        return single, vocab_size
    if tile >= vocab_size:
        return single, vocab_size
    rows = _even(n_rows, rows)
    one = _plan_cost(n_rows, hidden_size, vocab_size, element_size, single, vocab_size, grads)
    two = _plan_cost(n_rows, hidden_size, vocab_size, element_size, rows, tile, grads)
    return (rows, tile) if two < TWO_PASS_MARGIN * one else (single, vocab_size)


def _row_config(rows: int, n_cols: int, device: torch.device) -> tuple[int, int, int, int]:
    """(block, num_warps, span, n_splits) of the row kernels for ``rows`` rows of ``n_cols``."""
    if device.type == "cuda":
        block, warps = min(BLOCK, next_power_of_2(n_cols)), BLOCK_WARPS
    else:
        block, warps = min(CPU_BLOCK, next_power_of_2(n_cols)), CPU_BLOCK_WARPS
    blocks = cdiv(n_cols, block)
    splits = max(1, min(blocks, cdiv(SPLIT_PROGRAMS_PER_SM * multiprocessors(device), rows)))
    span = cdiv(blocks, splits) * block
    return block, warps, span, cdiv(n_cols, span)


def _work_buffers(sizes: tuple[int, ...], n_cols: int, tiles: int, device: torch.device):
    """(partial maxima, partial sums, partial sums of z, z[label]) for chunks of each of these
    numbers of rows over ``tiles`` tiles of ``n_cols`` columns: one allocation for every chunk,
    sized for the chunks that split their rows (none for those the one-kernel row path takes,
    whose logits are then the only transient the chunk budget has to hold)."""
    split = [rows for rows in sizes if rows and not (tiles == 1 and _fuses_rows(rows, device))]
    parts = max((r * tiles * _row_config(r, n_cols, device)[3] for r in split), default=0)
    return _work_buffers_for(parts, max(split, default=0), device)


def _work_buffers_for(parts: int, rows: int, device: torch.device):
    work = torch.empty(3 * parts + rows, dtype=torch.float32, device=device)
    return work[:parts], work[parts : 2 * parts], work[2 * parts : 3 * parts], work[3 * parts :]


def _row_stats(x, labels, row_start, col_start, part_offset, parts_stride, options, work, config):
    """Partial softmax statistics of rows ``x`` (columns ``col_start`` on of the vocabulary)
    into slots ``part_offset`` on of each row's ``parts_stride``."""
    # The kernel's arguments, each named as its parameter (``_library``'s "by name").
    ignore_index, smoothing, softcap = options
    block, warps, span, n_splits = config
    m_part, s_part, sum_part, zy = work
    n_cols, stride_x = x.shape[1], x.stride(0)
    HAS_SOFTCAP, SMOOTHING = softcap > 0, smoothing > 0
    args = (
        x, labels, m_part, s_part, sum_part, zy, row_start, col_start, n_cols, stride_x, span,
        part_offset, parts_stride, ignore_index, softcap, HAS_SOFTCAP, SMOOTHING, block,
    )  # fmt: skip
    launch(_row_stats_kernel, (x.shape[0], n_splits), args, warps, x.device)


def _loss_grad(
    x, dx, labels, row_start, col_start, vocab, parts_stride, loss, scale, scale_stride,
    options, work, config, write_loss, compute_grad,
):  # fmt: skip
    """With ``write_loss`` the loss of rows ``x`` into ``loss[row_start:]``; with
    ``compute_grad`` the gradient of their columns into ``dx`` (which may be ``x``)."""
    # The kernel's arguments, each named as its parameter (``_library``'s "by name").
    ignore_index, label_smoothing, softcap = options
    block, warps, span, n_splits = config
    m_part, s_part, sum_part, zy = work
    n_cols, stride_x, stride_dx = x.shape[1], x.stride(0), dx.stride(0)
    HAS_SOFTCAP, SMOOTHING = softcap > 0, label_smoothing > 0
    SPLITS = next_power_of_2(parts_stride)
    args = (
        x, dx, labels, m_part, s_part, sum_part, zy, loss, scale, row_start, col_start, n_cols,
        vocab, stride_x, stride_dx, span, parts_stride, scale_stride, ignore_index,
        label_smoothing, softcap, HAS_SOFTCAP, SMOOTHING, write_loss, compute_grad, SPLITS, block,
    )  # fmt: skip
    grid = (x.shape[0], n_splits if compute_grad else 1)
    launch(_loss_grad_kernel, grid, args, warps, x.device)


def _fuses_rows(n_rows: int, device: torch.device) -> bool:
    """Whether rows of the whole vocabulary take `_row_loss_grad` (one program a row): enough
    of them to give every multiprocessor FUSED_ROWS_PER_SM."""
    return n_rows >= FUSED_ROWS_PER_SM * multiprocessors(device)


def _row_loss_grad(x, dx, labels, row_start, loss, scale, scale_stride, options, compute_grad):
    """`_rows_loss_and_grad` in one launch, a program a row (see `_row_loss_grad_kernel`)."""
    # The kernel's arguments, each named as its parameter (``_library``'s "by name").
    ignore_index, label_smoothing, softcap = options
    n_cols, stride_x, stride_dx = x.shape[1], x.stride(0), dx.stride(0)
    block, warps = _row_config(x.shape[0], n_cols, x.device)[:2]
    HAS_SOFTCAP, SMOOTHING = softcap > 0, label_smoothing > 0
    args = (
        x, dx, labels, loss, scale, row_start, n_cols, stride_x, stride_dx, scale_stride,
        ignore_index, label_smoothing, softcap, HAS_SOFTCAP, SMOOTHING, compute_grad, block,
    )  # fmt: skip
    launch(_row_loss_grad_kernel, (x.shape[0],), args, warps, x.device)


def _rows_loss_and_grad(
    x, dx, labels, row_start, loss, scale, scale_stride, options, compute_grad, work
) -> None:
    """Loss of rows ``x`` (whole rows of the vocabulary; labels ``labels[row_start:]``) into
    ``loss[row_start:]``; with ``compute_grad`` the gradient into ``dx`` (which may be ``x``)."""
    if _fuses_rows(x.shape[0], x.device):
        _row_loss_grad(x, dx, labels, row_start, loss, scale, scale_stride, options, compute_grad)
        return
    config = _row_config(x.shape[0], x.shape[1], x.device)
    n_splits = config[3]
    _row_stats(x, labels, row_start, 0, 0, n_splits, options, work, config)
    _loss_grad(
        x, dx, labels, row_start, 0, x.shape[1], n_splits, loss, scale, scale_stride, options,
        work, config, True, compute_grad,
    )  # fmt: skip


def _col_config(n_rows: int, vocab: int, device: torch.device) -> tuple[int, int, int, int, int]:
    """(block_v, block_n, num_warps, span, n_splits) of the transposed kernels."""
    if device.type == "cuda":
        block_v, block_n, warps = COL_BLOCK_V, COL_BLOCK_N, COL_WARPS
    else:
        block_v = block_n = CPU_COL_BLOCK
        warps = CPU_BLOCK_WARPS
    blocks = cdiv(vocab, block_v)
    splits = max(
        1, min(blocks, cdiv(SPLIT_PROGRAMS_PER_SM * multiprocessors(device), cdiv(n_rows, block_n)))
    )
    span = cdiv(blocks, splits) * block_v
    return block_v, block_n, warps, span, cdiv(vocab, span)


def _cols_loss_and_grad(pieces, labels, loss, scale, scale_stride, options) -> None:
    """Loss and gradient of the tokens whose logits ``pieces`` hold transposed: a list of
    ``(zt, v_start)``, ``zt`` [entries, tokens] the logits of vocabulary entries ``v_start``
    on, together the whole vocabulary. The loss goes into ``loss[:tokens]``, each piece's
    gradient into it in place."""
    # The kernels' arguments, each named as its parameter (``_library``'s "by name").
    ignore_index, label_smoothing, softcap = options
    HAS_SOFTCAP, SMOOTHING = softcap > 0, label_smoothing > 0
    row_start = 0  # every piece holds all the tokens
    n_rows = pieces[0][0].shape[1]
    vocab = sum(zt.shape[0] for zt, _ in pieces)
    device = pieces[0][0].device
    configs = [_col_config(n_rows, zt.shape[0], device) for zt, _ in pieces]
    parts_stride = sum(config[4] for config in configs)
    SPLITS = next_power_of_2(parts_stride)
    m_part, s_part, sum_part, zy = _work_buffers_for(n_rows * parts_stride, n_rows, device)
    part_offset = 0
    for (zt, v_start), (block_v, block_n, warps, span, n_splits) in zip(
        pieces, configs, strict=True
    ):
        n_vocab, stride_z = zt.shape[0], zt.stride(0)
        stats = (
            zt, labels, m_part, s_part, sum_part, zy, row_start, n_rows, v_start, n_vocab,
            stride_z, span, part_offset, parts_stride, ignore_index, softcap, HAS_SOFTCAP,
            SMOOTHING, block_v, block_n,
        )  # fmt: skip
        launch(_col_stats_kernel, (cdiv(n_rows, block_n), n_splits), stats, warps, device)
        part_offset += n_splits
    for i, ((zt, v_start), config) in enumerate(zip(pieces, configs, strict=True)):
        block_v, block_n, warps, span, n_splits = config
        n_vocab, stride_z = zt.shape[0], zt.stride(0)
        WRITE_LOSS = i == 0
        grads = (
            zt, labels, m_part, s_part, sum_part, zy, loss, scale, row_start, n_rows, v_start,
            n_vocab, vocab, stride_z, span, parts_stride, scale_stride, ignore_index,
            label_smoothing, softcap, HAS_SOFTCAP, SMOOTHING, WRITE_LOSS, SPLITS, block_v, block_n,
        )  # fmt: skip
        launch(_col_loss_grad_kernel, (cdiv(n_rows, block_n), n_splits), grads, warps, device)


def _scale_(t: torch.Tensor | None, g: torch.Tensor) -> None:
    """``t *= g`` in place (``g`` a one-element tensor), skipped on the device when g == 1."""
    if t is None or t.numel() == 0:
        return
    n = t.numel()
    programs = max(1, min(cdiv(n, SCALE_BLOCK), SCALE_PROGRAMS_PER_SM * multiprocessors(t.device)))
    # The kernel's arguments, each named as its parameter (``_library``'s "by name").
    X, G, BLOCK = t, g.reshape(1).to(torch.float32), SCALE_BLOCK
    args = (X, G, n, BLOCK)
    launch(_scale_kernel, (programs,), args, 8, t.device)


def _inverse_items(labels, ignore_index: int, reduction: int, items) -> torch.Tensor:
    """The reduction's scale as a one-element fp32 tensor on the labels' device, without
    reading anything back to the host: 1 / (number of items) for a mean (the given
    ``items``, or the labels that are not ignore_index), 1 for a sum; 0 where there are no
    items, so that a batch whose every label is ignored has loss 0 and zero gradients."""
    if reduction != MEAN:
        return torch.ones(1, dtype=torch.float32, device=labels.device)
    if items is None:
        items = (labels != ignore_index).sum()
    items = items.to(device=labels.device, dtype=torch.float32).reshape(1)
    return torch.where(items > 0, 1.0 / items, torch.zeros_like(items))


def _check(hidden, weight, bias, labels) -> None:
    check_dtype("fused_linear_cross_entropy hidden_states", hidden)
    check_dtype("fused_linear_cross_entropy weight", weight)
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            "fused_linear_cross_entropy: hidden_states of shape "
            f"{tuple(hidden.shape)} and weight of shape {tuple(weight.shape)} do not fit: the "
            "weight must be (vocab_size, hidden_size), like lm_head.weight"
        )
    for what, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != hidden.dtype:
            raise TypeError(
                f"fused_linear_cross_entropy: {what} dtype {t.dtype} differs from the hidden "
                f"states' {hidden.dtype}; cast one of them (under autocast, the public function "
                "casts both to the autocast dtype)"
            )
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(
            f"fused_linear_cross_entropy: bias of shape {tuple(bias.shape)} does not match the "
            f"vocabulary size {weight.shape[0]}"
        )
    _check_labels("fused_linear_cross_entropy", hidden, labels)


def _check_labels(what: str, rows: torch.Tensor, labels: torch.Tensor) -> None:
    if labels.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{what}: labels must be int64 or int32, got {labels.dtype}")
    if labels.shape != rows.shape[:1]:
        raise ValueError(
            f"{what}: {labels.numel()} labels for {rows.shape[0]} rows; give one label a row "
            f"(labels of shape {tuple(labels.shape)})"
        )
    if labels.device != rows.device:
        raise ValueError(f"{what}: labels on {labels.device}, inputs on {rows.device}")


def _flce_pass(
    hidden, weight, bias, labels, options, chunking, scale, scale_stride, grads, fp32_weight_grad
):
    """The chunk loop: (per-row loss [N] fp32, grad_hidden, grad_weight, grad_bias), the
    gradients None unless ``grads`` (hidden, weight, bias) asks for them. ``scale`` holds the
    gradient's scale: one value (``scale_stride`` 0) or one a row (1). ``chunking``:
    (chunk_size, vocab_chunk) as the public function takes them."""
    n_rows, hidden_size = hidden.shape
    vocab = weight.shape[0]
    need_gh, need_gw, need_gb = grads
    compute_grad = need_gh or need_gw or need_gb
    device = hidden.device
    loss = torch.empty(n_rows, dtype=torch.float32, device=device)
    gh = torch.empty(hidden.shape, dtype=hidden.dtype, device=device) if need_gh else None
    gw = gb = None
    if need_gw:
        accumulate = torch.float32 if fp32_weight_grad else weight.dtype
        gw = torch.empty(weight.shape, dtype=accumulate, device=device)
    if need_gb:
        gb = torch.zeros(vocab, dtype=torch.float32, device=device)
    if n_rows == 0:
        if gw is not None:
            gw.zero_()
        return loss, gh, gw, gb
    fp32_rows = need_gh and hidden.dtype != torch.float32
    element = hidden.element_size()
    resident = 0
    if need_gw and not any(chunking):
        resident = resident_rows(n_rows, hidden_size, element, gw.element_size())
        # Its temporary keeps to Liger's budget: with no tokens after it, that is the loss's
        # only transient; with some, their chunk buffer, allocated after it, is the peak.
        lean = chunk_rows(n_rows, hidden_size, vocab, element, device, lean=True)
        budget = lean * vocab * element
        gh_rows = None if gh is None else gh[:resident]
        _resident_chunk(
            hidden[:resident], weight, bias, labels, options, scale, scale_stride, loss,
            gh_rows, gw, gb, budget,
        )  # fmt: skip
        if resident == n_rows:
            return loss, gh, gw, gb
    rows, tile = chunk_plan(
        n_rows, hidden_size, vocab, element, device, *chunking,
        grads=compute_grad, fp32_rows=fp32_rows,
        weight_grad_element_size=gw.element_size() if need_gw else None,
    )  # fmt: skip
    rows = _even(n_rows - resident, rows)
    tiles = cdiv(vocab, tile)
    buffer = hidden.new_empty(rows * tile)
    work = _work_buffers((rows, (n_rows - resident) % rows), tile, tiles, device)
    rows_acc = None
    if tiles > 1 and fp32_rows:
        rows_acc = torch.empty((rows, hidden_size), dtype=torch.float32, device=device)
    for start in range(resident, n_rows, rows):
        end = min(start + rows, n_rows)
        h = hidden[start:end]
        config = _row_config(end - start, tile, device)
        parts = tiles * config[3]
        fused = tiles == 1 and _fuses_rows(end - start, device)

        for t in range(tiles):  # tiles == 1: the one pass; else the first of two
            logits, first = _project(h, weight, bias, buffer, tile, t)
            if not fused:
                _row_stats(
                    logits, labels, start, first, t * config[3], parts, options, work, config
                )
        order = [tiles - 1, *range(tiles - 1)] if compute_grad else [tiles - 1]
        gh_rows = None
        if need_gh:
            gh_rows = gh[start:end] if rows_acc is None else rows_acc[: end - start]
        for i, t in enumerate(order):
            if i:  # the last tile's logits are still in the buffer; the others are recomputed
                logits, first = _project(h, weight, bias, buffer, tile, t)
            if fused:
                _row_loss_grad(
                    logits, logits, labels, start, loss, scale, scale_stride, options, compute_grad
                )
            else:
                _loss_grad(
                    logits, logits, labels, start, first, vocab, parts, loss, scale, scale_stride,
                    options, work, config, i == 0, compute_grad,
                )  # fmt: skip
            if not compute_grad:
                break
            columns = slice(first, first + logits.shape[1])
            if need_gh:
                _matmul_into(gh_rows, logits, weight[columns], accumulate=i > 0)
            if need_gw:
                _matmul_into(gw[columns], logits.t(), h, accumulate=start > 0)
            if need_gb:
                gb[columns] += logits.sum(0, dtype=torch.float32)
        if rows_acc is not None and need_gh:
            gh[start:end].copy_(gh_rows)
    return loss, gh, gw, gb


def resident_rows(
    n_rows: int, hidden_size: int, element_size: int, weight_grad_element_size: int
) -> int:
    """Tokens whose logits (``element_size`` bytes each) the weight gradient's buffer
    (``hidden_size`` elements of ``weight_grad_element_size`` bytes a vocabulary entry) holds:
    the resident plan's first chunk (see "the chunk plan" above)."""
    return min(n_rows, hidden_size * weight_grad_element_size // element_size)


def resident_temp_rows(n_rows: int, vocab: int, element_size: int, budget: int, device) -> int:
    """Vocabulary entries whose logits (of ``n_rows`` tokens) the resident chunk's temporary
    holds: as many as ``budget`` bytes allow beside the partial sums of the transposed kernels
    (at most two pieces' worth), so that the two together stay within it."""
    parts = 2 * _col_config(n_rows, vocab, device)[4]
    work = (3 * parts + 1) * n_rows * 4
    return max(1, min(vocab, (budget - work) // max(1, n_rows * element_size)))


def _resident_chunk(
    h, weight, bias, labels, options, scale, scale_stride, loss, gh, gw, gb, budget
):
    """Loss and gradients of the first ``len(h)`` tokens (their loss into ``loss[:len(h)]``),
    with their logits held transposed in ``gw``'s memory (see `resident_rows`): ``gw`` is
    written, not accumulated into; ``gh`` (these tokens' rows) and ``gb`` (accumulated) when
    not None. At most ``budget`` bytes of temporary memory.

    The weight's gradient is made a tile of T vocabulary entries at a time, each written over
    logits already used: the logits of all but the last T entries sit at the end of ``gw``'s
    memory, the last T entries' in a temporary, and the tiles run from the first (the
    narrowest, V mod T entries) to the last. Tile t's rows of ``gw`` then end before the
    logits of tile t itself start, so every product is written in place, without a copy."""
    n_rows, hidden_size = h.shape
    vocab = weight.shape[0]
    rows = resident_temp_rows(n_rows, vocab, h.element_size(), budget, h.device)
    split = vocab - rows
    flat = gw.view(-1).view(h.dtype)
    pieces = [(h.new_empty((rows, n_rows)), split)]
    if split:
        pieces.insert(0, (flat[flat.numel() - split * n_rows :].view(split, n_rows), 0))
    for zt, first in pieces:
        w = weight[first : first + zt.shape[0]]
        if bias is None:
            torch.mm(w, h.t(), out=zt)
        else:
            torch.addmm(bias[first : first + zt.shape[0]].unsqueeze(1), w, h.t(), out=zt)
    _cols_loss_and_grad(pieces, labels, loss, scale, scale_stride, options)
    if gb is not None:
        for zt, first in pieces:
            gb[first : first + zt.shape[0]] += zt.sum(1, dtype=torch.float32)
    if gh is not None:  # the temporary's few entries first: the rounding of the partial sum
        for i, (zt, first) in enumerate(reversed(pieces)):  # falls on the smaller part
            _matmul_into(gh, zt.t(), weight[first : first + zt.shape[0]], accumulate=i > 0)
    edges = sorted({0, *range(split % rows, split + 1, rows)})
    for first, last in zip(edges, edges[1:], strict=False):
        _matmul_into(gw[first:last], pieces[0][0][first:last], h, accumulate=False)
    _matmul_into(gw[split:], pieces[-1][0], h, accumulate=False)


def _project(h, weight, bias, buffer, tile: int, t: int) -> tuple[torch.Tensor, int]:
    """The logits of tile ``t`` (columns of ``tile`` each) of the chunk ``h``, computed into
    ``buffer`` (as a contiguous [rows, columns] view); and the tile's first column."""
    first, last = t * tile, min(weight.shape[0], (t + 1) * tile)
    out = buffer[: h.shape[0] * (last - first)].view(h.shape[0], last - first)
    w = weight[first:last]
    if bias is None:
        torch.mm(h, w.t(), out=out)
    else:
        torch.addmm(bias[first:last], h, w.t(), out=out)
    return out, first


def _matmul_into(out, a, b, accumulate: bool) -> None:
    """``out = a @ b`` or, with ``accumulate``, ``out += a @ b``: each product summed in fp32
    inside cuBLAS and rounded once to ``out``'s dtype (the operands', or fp32)."""
    if out.dtype == a.dtype:
        if accumulate:
            out.addmm_(a, b)
        else:
            torch.mm(a, b, out=out)
    elif out.device.type == "cuda" and _addmm_out_dtype(out.device):
        if not accumulate:
            out.zero_()
        torch.addmm(out, a, b, out_dtype=torch.float32, out=out)
    elif out.device.type == "cuda":  # no fp32 output from half operands: a temporary product
        product = torch.mm(a, b).float()
        if accumulate:
            out.add_(product)
        else:
            out.copy_(product)
    elif accumulate:  # the CPU: fp32 operands
        out.addmm_(a.float(), b.float())
    else:
        torch.mm(a.float(), b.float(), out=out)


@functools.cache
def _addmm_out_dtype(device: torch.device) -> bool:
    # torch.addmm(..., out_dtype=torch.float32) with half operands: torch 2.8 on, sm80 on.
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, _ = torch.cuda.get_device_capability(index)
    return major >= 8 and tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 8)


def _reduce(loss_rows: torch.Tensor, scale: torch.Tensor, reduction: int) -> torch.Tensor:
    if reduction == NONE:
        return loss_rows
    return (loss_rows.sum() * scale).reshape(())


def _flce_forward(
    hidden, weight, bias, labels, items, options, reduction, chunking, grads, fp32_weight_grad
):
    """(loss, grad_hidden, grad_weight, grad_bias) of the public function's semantics; for
    reduction="none" the gradients are not made here (they need the backward's per-row
    gradient before the matmuls sum over tokens) and ``grads`` must be all False."""
    _check(hidden, weight, bias, labels)
    scale = _inverse_items(labels, options[0], reduction, items)
    loss_rows, gh, gw, gb = _flce_pass(
        hidden, weight, bias, labels, options, chunking, scale, 0, grads, fp32_weight_grad
    )
    if gw is not None:
        gw = gw.to(weight.dtype)
    if gb is not None:
        gb = gb.to(bias.dtype)
    return _reduce(loss_rows, scale, reduction), gh, gw, gb


def _flce_backward_none(grad_loss, hidden, weight, bias, labels, options, chunking, grads, fp32):
    """The gradients of reduction="none": the chunk loop again, each row's gradient scaled by
    its own ``grad_loss`` before the matmuls sum over tokens."""
    g = grad_loss.to(torch.float32).contiguous()
    _, gh, gw, gb = _flce_pass(hidden, weight, bias, labels, options, chunking, g, 1, grads, fp32)
    if gw is not None:
        gw = gw.to(weight.dtype)
    if gb is not None:
        gb = gb.to(bias.dtype)
    return gh, gw, gb


def _ce_forward(logits, labels, items, options, reduction, compute_grad):
    """(loss, grad_logits or None) of ``cross_entropy`` on existing logits."""
    check_dtype("cross_entropy logits", logits)
    _check_labels("cross_entropy", logits, labels)
    scale = _inverse_items(labels, options[0], reduction, items)
    loss_rows = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    grad = torch.empty_like(logits, memory_format=torch.contiguous_format) if compute_grad else None
    if logits.shape[0]:
        work = _work_buffers((logits.shape[0],), logits.shape[1], 1, logits.device)
        dx = logits if grad is None else grad
        _rows_loss_and_grad(logits, dx, labels, 0, loss_rows, scale, 0, options, compute_grad, work)
    return _reduce(loss_rows, scale, reduction), grad


def _ce_backward_none(grad_loss, logits, labels, options):
    """The gradient of ``cross_entropy``'s reduction="none": each row's scaled by its own
    ``grad_loss`` (the loss is recomputed on the way and dropped)."""
    grad = torch.empty_like(logits, memory_format=torch.contiguous_format)
    n_rows = logits.shape[0]
    if n_rows:
        work = _work_buffers((n_rows,), logits.shape[1], 1, logits.device)
        loss_rows = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
        g = grad_loss.to(torch.float32).contiguous()
        _rows_loss_and_grad(logits, grad, labels, 0, loss_rows, g, 1, options, True, work)
    return grad


# ---------------------------------------------------------------------------------------------
# Autograd: eager path
# ---------------------------------------------------------------------------------------------


def _once(ctx) -> None:
    # The gradients made in the forward are handed to autograd (and scaled in place): a second
    # backward through the same graph would hand out the same, already used tensors.
    if getattr(ctx, "used", False):
        raise RuntimeError(
            "fused_linear_cross_entropy: backward ran twice through the same loss; its "
            "gradients are computed once, in the forward. Compute the loss again instead of "
            "retain_graph=True."
        )
    ctx.used = True


class _FusedLinearCrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, hidden, weight, bias, labels, items, options, reduction, chunking, fp32_weight_grad
    ):
        grads = tuple(ctx.needs_input_grad[:3])
        ctx.reduction = reduction
        if reduction == NONE:
            loss, *_ = _flce_forward(
                hidden, weight, bias, labels, items, options, reduction, chunking,
                (False, False, False), fp32_weight_grad,
            )  # fmt: skip
            ctx.save_for_backward(hidden, weight, bias, labels)
            ctx.recompute = (options, chunking, grads, fp32_weight_grad)
            return loss
        loss, gh, gw, gb = _flce_forward(
            hidden, weight, bias, labels, items, options, reduction, chunking, grads,
            fp32_weight_grad,
        )  # fmt: skip
        ctx.save_for_backward(gh, gw, gb)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        _once(ctx)
        if ctx.reduction == NONE:
            hidden, weight, bias, labels = ctx.saved_tensors
            gh, gw, gb = _flce_backward_none(
                grad_loss, hidden, weight, bias, labels, *ctx.recompute
            )
        else:
            gh, gw, gb = ctx.saved_tensors
            for t in (gh, gw, gb):
                _scale_(t, grad_loss)
        return gh, gw, gb, None, None, None, None, None, None


class _CrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, items, options, reduction):
        ctx.reduction = reduction
        if reduction == NONE:
            loss, _ = _ce_forward(logits, labels, items, options, reduction, False)
            ctx.save_for_backward(logits, labels)
            ctx.options = options
            return loss
        loss, grad = _ce_forward(logits, labels, items, options, reduction, True)
        ctx.save_for_backward(grad)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        if ctx.reduction == NONE:
            logits, labels = ctx.saved_tensors
            return _ce_backward_none(grad_loss, logits, labels, ctx.options), None, None, None, None
        _once(ctx)
        (grad,) = ctx.saved_tensors
        _scale_(grad, grad_loss)
        return grad, None, None, None, None


# ---------------------------------------------------------------------------------------------
# Autograd: torch.library ops (what torch.compile sees)
# ---------------------------------------------------------------------------------------------


def _or_empty(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    # A custom op returns tensors, never None: an absent gradient is an empty tensor.
    return like.new_empty((0,)) if t is None else t


def _loss_like(rows: torch.Tensor, reduction: int) -> torch.Tensor:
    shape = (rows.shape[0],) if reduction == NONE else ()
    return rows.new_empty(shape, dtype=torch.float32)


@torch.library.custom_op(op_name("fused_linear_cross_entropy"), mutates_args=())
def fused_linear_cross_entropy_op(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    items: torch.Tensor | None,
    ignore_index: int,
    label_smoothing: float,
    softcap: float,
    reduction: int,
    chunk_size: int,
    vocab_chunk: int,
    fp32_weight_grad: bool,
    grad_hidden: bool,
    grad_weight: bool,
    grad_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    options = (ignore_index, label_smoothing, softcap)
    grads = (grad_hidden, grad_weight, grad_bias)
    chunking = (chunk_size or None, vocab_chunk or None)
    loss, gh, gw, gb = _flce_forward(
        hidden, weight, bias, labels, items, options, reduction, chunking, grads, fp32_weight_grad
    )
    return loss, _or_empty(gh, hidden), _or_empty(gw, weight), _or_empty(gb, weight)


@fused_linear_cross_entropy_op.register_fake
def _(hidden, weight, bias, labels, items, ignore_index, label_smoothing, softcap, reduction,
      chunk_size, vocab_chunk, fp32_weight_grad, grad_hidden, grad_weight, grad_bias):  # fmt: skip
    _check(hidden, weight, bias, labels)
    gh = hidden.new_empty(hidden.shape if grad_hidden else (0,))
    gw = weight.new_empty(weight.shape if grad_weight else (0,))
    gb = weight.new_empty(bias.shape if grad_bias and bias is not None else (0,))
    return _loss_like(hidden, reduction), gh, gw, gb


@torch.library.custom_op(op_name("fused_linear_cross_entropy_backward"), mutates_args=())
def fused_linear_cross_entropy_backward_op(
    grad_loss: torch.Tensor,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    ignore_index: int,
    label_smoothing: float,
    softcap: float,
    chunk_size: int,
    vocab_chunk: int,
    fp32_weight_grad: bool,
    grad_hidden: bool,
    grad_weight: bool,
    grad_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of reduction="none" (recomputed with each row's ``grad_loss``)."""
    options = (ignore_index, label_smoothing, softcap)
    grads = (grad_hidden, grad_weight, grad_bias)
    chunking = (chunk_size or None, vocab_chunk or None)
    gh, gw, gb = _flce_backward_none(
        grad_loss, hidden, weight, bias, labels, options, chunking, grads, fp32_weight_grad
    )
    return _or_empty(gh, hidden), _or_empty(gw, weight), _or_empty(gb, weight)


@fused_linear_cross_entropy_backward_op.register_fake
def _(grad_loss, hidden, weight, bias, labels, ignore_index, label_smoothing, softcap, chunk_size,
      vocab_chunk, fp32_weight_grad, grad_hidden, grad_weight, grad_bias):  # fmt: skip
    gh = hidden.new_empty(hidden.shape if grad_hidden else (0,))
    gw = weight.new_empty(weight.shape if grad_weight else (0,))
    gb = weight.new_empty(bias.shape if grad_bias and bias is not None else (0,))
    return gh, gw, gb


def _flce_setup_context(ctx, inputs, output):
    hidden, weight, bias, labels, _, ignore_index, smoothing, softcap, reduction, chunk_size = (
        inputs[:10]
    )
    _, gh, gw, gb = output
    ctx.mark_non_differentiable(gh, gw, gb)
    ctx.reduction = reduction
    if reduction == NONE:
        ctx.save_for_backward(hidden, weight, bias, labels)
        ctx.recompute = (ignore_index, smoothing, softcap, chunk_size, *inputs[10:12])
    else:
        ctx.save_for_backward(gh, gw, gb)


def _flce_backward(ctx, grad_loss, _gh, _gw, _gb):
    need = ctx.needs_input_grad[:3]
    if ctx.reduction == NONE:
        hidden, weight, bias, labels = ctx.saved_tensors
        gh, gw, gb = fused_linear_cross_entropy_backward_op(
            grad_loss, hidden, weight, bias, labels, *ctx.recompute, *need
        )
    else:
        # Out of place: inductor reuses the saved buffers where it can.
        gh, gw, gb = (t * grad_loss for t in ctx.saved_tensors)
    grads = tuple(g if n else None for g, n in zip((gh, gw, gb), need, strict=True))
    return *grads, *(None,) * 12


fused_linear_cross_entropy_op.register_autograd(_flce_backward, setup_context=_flce_setup_context)


@torch.library.custom_op(op_name("cross_entropy"), mutates_args=())
def cross_entropy_op(
    logits: torch.Tensor,
    labels: torch.Tensor,
    items: torch.Tensor | None,
    ignore_index: int,
    label_smoothing: float,
    softcap: float,
    reduction: int,
    compute_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    options = (ignore_index, label_smoothing, softcap)
    loss, grad = _ce_forward(logits, labels, items, options, reduction, compute_grad)
    return loss, _or_empty(grad, logits)


@cross_entropy_op.register_fake
def _(logits, labels, items, ignore_index, label_smoothing, softcap, reduction, compute_grad):
    check_dtype("cross_entropy logits", logits)
    _check_labels("cross_entropy", logits, labels)
    grad = logits.new_empty(logits.shape if compute_grad else (0,))
    return _loss_like(logits, reduction), grad


@torch.library.custom_op(op_name("cross_entropy_backward"), mutates_args=())
def cross_entropy_backward_op(
    grad_loss: torch.Tensor,
    logits: torch.Tensor,
    labels: torch.Tensor,
    ignore_index: int,
    label_smoothing: float,
    softcap: float,
) -> torch.Tensor:
    """The gradient of reduction="none" (each row's scaled by its ``grad_loss``)."""
    return _ce_backward_none(grad_loss, logits, labels, (ignore_index, label_smoothing, softcap))


@cross_entropy_backward_op.register_fake
def _(grad_loss, logits, labels, ignore_index, label_smoothing, softcap):
    return logits.new_empty(logits.shape)


def _ce_setup_context(ctx, inputs, output):
    logits, labels, _, ignore_index, smoothing, softcap, reduction, _ = inputs
    _, grad = output
    ctx.mark_non_differentiable(grad)
    ctx.reduction = reduction
    if reduction == NONE:
        ctx.save_for_backward(logits, labels)
        ctx.options = (ignore_index, smoothing, softcap)
    else:
        ctx.save_for_backward(grad)


def _ce_backward(ctx, grad_loss, _grad):
    if ctx.reduction == NONE:
        logits, labels = ctx.saved_tensors
        grad = cross_entropy_backward_op(grad_loss, logits, labels, *ctx.options)
    else:
        (grad,) = ctx.saved_tensors
        grad = grad * grad_loss
    return grad, *(None,) * 7


cross_entropy_op.register_autograd(_ce_backward, setup_context=_ce_setup_context)


# ---------------------------------------------------------------------------------------------
# Public functions
# ---------------------------------------------------------------------------------------------


def _options(ignore_index, reduction, label_smoothing, softcap, num_items_in_batch, what):
    """((ignore_index, smoothing, softcap or 0.0), reduction code), checked."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"{what}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if num_items_in_batch is not None and reduction != "mean":
        raise ValueError(
            f"{what}: num_items_in_batch replaces the mean's denominator (transformers' "
            f"gradient accumulation); it does not go with reduction={reduction!r}"
        )
    label_smoothing = float(label_smoothing)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{what}: label_smoothing must be in [0, 1], got {label_smoothing}")
    if softcap is not None and not float(softcap) > 0.0:
        raise ValueError(f"{what}: softcap must be a positive number or None, got {softcap!r}")
    options = (int(ignore_index), label_smoothing, 0.0 if softcap is None else float(softcap))
    return options, REDUCTIONS[reduction]


def _items(num_items_in_batch, device: torch.device) -> torch.Tensor | None:
    if num_items_in_batch is None:
        return None
    if isinstance(num_items_in_batch, torch.Tensor):
        return num_items_in_batch.to(device=device, dtype=torch.float32).reshape(())
    return torch.full((), float(num_items_in_batch), dtype=torch.float32, device=device)


def _rows(x: torch.Tensor, n_cols: int) -> torch.Tensor:
    """``x`` as rows of ``n_cols`` with unit column stride (a copy only when needed)."""
    x2 = x.reshape(-1, n_cols)
    return x2 if x2.stride(-1) == 1 or n_cols <= 1 else x2.contiguous()


def _torch_reduce(loss_rows, labels, ignore_index, reduction, items):
    if reduction == NONE:
        return loss_rows
    scale = _inverse_items(labels, ignore_index, reduction, items)
    return (loss_rows.sum() * scale).reshape(())


def _torch_cross_entropy(logits, labels, options, reduction, items):
    """The PyTorch formula (logits in fp32, as transformers computes them), for tensors the
    kernels do not run on (CPU tensors without TRITON_INTERPRET=1)."""
    ignore_index, smoothing, softcap = options
    logits = logits.float()
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    loss_rows = torch.nn.functional.cross_entropy(
        logits, labels.long(), ignore_index=ignore_index, reduction="none",
        label_smoothing=smoothing,
    )  # fmt: skip
    return _torch_reduce(loss_rows, labels, ignore_index, reduction, items)


def _fused(hidden, weight, bias, flat, items, options, code, chunking, fp32_weight_grad):
    """The loss of 2-D ``hidden`` and 1-D ``flat`` labels, through whichever path fits: the
    PyTorch formula where the kernels do not run, the custom op under torch.compile, the
    autograd function when a backward is recorded, else the bare launcher."""
    # Under torch.compile the rule keeps the op (the formula's logits are [tokens, vocab] in
    # memory, which inductor cannot avoid); forcing the formula is for measurements.
    if not _runs_kernels(hidden.device) or (
        torch.compiler.is_compiling()
        and compile_side(
            "fused_linear_cross_entropy",
            *sizes(hidden),
            use_autograd_function(hidden, weight, bias),
        )
        != OP
    ):
        _check(hidden, weight, bias, flat)
        logits = torch.nn.functional.linear(hidden, weight, bias)
        return _torch_cross_entropy(logits, flat, options, code, items)
    if torch.compiler.is_compiling():
        needs = (
            hidden.requires_grad,
            weight.requires_grad,
            bias is not None and bias.requires_grad,
        )
        chunk_size, vocab_chunk = chunking
        return fused_linear_cross_entropy_op(
            hidden, weight, bias, flat, items, *options, code, chunk_size or 0, vocab_chunk or 0,
            fp32_weight_grad, *needs,
        )[0]  # fmt: skip
    if use_autograd_function(hidden, weight, bias):
        return _FusedLinearCrossEntropyFunction.apply(
            hidden, weight, bias, flat, items, options, code, chunking, fp32_weight_grad
        )
    no_grads = (False, False, False)
    return _flce_forward(
        hidden, weight, bias, flat, items, options, code, chunking, no_grads, False
    )[0]


def fused_linear_cross_entropy(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    softcap: float | None = None,
    num_items_in_batch: int | float | torch.Tensor | None = None,
    chunk_size: int | None = None,
    vocab_chunk: int | None = None,
    fp32_weight_grad: bool = False,
) -> torch.Tensor:
    """``F.cross_entropy(F.linear(hidden_states, weight, bias), labels)`` without the logits.

    Args:
        hidden_states: ``[..., hidden]``, float32, float16 or bfloat16.
        weight: ``[vocab, hidden]`` (``lm_head.weight``), the hidden states' dtype.
        labels: ``hidden_states.shape[:-1]``, int64 or int32: the class of each token (no shift;
            `causal_lm_loss` shifts like transformers' ``ForCausalLMLoss``).
        bias: ``[vocab]`` or None.
        ignore_index: tokens with this label add nothing to the loss or the gradients.
        reduction: ``"mean"`` over tokens not ignored, ``"sum"``, or ``"none"`` (one loss a
            token, 0 for ignored ones).
        label_smoothing: as ``torch.nn.CrossEntropyLoss``'s.
        softcap: Gemma's final-logit soft-capping: ``logits = softcap * tanh(logits / softcap)``.
        num_items_in_batch: the mean's denominator instead of the count of tokens not ignored
            (transformers' gradient accumulation: the summed loss divided by it).
        chunk_size: tokens per chunk; by default planned from the sizes and free memory: a
            chunk's logits up to the size of the weight's gradient (README).
        vocab_chunk: vocabulary columns a chunk's logits hold: fewer than the vocabulary runs
            two passes over tiles of that many columns (README); planned by default.
        fp32_weight_grad: accumulate the weight's gradient over chunks in an fp32 buffer
            (costs 4 bytes a weight element while the loss runs) instead of in the weight's
            dtype (each chunk's product is summed in fp32 inside the matmul either way).

    Returns:
        The loss, float32: a scalar, or ``labels.shape`` for ``reduction="none"``. A mean
        with nothing to count (every label ignored) is 0, with zero gradients.

    The gradients are computed in the forward pass; the backward only scales them, so a loss
    can be backpropagated once (``retain_graph=True`` and a second backward raise).
    """
    what = "fused_linear_cross_entropy"
    options, code = _options(
        ignore_index, reduction, label_smoothing, softcap, num_items_in_batch, what
    )
    if hidden_states.dim() == 0 or labels.shape != hidden_states.shape[:-1]:
        raise ValueError(
            f"{what}: labels of shape {tuple(labels.shape)} do not match hidden_states of shape "
            f"{tuple(hidden_states.shape)} (one label a token: hidden_states.shape[:-1])"
        )
    device = hidden_states.device
    hidden = _rows(hidden_states, hidden_states.shape[-1])
    flat = labels.reshape(-1)
    items = _items(num_items_in_batch, device)
    args = (flat, items, options, code, (chunk_size, vocab_chunk), fp32_weight_grad)
    if torch.is_autocast_enabled(device.type):
        # What lm_head computes under autocast: the matmul in the autocast dtype. The kernels'
        # matmuls run in the dtype they are given (``out=`` matmuls ignore autocast anyway).
        dtype = torch.get_autocast_dtype(device.type)
        with torch.autocast(device.type, enabled=False):
            cast = None if bias is None else bias.to(dtype)
            loss = _fused(hidden.to(dtype), weight.to(dtype), cast, *args)
    else:
        loss = _fused(hidden, weight, bias, *args)
    return loss.reshape(labels.shape) if code == NONE else loss


def cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    softcap: float | None = None,
    num_items_in_batch: int | float | torch.Tensor | None = None,
) -> torch.Tensor:
    """``F.cross_entropy(logits.float(), labels)`` over ``[..., vocab]`` logits that exist.

    Same arguments and semantics as `fused_linear_cross_entropy`. The logits are read in their
    own dtype (no fp32 copy); the gradient is made in the forward, in the logits' dtype, in a
    new tensor (the logits are left as they are: a model returns them).
    """
    what = "cross_entropy"
    options, code = _options(
        ignore_index, reduction, label_smoothing, softcap, num_items_in_batch, what
    )
    if logits.dim() == 0 or labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"{what}: labels of shape {tuple(labels.shape)} do not match logits of shape "
            f"{tuple(logits.shape)} (one label a row: logits.shape[:-1])"
        )
    rows = _rows(logits, logits.shape[-1])
    flat = labels.reshape(-1)
    items = _items(num_items_in_batch, logits.device)
    if not _runs_kernels(logits.device) or (
        torch.compiler.is_compiling()
        and compile_side("cross_entropy", *sizes(rows), use_autograd_function(rows)) != OP
    ):
        _check_labels(what, rows, flat)
        loss = _torch_cross_entropy(rows, flat, options, code, items)
    elif torch.compiler.is_compiling():
        loss = cross_entropy_op(rows, flat, items, *options, code, rows.requires_grad)[0]
    elif use_autograd_function(rows):
        loss = _CrossEntropyFunction.apply(rows, flat, items, options, code)
    else:
        loss = _ce_forward(rows, flat, items, options, code, False)[0]
    return loss.reshape(labels.shape) if code == NONE else loss
