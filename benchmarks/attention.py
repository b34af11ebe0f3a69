"""Benchmark our flash attention (library/attention) against each of torch SDPA's backends.

    python -m benchmarks.attention    # writes benchmarks/results/<device>/attention

Three sections, bf16, 32 query heads and 8 key/value heads (issue 39's measured targets):

- ``dense``: forward and forward+backward at batch x sequence 16x1024, 4x4096 and 1x16384, head
  dimensions 64 and 128, causal and not; ours (``flash_attn_func``, ``(batch, seq, heads, dim)``)
  against SDPA's ``flash``, ``cudnn`` and ``efficient`` backends, each alone
  (``torch.nn.attention.sdpa_kernel``) on ``(batch, heads, seq, dim)`` tensors. Grouped-query
  attention goes through ``enable_gqa=True`` where the backend takes it, else through
  ``repeat_interleave`` of k and v inside the timed call (what transformers' SDPA path does);
  the table says which. TFLOP/s count ``4 * batch * heads * dim`` per visible (query, key) pair
  (half the pairs, plus the diagonal, when causal), forward+backward 3.5 times the forward
  (flash-attn's convention: the backward's five products against the forward's two); % of the
  GPU's dense bf16 peak (``PEAK_TFLOPS``).
  Ours is the library's default, whose forward reads q, k and v through tensor descriptors
  (TMA) for head dims of 128 and more on Hopper (``_FORWARD_TMA``); ours with the descriptors
  forced on (``ours-tma``) and off (``ours-pointer``) in a table of their own.
- ``varlen``: 64 documents of 128-4096 tokens (seeded), packed through
  ``flash_attn_varlen_func`` (causal), against the same documents right-padded to the longest
  and run through each SDPA backend with ``is_causal=True`` (with right padding the causal mask
  alone keeps every real query off the padding); forward and forward+backward time, and the peak
  memory of a forward+backward beyond its inputs, with the inputs' own size beside it.
- ``decode``: one new query per sequence over a 4096-token KV cache, batch 1 and 8, head
  dimension 128: ours (``flash_attn_with_kvcache``, split-KV) against each SDPA backend over a
  ``(batch, kv_heads, 4096, dim)`` cache; attention alone (no cache append), each call captured
  in a CUDA graph (device time, as a captured decode step runs), L2 cleared before each call
  (each layer of a model reads its own cache); ours with each split count of ``SWEEP_SPLITS``
  forced, beside the one its rule picks; and ours as two launches (``TWO_LAUNCHES``: the split
  kernel, then a kernel that combines the splits, the path that the one-launch kernel replaced,
  through the library's private switch ``_ops._DECODE_FUSED``) at the rule's split count, in a
  table of its own beside the one launch. At batch 8 also a padded batch's step (sequence b
  left-padded by ``b / 8 x PADDING_SHARE`` of the context): ours with the padding mask read in
  the kernel (``key_padding_mask``), alone and as our transformers attention runs it
  (``padded_decode_step``'s small kernels count each sequence's keys first), against each SDPA
  backend with the mask as a boolean ``attn_mask``.

Timing: ``timing.interleaved_samples`` (rounds that run every contender in rotating order, a
block of calls each, L2 cleared before each call, CUDA events); the ratio's quartiles are over
the rounds. A contender that fails (a backend that cannot run a shape, out of memory) is
recorded with its error. Ours is checked against SDPA's output first (relative L2 error under
2e-2, else the row is flagged).

A full run takes about three minutes on an H100; ``--only``, ``--shapes`` and ``--dims`` select
parts, and rows of a later run into the same ``--out`` replace those of the same key.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
from collections.abc import Callable
from importlib import import_module

import torch
import torch.nn.functional as F

from benchmarks import timing
from benchmarks.results_io import default_out, save_results
from kernels.library.attention import padded_decode_step

HEADS, KV_HEADS = 32, 8
SHAPES = [(16, 1024), (4, 4096), (1, 16384)]
HEAD_DIMS = [64, 128]
DTYPE = torch.bfloat16
PEERS = ["flash", "cudnn", "efficient"]
OURS = "ours"
SECTIONS = ["dense", "varlen", "decode"]
VARLEN_DOCS, VARLEN_MIN, VARLEN_MAX, VARLEN_SEED, VARLEN_DIM = 64, 128, 4096, 0, 128
DECODE_BATCHES, DECODE_CONTEXT, DECODE_DIM = [1, 8], 4096, 128
#: Split counts that decode also times ours with, forced (``num_splits=``): how good the rule's
#: choice is, and what to change it to.
SWEEP_SPLITS = [1, 2, 4, 8, 16, 32, 64]
SWEEP = "ours-splits-"
#: Ours with the splits combined by a second launch (what the one-launch kernel replaced).
TWO_LAUNCHES = "ours-two-launches"
#: A padded batch's decode step: ours with the padding mask read in the kernel
#: (``key_padding_mask``), each SDPA backend with it as a boolean mask (``PADDED`` + backend).
OURS_PADDED = "ours-padded"
#: The same step as ``kernels_attention`` runs it: the mask's preparation, then the kernel.
OURS_PADDED_STEP = "ours-padded-step"
PADDED = "masked-"
#: The padded batch's left padding: sequence b of B has ``b * PADDING_SHARE / B`` of the context.
PADDING_SHARE = 0.5
#: Ours with the forward reading q, k and v through tensor descriptors (TMA) forced on, and
#: forced off (pointer loads): the measurement behind the library's ``_FORWARD_TMA`` rule.
OURS_TMA = "ours-tma"
OURS_POINTER = "ours-pointer"
#: Dense bf16 tensor-core peaks (TFLOP/s, without sparsity) from NVIDIA's datasheets, matched
#: against torch.cuda.get_device_name() in order (the first name contained wins).
PEAK_TFLOPS = [("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H200", 989.4), ("H100", 989.4)]
GiB = 2**30


def peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU by its name (None for a GPU not in ``PEAK_TFLOPS``)."""
    for name, peak in PEAK_TFLOPS:
        if name.lower() in device_name.lower():
            return peak
    return None


