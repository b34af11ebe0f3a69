"""Cross-entropy over a vocabulary, fused with the ``lm_head`` projection that makes the logits.

``fused_linear_cross_entropy(hidden, weight, labels)`` is ``F.cross_entropy(hidden @ weight.T,
labels)`` (with a bias, soft-capping, label smoothing, ``ignore_index`` and a given denominator)
without ever holding the logits of every token. The tokens are taken in chunks; for each chunk:

1. ``logits = hidden_chunk @ weight.T (+ bias)``, one cuBLAS matmul in the input dtype into a
   buffer reused by every chunk;
2. two Triton kernels reduce each row to its log-sum-exp and loss and overwrite the row, in
   place, with d(loss)/d(logits) (softmax minus the smoothed one-hot, times the reduction's
   scale, times the soft-cap's derivative);
3. ``grad_hidden_chunk = grad_logits @ weight`` and ``grad_weight += grad_logits.T @
   hidden_chunk`` (``grad_bias += grad_logits.sum(0)``), matmuls again.

The gradients are made in the forward (the loss is the last op of a training step, so its
backward follows at once) and only scaled by the loss's gradient in the backward, as
Liger-Kernel's fused linear cross-entropy does. ``cross_entropy(logits, labels)`` runs the same
two kernels on logits that already exist (step 2 alone), writing the gradient to a new tensor
of the logits' dtype rather than into them.

The file reads top to bottom: the Triton kernels, then the launchers (chunk size, the chunk
loop), then the eager autograd functions, then the ``torch.library`` ops torch.compile sees,
then the public functions.
"""

import os

import torch
import triton
import triton.language as tl

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

# ---- the chunk size -----------------------------------------------------------------------
#
# A chunk's logits are its only large transient: rows x vocab elements of the input dtype
# (the gradient overwrites them). Liger-Kernel bounds them by the size of the hidden states
# (rows = next power of two of tokens / ceil(vocab / hidden)); we use the same bound, so the
# peak memory of the loss is never above Liger's, and the chunks are as large, so the matmuls
# are as efficient: with fewer rows than a few hundred a chunk, each of its three matmuls
# reads the whole weight for little work, and the loss becomes bound by memory bandwidth.
# Within that bound a chunk never takes more than FREE_MEMORY_SHARE of the memory still free
# on the device (torch.cuda.mem_get_info, plus what PyTorch's allocator holds unused); on the
# CPU, where the interpreter runs tiny shapes, at most CPU_CHUNK_BYTES. The chunks are then
# evened out (17 chunks of 242 rows rather than 16 of 256 and one of 4). ``chunk_size=``
# overrides all of it: larger chunks are faster where the loss is bound by memory bandwidth
# (large vocabulary, small hidden size, few tokens), at the price of their logits' memory.
FREE_MEMORY_SHARE = 0.5
CPU_CHUNK_BYTES = 64 * 2**20

