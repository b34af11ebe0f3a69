"""Our flash attention (``library/attention``) as a transformers attention implementation.

`register_attention` registers it with transformers' ``AttentionInterface`` (and the padding mask
it needs with ``AttentionMaskInterface``) under `ATTENTION_IMPLEMENTATION`, on transformers 4.57
and 5.x alike, so that::

    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="kernels_attention")
    model.set_attn_implementation("kernels_attention")

run every attention layer through it. `kernels.library.register_library_kernels` calls it.

The attention function does what transformers' own flash-attention forward does with a kernel
repository: a batch with padding (a 2-D ``attention_mask``) is unpadded and goes through
``flash_attn_varlen_func``, except a decode step's (`padded_decode_step`), which reads the mask
on the device instead; packed sequences (``cu_seq_lens_q``/``cu_seq_lens_k`` keyword
arguments, or ``position_ids`` that restart, as ``DataCollatorWithFlattening`` makes them) too,
padding-free; any other batch through ``flash_attn_func``. Sliding windows, soft-capping and
attention sinks (``s_aux``, gpt-oss) are passed on. The name has no "flash" in it on purpose:
transformers 5.x takes any implementation named ``*flash*`` for a Hub flash-attention
repository and tries to download it.

On a Hub organisation the same repository serves ``attn_implementation="<org>/attention"``
through transformers' own loader, with no registration.
"""

from __future__ import annotations

import weakref
from types import ModuleType
from typing import Any

import torch

from ..errors import KernelLayerError

#: The name our attention is registered under in transformers' attention registries.
ATTENTION_IMPLEMENTATION = "kernels_attention"
#: The library repository that holds the kernel.
ATTENTION_REPO = "attention"


_kernel: ModuleType | None = None


def attention_kernel() -> ModuleType:
    """The ``attention`` kernel repository of our library, loaded once.

    Kept in a module global rather than behind ``functools.cache``: torch.compile traces into a
    cached function's body, and the loading there (file system calls) breaks a ``fullgraph``
    compile of the model; a global that is set is a constant to it."""
    global _kernel
    if _kernel is None:
        from .loading import load_library_package

        _kernel = load_library_package(ATTENTION_REPO)
    return _kernel


# The last position_ids tensor `is_packed_sequence` read: (a weak reference to it, its version
# counter then, the answer).
_last_packed: tuple[weakref.ref, int | None, bool] | None = None


def _version(t: torch.Tensor) -> int | None:
    # Inference tensors keep no version counter; nothing changes them outside inference mode.
    return None if t.is_inference() else t._version


def is_packed_sequence(position_ids: torch.Tensor, batch: int) -> bool:
    """transformers' ``_is_packed_sequence``: whether ``position_ids`` of a batch of one row
    restart (several documents packed in the row), read once per tensor.

    The check reads the ids' values, a device synchronisation; transformers makes it in every
    attention layer, which at batch 1 stalls the host once a layer while the GPU drains, so the
    host can no longer run ahead of the GPU. Every layer of a forward
    gets the same ``position_ids`` tensor, so the answer is kept for that tensor, and asked again
    only for another tensor or after an in-place change (its version counter). Under
    torch.compile the check is transformers' own, traced like the rest of the graph."""
    global _last_packed
    from transformers import modeling_flash_attention_utils as fa

    if batch != 1 or position_ids.shape[-1] == 1 or torch.compiler.is_compiling():
        return bool(fa._is_packed_sequence(position_ids, batch))
    version = _version(position_ids)
    last = _last_packed
    if last is not None and last[0]() is position_ids and last[1] == version:
        return last[2]
    packed = bool(fa._is_packed_sequence(position_ids, batch))
    _last_packed = (weakref.ref(position_ids), version, packed)
    return packed


def static_cache_fill(
    key: torch.Tensor,
    query_length: int,
    position_ids: torch.Tensor | None,
    options: dict[str, Any],
) -> torch.Tensor | None:
    """Each sequence's filled length of a static cache, ``(batch,)`` int32 on the device, when
    ``key`` (``(batch, kv_len, heads, dim)``) comes from one without a padding mask; else None.

    transformers' ``generate()`` drops an all-ones padding mask, except for implementations named
    ``*flash*`` under a static cache (its ``is_flash_attention_requested``): ours is not so named
    (module docstring), so a static cache's keys reach us without the mask that would say which
    rows are filled, and attending to all of them reads the unfilled rows. Without padding the
    queries' positions are the cache positions: the cache holds ``position_ids[:, -1] + 1`` tokens.
    Read on the device (no synchronisation: CUDA graphs), and only for an inference call whose
    keys outnumber its queries (a cache), with one position a query (not multimodal rotary
    positions, of three or four axes)."""
    if (
        key.shape[1] <= query_length
        or not isinstance(position_ids, torch.Tensor)
        or position_ids.dim() != 2
        or position_ids.shape[-1] != query_length
        or options.get("dropout_p")
        or (torch.is_grad_enabled() and key.requires_grad)
    ):
        return None
    last = position_ids[:, -1].expand(key.shape[0])
    return (last + 1).clamp(max=key.shape[1]).to(torch.int32)