def visible_pairs(seqlen_q: int, seqlen_k: int, causal: bool) -> int:
    """(query, key) pairs that attention computes: every pair, or with a causal mask aligned to
    the bottom right (flash-attn's), those with key <= query + seqlen_k - seqlen_q."""
    if not causal:
        return seqlen_q * seqlen_k
    shift = seqlen_k - seqlen_q
    return sum(max(0, min(seqlen_k, i + shift + 1)) for i in range(seqlen_q))


def attention_flops(batch: int, seqlen_q: int, seqlen_k: int, dim: int, causal: bool) -> int:
    """FLOPs of a forward: two products (q k^T and p v) of 2 * dim each per visible pair."""
    return 4 * batch * HEADS * dim * visible_pairs(seqlen_q, seqlen_k, causal)


#: The forward+backward's FLOPs over the forward's (flash-attn's benchmarks count so).
FWD_BWD_FACTOR = 3.5


def varlen_lengths(
    docs: int = VARLEN_DOCS, low: int = VARLEN_MIN, high: int = VARLEN_MAX, seed: int = VARLEN_SEED
) -> list[int]:
    """The documents' lengths, uniform in [low, high], the same on every run."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(low, high + 1, (docs,), generator=generator).tolist()


def cu_seqlens(lengths: list[int], device) -> torch.Tensor:
    """``(len(lengths) + 1,)`` int32 offsets of packed sequences."""
    return torch.tensor([0, *lengths], device=device).cumsum(0).to(torch.int32)


def pad_documents(packed: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """Packed ``(tokens, heads, dim)`` rows as SDPA's right-padded ``(docs, heads, longest,
    dim)``: each document's rows first, zeros after them."""
    out = packed.new_zeros(len(lengths), max(lengths), *packed.shape[1:])
    start = 0
    for i, n in enumerate(lengths):
        out[i, :n] = packed[start : start + n]
        start += n
    return out.transpose(1, 2).contiguous()


def unpad_documents(padded: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """SDPA's ``(docs, heads, longest, dim)`` output as packed ``(tokens, heads, dim)`` rows,
    the padding's rows dropped."""
    return torch.cat([padded[i, :, :n].transpose(0, 1) for i, n in enumerate(lengths)])


# ---- contenders -----------------------------------------------------------------------------


def _backend(name: str):
    from torch.nn.attention import SDPBackend

    return {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }[name]


def sdpa_function(
    backend: str | None, gqa: str, causal: bool, mask: torch.Tensor | None = None
) -> Callable:
    """SDPA on ``(batch, heads, seq, dim)`` q and ``(batch, kv_heads, seq, dim)`` k, v, through
    ``backend`` alone (None: SDPA's own choice), grouped-query attention by ``gqa``
    (``"enable_gqa"`` or ``"repeat"``: k and v repeated to every query head in the call), with
    ``mask`` as its ``attn_mask``."""
    import contextlib

    from torch.nn.attention import sdpa_kernel

    def call(q, k, v):
        if gqa == "repeat" and k.shape[1] != q.shape[1]:
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scope = sdpa_kernel(_backend(backend)) if backend else contextlib.nullcontext()
        with scope:
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=gqa == "enable_gqa"
            )

    return call


def gqa_mode(backend: str, dim: int, causal: bool, device="cuda") -> tuple[str | None, str]:
    """How ``backend`` runs grouped-query attention at head dimension ``dim``: ``("enable_gqa",
    "")`` when it takes ``enable_gqa=True`` forward and backward, else ``("repeat", why)``, or
    ``(None, why)`` when it runs neither (the backend is unavailable)."""
    q = torch.randn(1, HEADS, 128, dim, device=device, dtype=DTYPE, requires_grad=True)
    k, v = (
        torch.randn(1, KV_HEADS, 128, dim, device=device, dtype=DTYPE, requires_grad=True)
        for _ in range(2)
    )
    why = ""
    for mode in ("enable_gqa", "repeat"):
        try:
            out = sdpa_function(backend, mode, causal)(q, k, v)
            torch.autograd.grad(out.sum(), (q, k, v))
            return mode, why
        except RuntimeError as exc:
            why = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
    return None, why


def load_ours():
    from kernels.library import load_library_package

    return load_library_package("attention")


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float(), ref.float()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


#: Ours against SDPA's output: bf16 rounding of both stays well under this.
MAX_REL_ERR = 2e-2


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]


def _timed_rows(calls: dict, rep_ms: float, block: int, key: str) -> dict:
    """{name: {key_ms, key_rounds}} from interleaved rounds of ``calls``."""
    samples = timing.interleaved_samples(calls, rep_ms, block)
    return {
        name: {
            f"{key}_ms": timing.pooled_median(rounds),
            f"{key}_rounds": [round(statistics.median(r), 6) for r in rounds],
        }
        for name, rounds in samples.items()
    }