# ---- the row kernels ----------------------------------------------------------------------
#
# A row of logits is split between several programs (SPLIT_PROGRAMS_PER_SM programs a
# multiprocessor over the chunk), so that a chunk of few rows (a large vocabulary) still keeps
# every multiprocessor streaming. Each program walks its span of the row in BLOCK columns.
BLOCK = 4096
BLOCK_WARPS = 8  # 16 elements a thread: two 16-byte loads of bf16
SPLIT_PROGRAMS_PER_SM = 4
CPU_BLOCK = 256  # the interpreter: small blocks, so that odd vocabularies span several
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
def _row_stats_kernel(
    X,
    LABELS,
    M_PART,
    S_PART,
    SUM_PART,
    ZY,
    row_start,
    n_cols,
    stride_x,
    span,
    n_splits,
    ignore_index,
    softcap,
    HAS_SOFTCAP: tl.constexpr,
    SMOOTHING: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # Program (row, split) reduces columns [split * span, (split + 1) * span) of its row of
    # (soft-capped) logits z to a running maximum and sum of exp(z - maximum), kept per lane
    # (no reduction across the block inside the loop), and with label smoothing to the sum of
    # z. The program whose span holds the row's label stores z[label]. Rows whose label is
    # ignore_index are skipped: their loss and gradient are zero.
    row = tl.program_id(0)
    split = tl.program_id(1)
    y = tl.load(LABELS + row_start + row)
    if y == ignore_index:
        return
    start = split * span
    end = tl.minimum(start + span, n_cols)
    x_row = X + row.to(tl.int64) * stride_x
    # A large finite floor rather than -inf: lanes that never see a column keep s = 0 and
    # never compute exp(-inf - -inf).
    m = tl.full([BLOCK], -1.0e30, tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    total = tl.zeros([BLOCK], tl.float32)
    for first in range(start, end, BLOCK):
        cols = first + tl.arange(0, BLOCK)
        mask = cols < end
        z = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_SOFTCAP:
            z = softcap * _tanh(z / softcap)
        if SMOOTHING:
            total += tl.where(mask, z, 0.0)
        z = tl.where(mask, z, float("-inf"))
        m_new = tl.maximum(m, z)
        s = s * tl.exp(m - m_new) + tl.exp(z - m_new)
        m = m_new
    row_max = tl.max(m, axis=0)
    part = row * n_splits + split
    tl.store(M_PART + part, row_max)
    tl.store(S_PART + part, tl.sum(s * tl.exp(m - row_max), axis=0))
    if SMOOTHING:
        tl.store(SUM_PART + part, tl.sum(total, axis=0))
    if (y >= start) & (y < end):
        zy = tl.load(x_row + y).to(tl.float32)
        if HAS_SOFTCAP:
            zy = softcap * _tanh(zy / softcap)
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
    n_cols,
    stride_x,
    stride_dx,
    span,
    n_splits,
    scale_stride,
    ignore_index,
    label_smoothing,
    softcap,
    HAS_SOFTCAP: tl.constexpr,
    SMOOTHING: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # With lse the row's log-sum-exp (from the partial sums of _row_stats_kernel), eps the
    # smoothing and V the vocabulary:
    #   loss = lse - (1 - eps) z[y] - eps / V sum_j z_j
    #   dloss/dx_j = (softmax_j - eps / V - (1 - eps) [j == y]) * scale * dz_j/dx_j
    # with dz/dx = 1 - tanh^2(x / cap) under soft-capping, 1 otherwise. ``scale`` is the
    # reduction's (1 / number of items for a mean, 1 for a sum) or, recomputing for
    # reduction="none", the row's own gradient. Split 0 of each row writes the loss; every
    # split overwrites its span with the gradient (X and DX may be the same memory: each
    # element is read, then written, by one program). A label outside [0, V) that is not
    # ignore_index gives a NaN loss.
    row = tl.program_id(0)
    split = tl.program_id(1)
    y = tl.load(LABELS + row_start + row)
    start = split * span
    end = tl.minimum(start + span, n_cols)
    dx_row = DX + row.to(tl.int64) * stride_dx
    if y == ignore_index:
        if split == 0:
            tl.store(LOSS + row_start + row, 0.0)
        if COMPUTE_GRAD:
            for first in range(start, end, BLOCK):
                cols = first + tl.arange(0, BLOCK)
                tl.store(dx_row + cols, tl.zeros([BLOCK], DX.dtype.element_ty), mask=cols < end)
        return
    parts = tl.arange(0, SPLITS)
    part_mask = parts < n_splits
    part_max = tl.load(M_PART + row * n_splits + parts, mask=part_mask, other=float("-inf"))
    part_sum = tl.load(S_PART + row * n_splits + parts, mask=part_mask, other=0.0)
    row_max = tl.max(part_max, axis=0)
    lse = row_max + tl.log(tl.sum(part_sum * tl.exp(part_max - row_max), axis=0))
    eps = label_smoothing / n_cols
    if split == 0:
        loss = lse - (1.0 - label_smoothing) * tl.load(ZY + row)
        if SMOOTHING:
            total = tl.load(SUM_PART + row * n_splits + parts, mask=part_mask, other=0.0)
            loss -= eps * tl.sum(total, axis=0)
        loss = tl.where((y < 0) | (y >= n_cols), float("nan"), loss)
        tl.store(LOSS + row_start + row, loss)
    if COMPUTE_GRAD:
        scale = tl.load(SCALE + (row_start + row).to(tl.int64) * scale_stride).to(tl.float32)
        x_row = X + row.to(tl.int64) * stride_x
        for first in range(start, end, BLOCK):
            cols = first + tl.arange(0, BLOCK)
            mask = cols < end
            z = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
            if HAS_SOFTCAP:
                t = _tanh(z / softcap)
                z = softcap * t
            g = tl.exp(z - lse) - eps
            g = tl.where(cols == y, g - (1.0 - label_smoothing), g) * scale
            if HAS_SOFTCAP:
                g = g * (1.0 - t * t)
            tl.store(dx_row + cols, g.to(DX.dtype.element_ty), mask=mask)


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
    unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(FREE_MEMORY_SHARE * (free + unused))


def chunk_rows(
    n_rows: int,
    hidden_size: int,
    vocab_size: int,
    element_size: int,
    device: torch.device,
    chunk_size: int | None = None,
) -> int:
    """Tokens a chunk of ``fused_linear_cross_entropy`` takes (see "the chunk size" above)."""
    if n_rows == 0:
        return 1
    if chunk_size:
        return max(1, min(int(chunk_size), n_rows))
    rows = next_power_of_2(cdiv(n_rows * hidden_size, max(vocab_size, 1)))
    rows = min(rows, max(1, _free_bytes(device) // max(vocab_size * element_size, 1)), n_rows)
    return cdiv(n_rows, cdiv(n_rows, rows))


def _row_config(rows: int, n_cols: int, device: torch.device) -> tuple[int, int, int, int]:
    """(block, num_warps, span, n_splits) of the row kernels for ``rows`` rows of ``n_cols``."""
    if device.type == "cuda":
        block, warps = min(BLOCK, next_power_of_2(n_cols)), BLOCK_WARPS
    else:
        block, warps = min(CPU_BLOCK, next_power_of_2(n_cols)), 4
    blocks = cdiv(n_cols, block)
    splits = max(1, min(blocks, cdiv(SPLIT_PROGRAMS_PER_SM * multiprocessors(device), rows)))
    span = cdiv(blocks, splits) * block
    return block, warps, span, cdiv(n_cols, span)


def _work_buffers(max_rows: int, n_cols: int, device: torch.device):
    """(partial maxima, partial sums, partial sums of z, z[label]) for chunks up to
    ``max_rows`` rows: one allocation for every chunk (fewer rows never need more splits
    than one row does)."""
    _, _, _, splits = _row_config(1, n_cols, device)
    work = torch.empty(max_rows * (3 * splits + 1), dtype=torch.float32, device=device)
    parts = max_rows * splits
    return work[:parts], work[parts : 2 * parts], work[2 * parts : 3 * parts], work[3 * parts :]


def _rows_loss_and_grad(
    x, dx, labels, row_start, loss, scale, scale_stride, options, compute_grad, work
) -> None:
    """Loss of rows ``x`` (labels ``labels[row_start:]``) into ``loss[row_start:]``; with
    ``compute_grad`` the gradient into ``dx`` (which may be ``x``)."""
    ignore_index, smoothing, softcap = options
    rows, n_cols = x.shape
    block, warps, span, n_splits = _row_config(rows, n_cols, x.device)
    m_part, s_part, sum_part, zy = work
    has_softcap, smoothing_on = softcap > 0, smoothing > 0
    stats = (
        x, labels, m_part, s_part, sum_part, zy, row_start, n_cols, x.stride(0), span, n_splits,
        ignore_index, softcap, has_softcap, smoothing_on, block,
    )  # fmt: skip
    launch(_row_stats_kernel, (rows, n_splits), stats, warps, x.device)
    args = (
        x, dx, labels, m_part, s_part, sum_part, zy, loss, scale, row_start, n_cols, x.stride(0),
        dx.stride(0), span, n_splits, scale_stride, ignore_index, smoothing, softcap,
        has_softcap, smoothing_on, compute_grad, next_power_of_2(n_splits), block,
    )  # fmt: skip
    launch(_loss_grad_kernel, (rows, n_splits if compute_grad else 1), args, warps, x.device)


def _scale_(t: torch.Tensor | None, g: torch.Tensor) -> None:
    """``t *= g`` in place (``g`` a one-element tensor), skipped on the device when g == 1."""
    if t is None or t.numel() == 0:
        return
    n = t.numel()
    programs = max(1, min(cdiv(n, SCALE_BLOCK), SCALE_PROGRAMS_PER_SM * multiprocessors(t.device)))
    args = (t, g.reshape(1).to(torch.float32), n, SCALE_BLOCK)
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
    hidden, weight, bias, labels, options, chunk_size, scale, scale_stride, grads, fp32_weight_grad
):
    """The chunk loop: (per-row loss [N] fp32, grad_hidden, grad_weight, grad_bias), the
    gradients None unless ``grads`` (hidden, weight, bias) asks for them. ``scale`` holds the
    gradient's scale: one value (``scale_stride`` 0) or one a row (1)."""
    n_rows, hidden_size = hidden.shape
    vocab = weight.shape[0]
    need_gh, need_gw, need_gb = grads
    compute_grad = need_gh or need_gw or need_gb
    loss = torch.empty(n_rows, dtype=torch.float32, device=hidden.device)
    gh = torch.empty_like(hidden) if need_gh else None
    gw = gb = None
    if need_gw:
        accumulate = torch.float32 if fp32_weight_grad else weight.dtype
        gw = torch.empty(weight.shape, dtype=accumulate, device=weight.device)
    if need_gb:
        gb = torch.zeros(vocab, dtype=torch.float32, device=hidden.device)
    if n_rows == 0:
        if gw is not None:
            gw.zero_()
        return loss, gh, gw, gb
    rows = chunk_rows(n_rows, hidden_size, vocab, hidden.element_size(), hidden.device, chunk_size)
    buffer = hidden.new_empty((rows, vocab))
    work = _work_buffers(rows, vocab, hidden.device)
    w_t = weight.t()
    for start in range(0, n_rows, rows):
        end = min(start + rows, n_rows)
        h = hidden[start:end]
        logits = buffer if end - start == rows else buffer[: end - start]
        if bias is None:
            torch.mm(h, w_t, out=logits)
        else:
            torch.addmm(bias, h, w_t, out=logits)
        _rows_loss_and_grad(
            logits, logits, labels, start, loss, scale, scale_stride, options, compute_grad, work
        )
        if not compute_grad:
            continue
        if need_gh:
            torch.mm(logits, weight, out=gh[start:end])
        if need_gw:
            _accumulate_weight_grad(gw, logits.t(), h, first=start == 0)
        if need_gb:
            gb += logits.sum(0, dtype=torch.float32)
    return loss, gh, gw, gb


def _accumulate_weight_grad(gw, g_t, h, first: bool) -> None:
    """``gw (+)= g_t @ h``. Each product sums a chunk's tokens in fp32 inside cuBLAS and is
    rounded once to ``gw``'s dtype (the weight's, like Liger's default, or fp32)."""
    if gw.dtype == h.dtype:
        if first:
            torch.mm(g_t, h, out=gw)
        else:
            gw.addmm_(g_t, h)
    elif gw.device.type == "cuda":  # fp32 accumulation of half-precision products
        torch.addmm(gw, g_t, h, beta=0.0 if first else 1.0, out_dtype=torch.float32, out=gw)
    elif first:  # the CPU has no addmm with out_dtype
        torch.mm(g_t.float(), h.float(), out=gw)
    else:
        gw.addmm_(g_t.float(), h.float())


def _reduce(loss_rows: torch.Tensor, scale: torch.Tensor, reduction: int) -> torch.Tensor:
    if reduction == NONE:
        return loss_rows
    return (loss_rows.sum() * scale).reshape(())


def _flce_forward(
    hidden, weight, bias, labels, items, options, reduction, chunk_size, grads, fp32_weight_grad
):
    """(loss, grad_hidden, grad_weight, grad_bias) of the public function's semantics; for
    reduction="none" the gradients are not made here (they need the backward's per-row
    gradient before the matmuls sum over tokens) and ``grads`` must be all False."""
    _check(hidden, weight, bias, labels)
    scale = _inverse_items(labels, options[0], reduction, items)
    loss_rows, gh, gw, gb = _flce_pass(
        hidden, weight, bias, labels, options, chunk_size, scale, 0, grads, fp32_weight_grad
    )
    if gw is not None:
        gw = gw.to(weight.dtype)
    if gb is not None:
        gb = gb.to(bias.dtype)
    return _reduce(loss_rows, scale, reduction), gh, gw, gb


def _flce_backward_none(grad_loss, hidden, weight, bias, labels, options, chunk_size, grads, fp32):
    """The gradients of reduction="none": the chunk loop again, each row's gradient scaled by
    its own ``grad_loss`` before the matmuls sum over tokens."""
    g = grad_loss.to(torch.float32).contiguous()
    _, gh, gw, gb = _flce_pass(hidden, weight, bias, labels, options, chunk_size, g, 1, grads, fp32)
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
        work = _work_buffers(logits.shape[0], logits.shape[1], logits.device)
        dx = logits if grad is None else grad
        _rows_loss_and_grad(logits, dx, labels, 0, loss_rows, scale, 0, options, compute_grad, work)
    return _reduce(loss_rows, scale, reduction), grad


def _ce_backward_none(grad_loss, logits, labels, options):
    """The gradient of ``cross_entropy``'s reduction="none": each row's scaled by its own
    ``grad_loss`` (the loss is recomputed on the way and dropped)."""
    grad = torch.empty_like(logits, memory_format=torch.contiguous_format)
    n_rows = logits.shape[0]
    if n_rows:
        work = _work_buffers(n_rows, logits.shape[1], logits.device)
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
        ctx, hidden, weight, bias, labels, items, options, reduction, chunk_size, fp32_weight_grad
    ):
        grads = tuple(ctx.needs_input_grad[:3])
        ctx.reduction = reduction
        if reduction == NONE:
            loss, *_ = _flce_forward(
                hidden, weight, bias, labels, items, options, reduction, chunk_size,
                (False, False, False), fp32_weight_grad,
            )  # fmt: skip
            ctx.save_for_backward(hidden, weight, bias, labels)
            ctx.recompute = (options, chunk_size, grads, fp32_weight_grad)
            return loss
        loss, gh, gw, gb = _flce_forward(
            hidden, weight, bias, labels, items, options, reduction, chunk_size, grads,
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
    fp32_weight_grad: bool,
    grad_hidden: bool,
    grad_weight: bool,
    grad_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    options = (ignore_index, label_smoothing, softcap)
    grads = (grad_hidden, grad_weight, grad_bias)
    loss, gh, gw, gb = _flce_forward(
        hidden, weight, bias, labels, items, options, reduction, chunk_size, grads, fp32_weight_grad
    )
    return loss, _or_empty(gh, hidden), _or_empty(gw, weight), _or_empty(gb, weight)


@fused_linear_cross_entropy_op.register_fake
def _(hidden, weight, bias, labels, items, ignore_index, label_smoothing, softcap, reduction,
      chunk_size, fp32_weight_grad, grad_hidden, grad_weight, grad_bias):  # fmt: skip
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
    fp32_weight_grad: bool,
    grad_hidden: bool,
    grad_weight: bool,
    grad_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of reduction="none" (recomputed with each row's ``grad_loss``)."""
    options = (ignore_index, label_smoothing, softcap)
    grads = (grad_hidden, grad_weight, grad_bias)
    gh, gw, gb = _flce_backward_none(
        grad_loss, hidden, weight, bias, labels, options, chunk_size, grads, fp32_weight_grad
    )
    return _or_empty(gh, hidden), _or_empty(gw, weight), _or_empty(gb, weight)


@fused_linear_cross_entropy_backward_op.register_fake
def _(grad_loss, hidden, weight, bias, labels, ignore_index, label_smoothing, softcap, chunk_size,
      fp32_weight_grad, grad_hidden, grad_weight, grad_bias):  # fmt: skip
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
        ctx.recompute = (ignore_index, smoothing, softcap, chunk_size, inputs[10])
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
    return *grads, *(None,) * 11


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


def _fused(hidden, weight, bias, flat, items, options, code, chunk_size, fp32_weight_grad):
    """The loss of 2-D ``hidden`` and 1-D ``flat`` labels, through whichever path fits: the
    PyTorch formula where the kernels do not run, the custom op under torch.compile, the
    autograd function when a backward is recorded, else the bare launcher."""
    if not _runs_kernels(hidden.device):
        _check(hidden, weight, bias, flat)
        logits = torch.nn.functional.linear(hidden, weight, bias)
        return _torch_cross_entropy(logits, flat, options, code, items)
    if torch.compiler.is_compiling():
        needs = (
            hidden.requires_grad,
            weight.requires_grad,
            bias is not None and bias.requires_grad,
        )
        return fused_linear_cross_entropy_op(
            hidden, weight, bias, flat, items, *options, code, chunk_size or 0, fp32_weight_grad,
            *needs,
        )[0]  # fmt: skip
    if use_autograd_function(hidden, weight, bias):
        return _FusedLinearCrossEntropyFunction.apply(
            hidden, weight, bias, flat, items, options, code, chunk_size, fp32_weight_grad
        )
    no_grads = (False, False, False)
    return _flce_forward(
        hidden, weight, bias, flat, items, options, code, chunk_size, no_grads, False
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
        chunk_size: tokens per chunk; default from the vocabulary and free memory (README).
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
    args = (flat, items, options, code, chunk_size, fp32_weight_grad)
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
    if not _runs_kernels(logits.device):
        _check_labels(what, rows, flat)
        loss = _torch_cross_entropy(rows, flat, options, code, items)
    elif torch.compiler.is_compiling():
        loss = cross_entropy_op(rows, flat, items, *options, code, rows.requires_grad)[0]
    elif use_autograd_function(rows):
        loss = _CrossEntropyFunction.apply(rows, flat, items, options, code)
    else:
        loss = _ce_forward(rows, flat, items, options, code, False)[0]
    return loss.reshape(labels.shape) if code == NONE else loss
