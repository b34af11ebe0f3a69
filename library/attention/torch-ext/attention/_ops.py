"""The attention kernels as ``torch.library`` custom ops, with fake implementations and autograd.

Each op takes 4-D ``(batch, rows, heads, dim)`` tensors: packed (varlen) inputs come as
``(1, total, heads, dim)`` with ``cu_seqlens``. Being custom ops, they are opaque to
``torch.compile`` (``fullgraph=True`` traces them as one node) and their launchers read nothing
from the device (no ``.item()``, no host sync), so they can be captured in CUDA graphs.

``forward`` returns ``(out, lse)``; its registered autograd runs ``backward``, which returns
``(dq, dk, dv, delta)``; the sink gradient is ``-sum(exp(s_aux - lse) * delta)`` over a head's
rows (the sink's probability times ``dout . out``), summed here in PyTorch.

Dropout takes its randomness as an input: ``dropout_seed``, a 1-element int64 tensor that
``draw_dropout_seed`` draws from torch's generator outside the op (so ``torch.manual_seed``
fixes it, ``torch.compile`` sees an ordinary random op and a CUDA graph's replays draw anew).
The kernels key Philox numbers by (seed, query row, head, key), and the backward regenerates the
forward's mask from the seed it saved; ``dropout_keep_mask`` runs the same code for tests.

A call with at most ``DECODE_MAX_QUERIES`` queries a sequence (dense or over a KV cache, no
dropout) takes the split-KV (flash-decoding) path, ``_decode``: the keys are cut into
``decode_splits`` chunks, one program each (per batch row, kv head and tile of the group's query
rows), in one launch. Each program writes its chunk's partial output and log-sum-exp, then bumps
a counter of its rows (a split-K semaphore); the last program of those rows to finish combines
the chunks by their log-sum-exps and puts the counter back to zero. With one chunk the program
writes the output itself. The counters are kept per device and CUDA stream
(``_decode_counters``). With ``_DECODE_FUSED`` off it runs the former two launches instead, the
second combining the chunks: kept for benchmarks.

The forward can read q, k and v through tensor descriptors (Hopper's copy engine, TMA) instead
of pointer arithmetic (``_forward_tma``): by default on GPUs with TMA for head dimensions of 128
and more, where an H100 measured it faster (``_FORWARD_TMA``, benchmarks/attention.py's
``ours-tma`` rows). The backward's kernels do the same by the same rule (``_backward_tma``,
``_BACKWARD_TMA``), and its dk/dv kernel lays its tiles keys x queries from head dimension 128
(``_DKDV_KEYS_DOWN``); ``python -m benchmarks.diagnose.attention_versions`` times each switch.
"""

import math
import threading

import torch

from . import _kernels as K
from ._library import (
    _current_device,
    _current_stream,
    launch,
    multiprocessors,
    next_power_of_2,
    op_name,
    use_autograd_function,
)
from ._tuning import (
    BACKWARD_DKDV,
    BACKWARD_DQ,
    CPU,
    DECODE_MAX_QUERIES,
    DECODE_MAX_ROWS,
    DELTA_ROWS,
    FORWARD,
    config,
    decode_plan,
)

try:  # Triton 3.4 and newer
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton: the pointer loads only
    TensorDescriptor = None

_LOG2E = 1.4426950408889634


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _takes_gpu_path(device: torch.device) -> bool:
    """Whether a call on ``device`` takes the GPU's tiles, dot precision and split counts (else
    the interpreter's: small tiles, bf16 products widened). One place, so that
    tests/library/cuda_compile_check.py can have CPU tensors take the GPU's path and compile the
    launches a GPU would make."""
    return device.type == "cuda"


def _run(kernel, grid, args, cfg, device: torch.device) -> None:
    # The shared launcher: after a kernel's first launch, its compiled launcher directly
    # (Triton's runner binds this package's 60-odd arguments in Python on every call).
    launch(kernel, grid, args, cfg.num_warps, device, cfg.num_stages)


def _scales(softmax_scale: float, softcap: float) -> tuple[float, float]:
    # (logit_scale, cap_log2) as _kernels._logits takes them.
    if softcap > 0.0:
        return softmax_scale / softcap, softcap * _LOG2E
    return softmax_scale * _LOG2E, 0.0


def _dot_precision(dtype: torch.dtype, device: torch.device) -> str:
    # fp32 inputs get fp32 products (the GPU's default would round them to tf32); bf16 ones
    # are widened in the interpreter, whose bf16 tl.dot is wrong (_kernels._dot).
    if dtype == torch.float32:
        return "ieee"
    return "upcast" if dtype == torch.bfloat16 and not _takes_gpu_path(device) else "tf32"


