"""How the benchmarks time a call: L2 cleared by reading, interleaved rounds, CUDA graphs.

Every command of ``benchmarks`` times through these functions, so that its numbers compare with
the others': ``clear_l2`` before every timed call, ``interleaved_samples`` (rounds that run every
contender in rotating order, each for a block of calls in its own steady state), ``captured`` and
``back_to_back_graph`` for device time without the host, ``pooled_median`` and
``ratio_quartiles`` to read the rounds, and ``same_bytes_pair`` / ``copy_bandwidth`` for the
bandwidth ceiling the tables give percentages of. benchmarks/README.md says why each is done so.
"""

from __future__ import annotations

import functools
import statistics

import torch

# Not a contender: one element-wise kernel moving the same bytes as the pass, the ceiling at
# that size.
COPY = "copy"
TIMED_KEYS = ("fwd", "fwd_bwd", "graph_fwd", "graph_fwd_bwd")


def outputs(out) -> tuple:
    """A call's output as a tuple (one tensor or several)."""
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


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


def passes(inputs, params, fn):
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
    out = outputs(fn(*inputs))
    seeds = [torch.randn_like(o) for o in out]
    del out

    def fwd_bwd():
        torch.autograd.grad(outputs(fn(*inputs)), wrt, seeds)

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
        calls = {impl: passes(inputs, params, fn) for impl, fn in fns.items()}
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


def copy_bandwidth() -> float:
    """GB/s (read + write) of a device-to-device copy of 1 GiB: the bandwidth the tables' % are
    of."""
    n = 512 * 1024 * 1024  # 1 GiB of bf16
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = flushed_ms(lambda: dst.copy_(src), rep_ms=200, warmup=25)
    return 2 * n * 2 / (ms * 1e-3) / 1e9


def peak_extra(call) -> int:
    """Bytes allocated at the peak of ``call`` beyond what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    call()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before