class _ForwardMasks:
    """The padding masks `padding_mask` made for the forward running now, each with the decode
    step's key counts and key mask that `padded_decode_step` computed from it, per window.

    A mask function call replaces its mask's entry, so that nothing outlives the forward it was
    computed in: every forward asks the mask function for its masks before its first layer, also
    the one a CUDA graph captures (whose replays run no Python), and a mask changed in place
    since (its version counter) is computed anew. A mask no mask function made (attention
    called directly) is never kept; nor under torch.compile, which traces the computation and
    lets inductor share it."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref, int | None, dict]] = {}

    def made(self, mask: torch.Tensor | None) -> None:
        """Note ``mask`` as made by the mask function for the forward about to run."""
        self._entries = {k: e for k, e in self._entries.items() if e[0]() is not None}
        if mask is not None and not torch.compiler.is_compiling():
            self._entries[id(mask)] = (weakref.ref(mask), _version(mask), {})

    def results(self, mask: torch.Tensor) -> dict | None:
        """``mask``'s results by window, to read and fill; None where it is not to be kept."""
        if torch.compiler.is_compiling():
            return None
        entry = self._entries.get(id(mask))
        if entry is None or entry[0]() is not mask or entry[1] != _version(mask):
            return None
        return entry[2]


_forward_masks = _ForwardMasks()