#: Whether the forward reads q, k and v through tensor descriptors (`_forward_tma`): False
#: never, True wherever descriptors can describe the inputs, the CPU's interpreter included
#: (tests), None (the default) where the GPU has TMA (compute capability 9.0 and newer) and the
#: head dimension is at least ``_TMA_MIN_HEAD_DIM``. On an H100 (2026-11-27, Triton 3.6,
#: benchmarks/results/h100/attention, two runs) descriptors ran the dense forward 0.97-1.13x
#: the pointer loads' speed at head dimension 128 (1.08x or more at three or four of six
#: shapes) but 0.80-1.06x at 64, where a block's rows are 128 bytes and the pointer loads
#: already coalesce.
_FORWARD_TMA: bool | None = None
_TMA_MIN_HEAD_DIM = 128
#: Whether the backward reads the tensors its kernels walk (q and dout for dk and dv, k and v
#: for dq) through tensor descriptors (`_backward_tma`): False never, True wherever
#: descriptors can describe them, the interpreter included, None (the default) as the forward:
#: where the GPU has TMA and the head dimension is at least ``_TMA_MIN_HEAD_DIM``. On an H100
#: (2026-11-27, Triton 3.6, bf16, 4x4096 and 1x16384) descriptors took the forward+backward
#: 1.02-1.08x faster at head dimension 128; at 64, 1.01-1.05x without a mask but 0.93-0.97x
#: causal (benchmarks/results/h100/NOTES.md).
_BACKWARD_TMA: bool | None = None
#: How the dk/dv kernel lays its tiles (``KEYS_DOWN`` of ``_kernels._dkdv_steps``): True keys x
#: queries, False queries x keys, None (the default) by head dimension: keys x queries from
#: ``_KEYS_DOWN_MIN_HEAD_DIM``. On an H100 (2026-11-27, Triton 3.6, bf16, 4x4096 and 1x16384),
#: keys x queries with descriptors took the forward+backward 1.06-1.11x faster than queries x
#: keys with pointers at head dimension 128, and 0.93-0.96x at 64 with either (NOTES.md).
_DKDV_KEYS_DOWN: bool | None = None
_KEYS_DOWN_MIN_HEAD_DIM = 128


def _block_dim(head_dim: int) -> int:
    """A head dimension's block width in the kernels: the next power of two, and at least 16,
    the least reduction length Triton 3.6's ``tl.dot`` takes on a GPU (an H100 machine's tiny
    test model, head dim 8, failed to compile; Triton 3.9 and the interpreter take less). The
    padding columns are masked like any past the head dimension."""
    return max(16, next_power_of_2(head_dim))


def _describable(t: torch.Tensor) -> bool:
    # A tensor descriptor wants a 16-byte aligned base and 16-byte multiples for every stride
    # but the last, which must be 1.
    size = t.element_size()
    return (
        t.stride(-1) == 1
        and t.data_ptr() % 16 == 0
        and all(stride * size % 16 == 0 for stride in t.stride()[:-1])
    )


def _forward_tma(q, k, v, block_table, device: torch.device) -> bool:
    """Whether this forward reads q, k and v through tensor descriptors (``_FORWARD_TMA``):
    never for a paged cache (its key blocks are gathered page by page) or inputs whose layout a
    descriptor cannot describe."""
    if _FORWARD_TMA is False or TensorDescriptor is None or block_table is not None:
        return False
    if _FORWARD_TMA is None and (not _has_tma(device) or q.shape[-1] < _TMA_MIN_HEAD_DIM):
        return False
    return all(_describable(t) for t in (q, k, v))


def _backward_tma(q, k, v, dout, device: torch.device) -> bool:
    """Whether this backward reads through tensor descriptors (``_BACKWARD_TMA``): only where
    a descriptor can describe q, k, v and dout, and never for one query or one key row.
    Triton compiles a length of 1 as a constant, and ptxas (Triton 3.6's, sm_90a) crashed on
    the backward kernels walking it through descriptors; a single row gains nothing from them
    anyway."""
    if _BACKWARD_TMA is False or TensorDescriptor is None or 1 in (q.shape[1], k.shape[1]):
        return False
    if _BACKWARD_TMA is None and (not _has_tma(device) or q.shape[-1] < _TMA_MIN_HEAD_DIM):
        return False
    return all(_describable(t) for t in (q, k, v, dout))


def _has_tma(device: torch.device) -> bool:
    # Hopper (compute capability 9.0) brought the tensor memory accelerator.
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def _descriptor(t: torch.Tensor, rows: int):
    # Blocks of one head's rows: (1, rows, 1, head dimension padded to a power of two); the
    # padding columns and rows past the tensor's end read as zeros.
    return TensorDescriptor.from_tensor(t, [1, rows, 1, _block_dim(t.shape[3])])


