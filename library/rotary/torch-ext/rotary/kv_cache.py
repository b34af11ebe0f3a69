"""A decode step's keys and values written into a static KV cache in one launch.

transformers' ``StaticLayer.update`` writes a step's keys and values with two ``index_copy_``
calls at positions it computes on the device: 5.x adds ``arange(steps)`` to the layer's counter
``cumulative_length`` and advances the counter in place, 4.57 takes ``cache_position``. That is
five small kernels a layer (two on 4.57) for a few kilobytes, a noticeable share of a decoded
token's GPU time for a small model (benchmarks/results/<device>/NOTES.md has the measurement).
Here one Triton program copies both: it reads the
positions (or the counter), writes every row of keys and values, and then advances the
counter. Keys rotate (rotary) just before they are cached, which is why this kernel lives in
this repository.

Sizes: one program copies at most ``MAX_ELEMENTS`` elements of keys (and as many of values),
which holds decode steps of 8 sequences of 8 tokens with 8 heads of 128. Larger writes (a
prefill) take PyTorch's ``index_copy_``, exactly as transformers does; so do CPU tensors without
Triton's interpreter.
"""

import os

import torch
import triton
import triton.language as tl

from ._library import launch, next_power_of_2

#: The most elements of keys (and of values) that the kernel copies in one call.
MAX_ELEMENTS = 65536
#: Elements of a tensor that a step of the program's loop holds (rows times head dimension).
_STEP_ELEMENTS = 4096
_WARPS = 4

# Without a GPU the kernel runs through Triton's interpreter when TRITON_INTERPRET=1 is set;
# otherwise CPU tensors take PyTorch's ops.
_CPU_RUNS_KERNELS = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _copy_rows(SRC, DST, b, h, s, pos, cols, dim, row_mask, write_mask,
               stride_b, stride_h, stride_s, dst_b, dst_h, dst_s):  # fmt: skip
    # Rows (b, h, s) of SRC to rows (b, h, pos) of DST; both have contiguous last dimensions.
    col_mask = cols < dim
    src = SRC + (b * stride_b + h * stride_h + s * stride_s)[:, None] + cols[None, :]
    row = tl.load(src, mask=row_mask[:, None] & col_mask[None, :])
    dst = DST + (b * dst_b + h * dst_h + pos * dst_s)[:, None] + cols[None, :]
    tl.store(dst, row, mask=write_mask[:, None] & col_mask[None, :])


