"""Benchmark our library kernels beside eager PyTorch, torch.compile and Liger-Kernel.

    python benchmarks/ops.py --out benchmarks/results/<device>/ops

Runs, in one process on one CUDA GPU: a device-to-device copy (the bandwidth ceiling), then for
each op and shape, forward and forward+backward of

- ``eager``: the module code the kernel replaces (transformers' LlamaRMSNorm and GemmaRMSNorm,
  a residual add before LlamaRMSNorm, torch.nn.LayerNorm with and without bias, a vLLM-style
  SiluAndMul, transformers' GELUTanh and apply_rotary_pos_emb), in PyTorch;
  for ``SwiGLU``, the middle of transformers' LlamaMLP: ``F.silu(gate) * up`` on two tensors;
- ``compile``: ``torch.compile`` of that same code;
- ``liger``: Liger-Kernel's op, where it has one (carried as a wheel; optional);
- ``ours``: our kernel layer bound to the same module instance, as kernelize binds it (for
  ``SwiGLU``, our ``silu_mul``, which the ``SwiGLUMLP`` layer calls between the projections).

Timing, L2 cleared before every timed call (``clear_l2``: 256 MB read) so that inputs smaller
than L2 are not served from it: "eager calls" time the Python calls between CUDA events, in
rounds that run every contender in rotating order, each for a block of calls in its own steady
state (``interleaved_samples``), median over the rounds; "CUDA graph" replays the same calls
captured in a graph, in the same kind of rounds: device time without host overhead. The copy
of the same bytes (below) runs in the rounds beside the contenders, and the tables give, beside
each ratio, its quartiles over the rounds (``ratio_quartiles``). Forward is timed under
``torch.no_grad()`` (inference); forward+backward uses ``torch.autograd.grad`` for the input and
parameters (no gradient accumulation).

L2 is cleared by reading, not by writing as ``triton.testing.do_bench`` does: writing leaves L2
full of dirty lines that the timed call must write back to memory before it can use their
space, work that belongs to the clearing. On an H200 (2026-11-24, results/h200/NOTES.md) that
cost every contender the same 3.5-5 us a call (a 256 MB copy 67.9 against 64.1 us), a tenth of a
call at 4096x4096; cleared by reading, single calls time as the same calls do back to back in
one graph over inputs that L2 cannot hold (within 1-2%), which is how a model runs them.

Bytes counted ("bytes that must move"): every input of the pass read once, every output
written once. Forward: x (+ weight, bias) read, y written. Backward: the saved input and the
output gradient read (+ weight), the input gradient (+ weight, bias gradients) written;
forward+backward counts both passes. Rotary: q, k, cos, sin read and the two outputs written;
backward reads the two output gradients and cos, sin and writes dq, dk. SwiGLU: forward reads
gate and up and writes y; backward reads gate, up and dy and writes d_gate and d_up.
FusedAddRMSNorm: forward reads x and the residual and writes y and the sum; backward reads dy,
the sum's gradient and the saved sum and writes one gradient (x's and the residual's). Per-row
statistics (rstd, mean: 4 bytes a row) are not counted.

Writes ``results.md`` (tables: GB/s, % of copy bandwidth, ours vs each peer), ``results.json``
and one PNG per op into ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import re
import statistics
import sys
import types

import torch
import torch.nn.functional as F
import triton

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

NORM_SHAPES = [(4096, 4096), (16384, 4096), (8192, 8192), (32768, 8192)]
# Hidden sizes of real models that are not the square shapes above, at 64M+ elements, and the
# widest row the kernels take (65536): "RMSNorm-widths" and "LayerNorm-widths".
WIDTH_SHAPES = [(65536, 1024), (32768, 2048), (16384, 5120), (1024, 65536)]
ROTARY_SHAPES = [(1, 4096), (4, 2048), (8, 4096)]  # (batch, seq); 32 q heads, 8 kv heads of 128
Q_HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
DTYPE = torch.bfloat16
IMPLS = ["eager", "compile", "liger", "ours"]
# Not a contender: one element-wise kernel moving the same bytes as the pass, the ceiling at
# that size.
COPY = "copy"
# The norms and their variants: each a layer of library/norm (the variants' names say what
# differs from the layer's plain benchmark: fp32 data, other widths, no bias).
NORM_OPS = (
    "RMSNorm",
    "RMSNorm-fp32",
    "RMSNorm-widths",
    "GemmaRMSNorm",
    "FusedAddRMSNorm",
    "LayerNorm",
    "LayerNorm-fp32",
    "LayerNorm-widths",
    "LayerNorm-nobias",
)
OPS = (*NORM_OPS, "SiluAndMul", "SwiGLU", "GeluTanh", "rotary")


# ---- loading --------------------------------------------------------------------------------


def load_library():
    import kernels

    lib = os.path.join(ROOT, "library")
    return {
        name: kernels.get_local_kernel(os.path.join(lib, name), name)
        for name in ("activation", "norm", "rotary")
    }


def load_liger():
    try:
        import liger_kernel
        from liger_kernel.ops import (
            LigerFusedAddRMSNormFunction,
            LigerFusedGateUpSiLUMulFunction,
            LigerLayerNormFunction,
            LigerRMSNormFunction,
            LigerRopeFunction,
            LigerSiLUMulFunction,
        )
    except Exception as exc:  # noqa: BLE001  (report and go on without the peer)
        print(f"Liger-Kernel unavailable: {type(exc).__name__}: {exc}")
        return None
    version = getattr(liger_kernel, "__version__", None)
    if version is None:
        from importlib.metadata import version as _v

        version = _v("liger-kernel")
    return types.SimpleNamespace(
        version=version,
        rms_norm=LigerRMSNormFunction,
        fused_add_rms_norm=LigerFusedAddRMSNormFunction,
        layer_norm=LigerLayerNormFunction,
        silu_mul=LigerFusedGateUpSiLUMulFunction,
        swiglu=LigerSiLUMulFunction,
        rope=LigerRopeFunction,
    )


# ---- reference modules (the code the kernels replace) ---------------------------------------


class LlamaRMSNorm(torch.nn.Module):
    """transformers' LlamaRMSNorm, verbatim semantics."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class GemmaRMSNorm(torch.nn.Module):
    """transformers' GemmaRMSNorm, verbatim semantics (``1 + weight``, all in fp32)."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.zeros(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float())
        output = output * (1.0 + self.weight.float())
        return output.type_as(x)


class FusedAddRMSNorm(LlamaRMSNorm):
    """Residual add, then LlamaRMSNorm; returns (normalised, sum), as a decoder layer uses them
    (the reference module of library/norm's README)."""

    def forward(self, hidden_states, residual):
        hidden_states = hidden_states + residual
        return super().forward(hidden_states), hidden_states


class SiluAndMul(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]


class GELUTanh(torch.nn.Module):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.gelu(input, approximate="tanh")


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


# ---- cases ----------------------------------------------------------------------------------


def bound(layer_cls, module):
    return types.MethodType(layer_cls.forward, module)


def norm_case(kind, lib, liger, rows, cols):
    """(inputs, params, {impl: fn(*inputs)}, fwd bytes, bwd bytes) for a norm of NORM_OPS."""
    dtype = torch.float32 if kind.endswith("-fp32") else DTYPE
    e = dtype.itemsize
    x = torch.randn(rows, cols, device="cuda", dtype=dtype)
    inputs = [x]
    layers = lib["norm"].layers
    if kind in ("RMSNorm", "RMSNorm-fp32", "RMSNorm-widths"):
        module, layer = LlamaRMSNorm(cols), layers.RMSNorm
        peer = liger and (
            lambda t: liger.rms_norm.apply(t, module.weight, 1e-6, 0.0, "llama", True)
        )
    elif kind == "GemmaRMSNorm":
        module, layer = GemmaRMSNorm(cols), layers.GemmaRMSNorm
        peer = liger and (
            lambda t: liger.rms_norm.apply(t, module.weight, 1e-6, 1.0, "gemma", True)
        )
    elif kind == "FusedAddRMSNorm":
        module, layer = FusedAddRMSNorm(cols), layers.FusedAddRMSNorm
        inputs.append(torch.randn_like(x))
        peer = liger and (
            lambda t, r: liger.fused_add_rms_norm.apply(
                t, r, module.weight, 1e-6, 0.0, "llama", False
            )
        )
    else:  # LayerNorm, -fp32, -widths, -nobias (Liger's takes a bias only)
        has_bias = kind != "LayerNorm-nobias"
        module, layer = torch.nn.LayerNorm(cols, bias=has_bias), layers.LayerNorm
        peer = (
            liger
            and has_bias
            and (lambda t: liger.layer_norm.apply(t, module.weight, module.bias, 1e-5))
        )
    module = module.to("cuda", dtype)
    params = [p for p in (module.weight, getattr(module, "bias", None)) if p is not None]
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn_like(p) * 0.1)
    fns = {
        "eager": module,
        "compile": torch.compile(module, dynamic=False),
        "ours": bound(layer, module),
    }
    if peer:
        fns["liger"] = peer
    n = rows * cols * e
    p_bytes = len(params) * cols * e
    if kind == "FusedAddRMSNorm":
        # Forward reads x and the residual, writes y and the sum. Backward reads dy, the sum's
        # gradient and the saved sum, writes one gradient (the same for x and the residual).
        return inputs, params, fns, 4 * n + p_bytes, 4 * n + 2 * p_bytes
    return inputs, params, fns, 2 * n + p_bytes, 3 * n + 2 * p_bytes