def _descriptors(q, k, v, block_m: int, block_n: int) -> tuple:
    return _descriptor(q, block_m), _descriptor(k, block_n), _descriptor(v, block_n)


def _batches(q: torch.Tensor, cu_seqlens_q: torch.Tensor | None) -> int:
    return q.shape[0] if cu_seqlens_q is None else cu_seqlens_q.shape[0] - 1


def _k_len_mode(cu_seqlens_k, seqused_k) -> int:
    if cu_seqlens_k is not None:
        return K.K_CU
    if seqused_k is not None:
        return K.K_USED
    return K.K_FIXED


def _null(device: torch.device) -> torch.Tensor:
    # A placeholder for a pointer argument that a constexpr keeps the kernel from reading.
    return torch.empty(0, dtype=torch.int32, device=device)


def _lse_shape(q: torch.Tensor) -> tuple[int, int, int]:
    return (q.shape[0], q.shape[2], q.shape[1])


def draw_dropout_seed(device: torch.device) -> torch.Tensor:
    """A dropout seed for the kernels: one int64 drawn from torch's generator of ``device``
    (on the device: no host sync, and a CUDA graph's replays each draw a new one)."""
    return torch.randint(0, 2**62, (1,), dtype=torch.int64, device=device)


def _dropout_args(dropout_p: float, dropout_seed: torch.Tensor | None, max_seqlen_k: int,
                  device: torch.device) -> tuple:  # fmt: skip
    # (SEED, rng_cols, dropout_p, dropout_scale, DROPOUT) as the kernels take them; dropout_p 0
    # compiles the kernels without any of it.
    if dropout_p <= 0.0:
        return _null(device), 1, 0.0, 1.0, False
    if dropout_seed is None:
        raise ValueError("dropout_p > 0 needs a dropout_seed (draw_dropout_seed).")
    return dropout_seed, max(max_seqlen_k, 1), float(dropout_p), 1.0 / (1.0 - dropout_p), True