@triton.jit
def _kv_cache_write_kernel(
    K, V, K_CACHE, V_CACHE, POSITIONS,
    heads, steps, cache_len, k_dim, v_dim, rows,
    stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
    stride_kcb, stride_kch, stride_kcs, stride_vcb, stride_vch, stride_vcs,
    COUNTER: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
):  # fmt: skip
    # One program. A row is one (batch, head, step) of keys and of values; step s goes to cache
    # position POSITIONS[s], or, with COUNTER, to POSITIONS[0] + s, after which the counter is
    # advanced by the number of steps. Positions outside the cache are not written.
    if COUNTER:
        start = tl.load(POSITIONS)
    k_cols = tl.arange(0, BLOCK_K)
    v_cols = tl.arange(0, BLOCK_V)
    for first in range(0, rows, BLOCK_ROWS):
        r = first + tl.arange(0, BLOCK_ROWS).to(tl.int64)
        row_mask = r < rows
        s = r % steps
        h = (r // steps) % heads
        b = r // (steps * heads)
        if COUNTER:  # noqa: SIM108 (a constexpr branch: only one side is compiled)
            pos = start + s
        else:
            pos = tl.load(POSITIONS + s, mask=row_mask, other=-1).to(tl.int64)
        write_mask = row_mask & (pos >= 0) & (pos < cache_len)
        _copy_rows(K, K_CACHE, b, h, s, pos, k_cols, k_dim, row_mask, write_mask,
                   stride_kb, stride_kh, stride_ks, stride_kcb, stride_kch, stride_kcs)  # fmt: skip
        _copy_rows(V, V_CACHE, b, h, s, pos, v_cols, v_dim, row_mask, write_mask,
                   stride_vb, stride_vh, stride_vs, stride_vcb, stride_vch, stride_vcs)  # fmt: skip
    if COUNTER:
        # Every thread has read the counter (above) before any thread advances it.
        tl.debug_barrier()
        tl.store(POSITIONS, start + steps)


def _runs_kernel(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" or (t.device.type == "cpu" and _CPU_RUNS_KERNELS)


def takes_kv_write(keys: torch.Tensor, values: torch.Tensor) -> bool:
    """Whether `write_kv_cache` copies ``keys`` and ``values`` with its kernel (one launch):
    at most ``MAX_ELEMENTS`` elements each, on a CUDA device (or the CPU under Triton's
    interpreter). Other writes take PyTorch's ``index_copy_``."""
    return keys.numel() <= MAX_ELEMENTS and values.numel() <= MAX_ELEMENTS and _runs_kernel(keys)


def _check(key_cache, value_cache, keys, values, positions, counter) -> None:
    if (positions is None) == (counter is None):
        raise ValueError("write_kv_cache: pass exactly one of positions= and counter=")
    for name, t in (("key_cache", key_cache), ("value_cache", value_cache),
                    ("keys", keys), ("values", values)):  # fmt: skip
        if t.dim() != 4:
            raise ValueError(
                f"write_kv_cache: {name} has shape {tuple(t.shape)}; caches are [batch, heads, "
                "cache length, head dim] and keys/values [batch, heads, steps, head dim]"
            )
    for name, new, cache in (("keys", keys, key_cache), ("values", values, value_cache)):
        b, h, _, d = cache.shape
        if (new.shape[0], new.shape[1], new.shape[3]) != (b, h, d):
            raise ValueError(
                f"write_kv_cache: {name} of shape {tuple(new.shape)} do not fit a cache of "
                f"shape {tuple(cache.shape)} (batch, heads and head dim must agree)"
            )
        if new.dtype != cache.dtype or new.device != cache.device:
            raise TypeError(
                f"write_kv_cache: {name} are {new.dtype} on {new.device}, the cache "
                f"{cache.dtype} on {cache.device}; they must agree"
            )
        if cache.stride(-1) != 1:
            raise ValueError(f"write_kv_cache: the cache of {name} needs a contiguous last dim")
    if keys.shape[2] != values.shape[2]:
        raise ValueError(
            f"write_kv_cache: keys of {keys.shape[2]} steps and values of {values.shape[2]}"
        )
    where = positions if counter is None else counter
    if where.dtype not in (torch.int32, torch.int64) or where.device != keys.device:
        raise TypeError(
            f"write_kv_cache: positions must be an int32 or int64 tensor on {keys.device}; got "
            f"{where.dtype} on {where.device}"
        )
    if counter is not None and counter.numel() != 1:
        raise ValueError(f"write_kv_cache: counter must hold one position, got {counter.numel()}")
    if positions is not None and tuple(positions.shape) != (keys.shape[2],):
        raise ValueError(
            f"write_kv_cache: positions of shape {tuple(positions.shape)} for {keys.shape[2]} steps"
        )


def _torch_write(key_cache, value_cache, keys, values, positions, counter) -> None:
    # transformers' own StaticLayer.update (5.x with the counter, 4.57 with positions).
    if counter is not None:
        positions = torch.arange(keys.shape[2], device=keys.device) + counter
        counter.add_(keys.shape[2])
    key_cache.index_copy_(2, positions, keys)
    value_cache.index_copy_(2, positions, values)


def write_kv_cache(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    *,
    positions: torch.Tensor | None = None,
    counter: torch.Tensor | None = None,
) -> None:
    """Write a step's ``keys`` and ``values`` ([batch, heads, steps, head dim]) into the caches
    ([batch, heads, cache length, head dim]) along the cache length, in place.

    Exactly one of:
        positions: an int tensor of one cache position per step (transformers 4.57's
            ``cache_position``): ``key_cache.index_copy_(2, positions, keys)``, the same for values.
        counter: a one-element int tensor (transformers 5.x's ``cumulative_length``): the steps
            go to positions ``counter, counter + 1, ...``, and ``counter`` is advanced by the
            number of steps, on the device.

    Decode-size writes (`takes_kv_write`) are one kernel launch, which a CUDA graph can
    capture; their positions outside the cache are skipped (``index_copy_`` would raise). Others
    take ``index_copy_``. ``keys`` and ``values`` may be strided views (the transposed
    projections transformers passes); the caches need contiguous last dimensions.
    """
    _check(key_cache, value_cache, keys, values, positions, counter)
    if not takes_kv_write(keys, values) or keys.numel() == 0:
        _torch_write(key_cache, value_cache, keys, values, positions, counter)
        return
    # The kernel's arguments, each named as its parameter (``_library``'s "by name").
    k = keys if keys.stride(-1) == 1 else keys.contiguous()
    v = values if values.stride(-1) == 1 else values.contiguous()
    batch, heads, steps, k_dim = k.shape
    v_dim = v.shape[3]
    cache_len = key_cache.shape[2]
    block_k, block_v = next_power_of_2(k_dim), next_power_of_2(v_dim)
    rows = batch * heads * steps
    block_rows = max(1, min(next_power_of_2(rows), _STEP_ELEMENTS // max(block_k, block_v)))
    stride_kb, stride_kh, stride_ks, _ = k.stride()
    stride_vb, stride_vh, stride_vs, _ = v.stride()
    stride_kcb, stride_kch, stride_kcs, _ = key_cache.stride()
    stride_vcb, stride_vch, stride_vcs, _ = value_cache.stride()
    k_cache, v_cache = key_cache, value_cache
    COUNTER = counter is not None
    POSITIONS = counter if COUNTER else positions
    args = (
        k, v, k_cache, v_cache, POSITIONS, heads, steps, cache_len, k_dim, v_dim, rows,
        stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
        stride_kcb, stride_kch, stride_kcs, stride_vcb, stride_vch, stride_vcs,
        COUNTER, block_rows, block_k, block_v,
    )  # fmt: skip
    launch(_kv_cache_write_kernel, (1,), args, _WARPS, keys.device)