def silu_mul_case(lib, liger, rows, cols):
    e = 2
    x = torch.randn(rows, 2 * cols, device="cuda", dtype=DTYPE)
    module = SiluAndMul()
    fns = {
        "eager": module,
        "compile": torch.compile(module, dynamic=False),
        "ours": bound(lib["activation"].layers.SiluAndMul, module),
    }
    if liger:
        fns["liger"] = lambda t: liger.silu_mul.apply(t, False)
    n = rows * cols * e
    return [x], [], fns, 3 * n, 5 * n


def silu_times(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``act_fn(gate_proj(x)) * up_proj(x)`` of transformers' LlamaMLP, with SiLU."""
    return F.silu(gate) * up


def swiglu_case(lib, liger, rows, cols):
    e = 2
    gate = torch.randn(rows, cols, device="cuda", dtype=DTYPE)
    up = torch.randn(rows, cols, device="cuda", dtype=DTYPE)
    fns = {
        "eager": silu_times,
        "compile": torch.compile(silu_times, dynamic=False),
        "ours": lib["activation"].silu_mul,
    }
    if liger:
        # Liger's backward writes d_gate and d_up into the tensors it saved, here gate and up
        # themselves: their values change while it is timed, the bytes it moves do not.
        fns["liger"] = lambda g, u: liger.swiglu.apply(g, u)
    n = rows * cols * e
    return [gate, up], [], fns, 3 * n, 5 * n


def gelu_tanh_case(lib, liger, rows, cols):
    e = 2
    x = torch.randn(rows, cols, device="cuda", dtype=DTYPE)
    module = GELUTanh()
    fns = {
        "eager": module,
        "compile": torch.compile(module, dynamic=False),
        "ours": bound(lib["activation"].layers.GeluTanh, module),
    }
    n = rows * cols * e
    return [x], [], fns, 2 * n, 3 * n


def rotary_tables(batch, seq):
    """cos and sin (batch, seq, head_dim) as transformers' LlamaRotaryEmbedding makes them."""
    inv = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2, device="cuda").float() / HEAD_DIM))
    freqs = torch.arange(seq, device="cuda").float()[None, :, None] * inv
    emb = torch.cat((freqs, freqs), -1).expand(batch, seq, HEAD_DIM)
    return emb.cos().to(DTYPE).contiguous(), emb.sin().to(DTYPE).contiguous()