def _prepare(contenders: dict) -> tuple[dict, dict, dict]:
    """({name: fwd call}, {name: fwd+bwd call}, {name: error}) for ``{name: (fn, inputs)}``:
    a contender that fails to run is left out with its error."""
    fwd, fwd_bwd, failed = {}, {}, {}
    for name, (fn, inputs) in contenders.items():
        try:
            fwd[name], fwd_bwd[name] = timing.passes(inputs, [], fn)
        except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
            failed[name] = _error(exc)
            print(f"    {name}: {failed[name]}", flush=True)
            torch.cuda.empty_cache()
    return fwd, fwd_bwd, failed


def _check(ours_out: torch.Tensor, peer_outs: dict) -> float | None:
    """Ours against the first peer that ran (in ours' layout)."""
    for out in peer_outs.values():
        if out is not None:
            return relative_error(ours_out, out)
    return None


def attention_inputs(batch: int, seqlen_q: int, seqlen_k: int, dim: int) -> tuple:
    """Seeded q ``(batch, seqlen_q, HEADS, dim)`` and k, v ``(batch, seqlen_k, KV_HEADS, dim)``
    on the GPU, in DTYPE: what the dense and decode sections (and the diagnose tools) time."""
    torch.manual_seed(0)
    q = torch.randn(batch, seqlen_q, HEADS, dim, device="cuda", dtype=DTYPE)
    k, v = (
        torch.randn(batch, seqlen_k, KV_HEADS, dim, device="cuda", dtype=DTYPE) for _ in range(2)
    )
    return q, k, v


def run_dense(attn, batch, seqlen, dim, causal, rep_ms, block) -> list[dict]:
    q, k, v = attention_inputs(batch, seqlen, seqlen, dim)
    # Each contender gets its own layout, contiguous: ours (batch, seq, heads, dim), SDPA's
    # (batch, heads, seq, dim).
    sdpa_inputs = [t.transpose(1, 2).contiguous() for t in (q, k, v)]

    def forced(tma: bool) -> Callable:
        # The backward is the same either way (its own rule); only the forward reads differently.
        return lambda q, k, v: switched(
            attn, "_FORWARD_TMA", tma, attn.flash_attn_func, q, k, v, causal=causal
        )

    through_descriptors = forced(True)
    contenders = {
        OURS: (lambda q, k, v: attn.flash_attn_func(q, k, v, causal=causal), [q, k, v]),
        OURS_TMA: (through_descriptors, [t.clone() for t in (q, k, v)]),
        OURS_POINTER: (forced(False), [t.clone() for t in (q, k, v)]),
    }
    modes = {}
    for peer in PEERS:
        modes[peer] = gqa_mode(peer, dim, causal)
        if modes[peer][0] is not None:
            inputs = [t.clone() for t in sdpa_inputs]
            contenders[peer] = (sdpa_function(peer, modes[peer][0], causal), inputs)
    fwd, fwd_bwd, failed = _prepare(contenders)
    for peer, (mode, why) in modes.items():
        if mode is None:
            failed[peer] = why
    with torch.no_grad():
        ours_out = attn.flash_attn_func(q, k, v, causal=causal)
        peer_outs = {p: contenders[p][0](*sdpa_inputs).transpose(1, 2) for p in fwd if p in PEERS}
        tma_err = (
            relative_error(through_descriptors(q, k, v), ours_out) if OURS_TMA in fwd else None
        )
    rel = _check(ours_out, peer_outs)
    del peer_outs, ours_out
    times = _timed_rows(fwd, rep_ms, block, "fwd")
    for name, row in _timed_rows(fwd_bwd, rep_ms, block, "fwd_bwd").items():
        times[name].update(row)
    flops = attention_flops(batch, seqlen, seqlen, dim, causal)
    key = {"section": "dense", "batch": batch, "seqlen": seqlen, "dim": dim, "causal": causal}
    rows = []
    for name in [OURS, OURS_TMA, OURS_POINTER, *PEERS]:
        row = {**key, "impl": name, "fwd_flops": flops, "fwd_bwd_flops": FWD_BWD_FACTOR * flops}
        if name in modes:
            row["gqa"] = modes[name][0]
        if name in failed:
            row["error"] = failed[name]
        elif name in times:
            row.update(times[name])
        if name == OURS:
            row["rel_err_vs_sdpa"] = rel
        if name == OURS_TMA:
            row["rel_err_vs_ours"] = tma_err
        rows.append(row)
    _print(rows)
    del contenders, fwd, fwd_bwd
    torch.cuda.empty_cache()
    return rows