def dropout_keep_mask(
    dropout_seed: torch.Tensor, rows: int, heads: int, max_seqlen_k: int, dropout_p: float
) -> torch.Tensor:
    """The keep-mask ``(rows, heads, max_seqlen_k)`` (bool) that the kernels draw for
    ``dropout_seed``: for dense inputs ``rows`` is ``batch * seqlen_q`` (row ``b * seqlen_q + i``),
    for packed ones the packed query rows; ``max_seqlen_k`` as passed to the attention call. For
    tests: it runs the kernels' own random-number code."""
    device = dropout_seed.device
    keep = torch.zeros((rows, heads, max_seqlen_k), dtype=torch.int8, device=device)
    # Any blocks draw the same numbers; wide ones keep the interpreter's launches few.
    cfg = config(FORWARD, 16, not _takes_gpu_path(device))._replace(block_m=16, block_n=256)
    # The kernel's arguments, each named as its parameter (``_library``'s "by name").
    seed, n_rows, n_heads, rng_cols = dropout_seed, rows, heads, max_seqlen_k
    dropout_p, block_m, block_n = float(dropout_p), cfg.block_m, cfg.block_n
    args = (keep, seed, n_rows, n_heads, rng_cols, dropout_p, block_m, block_n)
    _run(K._dropout_mask_kernel, (-(-rows // cfg.block_m), heads), args, cfg, device)
    return keep.bool()


# The fused decode path's split-K counters, one int32 per (row tile, batch x kv head) of a call.
# A launch leaves every counter it used at zero (the last program of each row tile resets its
# own), so a buffer is zeroed once, when made, and never again: nothing on the host may zero it
# between the replays of a CUDA graph, which bake its address in. Kept per CUDA stream, because two
# launches running at once must not count in the same counters, and a stream's launches run one
# after another; on the CPU (the interpreter, one program at a time) per device. A graph uses
# the buffer of the stream it was captured on, wherever it is replayed: graphs captured on one
# stream must not be replayed at once on different streams.
_decode_counter_buffers: dict[tuple, torch.Tensor] = {}
# Buffers replaced by larger ones: a captured graph may still write to them.
_retired_counter_buffers: list[torch.Tensor] = []
# Keys of buffers made during a capture, whose zeros are in the graph (see _decode_counters).
_unzeroed_counter_buffers: set[tuple] = set()
#: Whether calls through the op take the one-launch decode path (else split and reduce kernels;
#: benchmarks time both in one process). Private: not an option of the public functions.
_DECODE_FUSED = True


def _counters_key(device: torch.device) -> tuple:
    if device.type != "cuda":
        return (device.type, device.index)
    index = device.index if device.index is not None else _current_device()
    return (device.type, index, _current_stream(index))


def _zeroed_outside_graphs(n: int, device: torch.device) -> torch.Tensor:
    # Made on a thread of its own, on a stream of its own, and zeroed there before the call goes
    # on: memory that outlives the call must not come from a CUDA-graph tree's pool (under
    # torch.compile's CUDA graphs every allocation of the recording thread goes there, even in
    # the eager warm-up, and the trees hand that memory out again as they see fit).
    made: list = []

    def make() -> None:
        try:
            with torch.cuda.device(device), torch.cuda.stream(torch.cuda.Stream(device)):
                made.append(torch.zeros(n, dtype=torch.int32, device=device))
                torch.cuda.current_stream(device).synchronize()
        except BaseException as exc:  # re-raised on the caller's thread
            made.append(exc)

    thread = threading.Thread(target=make, name="attention-decode-counters")
    thread.start()
    thread.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    return made[0]


def _decode_counters(device: torch.device, n: int) -> torch.Tensor:
    # At least n counters of device (and current stream), all zero between calls.
    key = _counters_key(device)
    counters = _decode_counter_buffers.get(key)
    if counters is not None and counters.numel() >= n:
        if key in _unzeroed_counter_buffers and not torch.cuda.is_current_stream_capturing():
            counters.zero_()
            _unzeroed_counter_buffers.discard(key)
        return counters
    if counters is not None:
        _retired_counter_buffers.append(counters)
    size = next_power_of_2(n)
    if device.type != "cuda":
        counters = torch.zeros(size, dtype=torch.int32, device=device)
    elif torch.cuda.is_current_stream_capturing():
        # A capture (torch.cuda.graph's, which forbids the allocating thread of
        # _zeroed_outside_graphs) on a stream that has no counters yet: the buffer comes from the
        # graph's pool, held for good so no other allocation gets it, and its memset is captured
        # too, so its zeros exist once the graph has run; a call outside a capture zeroes it
        # first, in case it comes before that.
        counters = torch.zeros(size, dtype=torch.int32, device=device)
        _unzeroed_counter_buffers.add(key)
    else:
        counters = _zeroed_outside_graphs(size, device)
    _decode_counter_buffers[key] = counters
    return counters


def _current_decode_counters(device: torch.device) -> torch.Tensor | None:
    """For tests: the decode counters that a call on ``device`` (and, on CUDA, the current
    stream) would use now, or None before the first call that needs them."""
    return _decode_counter_buffers.get(_counters_key(device))


def _decode(q, k, v, out, lse, seqused_k, block_table, s_aux, max_seqlen_k, logit_scale,
            cap_log2, window_left, window_right, softcap, num_splits, cache_leftpad,
            key_mask) -> None:  # fmt: skip
    device = q.device
    batch, seqlen_q, n_heads, d_qk = q.shape
    n_kv_heads, d_v = k.shape[2], v.shape[3]
    group = n_heads // n_kv_heads
    on_cpu = not _takes_gpu_path(device)
    rows = seqlen_q * group
    # tl.dot wants at least 16 rows; a larger group is cut into tiles of DECODE_MAX_ROWS.
    block_m = CPU.block_m if on_cpu else min(max(16, next_power_of_2(rows)), DECODE_MAX_ROWS)
    tiles = -(-rows // block_m)
    cfg, rule_splits = decode_plan(
        next_power_of_2(max(d_qk, d_v)), batch * n_kv_heads * tiles, max_seqlen_k,
        1 if on_cpu else multiprocessors(device), on_cpu, q.dtype == torch.float32,
    )  # fmt: skip
    if num_splits <= 0:
        num_splits = rule_splits
    if not _DECODE_FUSED:
        combine = K.DECODE_PARTIAL
    elif num_splits == 1:
        combine = K.DECODE_DIRECT
    else:
        combine = K.DECODE_LAST
    # The kernels' arguments, each named as its parameter (``_library``'s "by name"). null: a
    # placeholder for a pointer that a constexpr keeps the kernel from reading.
    null = _null(device)
    if combine == K.DECODE_DIRECT:
        out_p = lse_p = counters = null
    else:
        out_p = torch.empty((batch * n_kv_heads, num_splits, rows, d_v), dtype=torch.float32,
                            device=device)  # fmt: skip
        lse_p = torch.empty((batch * n_kv_heads, num_splits, rows), dtype=torch.float32,
                            device=device)  # fmt: skip
        counters = (
            _decode_counters(device, tiles * batch * n_kv_heads)
            if combine == K.DECODE_LAST
            else null
        )
    paged, has_sink = block_table is not None, s_aux is not None
    leftpad, key_padding = cache_leftpad is not None, key_mask is not None
    BLOCK_TABLE = block_table if paged else null
    sink = s_aux if has_sink else null
    CACHE_LEFTPAD = cache_leftpad if leftpad else null
    KEY_MASK = key_mask if key_padding else null
    stride_qb, stride_qs, stride_qh, _ = q.stride()
    stride_kb, stride_ks, stride_kh, _ = k.stride()
    stride_vb, stride_vs, stride_vh, _ = v.stride()
    stride_bt = block_table.stride(0) if paged else 0
    stride_km = key_mask.stride(0) if key_padding else 0
    stride_ob, stride_os, stride_oh, _ = out.stride()
    stride_lb, stride_lh, _ = lse.stride()
    WINDOW_LEFT, WINDOW_RIGHT = window_left >= 0, window_right >= 0
    window_left, window_right = max(window_left, 0), max(window_right, 0)
    head_dim_qk, head_dim_v, block_dqk, block_dv = d_qk, d_v, _block_dim(d_qk), _block_dim(d_v)
    block_n, page_size = cfg.block_n, (k.shape[1] if paged else 1)
    SOFTCAP, DOT_PRECISION = softcap > 0.0, _dot_precision(q.dtype, device)
    args = (
        q, k, v, out_p, lse_p, seqused_k, BLOCK_TABLE, sink, out, lse, counters, CACHE_LEFTPAD,
        KEY_MASK, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb,
        stride_vs, stride_vh, stride_bt, stride_km, stride_ob, stride_os, stride_oh, stride_lb,
        stride_lh, seqlen_q, n_kv_heads, group, num_splits, logit_scale, cap_log2, window_left,
        window_right, head_dim_qk, head_dim_v, block_dqk, block_dv, block_m, block_n, paged,
        page_size, WINDOW_LEFT, WINDOW_RIGHT, SOFTCAP, has_sink, DOT_PRECISION, combine, leftpad,
        key_padding,
    )  # fmt: skip
    _run(K._decode_split_kernel, (num_splits, tiles, batch * n_kv_heads), args, cfg, device)
    if combine != K.DECODE_PARTIAL:
        return
    args = (
        out_p, lse_p, sink, out, lse, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
        seqlen_q, n_kv_heads, group, num_splits, head_dim_v, block_dv, block_m, has_sink,
    )  # fmt: skip
    _run(K._decode_reduce_kernel, (tiles, batch * n_kv_heads), args, cfg, device)


def _forward_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_k: torch.Tensor | None,
    seqused_k: torch.Tensor | None,
    block_table: torch.Tensor | None,
    s_aux: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    dropout_p: float = 0.0,
    dropout_seed: torch.Tensor | None = None,
    num_splits: int = 0,
    cache_leftpad: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of 4-D ``q`` over ``k``/``v``: ``(out, lse)``, ``lse`` as ``(q.shape[0], heads,
    q.shape[1])`` fp32. ``window_*`` below 0 are unbounded; ``softcap`` 0 is none; dropout as
    the module's docstring says. ``num_splits``: the split-KV path's chunk count, 0 for
    ``decode_splits``' choice. ``cache_leftpad``: ``(batch,)`` int32, the first key of each
    sequence of a left-padded cache (with ``seqused_k``; the keys before it are not attended).
    ``key_padding_mask``: ``(batch, >= max_seqlen_k)`` bool, rows contiguous, true for the keys
    attended to (with ``seqused_k``)."""
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    if key_padding_mask is not None:
        # The kernels read its bytes. Viewed here, inside the op, rather than by the caller:
        # torch 2.11's inductor fails to lower a bool tensor's view as uint8 (a padded batch's
        # decode step under generate()'s compile, on an H100 machine).
        key_padding_mask = key_padding_mask.view(torch.uint8)
    device = q.device
    n_heads, d_qk, d_v = q.shape[2], q.shape[3], v.shape[3]
    alloc = torch.empty if cu_seqlens_q is None else torch.zeros
    out = alloc((*q.shape[:3], d_v), dtype=q.dtype, device=device)
    # Packed rows past the last sequence are no program's: +inf there, as for a row that sees
    # no key, so that the backward reads a probability of 0 for them.
    lse = (
        torch.empty(_lse_shape(q), dtype=torch.float32, device=device)
        if cu_seqlens_q is None
        else torch.full(_lse_shape(q), float("inf"), dtype=torch.float32, device=device)
    )
    batches = _batches(q, cu_seqlens_q)
    if q.numel() == 0 or batches == 0:
        return out.zero_(), lse.fill_(float("inf"))
    logit_scale, cap_log2 = _scales(softmax_scale, softcap)
    if (
        cu_seqlens_q is None
        and cu_seqlens_k is None
        and max_seqlen_q <= DECODE_MAX_QUERIES
        and dropout_p <= 0.0
    ):
        # A few queries a sequence (a decode step, through flash_attn_with_kvcache or, as
        # transformers' generate() calls it, flash_attn_func): the split-KV path. Its (out, lse)
        # are the forward kernel's, so the backward is the same.
        if seqused_k is None:
            seqused_k = torch.full((q.shape[0],), k.shape[1], dtype=torch.int32, device=device)
        _decode(q, k, v, out, lse, seqused_k, block_table, s_aux, max_seqlen_k, logit_scale,
                cap_log2, window_left, window_right, softcap, num_splits, cache_leftpad,
                key_padding_mask)  # fmt: skip
        return out, lse
    cfg = config(
        FORWARD, next_power_of_2(max(d_qk, d_v)), not _takes_gpu_path(device),
        q.dtype == torch.float32,
    )  # fmt: skip
    # The kernel's arguments, each named as its parameter (``_library``'s "by name"). null: a
    # placeholder for a pointer that a constexpr keeps the kernel from reading.
    null = _null(device)
    seed, rng_cols, dropout_p, dropout_scale, dropout = _dropout_args(
        dropout_p, dropout_seed, max_seqlen_k, device
    )
    paged, has_sink, varlen_q = block_table is not None, s_aux is not None, cu_seqlens_q is not None
    leftpad, key_padding = cache_leftpad is not None, key_padding_mask is not None
    sink = s_aux if has_sink else null
    CU_Q = cu_seqlens_q if varlen_q else null
    CU_K = cu_seqlens_k if cu_seqlens_k is not None else null
    SEQUSED_K = seqused_k if seqused_k is not None else null
    BLOCK_TABLE = block_table if paged else null
    CACHE_LEFTPAD = cache_leftpad if leftpad else null
    KEY_MASK = key_padding_mask if key_padding else null
    stride_qb, stride_qs, stride_qh, _ = q.stride()
    stride_kb, stride_ks, stride_kh, _ = k.stride()
    stride_vb, stride_vs, stride_vh, _ = v.stride()
    stride_ob, stride_os, stride_oh, _ = out.stride()
    stride_lb, stride_lh, _ = lse.stride()
    stride_bt = block_table.stride(0) if paged else 0
    stride_km = key_padding_mask.stride(0) if key_padding else 0
    seqlen_q, seqlen_k, group = q.shape[1], k.shape[1], n_heads // k.shape[2]
    WINDOW_LEFT, WINDOW_RIGHT = window_left >= 0, window_right >= 0
    window_left, window_right = max(window_left, 0), max(window_right, 0)
    head_dim_qk, head_dim_v, block_dqk, block_dv = d_qk, d_v, _block_dim(d_qk), _block_dim(d_v)
    block_m, block_n = cfg.block_m, cfg.block_n
    K_LEN, page_size = _k_len_mode(cu_seqlens_k, seqused_k), (k.shape[1] if paged else 1)
    SOFTCAP, DOT_PRECISION = softcap > 0.0, _dot_precision(q.dtype, device)
    TMA = _forward_tma(q, k, v, block_table, device)
    if TMA:
        q_desc, k_desc, v_desc = _descriptors(q, k, v, block_m, block_n)
    else:  # placeholders of the pointer type the kernel has always been compiled with
        q_desc = k_desc = v_desc = null
    args = (
        q, k, v, out, lse, sink, CU_Q, CU_K, SEQUSED_K, BLOCK_TABLE, seed, CACHE_LEFTPAD,
        KEY_MASK, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb,
        stride_vs, stride_vh, stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_bt,
        stride_km, seqlen_q, seqlen_k, n_heads, group, logit_scale, cap_log2, window_left,
        window_right, rng_cols, dropout_p, dropout_scale, head_dim_qk, head_dim_v, block_dqk,
        block_dv, block_m, block_n, varlen_q, K_LEN, paged, page_size, WINDOW_LEFT,
        WINDOW_RIGHT, SOFTCAP, has_sink, DOT_PRECISION, dropout, leftpad, key_padding, q_desc,
        k_desc, v_desc, TMA,
    )  # fmt: skip
    grid = (-(-max_seqlen_q // cfg.block_m), batches * n_heads)
    _run(K._fwd_kernel, grid, args, cfg, device)
    return out, lse


forward = torch.library.custom_op(op_name("flash_attn_forward"), mutates_args=())(_forward_impl)


@forward.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, s_aux, max_seqlen_q,
      max_seqlen_k, softmax_scale, window_left, window_right, softcap, dropout_p=0.0,
      dropout_seed=None, num_splits=0, cache_leftpad=None, key_padding_mask=None):  # fmt: skip
    out = q.new_empty((*q.shape[:3], v.shape[3]))
    return out, q.new_empty(_lse_shape(q), dtype=torch.float32)


def _backward_impl(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_k: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    dropout_p: float = 0.0,
    dropout_seed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of ``forward`` (without paging or a KV cache): ``(dq, dk, dv, delta)``, where
    ``delta = rowsum(dout * out)`` is laid out as ``lse``."""
    dout, q, k, v, out = (_last_dim_contiguous(t) for t in (dout, q, k, v, out))
    device = q.device
    n_heads, n_kv_heads, d_qk, d_v = q.shape[2], k.shape[2], q.shape[3], v.shape[3]
    varlen = cu_seqlens_q is not None
    # Packed rows past the last sequence are no program's: zero rather than garbage there.
    alloc = torch.zeros_like if varlen else torch.empty_like
    dq, dk, dv = alloc(q), alloc(k), alloc(v)
    delta = torch.zeros_like(lse)
    batches = _batches(q, cu_seqlens_q)
    if q.numel() == 0 or k.numel() == 0 or batches == 0:
        return dq.zero_(), dk.zero_(), dv.zero_(), delta
    on_cpu = not _takes_gpu_path(device)
    block_d = next_power_of_2(max(d_qk, d_v))
    # The kernels' arguments, each named as its parameter (``_library``'s "by name"). null: a
    # placeholder for a pointer that a constexpr keeps the kernel from reading.
    null = _null(device)
    cu_q = cu_seqlens_q if varlen else null
    cu_k = cu_seqlens_k if cu_seqlens_k is not None else null
    K_LEN = _k_len_mode(cu_seqlens_k, None)
    seed, rng_cols, dropout_p, dropout_scale, dropout = _dropout_args(
        dropout_p, dropout_seed, max_seqlen_k, device
    )
    scale = softmax_scale
    logit_scale, cap_log2 = _scales(softmax_scale, softcap)
    WINDOW_LEFT, WINDOW_RIGHT = window_left >= 0, window_right >= 0
    window_left, window_right = max(window_left, 0), max(window_right, 0)
    SOFTCAP, DOT_PRECISION = softcap > 0.0, _dot_precision(q.dtype, device)
    do = dout
    stride_qb, stride_qs, stride_qh, _ = q.stride()
    stride_kb, stride_ks, stride_kh, _ = k.stride()
    stride_vb, stride_vs, stride_vh, _ = v.stride()
    stride_ob, stride_os, stride_oh, _ = out.stride()
    stride_dob, stride_dos, stride_doh, _ = do.stride()
    stride_dqb, stride_dqs, stride_dqh, _ = dq.stride()
    stride_dkb, stride_dks, stride_dkh, _ = dk.stride()
    stride_dvb, stride_dvs, stride_dvh, _ = dv.stride()
    stride_lb, stride_lh, _ = lse.stride()
    seqlen_q, seqlen_k, group = q.shape[1], k.shape[1], n_heads // n_kv_heads
    head_dim_qk, head_dim_v = d_qk, d_v
    varlen_q = varlen

    fp32 = q.dtype == torch.float32
    delta_cfg = config(BACKWARD_DQ, block_d, on_cpu, fp32)
    block_m = delta_cfg.block_m if on_cpu else DELTA_ROWS  # the delta kernel's rows a program
    block_dv = next_power_of_2(d_v)
    args = (
        out, do, delta, cu_q, stride_ob, stride_os, stride_oh, stride_dob, stride_dos, stride_doh,
        stride_lb, stride_lh, seqlen_q, n_heads, head_dim_v, block_dv, block_m, varlen_q,
    )  # fmt: skip
    grid = (-(-max_seqlen_q // block_m), batches * n_heads)
    _run(K._delta_kernel, grid, args, delta_cfg, device)

    block_dqk, block_dv = _block_dim(d_qk), _block_dim(d_v)
    cfg = config(BACKWARD_DKDV, block_d, on_cpu, fp32)
    block_m, block_n = cfg.block_m, cfg.block_n
    TMA = _backward_tma(q, k, v, dout, device)
    # Without TMA, placeholders of the pointer type the kernels are otherwise compiled with.
    q_desc, do_desc = (_descriptor(q, block_m), _descriptor(do, block_m)) if TMA else (null, null)
    keys_down = _DKDV_KEYS_DOWN
    KEYS_DOWN = block_d >= _KEYS_DOWN_MIN_HEAD_DIM if keys_down is None else keys_down
    args = (
        q, k, v, do, lse, delta, dk, dv, cu_q, cu_k, seed, stride_qb, stride_qs, stride_qh,
        stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_dob, stride_dos,
        stride_doh, stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh,
        stride_lb, stride_lh, seqlen_q, seqlen_k, n_kv_heads, group, scale, logit_scale,
        cap_log2, window_left, window_right, rng_cols, dropout_p, dropout_scale, head_dim_qk,
        head_dim_v, block_dqk, block_dv, block_m, block_n, varlen_q, K_LEN, WINDOW_LEFT,
        WINDOW_RIGHT, SOFTCAP, DOT_PRECISION, dropout, q_desc, do_desc, TMA, KEYS_DOWN,
    )  # fmt: skip
    grid = (-(-max_seqlen_k // cfg.block_n), batches * n_kv_heads)
    _run(K._bwd_dkdv_kernel, grid, args, cfg, device)

    cfg = config(BACKWARD_DQ, block_d, on_cpu, fp32)
    block_m, block_n = cfg.block_m, cfg.block_n
    k_desc, v_desc = (_descriptor(k, block_n), _descriptor(v, block_n)) if TMA else (null, null)
    args = (
        q, k, v, do, lse, delta, dq, cu_q, cu_k, seed, stride_qb, stride_qs, stride_qh,
        stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_dob, stride_dos,
        stride_doh, stride_dqb, stride_dqs, stride_dqh, stride_lb, stride_lh, seqlen_q, seqlen_k,
        n_heads, group, scale, logit_scale, cap_log2, window_left, window_right, rng_cols,
        dropout_p, dropout_scale, head_dim_qk, head_dim_v, block_dqk, block_dv, block_m,
        block_n, varlen_q, K_LEN, WINDOW_LEFT, WINDOW_RIGHT, SOFTCAP, DOT_PRECISION, dropout,
        k_desc, v_desc, TMA,
    )  # fmt: skip
    grid = (-(-max_seqlen_q // cfg.block_m), batches * n_heads)
    _run(K._bwd_dq_kernel, grid, args, cfg, device)
    return dq, dk, dv, delta


backward = torch.library.custom_op(op_name("flash_attn_backward"), mutates_args=())(_backward_impl)


@backward.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
      softmax_scale, window_left, window_right, softcap, dropout_p=0.0,
      dropout_seed=None):  # fmt: skip
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(lse)


def _setup_context(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, seqused_k, block_table, s_aux, max_q, max_k, scale, left, right,
     softcap, *rest) = inputs  # fmt: skip
    # dropout_p, dropout_seed, num_splits, cache_leftpad, key_padding_mask
    defaults = [0.0, None, 0, None, None]
    dropout_p, dropout_seed, _, cache_leftpad, key_mask = rest + defaults[len(rest) :]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, s_aux, dropout_seed)
    ctx.params = (max_q, max_k, scale, left, right, softcap, dropout_p)
    ctx.paged_or_cache = any(
        t is not None for t in (seqused_k, block_table, cache_leftpad, key_mask)
    )


def _gradients(ctx, dout, run_backward):
    # One gradient per input of forward, from the saved context; ``run_backward`` is the
    # backward op (graphs) or its implementation (eager calls).
    if ctx.paged_or_cache:
        raise RuntimeError(
            "flash_attn_with_kvcache has no backward (as in flash-attn): call it under "
            "torch.no_grad(), or use flash_attn_func / flash_attn_varlen_func to train."
        )
    q, k, v, out, lse, cu_q, cu_k, s_aux, dropout_seed = ctx.saved_tensors
    dq, dk, dv, delta = run_backward(dout, q, k, v, out, lse, cu_q, cu_k, *ctx.params,
                                     dropout_seed)  # fmt: skip
    ds_aux = None
    if s_aux is not None and ctx.needs_input_grad[7]:
        # d lse / d sink is the sink's probability; d out / d sink is -p_sink * out.
        p_sink = torch.exp(s_aux.float()[None, :, None] - lse)
        ds_aux = (-(p_sink * delta).sum(dim=(0, 2))).to(s_aux.dtype)
    # One gradient per input of forward (7 tensors/options before s_aux, 11 after it).
    return dq, dk, dv, None, None, None, None, ds_aux, *([None] * 11)


def _backward(ctx, dout, _dlse):
    return _gradients(ctx, dout, backward)


forward.register_autograd(_backward, setup_context=_setup_context)


class _FlashAttention(torch.autograd.Function):
    """forward and its backward for eager calls: the implementations without the ops'
    dispatcher, whose round trips cost more host time than the launches (an H100 machine,
    2026-11-27: the backward op's dispatch alone about 0.4 ms)."""

    @staticmethod
    def forward(ctx, *inputs):
        output = _forward_impl(*inputs)
        _setup_context(ctx, inputs, output)
        return output

    @staticmethod
    def backward(ctx, dout, _dlse):
        return _gradients(ctx, dout, _backward_impl)


def attention(*inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """``forward(*inputs)``'s ``(out, lse)``: under ``torch.compile`` the op (one node in the
    graph), eagerly a plain ``autograd.Function`` where a backward must be recorded, else the
    implementation itself."""
    if torch.compiler.is_compiling():
        return forward(*inputs)
    if use_autograd_function(*inputs[:3], inputs[7]):
        return _FlashAttention.apply(*inputs)
    return _forward_impl(*inputs)


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
