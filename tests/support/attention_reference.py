"""A float64 attention reference in plain PyTorch for the attention kernel tests: the semantics
of flash-attn 2 (bottom-right aligned causal and window masks, soft-capping, GQA) plus sinks as
transformers' gpt-oss eager attention computes them, packed (varlen) batches, and dropout with a
given keep-mask (flash-attn 2's: after the softmax, the kept probabilities scaled by 1/(1-p))."""

import torch


def attention(q, k, v, causal=False, scale=None, window=(-1, -1), softcap=0.0, sink=None,
              keep=None, dropout_p=0.0):  # fmt: skip
    """``(out, lse)`` for ``(batch, seqlen, heads, dim)`` tensors, in float64 (differentiable).

    A row that sees no key and has no sink gets output 0 and log-sum-exp +inf (flash-attn 2).
    ``keep``: a dropout keep-mask ``(batch, seqlen_q, heads, >= seqlen_k)`` (the kernel's
    layout), applied with ``dropout_p``'s scaling; the log-sum-exp does not see it.
    """
    batch, seqlen_q, heads, dim = q.shape
    seqlen_k, kv_heads = k.shape[1], k.shape[2]
    q, k, v = (t.double() for t in (q, k, v))
    k = k.repeat_interleave(heads // kv_heads, dim=2)
    v = v.repeat_interleave(heads // kv_heads, dim=2)
    scale = dim**-0.5 if scale is None else scale
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(seqlen_q)[:, None]
    j = torch.arange(seqlen_k)[None, :]
    shift = seqlen_k - seqlen_q
    left, right = window
    if causal:
        right = 0
    mask = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool)
    if right >= 0:
        mask &= j <= i + shift + right
    if left >= 0:
        mask &= j >= i + shift - left
    s = s.masked_fill(~mask, float("-inf"))
    if sink is not None:
        sinks = sink.double()[None, :, None, None].expand(batch, heads, seqlen_q, 1)
        s = torch.cat([s, sinks], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    empty = torch.isinf(lse)
    p = torch.exp(s - torch.where(empty, 0.0, lse)[..., None])
    if sink is not None:
        p = p[..., :-1]
    if keep is not None:
        kept = keep[..., :seqlen_k].permute(0, 2, 1, 3).to(p.device)
        p = torch.where(kept, p / (1.0 - dropout_p), 0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", p, v)
    return out, torch.where(empty, float("inf"), lse)


def varlen_attention(q, k, v, cu_q, cu_k, keep=None, **options):
    """``(out, lse)`` for packed ``(total, heads, dim)`` tensors, one sequence at a time; ``lse``
    as ``(heads, total_q)``, +inf on rows of no sequence. ``keep``: a dropout keep-mask
    ``(total_q, heads, >= max seqlen_k)`` of the packed rows (with ``dropout_p``)."""
    outs, lses = [], []
    total_q = q.shape[0]
    bounds_q, bounds_k = cu_q.tolist(), cu_k.tolist()
    for b in range(len(bounds_q) - 1):
        qs = q[bounds_q[b] : bounds_q[b + 1]][None]
        ks = k[bounds_k[b] : bounds_k[b + 1]][None]
        vs = v[bounds_k[b] : bounds_k[b + 1]][None]
        if qs.shape[1] == 0:
            continue
        if keep is not None:
            options["keep"] = keep[bounds_q[b] : bounds_q[b + 1]][None]
        out, lse = attention(qs, ks, vs, **options)
        outs.append(out[0])
        lses.append(lse[0])
    out = torch.cat(outs) if outs else q.new_zeros((0, q.shape[1], v.shape[-1])).double()
    lse = torch.cat(lses, dim=1) if lses else torch.zeros(q.shape[1], 0, dtype=torch.float64)
    rest = total_q - out.shape[0]
    if rest:
        out = torch.cat([out, out.new_zeros((rest, *out.shape[1:]))])
        lse = torch.cat([lse, lse.new_full((lse.shape[0], rest), float("inf"))], dim=1)
    return out, lse