def run_varlen(attn, rep_ms, block) -> list[dict]:
    lengths = varlen_lengths()
    total, longest, docs = sum(lengths), max(lengths), len(lengths)
    dim = VARLEN_DIM
    cu = cu_seqlens(lengths, "cuda")
    torch.manual_seed(0)
    q = torch.randn(total, HEADS, dim, device="cuda", dtype=DTYPE)
    k, v = (torch.randn(total, KV_HEADS, dim, device="cuda", dtype=DTYPE) for _ in range(2))

    def ours(q, k, v):
        return attn.flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=True)

    contenders = {OURS: (ours, [q, k, v])}
    modes = {}
    for peer in PEERS:
        modes[peer] = gqa_mode(peer, dim, True)
        if modes[peer][0] is not None:
            padded = [pad_documents(t, lengths) for t in (q, k, v)]
            contenders[peer] = (sdpa_function(peer, modes[peer][0], True), padded)
    inputs_bytes = {
        n: sum(t.numel() * t.element_size() for t in c[1]) for n, c in contenders.items()
    }
    fwd, fwd_bwd, failed = _prepare(contenders)
    for peer, (mode, why) in modes.items():
        if mode is None:
            failed[peer] = why
    peaks = {}
    for name in list(fwd_bwd):
        try:
            peaks[name] = timing.peak_extra(fwd_bwd[name])
        except torch.cuda.OutOfMemoryError as exc:
            failed[name] = _error(exc)
            fwd.pop(name), fwd_bwd.pop(name)
            torch.cuda.empty_cache()
    with torch.no_grad():
        ours_out = ours(q, k, v)
        rel = None
        for peer in fwd:
            if peer != OURS:
                out = contenders[peer][0](*contenders[peer][1])
                rel = relative_error(ours_out, unpad_documents(out, lengths))
                del out
                break
    del ours_out
    times = _timed_rows(fwd, rep_ms, block, "fwd")
    for name, row in _timed_rows(fwd_bwd, rep_ms, block, "fwd_bwd").items():
        times[name].update(row)
    flops = sum(attention_flops(1, n, n, dim, True) for n in lengths)
    padded_flops = docs * attention_flops(1, longest, longest, dim, True)
    key = {
        "section": "varlen",
        "docs": docs,
        "tokens": total,
        "longest": longest,
        "dim": dim,
        "causal": True,
    }
    rows = []
    for name in [OURS, *PEERS]:
        row = {
            **key,
            "impl": name,
            "fwd_flops": flops,
            "fwd_bwd_flops": FWD_BWD_FACTOR * flops,
            "computed_flops": flops if name == OURS else padded_flops,
        }
        if name in modes:
            row["gqa"] = modes[name][0]
        if name in failed:
            row["error"] = failed[name]
        elif name in times:
            row.update(times[name])
            row["peak_extra_gib"] = peaks[name] / GiB
            row["inputs_gib"] = inputs_bytes[name] / GiB
        if name == OURS:
            row["rel_err_vs_sdpa"] = rel
        rows.append(row)
    _print(rows)
    del contenders, fwd, fwd_bwd
    torch.cuda.empty_cache()
    return rows


def switched(attn, switch: str, value, call: Callable, *args, **kwargs):
    """``call(*args, **kwargs)`` with the attention ops' private ``switch`` at ``value``, put
    back after: a plain assignment, so that a timed call pays next to nothing for it."""
    ops = import_module(attn.__name__ + "._ops")
    kept = getattr(ops, switch)
    setattr(ops, switch, value)
    try:
        return call(*args, **kwargs)
    finally:
        setattr(ops, switch, kept)


def left_padding_mask(batch: int, context: int, device) -> torch.Tensor:
    """``(batch, context)`` bool: sequence ``b`` left-padded by ``b * PADDING_SHARE / batch`` of
    the context, as generate() pads a batch of prompts of different lengths."""
    starts = [int(b * PADDING_SHARE * context / batch) for b in range(batch)]
    rows = torch.arange(context, device=device)
    return rows[None, :] >= torch.tensor(starts, device=device)[:, None]


def padded_decode_calls(attn, q, k_cache, v_cache, keep, peers: dict) -> dict:
    """{name: call} for a padded decode step: ours with ``keep`` as its key mask (the cache full
    to ``keep``'s length), the kernel alone and as ``kernels_attention`` runs it (with
    `padded_decode_step`'s small kernels that turn the mask into key counts first), and each of
    ``peers`` ({backend: gqa mode}) with it as SDPA's boolean mask, in SDPA's layout."""
    used = torch.full((q.shape[0],), keep.shape[1], dtype=torch.int32, device=q.device)

    def step():
        ends, kept = padded_decode_step(k_cache, keep, 1, {})
        return attn.flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=ends, key_padding_mask=kept, causal=True
        )

    calls = {
        OURS_PADDED: lambda: attn.flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=used, key_padding_mask=keep, causal=True
        ),
        OURS_PADDED_STEP: step,
    }
    sdpa_q = q.transpose(1, 2).contiguous()
    sdpa_k, sdpa_v = (t.transpose(1, 2).contiguous() for t in (k_cache, v_cache))
    mask = keep[:, None, None, :]
    for peer, gqa in peers.items():
        fn = sdpa_function(peer, gqa, False, mask)
        calls[f"{PADDED}{peer}"] = lambda fn=fn: fn(sdpa_q, sdpa_k, sdpa_v).transpose(1, 2)
    return calls


def _check_padded(padded: dict, fns: dict, failed: dict) -> float | None:
    """Ours' relative error against the first masked SDPA backend that runs; a backend that
    takes no mask (flash) is marked failed and left out of the timing, and so is ours with the
    mask's preparation if it does not give the kernel's output alone."""
    ours = padded[OURS_PADDED]()
    if not torch.equal(padded[OURS_PADDED_STEP](), ours):
        failed[OURS_PADDED_STEP] = "its output differs from the kernel's alone"
        del fns[OURS_PADDED_STEP]
    rel = None
    for name, call in padded.items():
        if not name.startswith(PADDED):
            continue
        try:
            error = relative_error(ours, call())
        except RuntimeError as exc:
            failed[name] = _error(exc)
            del fns[name]
            continue
        rel = error if rel is None else rel
    return rel


