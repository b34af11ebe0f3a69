"""The attention kernels as ``torch.library`` custom ops, with fake implementations and autograd.

Each op takes 4-D ``(batch, rows, heads, dim)`` tensors: packed (varlen) inputs come as
``(1, total, heads, dim)`` with ``cu_seqlens``. Being custom ops, they are opaque to
``torch.compile`` (``fullgraph=True`` traces them as one node) and their launchers read nothing
from the device (no ``.item()``, no host sync), so they can be captured in CUDA graphs.

``forward`` returns ``(out, lse)``; its registered autograd runs ``backward``, which returns
``(dq, dk, dv, delta)``; the sink gradient is ``-sum(exp(s_aux - lse) * delta)`` over a head's
rows (the sink's probability times ``dout . out``), summed here in PyTorch.
"""

import math

import torch

from . import _kernels as K
from ._library import launch, next_power_of_2, op_name
from ._tuning import BACKWARD, DECODE, DECODE_MAX_QUERIES, DELTA_ROWS, FORWARD, config

_LOG2E = 1.4426950408889634


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _run(kernel, grid, args, cfg, device: torch.device) -> None:
    if device.type == "cuda":
        kernel[grid](*args, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    else:
        # The interpreter, or the shared launcher's error naming TRITON_INTERPRET.
        launch(kernel, grid, args, cfg.num_warps, device)


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
    return "upcast" if dtype == torch.bfloat16 and device.type != "cuda" else "tf32"


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


@torch.library.custom_op(op_name("flash_attn_forward"), mutates_args=())
def forward(
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of 4-D ``q`` over ``k``/``v``: ``(out, lse)``, ``lse`` as ``(q.shape[0], heads,
    q.shape[1])`` fp32. ``window_*`` below 0 are unbounded; ``softcap`` 0 is none."""
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
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
    block_d = next_power_of_2(max(d_qk, d_v))
    table = DECODE if max_seqlen_q <= DECODE_MAX_QUERIES and seqused_k is not None else FORWARD
    cfg = config(table, block_d, device.type != "cuda")
    logit_scale, cap_log2 = _scales(softmax_scale, softcap)
    page_size = k.shape[1] if block_table is not None else 1
    null = _null(device)
    args = (
        q, k, v, out, lse,
        s_aux if s_aux is not None else null,
        cu_seqlens_q if cu_seqlens_q is not None else null,
        cu_seqlens_k if cu_seqlens_k is not None else null,
        seqused_k if seqused_k is not None else null,
        block_table if block_table is not None else null,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        lse.stride(0), lse.stride(1),
        block_table.stride(0) if block_table is not None else 0,
        q.shape[1], k.shape[1], n_heads, n_heads // k.shape[2],
        logit_scale, cap_log2, max(window_left, 0), max(window_right, 0),
        d_qk, d_v, next_power_of_2(d_qk), next_power_of_2(d_v), cfg.block_m, cfg.block_n,
        cu_seqlens_q is not None, _k_len_mode(cu_seqlens_k, seqused_k),
        block_table is not None, page_size,
        window_left >= 0, window_right >= 0, softcap > 0.0, s_aux is not None,
        _dot_precision(q.dtype, device),
    )  # fmt: skip
    grid = (-(-max_seqlen_q // cfg.block_m), batches * n_heads)
    _run(K._fwd_kernel, grid, args, cfg, device)
    return out, lse


@forward.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, s_aux, max_seqlen_q,
      max_seqlen_k, softmax_scale, window_left, window_right, softcap):  # fmt: skip
    out = q.new_empty((*q.shape[:3], v.shape[3]))
    return out, q.new_empty(_lse_shape(q), dtype=torch.float32)


@torch.library.custom_op(op_name("flash_attn_backward"), mutates_args=())
def backward(
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
    on_cpu = device.type != "cuda"
    block_d = next_power_of_2(max(d_qk, d_v))
    null = _null(device)
    cu_q = cu_seqlens_q if varlen else null
    cu_k = cu_seqlens_k if cu_seqlens_k is not None else null
    k_len = _k_len_mode(cu_seqlens_k, None)
    flags = (window_left >= 0, window_right >= 0, softcap > 0.0, _dot_precision(q.dtype, device))
    logit_scale, cap_log2 = _scales(softmax_scale, softcap)
    windows = (max(window_left, 0), max(window_right, 0))
    dims = (d_qk, d_v, next_power_of_2(d_qk), next_power_of_2(d_v))

    delta_cfg = config(BACKWARD, block_d, on_cpu)
    delta_rows = delta_cfg.block_m if on_cpu else DELTA_ROWS
    args = (
        out, dout, delta, cu_q,
        out.stride(0), out.stride(1), out.stride(2),
        dout.stride(0), dout.stride(1), dout.stride(2),
        lse.stride(0), lse.stride(1),
        q.shape[1], n_heads, d_v, next_power_of_2(d_v), delta_rows, varlen,
    )  # fmt: skip
    grid = (-(-max_seqlen_q // delta_rows), batches * n_heads)
    _run(K._delta_kernel, grid, args, delta_cfg, device)

    cfg = config(BACKWARD, block_d, on_cpu)
    common = (
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        dout.stride(0), dout.stride(1), dout.stride(2),
    )  # fmt: skip
    args = (
        q, k, v, dout, lse, delta, dk, dv, cu_q, cu_k, *common,
        dk.stride(0), dk.stride(1), dk.stride(2),
        dv.stride(0), dv.stride(1), dv.stride(2),
        lse.stride(0), lse.stride(1),
        q.shape[1], k.shape[1], n_kv_heads, n_heads // n_kv_heads,
        softmax_scale, logit_scale, cap_log2, *windows,
        *dims, cfg.block_m, cfg.block_n, varlen, k_len, *flags,
    )  # fmt: skip
    grid = (-(-max_seqlen_k // cfg.block_n), batches * n_kv_heads)
    _run(K._bwd_dkdv_kernel, grid, args, cfg, device)

    args = (
        q, k, v, dout, lse, delta, dq, cu_q, cu_k, *common,
        dq.stride(0), dq.stride(1), dq.stride(2),
        lse.stride(0), lse.stride(1),
        q.shape[1], k.shape[1], n_heads, n_heads // n_kv_heads,
        softmax_scale, logit_scale, cap_log2, *windows,
        *dims, cfg.block_m, cfg.block_n, varlen, k_len, *flags,
    )  # fmt: skip
    grid = (-(-max_seqlen_q // cfg.block_m), batches * n_heads)
    _run(K._bwd_dq_kernel, grid, args, cfg, device)
    return dq, dk, dv, delta


@backward.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
      softmax_scale, window_left, window_right, softcap):  # fmt: skip
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(lse)


def _setup_context(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, seqused_k, block_table, s_aux, max_q, max_k, scale, left, right,
     softcap) = inputs  # fmt: skip
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, s_aux)
    ctx.params = (max_q, max_k, scale, left, right, softcap)
    ctx.paged_or_cache = seqused_k is not None or block_table is not None


def _backward(ctx, dout, _dlse):
    if ctx.paged_or_cache:
        raise RuntimeError(
            "flash_attn_with_kvcache has no backward (as in flash-attn): call it under "
            "torch.no_grad(), or use flash_attn_func / flash_attn_varlen_func to train."
        )
    q, k, v, out, lse, cu_q, cu_k, s_aux = ctx.saved_tensors
    dq, dk, dv, delta = backward(dout, q, k, v, out, lse, cu_q, cu_k, *ctx.params)
    ds_aux = None
    if s_aux is not None and ctx.needs_input_grad[7]:
        # d lse / d sink is the sink's probability; d out / d sink is -p_sink * out.
        p_sink = torch.exp(s_aux.float()[None, :, None] - lse)
        ds_aux = (-(p_sink * delta).sum(dim=(0, 2))).to(s_aux.dtype)
    return dq, dk, dv, None, None, None, None, ds_aux, None, None, None, None, None, None


forward.register_autograd(_backward, setup_context=_setup_context)


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