def rotary_case(lib, liger, batch, seq):
    e = 2
    # transformers' layout: the projections' (b, s, h, d) outputs viewed as (b, h, s, d).
    q = torch.randn(batch, seq, Q_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE).transpose(1, 2)
    k = torch.randn(batch, seq, KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE).transpose(1, 2)
    cos, sin = rotary_tables(batch, seq)
    ours = lib["rotary"].apply_rotary_pos_emb
    fns = {
        "eager": lambda q, k: apply_rotary_pos_emb(q, k, cos, sin),
        "compile": torch.compile(lambda q, k: apply_rotary_pos_emb(q, k, cos, sin), dynamic=False),
        "ours": lambda q, k: ours(q, k, cos, sin),
    }
    if liger:
        fns["liger"] = lambda q, k: liger.rope.apply(q, k, cos, sin, None, 1)
    qk = (q.numel() + k.numel()) * e
    cs = 2 * cos.numel() * e
    return [q, k], [], fns, 2 * qk + cs, 2 * qk + cs


def make_case(op, lib, liger, shape):
    """(inputs, params, {impl: fn(*inputs)}, fwd bytes, bwd bytes) of ``op`` at ``shape``."""
    if op in NORM_OPS:
        return norm_case(op, lib, liger, *shape)
    if op == "SiluAndMul":
        return silu_mul_case(lib, liger, *shape)
    if op == "SwiGLU":
        return swiglu_case(lib, liger, *shape)
    if op == "GeluTanh":
        return gelu_tanh_case(lib, liger, *shape)
    return rotary_case(lib, liger, *shape)


# ---- timing ---------------------------------------------------------------------------------


def _outputs(out):
    return out if isinstance(out, (tuple, list)) else (out,)


_l2_buffer = None


def clear_l2() -> None:
    """Evict everything from L2 by reading 256 MB (more than any GPU's L2 holds). Reading leaves
    only clean lines behind, which the next kernel replaces without writing anything back."""
    global _l2_buffer
    if _l2_buffer is None:
        _l2_buffer = torch.zeros(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    torch.amax(_l2_buffer)


def flushed_ms(fn, rep_ms: float, warmup: int = 5) -> float:
    """Median milliseconds of ``fn`` between two CUDA events, L2 cleared (``clear_l2``) before
    each call: ``triton.testing.do_bench``'s method, with a clean clearing. Calls are queued
    ahead of the GPU (the host is not waited for), so this is device time where the host keeps
    up, as it does for a graph replay."""
    for _ in range(warmup):
        clear_l2()
        fn()
    start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    start.record()
    for _ in range(3):
        fn()
    end.record()
    torch.cuda.synchronize()
    n = int(min(1000, max(10, rep_ms / max(start.elapsed_time(end) / 3, 1e-3))))
    pairs = []
    for _ in range(n):
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        clear_l2()
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in pairs)