def run_decode(attn, batch, rep_ms, block) -> list[dict]:
    dim, context = DECODE_DIM, DECODE_CONTEXT
    q, k_cache, v_cache = attention_inputs(batch, 1, context, dim)
    used = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    sdpa_q = q.transpose(1, 2).contiguous()
    sdpa_k, sdpa_v = (t.transpose(1, 2).contiguous() for t in (k_cache, v_cache))

    def ours():
        return attn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=used, causal=True)

    def two_launches():
        # Read by each call, so the graph captured here holds the two launches.
        return switched(attn, "_DECODE_FUSED", False, ours)

    fns, modes, failed = {OURS: ours, TWO_LAUNCHES: two_launches}, {}, {}
    for n in SWEEP_SPLITS:
        fns[f"{SWEEP}{n}"] = lambda n=n: attn.flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=used, causal=True, num_splits=n
        )
    for peer in PEERS:
        modes[peer] = gqa_mode(peer, dim, False)
        if modes[peer][0] is None:
            failed[peer] = modes[peer][1]
            continue
        fn = sdpa_function(peer, modes[peer][0], False)
        fns[peer] = lambda fn=fn: fn(sdpa_q, sdpa_k, sdpa_v)
    padded: dict = {}
    if batch > 1:
        keep = left_padding_mask(batch, context, "cuda")
        runnable = {peer: mode[0] for peer, mode in modes.items() if mode[0] is not None}
        padded = padded_decode_calls(attn, q, k_cache, v_cache, keep, runnable)
        fns.update(padded)
    rel, same, padded_rel = None, None, None
    with torch.no_grad():
        ours_out = ours()
        same = torch.equal(two_launches(), ours_out)
        for peer in PEERS:
            if peer not in fns:
                continue
            try:
                rel = relative_error(ours_out, fns[peer]().transpose(1, 2))
                break
            except RuntimeError as exc:  # a backend that takes no single-query shape
                failed[peer] = _error(exc)
                del fns[peer]
        if padded:
            padded_rel = _check_padded(padded, fns, failed)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    replays = {}
    with torch.no_grad(), torch.cuda.stream(stream):
        for name, fn in fns.items():
            try:
                replays[name] = timing.captured(fn, stream)
            except RuntimeError as exc:
                failed[name] = f"CUDA graph capture failed: {_error(exc)}"
                torch.cuda.synchronize()
        times = _timed_rows(replays, rep_ms, block, "step")
    torch.cuda.current_stream().wait_stream(stream)
    rows = []
    for name in [OURS, TWO_LAUNCHES, *PEERS, *(f"{SWEEP}{n}" for n in SWEEP_SPLITS), *padded]:
        row = {"section": "decode", "batch": batch, "context": context, "dim": dim, "impl": name}
        if name.startswith(SWEEP):
            row["num_splits"] = int(name[len(SWEEP) :])
        if name in modes:
            row["gqa"] = modes[name][0]
        if name in failed:
            row["error"] = failed[name]
        elif name in times:
            row.update(times[name])
        if name == OURS:
            row["rel_err_vs_sdpa"] = rel
        if name == OURS_PADDED:
            row["rel_err_vs_sdpa"] = padded_rel
            row["padding_share"] = PADDING_SHARE
        if name in (OURS, TWO_LAUNCHES):
            row["num_splits"] = decode_splits(attn, batch, context)
        if name == TWO_LAUNCHES:
            row["bitwise_equal_to_ours"] = same
        rows.append(row)
    _print(rows)
    del replays
    torch.cuda.empty_cache()
    return rows


def decode_splits(attn, batch: int, context: int) -> int:
    """The split count our decode path picks here (its rule, ``_tuning.decode_plan``): one
    query per sequence packs a group's 4 query heads into one row tile, so a program a
    sequence and kv head."""
    plan = import_module(attn.__name__ + "._tuning").decode_plan
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return plan(DECODE_DIM, batch * KV_HEADS, context, sms, False, False)[1]


def _print(rows: list[dict]) -> None:
    for row in rows:
        where = " ".join(
            f"{k}={row[k]}"
            for k in ("batch", "seqlen", "docs", "context", "dim", "causal")
            if k in row
        )
        times = " ".join(
            f"{k[:-3]} {row[k]:.3f} ms" for k in ("fwd_ms", "fwd_bwd_ms", "step_ms") if k in row
        )
        print(
            f"  {row['section']:6s} {where:40s} {row['impl']:9s} {row.get('error', times)}",
            flush=True,
        )


# ---- tables ---------------------------------------------------------------------------------


def row_key(row: dict) -> tuple:
    """What identifies a row across runs (a later run replaces rows of the same key)."""
    fields = ("section", "batch", "seqlen", "docs", "context", "dim", "causal", "impl")
    return tuple(row.get(f) for f in fields)


def merge(previous: list, new: list) -> list:
    fresh = {row_key(r) for r in new}
    return [r for r in previous if row_key(r) not in fresh] + new


def _ms(row: dict | None, key: str, scale: float = 1.0, fmt: str = "{:.3f}") -> str:
    if row is None:
        return "—"
    if f"{key}_ms" not in row:
        return "failed" if "error" in row else "—"
    return fmt.format(row[f"{key}_ms"] * scale)


def tflops(row: dict, key: str) -> float | None:
    """TFLOP/s of a row's pass (``key`` "fwd" or "fwd_bwd"), from its useful FLOPs."""
    if f"{key}_ms" not in row:
        return None
    return row[f"{key}_flops"] / (row[f"{key}_ms"] * 1e-3) / 1e12


def best_peer(rows: dict, key: str, prefix: str = "") -> str | None:
    """The fastest peer (an SDPA backend, its row named ``prefix`` + backend) of a group of rows
    ``{impl: row}``: the backend's name."""
    timed = [p for p in PEERS if f"{key}_ms" in rows.get(prefix + p, {})]
    return min(timed, key=lambda p: rows[prefix + p][f"{key}_ms"]) if timed else None