def padded_decode_step(
    key: torch.Tensor,
    attention_mask: torch.Tensor,
    query_length: int,
    options: dict[str, Any],
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(key counts, key mask)`` when this call is a padded batch's decode step that
    ``flash_attn_with_kvcache`` can take without unpadding: each sequence's key count,
    ``(batch,)`` int32 on the device (one past its last key), for ``cache_seqlens``, and the
    ``(batch, mask length)`` bool mask of the keys its query sees, for ``key_padding_mask``
    (``options``' sliding window applied); else None.

    Unpadding reads the mask on the host (its nonzero rows, the longest sequence): a host
    synchronisation in every attention layer of every decode step, which keeps the host from
    running ahead of the GPU and which a CUDA graph cannot capture. A decode step has one
    query a sequence, the newest key, which sees every key its mask keeps; with a sliding
    window of ``w`` keys to its left, the last ``w + 1`` kept keys, counted among the kept ones
    as unpadding counts them (so holes in the mask, as a continued right-padded prompt leaves,
    are not counted). All of it on the device. Not with dropout or a gradient. The mask may be
    shorter than ``key`` (a static cache's unfilled rows): those rows are no key.

    Every layer of a forward gets the same mask, so for a mask that `padding_mask` made in this
    forward the result is computed once per window and kept for the layers after
    (`_forward_masks`): a few small kernels once a step instead of once a layer."""
    if (
        query_length != 1
        or attention_mask.shape[1] > key.shape[1]
        or options.get("dropout_p")
        or (torch.is_grad_enabled() and key.requires_grad)
    ):
        return None
    window = options.get("window_size")
    kept_for = _forward_masks.results(attention_mask)
    if kept_for is None:
        return _decode_keys(attention_mask, window)
    if window not in kept_for:
        kept_for[window] = _decode_keys(attention_mask, window)
    return kept_for[window]


def _decode_keys(
    attention_mask: torch.Tensor, window: tuple[int, int] | None
) -> tuple[torch.Tensor, torch.Tensor]:
    kept = attention_mask != 0
    if window is not None:
        kept_from_here = kept.flip(-1).cumsum(-1).flip(-1)  # kept keys at or after each row
        kept = kept & (kept_from_here <= window[0] + 1)
    rows = torch.arange(1, kept.shape[1] + 1, device=kept.device)
    return (rows * kept).amax(-1).to(torch.int32), kept


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: ``query`` ``(batch, heads, seqlen, dim)``,
    ``key``/``value`` ``(batch, kv_heads, kv_len, dim)``; returns ``(out (batch, seqlen, heads,
    dim_v), None)`` (no attention weights, as with flash attention)."""
    from transformers import modeling_flash_attention_utils as fa

    kernel = attention_kernel()
    batch, _, query_length, _ = query.shape
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    options: dict[str, Any] = {
        "dropout_p": dropout,
        "softmax_scale": scaling,
        "causal": causal,
        "softcap": softcap or 0.0,
        "s_aux": s_aux,
    }
    if sliding_window is not None and k.shape[1] > sliding_window:
        # transformers' convention for flash attention (modeling_flash_attention_utils): a window
        # of N tokens sees N - 1 to each side, the right side then cut by the causal mask.
        options["window_size"] = (sliding_window - 1, sliding_window - 1)
    if attention_mask is not None:
        if attention_mask.dim() != 2:
            raise KernelLayerError(
                f"{ATTENTION_IMPLEMENTATION} takes a 2-D padding mask (batch, kv_len) as flash "
                f"attention does, got one of shape {tuple(attention_mask.shape)}. Use "
                "attn_implementation='sdpa' for arbitrary 4-D masks."
            )
        decode = padded_decode_step(k, attention_mask, query_length, options)
        if decode is not None:
            filled, kept = decode
            del options["dropout_p"]  # inference only (no backward over a cache)
            options.pop("window_size", None)  # in the key mask
            keys = kept.shape[1]
            out = kernel.flash_attn_with_kvcache(
                q, k[:, :keys], v[:, :keys], cache_seqlens=filled, key_padding_mask=kept,
                **options,
            )  # fmt: skip
            return out, None
        q, k, v, indices, (cu_q, cu_k), (max_q, max_k) = fa._upad_input(
            q, k, v, attention_mask, query_length, fa._unpad_input
        )
        out = kernel.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, **options)
        return fa._pad_input(out, indices, batch, query_length), None
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
    position_ids = kwargs.get("position_ids")
    if cu_q is not None and cu_k is not None and max_q is not None and max_k is not None:
        q, k, v = (t.reshape(-1, *t.shape[-2:]) for t in (q, k, v))
    elif position_ids is not None and is_packed_sequence(position_ids, batch):
        q, k, v, (cu_q, cu_k), (max_q, max_k) = fa._prepare_from_posids(q, k, v, position_ids)
    elif (cache_fill := static_cache_fill(k, query_length, position_ids, options)) is not None:
        del options["dropout_p"]  # inference only (no backward over a cache)
        return kernel.flash_attn_with_kvcache(q, k, v, cache_seqlens=cache_fill, **options), None
    else:
        return kernel.flash_attn_func(q, k, v, **options), None
    out = kernel.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, **options)
    return out.view(batch, -1, *out.shape[-2:]), None


def capturing() -> bool:
    """Whether a CUDA graph is being captured on the current stream (never without CUDA)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def padding_mask(**kwargs: Any) -> torch.Tensor | None:
    """transformers' flash-attention mask function (``AttentionMaskInterface``): the 2-D padding
    mask, or None for a mask of ones; except that a decode step (one query) being captured in
    a CUDA graph keeps its mask whole.

    Flash attention's function learns whether the mask is all ones by reading it on the host
    (``mask.all()``) in every forward: a synchronisation a CUDA graph cannot capture. A decode
    step's mask goes to `padded_decode_step`, which reads it on the device and gives the same
    result for a mask of ones. Outside a capture the host read stays: it costs one
    synchronisation a forward, and spares an unpadded batch the key mask's few small kernels
    in every layer. The mask it returns is noted for the forward about to run
    (`_ForwardMasks`), so that the decode step's key counts are computed once for all its
    layers. Called with keywords by both transformers lines (``q_length`` on 5.x,
    ``cache_position`` on 4.57)."""
    from transformers.masking_utils import flash_attention_mask

    mask = kwargs.get("attention_mask")
    positions = kwargs.get("cache_position")
    queries = kwargs.get("q_length", positions.shape[0] if positions is not None else None)
    if mask is None or queries != 1 or not capturing():
        made = flash_attention_mask(**kwargs)
    else:
        made = mask[:, -kwargs["kv_length"] :]
    _forward_masks.made(made)
    return made


def register_attention(name: str = ATTENTION_IMPLEMENTATION) -> None:
    """Register our attention with transformers under ``name``, with flash attention's padding
    masks (`padding_mask`), and load the kernel (about 0.3 s), so that a model compiled with
    ``fullgraph=True`` before its first call does not trace the loading. Does nothing without
    transformers (there is nothing to register with then)."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:
        return
    attention_kernel()
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, padding_mask)


__all__ = [
    "ATTENTION_IMPLEMENTATION",
    "ATTENTION_REPO",
    "attention_forward",
    "attention_kernel",
    "capturing",
    "padded_decode_step",
    "padding_mask",
    "register_attention",
]
