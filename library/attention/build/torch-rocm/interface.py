"""flash-attn 2's Python API: ``flash_attn_func``, ``flash_attn_varlen_func`` and
``flash_attn_with_kvcache``, with its signatures, layouts and return values, plus attention
sinks (``s_aux``, as transformers passes them for gpt-oss).

transformers 5.x calls these when a model is loaded with ``attn_implementation=<this repo>``: it
reads their signatures to decide which options to pass (``dropout_p``, ``window_size``,
``softcap``, ``s_aux``, ``block_table``, ``cache_seqlens``, ``deterministic``).

Dropout (``dropout_p``) is flash-attn 2's: the probabilities are dropped after the softmax and
the kept ones scaled by ``1 / (1 - dropout_p)``; the mask comes from a seed drawn from torch's
generator on each call, so ``torch.manual_seed`` makes it repeatable, and the backward
regenerates it rather than storing it.

Differences from flash-attn 2, each raised as an error rather than silently ignored:
ALiBi (``alibi_slopes``), rotary embedding inside ``flash_attn_with_kvcache``
(``rotary_cos``/``rotary_sin``) and ``cache_batch_idx``.
``return_attn_probs=True`` returns ``(out, softmax_lse, None)``: no probabilities or dropout
mask (flash-attn 2 returns them only for its tests). The backward is always deterministic (no
atomics).
Values inside ``cu_seqlens`` and ``cache_seqlens`` are not checked: that would read them back
from the GPU, a host synchronisation on every call.
"""

from __future__ import annotations

import math

import torch

from . import _ops

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_INDEX_DTYPES = (torch.int32, torch.int64)
MAX_HEAD_DIM = 256


def _fail(message: str) -> None:
    raise ValueError(message)


_LAYOUTS = {3: "(total_tokens, heads, head_dim)", 4: "(batch, seqlen, heads, head_dim)"}


def _check_tensors(where: str, q, k, v, q_dims: int, kv_dims: int) -> None:
    for name, t, dims in (("q", q, q_dims), ("k", k, kv_dims), ("v", v, kv_dims)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}.")
        if t.dim() != dims:
            _fail(f"{where}: {name} must be {_LAYOUTS[dims]}, got shape {tuple(t.shape)}.")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in _DTYPES:
        raise TypeError(
            f"{where}: q, k and v must share one dtype among float16, bfloat16 and float32; got "
            f"{q.dtype}, {k.dtype} and {v.dtype}. Cast them to the model's dtype."
        )
    if not (q.device == k.device == v.device):
        _fail(
            f"{where}: q, k and v are on {q.device}, {k.device} and {v.device}; move them to one device."
        )
    n_heads, n_kv_heads = q.shape[-2], k.shape[-2]
    if v.shape[-2] != n_kv_heads or n_kv_heads == 0 or n_heads % n_kv_heads:
        _fail(
            f"{where}: q has {n_heads} heads, k {n_kv_heads} and v {v.shape[-2]}: k and v need the "
            "same number of heads, which must divide q's (grouped-query attention)."
        )
    d_qk, d_v = q.shape[-1], v.shape[-1]
    if k.shape[-1] != d_qk:
        _fail(
            f"{where}: q's head dimension is {d_qk} but k's is {k.shape[-1]}; they must be equal."
        )
    if not (0 < d_qk <= MAX_HEAD_DIM and 0 < d_v <= MAX_HEAD_DIM):
        _fail(
            f"{where}: head dimensions {d_qk} (q, k) and {d_v} (v) must be between 1 and "
            f"{MAX_HEAD_DIM}."
        )


def _check_options(where: str, dropout_p, alibi_slopes) -> float:
    try:
        p = float(dropout_p or 0.0)
    except (TypeError, ValueError):
        p = float("nan")
    if not 0.0 <= p < 1.0:
        _fail(f"{where}: dropout_p must be a probability in [0, 1), got {dropout_p!r}.")
    if alibi_slopes is not None:
        _fail(
            f"{where}: alibi_slopes (ALiBi) is not supported by this kernel; use another attention implementation."
        )
    return p


def _dropout(p: float, device) -> tuple[float, torch.Tensor | None]:
    # (dropout_p, seed) for _ops.attention: a seed only when something is dropped.
    return (p, _ops.draw_dropout_seed(device)) if p > 0.0 else (0.0, None)


def _check_sink(where: str, s_aux, n_heads: int, device) -> None:
    if s_aux is None:
        return
    if not isinstance(s_aux, torch.Tensor) or tuple(s_aux.shape) != (n_heads,):
        shape = tuple(s_aux.shape) if isinstance(s_aux, torch.Tensor) else type(s_aux).__name__
        _fail(
            f"{where}: s_aux must be a tensor of one logit per query head, shape ({n_heads},); got {shape}."
        )
    if s_aux.device != device or s_aux.dtype not in _DTYPES:
        _fail(
            f"{where}: s_aux must be a floating tensor on {device}; got {s_aux.dtype} on {s_aux.device}."
        )