def captured(call, stream):
    """``call`` captured in a CUDA graph (after three warm-up calls); returns the replay.

    Warm-up and capture run on ``stream``, the stream the eager timing used, so that autograd's
    leaf nodes (created by the eager runs) need no cross-stream synchronisation, which capture
    forbids. The graph lives as long as the returned replay does.
    """
    for _ in range(3):
        call()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        call()
    return graph.replay


def _calls(inputs, params, fn):
    """(forward, forward+backward) closures for ``fn``, compiled and warmed up.

    The gradient seeds are drawn here, before any CUDA-graph capture: a capture must not draw
    random numbers outside the graph.
    """

    def fwd():
        with torch.no_grad():
            fn(*inputs)

    for t in inputs:
        t.requires_grad_(True)
    wrt = [*inputs, *params]
    out = _outputs(fn(*inputs))
    seeds = [torch.randn_like(o) for o in out]
    del out

    def fwd_bwd():
        torch.autograd.grad(_outputs(fn(*inputs)), wrt, seeds)

    for _ in range(3):
        fwd_bwd()
        fwd()
    return fwd, fwd_bwd


def interleaved_samples(calls: dict, rep_ms: float, block: int = 6) -> dict:
    """{name: [[ms of each counted call] for each round]}: every call timed in rounds that run
    every contender in turn.

    Host-bound calls are at the mercy of the host's state (other tenants of a VM, clock
    changes), and device-bound ones at that of the GPU's (clocks, power, temperature); timing
    the contenders one after another lets such phases favour one of them. Each round runs
    every contender (the order rotating) for a block of ``block`` calls, each call after
    clearing L2 (``clear_l2``) and between two CUDA events, as ``flushed_ms`` does for one. The
    GPU is drained before each block and the block's first call is not counted, so each call is
    timed in its own steady state: GPU work queued by a contender that is slower on the device
    would otherwise hide the host time of the next one (an H100 VM, 2026-11-23, with one call
    per contender a round: ``torch.compile``'s rotary forward+backward took 241 us at 4x2048,
    behind eager PyTorch's 1.1 ms, and ~680 us at 1x4096, a shape of half the bytes).
    """
    names = list(calls)
    estimate = {name: flushed_ms(calls[name], rep_ms=10) for name in names}
    per_round = block * max(sum(estimate.values()), 1e-3)
    rounds = int(min(200, max(8, rep_ms / per_round * len(names))))
    events = {name: [] for name in names}
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            torch.cuda.synchronize()
            pairs = []
            for call in range(block):
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                clear_l2()
                start.record()
                calls[name]()
                end.record()
                if call:
                    pairs.append((start, end))
            events[name].append(pairs)
    torch.cuda.synchronize()
    return {
        name: [[s.elapsed_time(e) for s, e in pairs] for pairs in rounds_]
        for name, rounds_ in events.items()
    }


def pooled_median(rounds: list) -> float:
    """The median of every call of every round (``interleaved_samples``' lists)."""
    return statistics.median(ms for one_round in rounds for ms in one_round)


def ratio_quartiles(peer_rounds: list, ours_rounds: list) -> tuple:
    """(25th, 50th, 75th percentile) over rounds of peer ms / ours ms, each round's medians
    paired: the two ran minutes apart at most, in the same state of the machine. When the
    quartiles straddle 1.0 the two are level within that run's spread."""
    ratios = [
        statistics.median(p) / statistics.median(o)
        for p, o in zip(peer_rounds, ours_rounds, strict=True)
    ]
    if len(ratios) < 2:
        return (ratios[0],) * 3
    q1, q2, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return q1, q2, q3


TIMED_KEYS = ("fwd", "fwd_bwd", "graph_fwd", "graph_fwd_bwd")