def ratio(peer: dict | None, ours: dict | None, key: str) -> str:
    """Speed of ours over the peer (> 1: ours faster), quartiles over the rounds in brackets."""
    if peer is None or ours is None or f"{key}_ms" not in ours or f"{key}_ms" not in peer:
        return "—"
    q1, _, q3 = timing.ratio_quartiles(
        [[ms] for ms in peer[f"{key}_rounds"]], [[ms] for ms in ours[f"{key}_rounds"]]
    )
    return f"{peer[f'{key}_ms'] / ours[f'{key}_ms']:.2f}x [{q1:.2f}-{q3:.2f}]"


def _groups(results: list, section: str, fields: tuple) -> list[tuple[tuple, dict]]:
    groups: dict = {}
    for row in results:
        if row["section"] == section:
            groups.setdefault(tuple(row[f] for f in fields), {})[row["impl"]] = row
    return sorted(groups.items())


def _gqa(rows: dict) -> str:
    return ", ".join(f"{p}: {rows[p].get('gqa') or 'n/a'}" for p in PEERS if p in rows)


def _flag(ours: dict | None) -> str:
    rel = (ours or {}).get("rel_err_vs_sdpa")
    if rel is None:
        return ""
    return f" **(ours off by {rel:.2g})**" if rel > MAX_REL_ERR else ""