def _window(where: str, window_size, causal: bool) -> tuple[int, int]:
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        _fail(
            f"{where}: window_size must be a pair (left, right) of ints, -1 for unbounded; got {window_size!r}."
        )
    left = -1 if left < 0 else left
    right = -1 if right < 0 else right
    if causal:
        right = 0
    return left, right


def _scale(softmax_scale, head_dim: int) -> float:
    return float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(head_dim)


def _softcap(where: str, softcap) -> float:
    cap = float(softcap or 0.0)
    if cap < 0 or not math.isfinite(cap):
        _fail(f"{where}: softcap must be 0 (none) or a positive number, got {softcap!r}.")
    return cap


def _as_int(value) -> int:
    # transformers may pass a max_seqlen as a 0-d tensor; reading it is the caller's choice.
    return int(value.item()) if isinstance(value, torch.Tensor) else int(value)


def _check_cu(where: str, name: str, cu, device) -> None:
    if (
        not isinstance(cu, torch.Tensor)
        or cu.dim() != 1
        or cu.shape[0] < 1
        or cu.dtype not in _INDEX_DTYPES
    ):
        _fail(
            f"{where}: {name} must be a 1-D int32 tensor of batch + 1 cumulative sequence lengths, got {cu!r}."
        )
    if cu.device != device:
        _fail(f"{where}: {name} is on {cu.device}, but q is on {device}.")


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    s_aux: torch.Tensor | None = None,
):
    """Attention over a batch of equal-length sequences (flash-attn 2's ``flash_attn_func``).

    Args:
        q: ``(batch, seqlen_q, heads, head_dim)``, float16, bfloat16 or float32.
        k: ``(batch, seqlen_k, kv_heads, head_dim)``; ``kv_heads`` divides ``heads`` (GQA/MQA).
        v: ``(batch, seqlen_k, kv_heads, head_dim_v)``.
        dropout_p: the probability of dropping each attention probability (training); the
            kept ones are scaled by ``1 / (1 - dropout_p)``. 0 (evaluation) costs nothing.
        softmax_scale: the logits' scale, ``1 / sqrt(head_dim)`` by default.
        causal: mask aligned to the bottom right when ``seqlen_q != seqlen_k``, as flash-attn 2.
        window_size: ``(left, right)`` keys each query sees around its diagonal, -1 unbounded.
        softcap: logits become ``softcap * tanh(logits / softcap)`` when positive.
        alibi_slopes: must be None.
        deterministic: accepted; the backward is always deterministic.
        return_attn_probs: also return the log-sum-exp ``(batch, heads, seqlen_q)`` (fp32), and
            None in place of flash-attn's dropout mask.
        s_aux: attention sinks, one logit per query head ``(heads,)``, added to each softmax's
            denominator (gpt-oss); it has a gradient.

    Returns:
        ``out`` ``(batch, seqlen_q, heads, head_dim_v)``, or ``(out, softmax_lse, None)``.
    """
    where = "flash_attn_func"
    _check_tensors(where, q, k, v, 4, 4)
    dropout = _dropout(_check_options(where, dropout_p, alibi_slopes), q.device)
    if k.shape[0] != q.shape[0] or v.shape[:2] != k.shape[:2]:
        _fail(
            f"{where}: q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} need the same "
            "batch size, and k and v the same sequence length."
        )
    _check_sink(where, s_aux, q.shape[2], q.device)
    left, right = _window(where, window_size, causal)
    out, lse = _ops.attention(
        q, k, v, None, None, None, None, s_aux, q.shape[1], k.shape[1],
        _scale(softmax_scale, q.shape[-1]), left, right, _softcap(where, softcap), *dropout,
    )  # fmt: skip
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: torch.Tensor | None = None,
    s_aux: torch.Tensor | None = None,
):
    """Attention over packed sequences of different lengths (flash-attn 2's
    ``flash_attn_varlen_func``): padding-free batches.

    Args:
        q: ``(total_q, heads, head_dim)``: the sequences' queries one after another.
        k, v: ``(total_k, kv_heads, head_dim[_v])``; with ``block_table``, paged caches
            ``(num_blocks, page_size, kv_heads, head_dim[_v])`` (no backward then).
        cu_seqlens_q, cu_seqlens_k: ``(batch + 1,)`` int32, each sequence's first row and, last,
            the total; a sequence may be empty.
        max_seqlen_q, max_seqlen_k: the longest sequence (an upper bound is fine).
        block_table: ``(batch, max_pages)`` int32: sequence ``b``'s key ``j`` is in page
            ``block_table[b, j // page_size]``.
        The other arguments are those of ``flash_attn_func``.

    Returns:
        ``out`` ``(total_q, heads, head_dim_v)``, or ``(out, softmax_lse (heads, total_q), None)``.
    """
    where = "flash_attn_varlen_func"
    _check_tensors(where, q, k, v, 3, 4 if block_table is not None else 3)
    dropout = _dropout(_check_options(where, dropout_p, alibi_slopes), q.device)
    _check_cu(where, "cu_seqlens_q", cu_seqlens_q, q.device)
    _check_cu(where, "cu_seqlens_k", cu_seqlens_k, q.device)
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        _fail(
            f"{where}: cu_seqlens_q has {cu_seqlens_q.shape[0]} entries and cu_seqlens_k "
            f"{cu_seqlens_k.shape[0]}: both need batch + 1."
        )
    if v.shape[:-1] != k.shape[:-1]:
        _fail(
            f"{where}: k {tuple(k.shape)} and v {tuple(v.shape)} differ in all but the head dimension."
        )
    if block_table is not None:
        _check_block_table(where, block_table, cu_seqlens_q.shape[0] - 1, q.device)
    _check_sink(where, s_aux, q.shape[1], q.device)
    left, right = _window(where, window_size, causal)
    k4 = k if block_table is not None else k.unsqueeze(0)
    v4 = v if block_table is not None else v.unsqueeze(0)
    out, lse = _ops.attention(
        q.unsqueeze(0), k4, v4, cu_seqlens_q, cu_seqlens_k, None, block_table, s_aux,
        _as_int(max_seqlen_q), _as_int(max_seqlen_k), _scale(softmax_scale, q.shape[-1]),
        left, right, _softcap(where, softcap), *dropout,
    )  # fmt: skip
    out = out.squeeze(0)
    return (out, lse.squeeze(0), None) if return_attn_probs else out