def time_cases(inputs, params, fns: dict, rep_ms, same_bytes: tuple) -> dict:
    """{impl: {key: per-round ms lists (``interleaved_samples``)}} for each of ``TIMED_KEYS``
    that ran; ``same_bytes`` (forward, forward+backward) calls join the rounds as ``COPY``.

    Eager calls and CUDA-graph replays are each timed in interleaved rounds, so that a drift
    of the GPU's state during the run falls on every contender alike: timed one contender after
    another (as before 2026-11-24), the CUDA-graph tables put RMSNorm at 16384x4096 at 0.98x of
    Liger in three runs, where L2-cleared probes that alternated the two had them level.
    Everything runs on one side stream: CUDA graphs cannot be captured on the default one, and
    autograd's leaf nodes (made by the eager runs) must live on the capturing stream.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    times = {impl: {} for impl in [*fns, COPY]}
    with torch.cuda.stream(stream):
        calls = {impl: _calls(inputs, params, fn) for impl, fn in fns.items()}
        calls[COPY] = same_bytes
        for slot, key in enumerate(("fwd", "fwd_bwd")):
            samples = interleaved_samples({impl: c[slot] for impl, c in calls.items()}, rep_ms)
            for impl, rounds in samples.items():
                times[impl][key] = rounds
        for slot, key in enumerate(("graph_fwd", "graph_fwd_bwd")):
            replays = {}
            for impl, c in calls.items():
                try:
                    replays[impl] = captured(c[slot], stream)
                except Exception as exc:  # noqa: BLE001  (a peer that cannot be captured)
                    print(f"    {impl}: CUDA graph capture of {key} failed: {exc}"[:300])
                    torch.cuda.synchronize()
            for impl, rounds in interleaved_samples(replays, rep_ms).items():
                times[impl][key] = rounds
            del replays
    torch.cuda.current_stream().wait_stream(stream)
    return times


def same_bytes_pair(moved_fwd: int, moved_fwd_bwd: int) -> tuple:
    """(forward, forward+backward) calls of one element-wise kernel (``torch.neg``) that moves
    as many bytes as the pass (half read, half written): the ceiling at that size. On an H100
    (2026-11-23) a copy of 64M bf16 elements (256 MB moved) reached only ~95% of the 1 GiB
    copy's bandwidth, as its ramp and tail weigh more. Not ``copy_``: captured in a graph, a
    1 GiB ``copy_`` became a memcpy node that ran at 2400 GB/s against 2960 GB/s outside."""
    return same_bytes_call(moved_fwd), same_bytes_call(moved_fwd_bwd)


def same_bytes_call(moved: int):
    """A call of one element-wise kernel (``torch.neg``) on buffers of its own, reading and
    writing ``moved`` bytes in all (half read, half written)."""
    src = torch.zeros(moved // 2 // 2, device="cuda", dtype=torch.bfloat16)
    return functools.partial(torch.neg, src, out=torch.empty_like(src))


def back_to_back_graph(calls: list, rep_ms: float) -> tuple:
    """``(graph, n)``: ``calls`` captured round after round, back to back, in one CUDA graph
    about ``rep_ms`` long; a replay runs ``n`` calls in all."""
    for call in calls:
        call()
    start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    start.record()
    for call in calls:
        call()
    end.record()
    torch.cuda.synchronize()
    rounds = int(min(500, max(2, rep_ms / max(start.elapsed_time(end), 1e-3))))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.current_stream()):
        for _ in range(rounds):
            for call in calls:
                call()
    graph.replay()
    return graph, rounds * len(calls)


def interleaved_graphs_ms(graphs: dict, rounds: int = 9) -> dict:
    """Median ms per call of each ``name: (graph, calls)`` (``back_to_back_graph``), replayed in
    rounds that run every graph in turn (rotating order), so that a drift of clocks or memory
    over the run is shared by all: an A/B of kernels within a percent or two needs that."""
    names = list(graphs)
    samples = {name: [] for name in names}
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            graph, calls = graphs[name]
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            samples[name].append(start.elapsed_time(end) / calls)
    return {name: statistics.median(t) for name, t in samples.items()}


def copy_bandwidth():
    n = 512 * 1024 * 1024  # 1 GiB of bf16
    src = torch.randn(n, device="cuda", dtype=DTYPE)
    dst = torch.empty_like(src)
    ms = flushed_ms(lambda: dst.copy_(src), rep_ms=200, warmup=25)
    return 2 * n * 2 / (ms * 1e-3) / 1e9  # GB/s, read + write


# ---- correctness spot check (the test suite does the real checking) --------------------------


def spot_check(name, inputs, fns):
    with torch.no_grad():
        ref = _outputs(fns["eager"](*inputs))
        got = _outputs(fns["ours"](*inputs))
    for r, g in zip(ref, got, strict=False):
        err = ((g.float() - r.float()).norm() / r.float().norm()).item()
        if not err < 2e-2:
            raise AssertionError(f"{name}: ours differs from eager (relative error {err:.3g})")


# ---- main -----------------------------------------------------------------------------------


def run(ops, rep_ms, save=None):
    """(meta, results) of every op in ``ops``; ``save(meta, results)`` after each op, so that a
    run cut short keeps what it measured."""
    lib = load_library()
    liger = load_liger()
    torch._dynamo.config.cache_size_limit = 256
    copy_gbs = copy_bandwidth()
    print(f"copy bandwidth: {copy_gbs:.0f} GB/s")
    meta = {
        "device": torch.cuda.get_device_name(),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "liger": liger.version if liger else None,
        "copy_gbs": copy_gbs,
        "ops": list(ops),
        "dtype": "bfloat16 (RMSNorm-fp32, LayerNorm-fp32: float32)",
        "timing": "median of CUDA-event timings, L2 cleared before each call (256 MB read, "
        "which leaves no dirty line to write back); 'eager calls' "
        "tables time Python calls (host overhead included) in rounds that run every contender "
        "in rotating order, each for a block of 6 calls (the first not counted) after draining "
        "the GPU; 'CUDA graph' tables replay the same calls captured in a graph (device time "
        "only), in the same kind of rounds; the copy of the same bytes runs in the rounds too",
    }
    results = []
    for op in ops:
        if results and save:
            save(meta, results)
        shapes = WIDTH_SHAPES if op.endswith("-widths") else NORM_SHAPES
        shapes = ROTARY_SHAPES if op == "rotary" else shapes
        for shape in shapes:
            torch._dynamo.reset()
            inputs, params, fns, b_fwd, b_bwd = make_case(op, lib, liger, shape)
            spot_check(f"{op} {shape}", inputs, fns)
            same_bytes = same_bytes_pair(b_fwd, b_fwd + b_bwd)
            fns = {i: fns[i] for i in IMPLS if i in fns}
            timed = time_cases(inputs, params, fns, rep_ms, same_bytes)
            for impl, samples in timed.items():
                row = {"op": op, "shape": list(shape), "impl": impl}
                for key, moved in zip(TIMED_KEYS, (b_fwd, b_fwd + b_bwd) * 2, strict=True):
                    if key not in samples:
                        continue
                    t = pooled_median(samples[key])
                    row[key + "_ms"] = t
                    row[key + "_gbs"] = moved / (t * 1e-3) / 1e9
                    row[key + "_pct"] = 100 * row[key + "_gbs"] / copy_gbs
                    # Each round's median, for the ratio quartiles of the tables.
                    row[key + "_rounds_ms"] = [round(statistics.median(r), 6) for r in samples[key]]
                results.append(row)
                print(
                    f"{op:10s} {str(shape):14s} {impl:8s} "
                    + "  ".join(
                        f"{k} {row[k + '_ms'] * 1e3:7.1f} us {row[k + '_pct']:5.1f}%"
                        for k in ("fwd", "fwd_bwd", "graph_fwd", "graph_fwd_bwd")
                        if k + "_ms" in row
                    ),
                    flush=True,
                )
            del inputs, params, fns, same_bytes
            torch.cuda.empty_cache()
    return meta, results


def _shape_str(op, shape):
    if op == "rotary":
        return f"{shape[0]}x{shape[1]} (b x s)"
    if op == "SiluAndMul":
        return f"{shape[0]}x{shape[1]} (in {shape[0]}x{2 * shape[1]})"
    if op == "SwiGLU":
        return f"{shape[0]}x{shape[1]} (gate, up)"
    return f"{shape[0]}x{shape[1]}"


def _parts(meta) -> list:
    """The runs a result set was made of (``--merge``), each with its ops and copy bandwidth."""
    return meta.get("parts") or [{"ops": meta.get("ops", ["all"]), "copy_gbs": meta["copy_gbs"]}]


def merge(folders: list) -> tuple:
    """(meta, results) of several runs' ``results.json`` (one process each, on one machine in
    one session: a run of every op takes longer than one command on the GPU machine may).
    Each row keeps the % of the copy bandwidth its own run measured; the meta lists the parts."""
    meta, results, parts = None, [], []
    for folder in folders:
        with open(os.path.join(folder, "results.json")) as f:
            data = json.load(f)
        meta = meta or dict(data["meta"])
        results += data["results"]
        parts += _parts(data["meta"])
    meta["parts"] = parts
    return meta, results


def save_results(out: str, meta: dict, results: list, write_markdown) -> None:
    """A benchmark's two result files in ``out``: ``results.json`` (``{"meta", "results"}``)
    and ``results.md``, the tables ``write_markdown(meta, results, path)`` renders."""
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    write_markdown(meta, results, os.path.join(out, "results.md"))


def write_markdown(meta, results, path):
    lines = [
        "# Library kernel benchmarks",
        "",
        f"- device: {meta['device']}",
        f"- date: {meta['date']}",
        f"- torch {meta['torch']}, triton {meta['triton']}, liger-kernel {meta['liger']}",
        "- copy bandwidth (device-to-device copy of 1 GiB, read + write): "
        + "; ".join(f"{p['copy_gbs']:.0f} GB/s ({', '.join(p['ops'])})" for p in _parts(meta))
        + ", each part's % of its own",
        f"- dtype {meta['dtype']}; timing: {meta['timing']}",
        "- GB/s counts the bytes that must move (each input of a pass read once, each output "
        "written once); % is of the copy bandwidth above. Ratios are ours / peer in speed "
        "(>1: ours faster); in brackets, where the run kept them, the quartiles of that ratio "
        "over the rounds (each round's medians paired): when they straddle 1.00 the two are "
        "level within the run's spread.",
        "- 'copy of the same bytes' is not a contender: one element-wise kernel (torch.neg) that "
        "reads and writes as many bytes as the pass, timed the same way: the ceiling at that "
        "size (ramp and tail weigh more in a shorter kernel).",
        "",
    ]
    ops = list(dict.fromkeys(r["op"] for r in results))
    for op in ops:
        rows = [r for r in results if r["op"] == op]
        shapes = list(dict.fromkeys(tuple(r["shape"]) for r in rows))
        impls = [i for i in IMPLS if any(r["impl"] == i for r in rows)]
        if any(r["impl"] == COPY for r in rows):
            impls.append(COPY)
        for phase, key in (
            ("forward, eager calls", "fwd"),
            ("forward+backward, eager calls", "fwd_bwd"),
            ("forward, CUDA graph", "graph_fwd"),
            ("forward+backward, CUDA graph", "graph_fwd_bwd"),
        ):
            lines.append(f"## {op}: {phase}")
            lines.append("")
            head = ["shape"] + [f"{_column(i)} GB/s (%)" for i in impls]
            head += [f"ours vs {_column(i)}" for i in impls if i != "ours"]
            lines.append("| " + " | ".join(head) + " |")
            lines.append("|" + "---|" * len(head))
            for shape in shapes:
                by = {r["impl"]: r for r in rows if tuple(r["shape"]) == shape}
                cells = [_shape_str(op, shape)]
                for i in impls:
                    r = by.get(i)
                    ok = r is not None and key + "_ms" in r
                    cells.append(f"{r[key + '_gbs']:.0f} ({r[key + '_pct']:.0f}%)" if ok else "-")
                for i in impls:
                    if i == "ours":
                        continue
                    r, o = by.get(i), by.get("ours")
                    ok = r and o and key + "_ms" in r and key + "_ms" in o
                    cells.append(_ratio_cell(r, o, key) if ok else "-")
                lines.append("| " + " | ".join(cells) + " |")
            lines.append("")
    with open(path, "w") as f:
        f.write("\n".join(lines))


def _ratio_cell(peer: dict, ours: dict, key: str) -> str:
    """``peer`` ms / ``ours`` ms, followed by the quartiles of the per-round ratios where both
    rows kept their rounds (runs from 2026-11-24 on)."""
    cell = f"{peer[key + '_ms'] / ours[key + '_ms']:.2f}x"
    rounds = key + "_rounds_ms"
    if rounds in peer and rounds in ours and len(peer[rounds]) == len(ours[rounds]):
        q1, _, q3 = ratio_quartiles([[t] for t in peer[rounds]], [[t] for t in ours[rounds]])
        cell += f" ({q1:.2f}-{q3:.2f})"
    return cell


def _column(impl: str) -> str:
    return "copy of the same bytes" if impl == COPY else impl


def _best_peer(by_impl: dict, key: str) -> str:
    """The fastest contender other than ours (eager, compile or Liger) in ``key``'s timing."""
    peers = [i for i in by_impl if i not in ("ours", COPY) and key + "_ms" in by_impl[i]]
    return min(peers, key=lambda i: by_impl[i][key + "_ms"])