def dense_table(results: list, key: str, peak: float | None) -> list[str]:
    label = "forward" if key == "fwd" else "forward+backward"
    lines = [
        f"### Dense, {label}",
        "",
        "| batch x seq | dim | causal | ours ms | ours TFLOP/s | ours % peak | "
        + " | ".join(f"{p} ms" for p in PEERS)
        + " | best peer TFLOP/s | ours vs best peer |",
        "|---|---|---|---|---|---|" + "---|" * len(PEERS) + "---|---|",
    ]
    for (batch, seqlen, dim, causal), rows in _groups(
        results, "dense", ("batch", "seqlen", "dim", "causal")
    ):
        ours = rows.get(OURS)
        ours_tf = tflops(ours, key) if ours else None
        best = best_peer(rows, key)
        best_tf = tflops(rows[best], key) if best else None
        cells = [
            f"{batch}x{seqlen}",
            str(dim),
            "yes" if causal else "no",
            _ms(ours, key) + _flag(ours),
            f"{ours_tf:.0f}" if ours_tf else "—",
            f"{100 * ours_tf / peak:.0f}%" if ours_tf and peak else "—",
            *(_ms(rows.get(p), key) for p in PEERS),
            f"{best_tf:.0f} ({best})" if best_tf else "—",
            ratio(rows.get(best) if best else None, ours, key),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def tma_table(results: list) -> list[str]:
    """Ours reading q, k and v through tensor descriptors against the pointer loads, dense."""
    groups = [
        (key, rows)
        for key, rows in _groups(results, "dense", ("batch", "seqlen", "dim", "causal"))
        if OURS_TMA in rows
    ]
    if not groups:
        return []
    lines = [
        "### Dense, ours with q, k and v read through tensor descriptors (TMA)",
        "",
        "Ours' forward forced to read through descriptors against forced to pointer loads, ms; "
        "ratios pointer ms / TMA ms (> 1: TMA faster). The backward is the same in both (its "
        "own rule: descriptors on Hopper from head dim 128). The default (ours above) takes "
        "the descriptors on Hopper for head dims of 128 and more.",
        "",
        "| batch x seq | dim | causal | fwd ms | TMA fwd ms | TMA vs pointer (fwd) | "
        "fwd+bwd ms | TMA fwd+bwd ms | TMA vs pointer (fwd+bwd) | TMA vs pointer output |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (batch, seqlen, dim, causal), rows in groups:
        ours, tma = rows.get(OURS_POINTER, rows.get(OURS)), rows[OURS_TMA]
        err = tma.get("rel_err_vs_ours")
        cells = [
            f"{batch}x{seqlen}",
            str(dim),
            "yes" if causal else "no",
            _ms(ours, "fwd"),
            _ms(tma, "fwd"),
            ratio(ours, tma, "fwd"),
            _ms(ours, "fwd_bwd"),
            _ms(tma, "fwd_bwd"),
            ratio(ours, tma, "fwd_bwd"),
            f"{err:.1e}" if err is not None else "—",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def varlen_table(results: list) -> list[str]:
    lines = [
        "### Varlen: packed documents against the same documents padded",
        "",
        "| contender | fwd ms | fwd+bwd ms | useful TFLOP/s (fwd+bwd) | peak GiB beyond inputs | "
        "inputs GiB | ours vs it (fwd) | ours vs it (fwd+bwd) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    groups = _groups(results, "varlen", ("docs", "tokens", "longest"))
    for docs, tokens, longest in (key for key, _ in groups):
        lines.insert(
            2,
            f"{docs} documents ({VARLEN_MIN}-{VARLEN_MAX} tokens, seed {VARLEN_SEED}), "
            f"{tokens} tokens, the longest {longest}; SDPA runs them padded to "
            f"{docs} x {longest}.\n",
        )
    for _, rows in groups:
        ours = rows.get(OURS)
        for name in [OURS, *PEERS]:
            row = rows.get(name)
            if row is None:
                continue
            tf = tflops(row, "fwd_bwd")
            cells = [
                name if name == OURS else f"SDPA {name}, padded ({row.get('gqa') or 'n/a'})",
                _ms(row, "fwd") + (_flag(row) if name == OURS else ""),
                _ms(row, "fwd_bwd"),
                f"{tf:.0f}" if tf else "—",
                f"{row['peak_extra_gib']:.2f}" if "peak_extra_gib" in row else "—",
                f"{row['inputs_gib']:.2f}" if "inputs_gib" in row else "—",
                "" if name == OURS else ratio(row, ours, "fwd"),
                "" if name == OURS else ratio(row, ours, "fwd_bwd"),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _peers_header(leading: str) -> list[str]:
    """A decode table's header and rule: the ``leading`` columns ("a | b"), a column of us per
    step for each peer, then ours against the best peer."""
    columns = leading.count("|") + 1 + len(PEERS) + 1
    return [
        f"| {leading} | " + " | ".join(f"{p} us" for p in PEERS) + " | ours vs best peer |",
        "|" + "---|" * columns,
    ]


def decode_table(results: list) -> list[str]:
    lines = [
        "### Decode: one query per sequence over a KV cache, us per step (CUDA graphs)",
        "",
        *_peers_header("batch | context | ours us (splits)"),
    ]
    groups = _groups(results, "decode", ("batch", "context"))
    for (batch, context), rows in groups:
        ours = rows.get(OURS)
        best = best_peer(rows, "step")
        cells = [
            str(batch),
            str(context),
            _ms(ours, "step", 1e3, "{:.1f}")
            + f" ({(ours or {}).get('num_splits', '?')})"
            + _flag(ours),
            *(_ms(rows.get(p), "step", 1e3, "{:.1f}") for p in PEERS),
            f"{ratio(rows.get(best) if best else None, ours, 'step')} ({best})" if best else "—",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    sweeps = [(key, rows) for key, rows in groups if any(i.startswith(SWEEP) for i in rows)]
    if sweeps:
        lines += [
            "",
            "Ours with the split count forced (us per step); the rule's choice in the first column.",
            "",
            "| batch | rule | " + " | ".join(str(n) for n in SWEEP_SPLITS) + " |",
            "|---|---|" + "---|" * len(SWEEP_SPLITS),
        ]
        for (batch, _), rows in sweeps:
            cells = [str(batch), str((rows.get(OURS) or {}).get("num_splits", "?"))]
            cells += [_ms(rows.get(f"{SWEEP}{n}"), "step", 1e3, "{:.1f}") for n in SWEEP_SPLITS]
            lines.append("| " + " | ".join(cells) + " |")
    pairs = [(key, rows) for key, rows in groups if TWO_LAUNCHES in rows]
    if pairs:
        lines += [
            "",
            "Ours in one launch (the last program of each row tile combines the splits) against "
            "two (a second kernel combines them), us per step at the rule's split count.",
            "",
            "| batch | splits | one launch us | two launches us | one vs two |",
            "|---|---|---|---|---|",
        ]
        for (batch, _), rows in pairs:
            ours, two = rows.get(OURS), rows[TWO_LAUNCHES]
            cells = [
                str(batch),
                str(two.get("num_splits", "?")),
                _ms(ours, "step", 1e3, "{:.1f}"),
                _ms(two, "step", 1e3, "{:.1f}"),
                ratio(two, ours, "step"),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return lines + padded_decode_table(groups)


def padded_decode_table(groups: list[tuple[tuple, dict]]) -> list[str]:
    """The padded batch's decode step, from the decode section's groups: ours with the padding
    mask read in the kernel against each SDPA backend with it as a boolean mask."""
    padded = [(key, rows) for key, rows in groups if OURS_PADDED in rows]
    if not padded:
        return []
    lines = [
        "",
        f"A padded batch's decode step (sequence b of B left-padded by b/B x {PADDING_SHARE:.0%} "
        "of the context): ours reading the padding mask in the kernel (`key_padding_mask`), "
        "alone and as `kernels_attention` runs it (with `padded_decode_step`'s small kernels "
        "that count each sequence's keys first), each SDPA backend with the mask as a boolean "
        "mask; us per step (CUDA graphs).",
        "",
        *_peers_header("batch | context | ours us | ours with preparation us"),
    ]
    for (batch, context), rows in padded:
        ours = rows[OURS_PADDED]
        best = best_peer(rows, "step", PADDED)
        step = rows.get(OURS_PADDED_STEP)
        cells = [
            str(batch),
            str(context),
            _ms(ours, "step", 1e3, "{:.1f}") + _flag(ours),
            _ms(step, "step", 1e3, "{:.1f}"),
            *(_ms(rows.get(PADDED + p), "step", 1e3, "{:.1f}") for p in PEERS),
            f"{ratio(rows[PADDED + best], ours, 'step')} ({best})" if best else "—",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _errors(results: list) -> list[str]:
    failed = [r for r in results if "error" in r]
    if not failed:
        return []
    lines = ["### Contenders that did not run", ""]
    for r in failed:
        where = ", ".join(
            f"{k} {r[k]}" for k in ("batch", "seqlen", "docs", "context", "dim", "causal") if k in r
        )
        lines.append(f"- {r['section']} ({where}), {r['impl']}: {r['error']}")
    return [*lines, ""]


def gqa_notes(results: list) -> list[str]:
    modes = sorted({(r["impl"], r.get("gqa")) for r in results if r["impl"] in PEERS})
    if not modes:
        return []
    return [
        "Grouped-query attention through SDPA: "
        + "; ".join(f"{impl} {mode or 'did not run'}" for impl, mode in modes)
        + ".",
        "",
    ]


def section_dates(previous_meta: dict | None, sections: list, today: str) -> dict:
    """{section: the date its rows were last timed}: ``sections`` (this run's) today, the others
    as ``previous_meta`` (the kept results' meta) says, its ``date`` for results kept before
    sections were dated apart."""
    dates = {}
    if previous_meta:
        dates = dict(previous_meta.get("section_dates") or {})
        dates = {s: dates.get(s, previous_meta["date"]) for s in SECTIONS} | dates
    return dates | dict.fromkeys(sections, today)


def date_line(meta: dict, results: list) -> str:
    """The results' date, or each section's where a later run replaced some sections' rows."""
    present = [s for s in SECTIONS if any(r["section"] == s for r in results)]
    dates = meta.get("section_dates") or {}
    if len({dates.get(s, meta["date"]) for s in present}) < 2:
        return f"- date: {meta['date']}"
    return "- dates: " + ", ".join(f"{s} {dates.get(s, meta['date'])}" for s in present)


def write_markdown(meta: dict, results: list, path) -> None:
    peak = meta.get("peak_tflops")
    lines = [
        "# Attention: ours against torch SDPA's backends",
        "",
        f"- device: {meta['device']} (dense bf16 peak: {peak or 'unknown'} TFLOP/s)",
        date_line(meta, results),
        f"- torch {meta['torch']}, triton {meta['triton']}",
        f"- bf16, {HEADS} query heads, {KV_HEADS} key/value heads",
        f"- timing: {meta['timing']}",
        "",
        "Ratios are peer ms / ours ms (> 1: ours faster), quartiles over the rounds in brackets. "
        "TFLOP/s count the pairs each call computes usefully (causal: half); forward+backward "
        f"{FWD_BWD_FACTOR}x the forward.",
        "",
        *gqa_notes(results),
    ]
    if any(r["section"] == "dense" for r in results):
        lines += [
            *dense_table(results, "fwd", peak),
            "",
            *dense_table(results, "fwd_bwd", peak),
            "",
        ]
        if tma := tma_table(results):
            lines += [*tma, ""]
    if any(r["section"] == "varlen" for r in results):
        lines += [*varlen_table(results), ""]
    if any(r["section"] == "decode" for r in results):
        lines += [*decode_table(results), ""]
    lines += _errors(results)
    with open(path, "w") as f:
        f.write("\n".join(lines).rstrip() + "\n")


# ---- the command ----------------------------------------------------------------------------


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"16x1024,4x4096"`` -> ``[(16, 1024), (4, 4096)]``."""
    shapes = []
    for item in text.split(","):
        batch, _, seqlen = item.strip().partition("x")
        if not (batch.isdigit() and seqlen.isdigit()):
            raise argparse.ArgumentTypeError(f"shape {item!r} is not BATCHxSEQ (e.g. 4x4096)")
        shapes.append((int(batch), int(seqlen)))
    return shapes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", help="results folder (default benchmarks/results/<device>/attention)"
    )
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help=f"sections to run, of {','.join(SECTIONS)}"
    )
    parser.add_argument(
        "--shapes",
        type=parse_shapes,
        default=SHAPES,
        help="dense shapes, BATCHxSEQ,... (default 16x1024,4x4096,1x16384)",
    )
    parser.add_argument("--dims", default=",".join(map(str, HEAD_DIMS)), help="dense head dims")
    parser.add_argument(
        "--rep-ms",
        type=float,
        default=150.0,
        help="how long each timing's rounds should take, roughly",
    )
    parser.add_argument("--block", type=int, default=4, help="calls a contender makes a round")
    parser.add_argument(
        "--report",
        action="store_true",
        help="rewrite results.md from --out's results.json (no GPU)",
    )
    args = parser.parse_args(argv)
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"--only: unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    if args.report:
        if args.out is None:
            parser.error("--report needs --out")
        with open(os.path.join(args.out, "results.json")) as f:
            data = json.load(f)
        save_results(args.out, data["meta"], data["results"], write_markdown)
        return
    if not torch.cuda.is_available():
        sys.exit("python -m benchmarks.attention needs a CUDA GPU (--report does not)")
    out = args.out or str(default_out("attention"))
    os.makedirs(out, exist_ok=True)
    import triton

    device = torch.cuda.get_device_name()
    meta = {
        "device": device,
        "peak_tflops": peak_tflops(device),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "timing": f"timing.interleaved_samples: rounds of every contender in rotating order, "
        f"{args.block} calls each (the first not counted), L2 cleared before each call, CUDA "
        "events; median over every counted call; decode: each call a CUDA graph replay",
    }
    results, previous_meta = [], None
    path = os.path.join(out, "results.json")
    if os.path.exists(path):
        with open(path) as f:
            kept = json.load(f)
        results, previous_meta = kept["results"], kept["meta"]
    meta["section_dates"] = section_dates(previous_meta, sections, meta["date"])
    attn = load_ours()
    if "dense" in sections:
        for batch, seqlen in args.shapes:
            for dim in map(int, args.dims.split(",")):
                for causal in (False, True):
                    rows = run_dense(attn, batch, seqlen, dim, causal, args.rep_ms, args.block)
                    results = merge(results, rows)
                    save_results(out, meta, results, write_markdown)
    if "varlen" in sections:
        results = merge(results, run_varlen(attn, args.rep_ms, max(2, args.block // 2)))
        save_results(out, meta, results, write_markdown)
    if "decode" in sections:
        for batch in DECODE_BATCHES:
            results = merge(results, run_decode(attn, batch, args.rep_ms, args.block))
            save_results(out, meta, results, write_markdown)
    with open(os.path.join(out, "results.md")) as f:
        print(f.read())


if __name__ == "__main__":
    main()