def _check_block_table(where: str, block_table, batch: int, device) -> None:
    if (
        not isinstance(block_table, torch.Tensor)
        or block_table.dim() != 2
        or block_table.shape[0] != batch
        or block_table.dtype not in _INDEX_DTYPES
        or block_table.device != device
    ):
        _fail(
            f"{where}: block_table must be a (batch={batch}, max_pages) int32 tensor on {device}, "
            f"got {block_table!r}."
        )


def _check_index(where: str, name: str, t, batch: int, device) -> None:
    # A (batch,) tensor of row indices, one a sequence.
    if (
        not isinstance(t, torch.Tensor)
        or t.shape != (batch,)
        or t.dtype not in _INDEX_DTYPES
        or t.device != device
    ):
        _fail(f"{where}: {name} must be a (batch={batch},) int32 tensor on {device}, got {t!r}.")


def _key_mask(where: str, mask, batch: int, capacity: int, device) -> torch.Tensor:
    # The mask as the op takes it: bool, rows contiguous (the op reads its bytes).
    if (
        not isinstance(mask, torch.Tensor)
        or mask.shape != (batch, capacity)
        or mask.is_floating_point()
        or mask.is_complex()
        or mask.device != device
    ):
        _fail(
            f"{where}: key_padding_mask must be a (batch={batch}, capacity={capacity}) bool "
            f"tensor on {device}, got {mask!r}."
        )
    if mask.dtype != torch.bool:
        mask = mask != 0
    if mask.stride(-1) != 1:
        mask = mask.contiguous()
    return mask


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: int | torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: torch.Tensor | None = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
    s_aux: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
):
    """Attention of a few new queries over a KV cache (flash-attn 2's ``flash_attn_with_kvcache``),
    for decoding. No backward.

    Args:
        q: ``(batch, seqlen_q, heads, head_dim)``.
        k_cache, v_cache: ``(batch, capacity, kv_heads, head_dim[_v])``, or with ``block_table``
            paged ``(num_blocks, page_size, kv_heads, head_dim[_v])``.
        k, v: optional new keys and values ``(batch, seqlen_new, kv_heads, head_dim[_v])``,
            written into the caches (in place) at rows ``cache_seqlens[b]`` onwards before the
            attention, which then covers ``cache_seqlens[b] + seqlen_new`` keys.
        cache_seqlens: the filled length of each sequence's cache, an int or ``(batch,)`` int32;
            None: the whole cache.
        cache_leftpad: ``(batch,)`` int32, the row where each sequence's cache starts (a
            left-padded batch): the rows before it are not attended to, nor read, and the
            causal and window masks still align the queries with row ``cache_seqlens[b]``, as
            in flash-attn. None: every sequence starts at row 0.
        block_table: ``(batch, max_pages)`` int32, the pages of each sequence.
        causal, window_size, softcap, softmax_scale, s_aux: as in ``flash_attn_func`` (the mask
            aligned to the bottom right, i.e. the newest queries are the cache's last keys).
        rotary_cos, rotary_sin, cache_batch_idx, alibi_slopes: must be None.
        num_splits: how many chunks of the keys separate programs attend to (split-KV,
            flash-decoding) when at most 16 queries a sequence; 0 picks by a rule from the batch,
            kv heads, cache capacity and the GPU's SM count (no autotuning: CUDA graphs).
        rotary_interleaved: accepted and ignored.
        return_softmax_lse: also return the log-sum-exp ``(batch, heads, seqlen_q)``.
        key_padding_mask: not in flash-attn: ``(batch, capacity)`` (bool, or integers read as
            nonzero), which cache rows hold keys; the others are neither attended to nor read.
            For a padded batch's decode step without unpadding it (transformers' 2-D padding
            mask, with ``cache_seqlens`` one past each sequence's last key): no host
            synchronisation, so a CUDA graph can capture it.

    Returns:
        ``out`` ``(batch, seqlen_q, heads, head_dim_v)``, or ``(out, softmax_lse)``.
    """
    where = "flash_attn_with_kvcache"
    _check_tensors(where, q, k_cache, v_cache, 4, 4)
    _check_options(where, 0.0, alibi_slopes)
    for name, value in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin),
                        ("cache_batch_idx", cache_batch_idx)):  # fmt: skip
        if value is not None:
            _fail(
                f"{where}: {name} is not supported by this kernel; apply rotary embeddings to q "
                "and k before the call, and index the cache per sequence yourself."
            )
    batch = q.shape[0]
    if k_cache.shape[:-1] != v_cache.shape[:-1]:
        _fail(
            f"{where}: k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ in all but the head dimension."
        )
    if block_table is not None:
        _check_block_table(where, block_table, batch, q.device)
        capacity = block_table.shape[1] * k_cache.shape[1]
    else:
        if k_cache.shape[0] != batch:
            _fail(f"{where}: k_cache holds {k_cache.shape[0]} sequences but q {batch}.")
        capacity = k_cache.shape[1]
    _check_sink(where, s_aux, q.shape[2], q.device)
    if cache_leftpad is not None:
        _check_index(where, "cache_leftpad", cache_leftpad, batch, q.device)
        cache_leftpad = cache_leftpad.to(torch.int32)
    if key_padding_mask is not None:
        key_padding_mask = _key_mask(where, key_padding_mask, batch, capacity, q.device)
    if cache_seqlens is None:
        if k is not None:
            _fail(f"{where}: new k and v need cache_seqlens, the rows at which to write them.")
        used = torch.full((batch,), capacity, dtype=torch.int32, device=q.device)
    elif isinstance(cache_seqlens, int):
        used = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    else:
        if cache_seqlens.shape != (batch,) or cache_seqlens.dtype not in _INDEX_DTYPES:
            _fail(
                f"{where}: cache_seqlens must be an int or a ({batch},) int32 tensor, got {cache_seqlens!r}."
            )
        used = cache_seqlens
    if (k is None) != (v is None):
        _fail(f"{where}: pass both k and v (the new keys and values), or neither.")
    if k is not None:
        if k.shape[0] != batch or k.shape[2:] != k_cache.shape[2:] or v.shape[:-1] != k.shape[:-1]:
            _fail(
                f"{where}: new k {tuple(k.shape)} and v {tuple(v.shape)} must be (batch, "
                "seqlen_new, kv_heads, head_dim) matching the caches."
            )
        _append(k_cache, v_cache, k, v, used, block_table)
        used = used + k.shape[1]
    left, right = _window(where, window_size, causal)
    with torch.no_grad():
        out, lse = _ops.attention(
            q, k_cache, v_cache, None, None, used.to(torch.int32), block_table, s_aux,
            q.shape[1], capacity, _scale(softmax_scale, q.shape[-1]), left, right,
            _softcap(where, softcap), 0.0, None, max(int(num_splits), 0), cache_leftpad,
            key_padding_mask,
        )  # fmt: skip
    return (out, lse) if return_softmax_lse else out


def _append(k_cache, v_cache, k, v, cache_seqlens, block_table) -> None:
    # Index writes (no host sync, so a CUDA graph can capture them): sequence b's new row i goes
    # to cache row cache_seqlens[b] + i.
    batch, new = k.shape[:2]
    rows = cache_seqlens.to(torch.int64)[:, None] + torch.arange(new, device=k.device)
    if block_table is None:
        index = (torch.arange(batch, device=k.device)[:, None].expand(batch, new), rows)
    else:
        page_size = k_cache.shape[1]
        pages = block_table.to(torch.int64).gather(1, rows // page_size)
        index = (pages, rows % page_size)
    k_cache.index_put_(index, k.to(k_cache.dtype))
    v_cache.index_put_(index, v.to(v_cache.dtype))