def card_tables(results, op) -> str:
    """The model-card tables of ``op`` (library/*/README.md): for eager calls and CUDA graph,
    ours against the fastest peer (eager, compile or Liger), forward and forward+backward; each
    ratio with its quartiles over the rounds where the run kept them."""
    rows = [r for r in results if r["op"] == op]
    shapes = list(dict.fromkeys(tuple(r["shape"]) for r in rows))
    head = (
        "| shape | fwd: ours GB/s (% of copy) | fwd: best peer GB/s | fwd: ours / best "
        "| fwd+bwd: ours GB/s (% of copy) | fwd+bwd: best peer GB/s | fwd+bwd: ours / best |"
    )
    lines = []
    for title, prefix in (("Eager calls", ""), ("CUDA graph", "graph_")):
        lines += [f"{title}:", "", head, "|---|---|---|---|---|---|---|"]
        for shape in shapes:
            by = {r["impl"]: r for r in rows if tuple(r["shape"]) == shape}
            cells = [_shape_str(op, shape)]
            for key in (prefix + "fwd", prefix + "fwd_bwd"):
                ours, best = by["ours"], _best_peer(by, key)
                cells += [
                    f"{ours[key + '_gbs']:.0f} ({ours[key + '_pct']:.0f}%)",
                    f"{best} {by[best][key + '_gbs']:.0f}",
                    _ratio_cell(by[best], ours, key),
                ]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def summary_table(results, folder: str) -> str:
    """One row per op: ours / the fastest peer at each shape (speed, > 1: ours faster), forward
    and forward+backward under CUDA graph (device time) and forward+backward in eager calls,
    with links to the op's tables in ``folder``'s results.md and to its plot. ``folder`` is the
    results folder as seen from the page the table goes in (benchmarks/README.md shows one
    table per device)."""
    lines = [
        "| op | shapes | fwd, CUDA graph | fwd+bwd, CUDA graph | fwd+bwd, eager calls | tables |",
        "|---|---|---|---|---|---|",
    ]
    for op in dict.fromkeys(r["op"] for r in results):
        rows = [r for r in results if r["op"] == op]
        shapes = list(dict.fromkeys(tuple(r["shape"]) for r in rows))
        cells = [op, " / ".join(f"{a}x{b}" for a, b in shapes)]
        cells[-1] += " (b x s)" if op == "rotary" else ""
        for key in ("graph_fwd", "graph_fwd_bwd", "fwd_bwd"):
            ratios = []
            for shape in shapes:
                by = {r["impl"]: r for r in rows if tuple(r["shape"]) == shape}
                best = _best_peer(by, key)
                ratios.append(f"{by[best][key + '_ms'] / by['ours'][key + '_ms']:.2f}")
            cells.append(" / ".join(ratios))
        # GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens.
        anchor = re.sub(r"[^\w\- ]", "", f"{op}: forward, eager calls".lower()).replace(" ", "-")
        cells.append(f"[{op}]({folder}/results.md#{anchor}), [plot]({folder}/{op}.png)")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_plots(meta, results, out):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib unavailable: no plots")
        return
    for op in dict.fromkeys(r["op"] for r in results):
        rows = [r for r in results if r["op"] == op]
        shapes = list(dict.fromkeys(tuple(r["shape"]) for r in rows))
        impls = [i for i in [*IMPLS, COPY] if any(r["impl"] == i for r in rows)]
        fig, axes = plt.subplots(2, 2, figsize=(13, 8), sharey=True)
        width = 0.8 / len(impls)
        panels = (
            ("forward, eager", "fwd_pct"),
            ("forward+backward, eager", "fwd_bwd_pct"),
            ("forward, CUDA graph", "graph_fwd_pct"),
            ("forward+backward, CUDA graph", "graph_fwd_bwd_pct"),
        )
        for ax, (phase, key) in zip(axes.flat, panels, strict=True):
            for j, impl in enumerate(impls):
                vals = [
                    next(
                        (
                            r.get(key, 0)
                            for r in rows
                            if r["impl"] == impl and tuple(r["shape"]) == s
                        ),
                        0,
                    )
                    for s in shapes
                ]
                ax.bar(
                    [i + j * width for i in range(len(shapes))],
                    vals,
                    width,
                    label=_column(impl),
                    **({"color": "lightgrey", "hatch": "//"} if impl == COPY else {}),
                )
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(shapes))])
            ax.set_xticklabels([_shape_str(op, s) for s in shapes], fontsize=8)
            ax.axhline(100, color="grey", lw=0.8, ls="--")
            ax.set_title(f"{op} {phase}")
            ax.set_ylabel("% of copy bandwidth")
        axes.flat[0].legend()
        fig.suptitle(f"{meta['device']}, bf16, {meta['date']} (copy {meta['copy_gbs']:.0f} GB/s)")
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"{op}.png"), dpi=110)
        plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for results.md, results.json, PNGs")
    parser.add_argument(
        "--ops",
        default=",".join(OPS),
        help=f"comma-separated subset of {','.join(OPS)}",
    )
    parser.add_argument("--rep-ms", type=float, default=100.0, help="time each timing may take")
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="DIR",
        help="write --out's results, tables and plots from these runs' results.json (no GPU)",
    )
    parser.add_argument(
        "--card",
        action="store_true",
        help="print the model-card tables of --ops from --out/results.json (no GPU needed)",
    )
    parser.add_argument(
        "--summary",
        action="store_true",
        help="print benchmarks/README.md's table of --out/results.json (no GPU needed)",
    )
    args = parser.parse_args()
    if args.card or args.summary:
        with open(os.path.join(args.out, "results.json")) as f:
            results = json.load(f)["results"]
        if args.summary:
            print(summary_table(results, os.path.relpath(args.out, os.path.dirname(__file__))))
            return
        for op in args.ops.split(","):
            print(f"### {op}\n\n{card_tables(results, op)}")
        return
    os.makedirs(args.out, exist_ok=True)

    def save(meta, results):
        save_results(args.out, meta, results, write_markdown)

    if args.merge:
        meta, results = merge(args.merge)
    elif not torch.cuda.is_available():
        sys.exit("benchmarks/ops.py needs a CUDA GPU")
    else:
        meta, results = run(args.ops.split(","), args.rep_ms, save)
    save(meta, results)
    write_plots(meta, results, args.out)
    with open(os.path.join(args.out, "results.md")) as f:
        print(f.read())


if __name__ == "__main__":
    main()
