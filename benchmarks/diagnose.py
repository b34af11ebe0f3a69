"""Where the time goes: host (Python) cost per call, and device time per kernel.

    python benchmarks/diagnose.py

1. Host cost: microseconds of CPU per call at a tiny shape (the GPU work is negligible), for a
   bare Triton launch, a launch through the cached compiled kernel, our functions, our layers
   bound to a module, the custom op, forward+backward through autograd, and the peers.
2. Sweeps: device time (CUDA graphs) of the norms' backward launchers over elements per step,
   programs per SM and warps, and of the rotary forward over warps, beside Liger's.
3. Device time: ``torch.profiler`` over a few forward+backward iterations per case, listing each
   kernel's mean device time, so the kernels can be compared with the bytes they must move.
4. Widths (only when asked for): the norms' forward and backward launch configurations at the
   hidden sizes of ``ops.WIDTH_SHAPES`` (1024 ... 65536).
5. Ceilings (only when asked for): a copy of the same bytes beside each norm and rotary forward,
   in a CUDA graph and between events; the norm forwards over block size and warps; rotary
   writing in place (as Liger's does) beside out of place.
6. Timing methods (only when asked for): each contender, a copy of the same bytes and the 1 GiB
   copy timed four ways, to separate what the kernels cost from what the harness adds: alone in
   a CUDA graph after L2 is cleared by writing 256 MB (``ops.py``'s graph tables until
   2026-11-24), the same after L2 is cleared by reading 256 MB, between events after a read
   clear, and back to back in one graph over enough copies of the inputs that none is in L2.
7. Forward A/B (``forward-ab``, only when asked for; ``--norms`` picks norms): each norm's forward
   launch configurations beside torch.compile and Liger, back to back in CUDA graphs replayed in
   interleaved rounds, the A/B behind the norms' ``_fwd_block``; ``inductor`` prints the Triton
   code torch.compile generates for the norm forwards at 8192 wide.

    python benchmarks/diagnose.py sweep       # one part: host, sweep, sweep-fp32, profile, widths,
                                              # ceiling, timing, forward-ab or inductor
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ops  # noqa: E402

DT = torch.bfloat16


def host_us(fn, n=3000):
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def host_costs(lib, liger):
    norm = lib["norm"]
    rms = sys.modules[f"{norm.__name__}.rms_norm"]
    x = torch.randn(8, 4096, device="cuda", dtype=DT)
    module = ops.LlamaRMSNorm(4096).to("cuda", DT)
    w = module.weight
    y = torch.empty_like(x)
    rstd = torch.empty(8, device="cuda")
    layer = ops.bound(norm.layers.RMSNorm, module)
    compiled = torch.compile(module, dynamic=False)
    rows = {}

    def launch():
        rms._rms_norm_fwd_kernel[(8,)](
            x, x, w, y, x, rstd, 8, 4096, 4096, 4096, 1e-6,
            MODE=0, HAS_RESIDUAL=False, ONE_PASS=True, ROWS=1, BLOCK_N=4096, num_warps=8,
        )  # fmt: skip

    ck = rms._rms_norm_fwd_kernel[(8,)](
        x, x, w, y, x, rstd, 8, 4096, 4096, 4096, 1e-6,
        MODE=0, HAS_RESIDUAL=False, ONE_PASS=True, ROWS=1, BLOCK_N=4096, num_warps=8,
    )  # fmt: skip
    all_args = (x, x, w, y, x, rstd, 8, 4096, 4096, 4096, 1e-6, 0, False, True, 1, 4096)
    try:
        runner = ck[(8, 1, 1)]
        runner(*all_args)
        torch.cuda.synchronize()
        rows["compiled-kernel runner (ck[grid](*args))"] = host_us(lambda: ck[(8, 1, 1)](*all_args))
        ok = torch.equal(y, y)  # ran without error
        rows["compiled-kernel runner, ok"] = float(ok)
    except Exception as exc:  # noqa: BLE001
        print("compiled-kernel runner failed:", type(exc).__name__, exc)
    rows["torch.empty"] = host_us(lambda: torch.empty((8, 4096), device="cuda", dtype=DT))
    rows["bare triton launch (kernel[grid](...))"] = host_us(launch)
    with torch.no_grad():
        rows["ours rms_norm() no_grad"] = host_us(lambda: norm.rms_norm(x, w, 1e-6))
        rows["ours layer no_grad"] = host_us(lambda: layer(x))
        rows["ours custom op no_grad"] = host_us(lambda: rms.rms_norm_op(x, w, 1e-6, 0))
        rows["compile no_grad"] = host_us(lambda: compiled(x))
        rows["eager no_grad"] = host_us(lambda: module(x))
        if liger:
            rows["liger no_grad"] = host_us(
                lambda: liger.rms_norm.apply(x, w, 1e-6, 0.0, "llama", True)
            )
    xg = x.clone().requires_grad_()
    dy = torch.randn_like(x)
    wrt = (xg, w)
    for name, fn in (
        ("ours", layer),
        ("compile", compiled),
        ("eager", module),
        (
            "liger",
            (lambda t: liger.rms_norm.apply(t, w, 1e-6, 0.0, "llama", False)) if liger else None,
        ),
    ):
        if fn is None:
            continue
        rows[f"{name} fwd+bwd (autograd.grad)"] = host_us(
            lambda fn=fn: torch.autograd.grad(fn(xg), wrt, dy), n=1000
        )
    rows["ours fwd+bwd through custom op"] = host_us(
        lambda: torch.autograd.grad(rms.rms_norm_op(xg, w, 1e-6, 0)[0], wrt, dy), n=1000
    )
    for k, v in rows.items():
        print(f"host {k:45s} {v:8.1f} us")


def profile(label, inputs, params, fn, iters=10):
    for t in inputs:
        t.requires_grad_(True)
    wrt = [*inputs, *params]
    out = ops._outputs(fn(*inputs))
    seeds = [torch.randn_like(o) for o in out]
    for _ in range(3):
        torch.autograd.grad(ops._outputs(fn(*inputs)), wrt, seeds)
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    with prof(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(iters):
            torch.autograd.grad(ops._outputs(fn(*inputs)), wrt, seeds)
        torch.cuda.synchronize()
    print(f"--- {label}: device time per iteration by kernel")
    for e in sorted(p.key_averages(), key=lambda e: -e.device_time_total):
        if e.device_time_total <= 0:
            continue
        print(f"    {e.device_time_total / iters:9.1f} us  x{e.count // iters:<3d} {e.key[:90]}")


@contextlib.contextmanager
def _swapped(module, **attributes):
    """Set ``module``'s ``attributes`` (a launch configuration under test) while the block runs,
    and put the previous values back after it, also when it raises."""
    previous = {name: getattr(module, name) for name in attributes}
    for name, value in attributes.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in previous.items():
            setattr(module, name, value)


SWEEP_SHAPES = ((4096, 2048), (4096, 4096), (16384, 4096), (8192, 8192), (32768, 8192),
                (65536, 1024), (16384, 5120))  # fmt: skip


def _norm_backward_call(op, module, liger, rows, cols, dtype=DT):
    """(ours, liger): closures that run one backward of the norm at (rows, cols) in ``dtype``;
    ours is the launcher alone (kernel and partial sums), Liger's goes through its autograd
    function."""
    x = torch.randn(rows, cols, device="cuda", dtype=dtype)
    dy = torch.randn_like(x)
    w = torch.randn(cols, device="cuda", dtype=dtype)
    xl, wl = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    if op == "RMSNorm":
        _, _, rstd = module._forward(x, None, w, 1e-6, 0)

        def ours():
            module._backward(dy, None, x, w, rstd, 0, True)

        wrt = (xl, wl)
        out = liger.rms_norm.apply(xl, wl, 1e-6, 0.0, "llama", True) if liger else None
    else:
        _, mean, rstd = module._forward(x, [cols], w, w, 1e-5)

        def ours():
            module._backward(dy, x, [cols], w, mean, rstd, True, True, dtype)

        wrt = (xl, wl, w.clone().requires_grad_(True))
        out = liger.layer_norm.apply(xl, wl, wrt[2], 1e-5) if liger else None
    if out is None:
        return ours, None

    def peer():
        torch.autograd.grad(out, wrt, dy, retain_graph=True)

    return ours, peer


def norm_modules(lib):
    """(op, module) of each norm in the loaded library: RMSNorm's and LayerNorm's."""
    norm = lib["norm"].__name__
    return [(op, sys.modules[f"{norm}.{name}"]) for op, name in
            (("RMSNorm", "rms_norm"), ("LayerNorm", "layer_norm"))]  # fmt: skip


BWD_GRID = ((4096, 8192, 16384), (1, 2), (4, 8, 16))  # elements a step, programs per SM, warps


def _sweep_shape(op, m, liger, rows, cols, grid=BWD_GRID, dtype=DT):
    """Time one norm's backward at (rows, cols): Liger's, ours as configured, and ours over the
    configurations of ``grid`` (on the current stream, which must not be the default one).
    For rows too wide for one pass, the elements a step are the width of a program's block of
    columns (taken 8192 elements a step)."""
    import itertools

    from triton.testing import do_bench_cudagraph

    moved = 3 * rows * cols * dtype.itemsize  # x, dy read; dx written

    def report(label, ms):
        print(
            f"{op} {dtype} {rows}x{cols} {label}: {ms * 1e3:7.1f} us {moved / ms / 1e6:6.0f} GB/s"
        )

    ours, peer = _norm_backward_call(op, m, liger, rows, cols, dtype)
    for label, call in (("liger", peer), ("ours as configured", ours)):
        if call is not None:
            call()
            report(label, do_bench_cudagraph(call, rep=30))
    row_block = m.row_block
    # LayerNorm's launcher takes its configuration, look-ahead included, from _bwd_config.
    lookaheads = LOOKAHEADS.get(dtype, (True,)) if hasattr(m, "_bwd_config") else (None,)
    timed = []
    for elements, per_sm, warps in itertools.product(*grid):

        def block(n, *_, elements=elements, per_sm=per_sm, warps=warps):
            one_pass, block_n, n_rows, _ = row_block(n, elements)
            if one_pass:
                return one_pass, block_n, n_rows, warps, per_sm
            return False, elements, max(1, 8192 // elements), warps, per_sm

        for lookahead in lookaheads:
            if lookahead is None:
                swap = {"bwd_block": block}
            else:
                swap = {"_bwd_config": lambda n, *_, b=block, la=lookahead: (*b(n), la)}
            with _swapped(m, **swap):
                ours()
                ms = do_bench_cudagraph(ours, rep=20)
            timed.append((ms, elements, per_sm, warps, lookahead))
    for ms, elements, per_sm, warps, lookahead in sorted(timed)[:6]:
        ahead = "" if lookahead is None else f", look-ahead {'on' if lookahead else 'off'}"
        report(f"  elements {elements:5d}, {per_sm}/SM, {warps:2d} warps{ahead}", ms)
    sys.stdout.flush()


def sweep_backward(lib, liger):
    """Device time of the norm backward launchers over their launch configuration: elements a
    program handles per step, programs per SM and warps; CUDA graphs, so device time only.

    Prints, per norm and shape, Liger's backward, ours as configured, and the six fastest
    configurations. The configuration is ``bwd_block`` of the norm package's ``_library``; the sweep swaps
    it and puts it back (``_swapped``).
    """
    stream = torch.cuda.Stream()  # graphs cannot be captured on the default stream
    with torch.cuda.stream(stream):
        for op, m in norm_modules(lib):
            for rows, cols in SWEEP_SHAPES:
                _sweep_shape(op, m, liger, rows, cols)


FP32_BWD_GRID = ((4096, 8192), (1, 2), (8, 16, 32))
# Look-ahead settings swept per dtype where the launcher takes one (LayerNorm's _bwd_config).
LOOKAHEADS = {torch.float32: (True, False)}


def sweep_backward_fp32(lib, liger):
    """``sweep_backward`` for fp32 data at the square shapes of ops.NORM_SHAPES from 64M
    elements, with up to 32 warps (an fp32 row holds twice the registers of a bf16 one)."""
    stream = torch.cuda.Stream()  # graphs cannot be captured on the default stream
    with torch.cuda.stream(stream):
        for op, m in norm_modules(lib):
            for rows, cols in ops.NORM_SHAPES[1:]:
                _sweep_shape(op, m, liger, rows, cols, FP32_BWD_GRID, torch.float32)


# Forward configurations (one_pass, block_n, rows a block, warps) per width: rows packed to a
# block and warps for narrow rows; one block or chunks of a non-power-of-two width; chunks and
# warps for rows too wide for one pass.
FWD_CONFIGS = {
    1024: [(True, 1024, r, w) for r in (4, 8, 16) for w in (4, 8)],
    2048: [(True, 2048, r, w) for r in (2, 4) for w in (4, 8, 16)],
    5120: [(True, 8192, 1, w) for w in (4, 8, 16, 32)]
    + [(False, c, 1, w) for c in (1024, 2048) for w in (4, 8)],
    65536: [(False, c, 1, w) for c in (4096, 8192, 16384) for w in (8, 16, 32)],
}
# Backward grids (elements a step or chunk, programs per SM, warps) per width.
BWD_GRIDS = {
    65536: ((2048, 4096, 8192), (1, 2, 4), (4, 8, 16)),
}
BWD_GRID_NARROW = ((8192, 16384, 32768), (1, 2, 4), (4, 8, 16))


def _sweep_forward(op, m, rows, cols):
    """Device time of one norm's forward at (rows, cols): ours as configured, then over the
    configurations of FWD_CONFIGS (CUDA graphs, back to back)."""
    from triton.testing import do_bench_cudagraph

    x, ours = _norm_forward_call(op, m, rows, cols)
    moved = 2 * x.numel() * DT.itemsize

    def report(label, ms):
        print(f"{op} fwd {rows}x{cols} {label}: {ms * 1e3:7.1f} us {moved / ms / 1e6:6.0f} GB/s")

    ours()
    report("ours as configured", do_bench_cudagraph(ours, rep=30))
    timed = []
    for config in FWD_CONFIGS[cols]:
        with _swapped(m, _fwd_block=lambda n, *_, config=config: config):
            ours()
            timed.append((do_bench_cudagraph(ours, rep=20), config))
    for ms, (one_pass, block_n, n_rows, warps) in sorted(timed)[:6]:
        kind = f"block {block_n:5d} x {n_rows:2d} rows" if one_pass else f"chunks of {block_n:5d}"
        report(f"  {kind}, {warps:2d} warps", ms)
    sys.stdout.flush()


def sweep_widths(lib, liger):
    """The norms at the widths of ``ops.WIDTH_SHAPES``: forward over FWD_CONFIGS, backward over
    BWD_GRIDS (CUDA graphs, device time)."""
    stream = torch.cuda.Stream()  # graphs cannot be captured on the default stream
    with torch.cuda.stream(stream):
        for op, m in norm_modules(lib):
            for rows, cols in ops.WIDTH_SHAPES:
                _sweep_forward(op, m, rows, cols)
                _sweep_shape(op, m, liger, rows, cols, BWD_GRIDS.get(cols, BWD_GRID_NARROW))


def _inductor_kernels(fn, *args) -> str:
    """The Triton source inductor generates for ``fn(*args)`` (its kernels and launch
    configuration), for comparing its choices with ours."""
    from torch._inductor.utils import run_and_get_code

    _, sources = run_and_get_code(fn, *args)
    return "\n".join(sources)


def _fwd_candidates(cols: int) -> list:
    """Forward configurations (one_pass, block_n or chunk, rows, warps) for the interleaved
    A/B at ``cols`` wide: one block of the row (4 to 32 warps) and narrow rows packed 2 to 16 to
    a block (2 to 16 warps), each with 8 to 64 elements a thread; chunks of 1024 to 8192 (4 to
    16 warps, 4 to 32 elements a thread, narrower than the row). Rows past 16384 only in chunks."""
    chunks = [(False, c, 1, w) for c in (1024, 2048, 4096, 8192) for w in (4, 8, 16)
              if 4 <= c // (32 * w) <= 32 and c < cols]  # fmt: skip
    if cols > 16384:
        return chunks + [(False, 16384, 1, w) for w in (16, 32)]
    block = 1 << (cols - 1).bit_length()

    def fits(rows, warps):
        return 8 <= rows * block // (32 * warps) <= 64

    configs = [(True, block, 1, w) for w in (4, 8, 16, 32) if fits(1, w)]
    configs += [(True, block, r, w) for r in (2, 4, 8, 16) for w in (2, 4, 8, 16)
                if r * block <= 16384 and fits(r, w)]  # fmt: skip
    return configs + chunks


# Cases of the A/B (a norm of ops.NORM_OPS, shapes): the square shapes of ops.NORM_SHAPES from
# 64M elements, and about 64M elements at the widths of real models' hidden sizes, for the two
# norms; the square shapes for the RMSNorm kernel's other uses (fp32 data, Gemma, fused add) and
# LayerNorm's (fp32 data, no bias); LayerNorm's widest rows.
_WIDE_SHAPES = [*ops.NORM_SHAPES[1:], (16384, 5120), (5461, 12288), (4096, 16384)]
FWD_AB_CASES = [("RMSNorm", s) for s in _WIDE_SHAPES] + [("LayerNorm", s) for s in _WIDE_SHAPES]
FWD_AB_CASES += [(k, s) for k in ("RMSNorm", "LayerNorm") for s in ops.WIDTH_SHAPES[:2]]
FWD_AB_CASES += [(k, s) for k in ("RMSNorm-fp32", "GemmaRMSNorm", "FusedAddRMSNorm",
                                  "LayerNorm-fp32", "LayerNorm-nobias")
                 for s in ops.NORM_SHAPES[1:]]  # fmt: skip
# LayerNorm's rows of 4096 at fewer rows; hidden sizes between 4096 and 16384 that are not
# multiples of 4096, about 64M elements each; rows past MAX_ONE_PASS, bf16 and fp32.
FWD_AB_CASES += [("LayerNorm", s) for s in ((4096, 4096), (8192, 4096), (10923, 6144),
                                            (9362, 7168), (6554, 10240), (4681, 14336),
                                            (1024, 65536), (1024, 50000))]  # fmt: skip
FWD_AB_CASES += [("LayerNorm-fp32", (1024, 65536)), ("LayerNorm-fp32", (4096, 4096))]
FWD_AB_CASES += [("RMSNorm-fp32", (4096, 4096))]


def forward_ab(lib, liger, kinds=(), shapes=()):
    """The norms' forward in FWD_AB_CASES (only those of ``kinds`` and ``shapes``, if given): ours as
    configured and the candidates of ``_fwd_candidates`` beside torch.compile and Liger, each
    back to back in a CUDA graph, the graphs replayed in interleaved rounds
    (``ops.interleaved_graphs_ms``)."""
    modules = dict(norm_modules(lib))
    stream = torch.cuda.Stream()  # graphs cannot be captured on the default stream
    with torch.cuda.stream(stream):
        cases = [(op, shape) for op, shape in FWD_AB_CASES
                 if (not kinds or op in kinds) and (not shapes or shape in shapes)]  # fmt: skip
        for op, (rows, cols) in cases:
            m = modules["LayerNorm" if op.startswith("LayerNorm") else "RMSNorm"]
            torch._dynamo.reset()  # each case's torch.compile from scratch, not a recompile
            inputs, _, fns, moved, _ = ops.norm_case(op, lib, liger, rows, cols)
            graphs = {}
            with torch.no_grad():
                for impl in ("compile", "liger", "ours"):
                    if impl in fns:
                        graphs[impl] = ops.back_to_back_graph(
                            [functools.partial(fns[impl], *inputs)], 15.0
                        )
                for config in _fwd_candidates(cols):
                    one_pass, block_n, n_rows, warps = config
                    kind = f"block {block_n} x {n_rows}" if one_pass else f"chunks {block_n}"
                    with _swapped(m, _fwd_block=lambda n, *_, config=config: config):
                        graphs[f"{kind}, {warps} warps"] = ops.back_to_back_graph(
                            [functools.partial(fns["ours"], *inputs)], 15.0
                        )
            times = ops.interleaved_graphs_ms(graphs)
            best = min(times["compile"], times.get("liger", float("inf")))
            for name, ms in sorted(times.items(), key=lambda t: t[1]):
                print(f"{op} fwd {rows}x{cols} {name:22s} {ms * 1e3:7.1f} us "
                      f"{moved / ms / 1e6:6.0f} GB/s  {best / ms:5.3f}x best peer")  # fmt: skip
            del graphs, inputs, fns
            torch.cuda.empty_cache()


def inductor_code(lib, liger):
    """The Triton code inductor generates for the RMSNorm and LayerNorm forwards at 8192 wide
    (its kernels and launch configuration), to compare its choices with ours."""
    for op in ("RMSNorm", "LayerNorm"):
        torch._dynamo.reset()
        inputs, _, fns, _, _ = ops.norm_case(op, lib, liger, 8192, 8192)
        with torch.no_grad():
            print(
                f"--- {op} 8192x8192, torch.compile\n{_inductor_kernels(fns['compile'], *inputs)}"
            )


def _sweep_rotary_shape(lib, liger, rotary, batch, seq):
    from triton.testing import do_bench_cudagraph

    (q, k), _, fns, moved, _ = ops.rotary_case(lib, liger, batch, seq)

    def timed(label, fn, rep):
        fn(q, k)  # compile outside the graph capture
        ms = do_bench_cudagraph(lambda: fn(q, k), rep=rep)
        print(f"rotary {batch}x{seq} {label}: {ms * 1e3:7.1f} us {moved / ms / 1e6:6.0f} GB/s")

    if "liger" in fns:
        timed("liger", fns["liger"], 30)
    timed("ours as configured", fns["ours"], 30)
    launch_config = rotary._launch_config
    for heads in (32, 16, 8):
        for warps in (1, 2, 4, 8, 16):

            def config(n_q, n_k, d, heads=heads, warps=warps):
                block_half, block_hq, block_hk, _, _ = launch_config(n_q, n_k, d)
                block_hq, block_hk = min(block_hq, heads), min(block_hk, heads)
                return block_half, block_hq, block_hk, n_q <= block_hq and n_k <= block_hk, warps

            with _swapped(rotary, _launch_config=config):
                timed(f"  ours, heads per block {heads:2d}, {warps:2d} warps", fns["ours"], 20)


def sweep_rotary(lib, liger):
    """Device time (CUDA graphs) of the rotary forward over heads per block and ``num_warps``,
    beside Liger's, at the benchmark's shapes. The configuration lives in
    ``rotary._launch_config`` (cached per head counts); the sweep swaps it and puts it back."""
    rotary = sys.modules[f"{lib['rotary'].__name__}.rotary"]
    stream = torch.cuda.Stream()  # graphs cannot be captured on the default stream
    with torch.cuda.stream(stream):
        for batch, seq in ops.ROTARY_SHAPES:
            _sweep_rotary_shape(lib, liger, rotary, batch, seq)


def _ceiling_times(fn) -> tuple:
    """(name, us) of ``fn`` three ways: replayed alone in a CUDA graph with L2 cleared first, as
    ops.py's graph tables time it; between CUDA events without a graph, L2 cleared first (the host
    queues ahead at these sizes, so device time without a graph launch); and back to back in one
    graph without clearing L2 (``do_bench_cudagraph``: the kernel alone, but inputs under the
    L2's size stay cached)."""
    from triton.testing import do_bench_cudagraph

    fn()  # compile outside any capture
    graph = ops.graph_ms(fn, torch.cuda.current_stream(), 50)
    events = ops.flushed_ms(fn, rep_ms=100, warmup=25)
    b2b = do_bench_cudagraph(fn, rep=30, return_mode="median")
    return (("graph", graph * 1e3), ("events", events * 1e3), ("b2b", b2b * 1e3))


def _ceiling_row(label, moved, times):
    cells = "  ".join(f"{name} {us:7.1f} us {moved / us / 1e3:5.0f} GB/s" for name, us in times)
    print(f"{label}: {cells}")


def _norm_forward_call(op, m, rows, cols):
    """(x, ours): a bf16 input and a closure that runs the norm's forward launcher on it alone."""
    x = torch.randn(rows, cols, device="cuda", dtype=DT)
    w = torch.randn(cols, device="cuda", dtype=DT)

    def ours():
        if op == "RMSNorm":
            m._forward(x, None, w, 1e-6, 0)
        else:
            m._forward(x, [cols], w, w, 1e-5)

    return x, ours


def _norm_forward_ceiling(op, m, rows, cols):
    x, ours = _norm_forward_call(op, m, rows, cols)
    y = torch.empty_like(x)

    def copy():
        y.copy_(x)

    moved = 2 * x.numel() * DT.itemsize
    for name, fn in (("copy", copy), ("ours", ours)):
        _ceiling_row(f"{op} fwd {rows}x{cols} {name:4s}", moved, _ceiling_times(fn))
    row_block = m.row_block
    timed = []
    for elements, warps in ((2048, 4), (4096, 4), (4096, 8), (8192, 8), (8192, 16), (16384, 16)):

        def block(n, *_, elements=elements, warps=warps):
            one_pass, block_n, n_rows, _ = row_block(n, elements)
            return one_pass, block_n, n_rows, warps

        with _swapped(m, _fwd_block=block):
            timed.append((_ceiling_times(ours), elements, warps))
    for times, elements, warps in sorted(timed, key=lambda t: t[0][0][1]):
        _ceiling_row(f"    elements {elements:5d}, {warps:2d} warps", moved, times)


def _rotary_ceiling(lib, liger, rotary, batch, seq):
    (q, k), _, fns, moved, _ = ops.rotary_case(lib, liger, batch, seq)
    cos, sin = ops.rotary_tables(batch, seq)
    qo, ko = torch.empty_like(q), torch.empty_like(k)

    def copy():
        qo.copy_(q)
        ko.copy_(k)

    def in_place():
        rotary._launch(q, k, cos, sin, q, k, 1, False)

    calls = [("copy", copy), ("ours", lambda: fns["ours"](q, k)), ("ours in place", in_place)]
    if "liger" in fns:
        calls.append(("liger", lambda: fns["liger"](q, k)))
    for name, fn in calls:
        _ceiling_row(f"rotary fwd {batch}x{seq} {name:13s}", moved, _ceiling_times(fn))


def ceilings(lib, liger):
    """How far each forward is from what moving its bytes can cost: a copy of the same bytes
    beside ours, timed in a CUDA graph and between events; the norm forwards over block size
    and warps; and the rotary forward writing in place (as Liger's does) beside out of place."""
    stream = torch.cuda.Stream()  # graphs cannot be captured on the default stream
    with torch.cuda.stream(stream):
        for op, m in norm_modules(lib):
            for rows, cols in ops.NORM_SHAPES:
                _norm_forward_ceiling(op, m, rows, cols)
        rotary = sys.modules[f"{lib['rotary'].__name__}.rotary"]
        for batch, seq in ops.ROTARY_SHAPES:
            _rotary_ceiling(lib, liger, rotary, batch, seq)


def _flushed_ms(call, flush, graphed: bool) -> float:
    """``ops.flushed_ms`` of ``call`` with ``flush`` clearing L2; ``graphed``: the call captured
    in a CUDA graph and replayed (one graph launch a call, as ``ops.graph_ms``)."""
    fn = call
    if graphed:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=torch.cuda.current_stream()):
            call()
        fn = graph.replay
    return ops.flushed_ms(fn, rep_ms=20, warmup=3, clear=flush)


def _timing_methods(label, moved, calls, flush_buffer):
    """Print ``calls`` (a list of callables, one per copy of the inputs) timed four ways."""
    write = flush_buffer.zero_  # the clearing of triton.testing.do_bench, and of ops.py before
    times = {
        "write+graph": _flushed_ms(calls[0], write, True),
        "read+graph": _flushed_ms(calls[0], ops.clear_l2, True),
        "read+events": _flushed_ms(calls[0], ops.clear_l2, False),
        "rotating b2b": ops.back_to_back_ms(calls),
    }
    cells = "  ".join(f"{k} {ms * 1e3:7.1f} us {moved / ms / 1e6:5.0f}" for k, ms in times.items())
    print(f"{label:42s} {cells}", flush=True)
    return times


def timing_methods(lib, liger):
    """Each contender's forward and forward+backward timed four ways (``_timing_methods``),
    beside a copy of the same bytes and the 1 GiB copy, in GB/s of the bytes that must move."""
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        n = 512 * 1024 * 1024
        calls = ops.same_bytes_calls(2 * n * 2, 1)
        _timing_methods("copy 1 GiB (neg)", 2 * n * 2, calls, flush)
        del calls
        cases = [("RMSNorm", s) for s in ops.NORM_SHAPES]
        cases += [("LayerNorm", (16384, 4096)), ("SiluAndMul", (16384, 4096))]
        cases += [("rotary", s) for s in ops.ROTARY_SHAPES[:2]]
        for op, shape in cases:
            torch._dynamo.reset()
            inputs, params, fns, b_fwd, b_bwd = ops.make_case(op, lib, liger, shape)
            for pass_, moved in (("fwd", b_fwd), ("fwd+bwd", b_fwd + b_bwd)):
                copies = ops.copies_for(moved)
                sets = [inputs] + [ops.clone_inputs(inputs) for _ in range(copies - 1)]
                calls = ops.same_bytes_calls(moved, copies)
                _timing_methods(f"{op} {shape} {pass_} copy x{copies}", moved, calls, flush)
                for impl in ("compile", "liger", "ours"):
                    if impl in fns:
                        fwd_bwd = [ops._calls(s, params, fns[impl]) for s in sets]
                        calls = [c[0] if pass_ == "fwd" else c[1] for c in fwd_bwd]
                        _timing_methods(f"{op} {shape} {pass_} {impl}", moved, calls, flush)
                del sets, calls
            del inputs, params, fns
            torch.cuda.empty_cache()
    torch.cuda.current_stream().wait_stream(stream)


def device_profiles(lib, liger):
    """torch.profiler device time per kernel for the norms, GeluTanh and rotary."""
    for op, shape in (
        ("RMSNorm", (4096, 4096)),
        ("RMSNorm", (16384, 4096)),
        ("RMSNorm", (8192, 8192)),
        ("LayerNorm", (8192, 8192)),
    ):
        inputs, params, fns, b_fwd, b_bwd = ops.norm_case(op, lib, liger, *shape)
        for impl in ("ours", "liger", "compile"):
            if impl in fns:
                profile(
                    f"{op} {shape} {impl} (fwd {b_fwd / 1e6:.0f} MB, bwd {b_bwd / 1e6:.0f} MB)",
                    inputs,
                    params,
                    fns[impl],
                )
    inputs, params, fns, b_fwd, b_bwd = ops.gelu_tanh_case(lib, liger, 8192, 8192)
    profile(f"GeluTanh 8192x8192 ours (fwd {b_fwd / 1e6:.0f} MB)", inputs, params, fns["ours"])
    for shape in ((1, 4096), (8, 4096)):
        inputs, params, fns, b_fwd, b_bwd = ops.rotary_case(lib, liger, *shape)
        for impl in ("ours", "liger", "compile"):
            profile(f"rotary {shape} {impl} (fwd {b_fwd / 1e6:.0f} MB)", inputs, params, fns[impl])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "parts",
        nargs="*",
        choices=(
            "host",
            "sweep",
            "sweep-fp32",
            "profile",
            "ceiling",
            "widths",
            "timing",
            "forward-ab",
            "inductor",
        ),
        help="what to run (default: host, sweep and profile)",
    )
    parser.add_argument(
        "--norms", default="", help="forward-ab: only these norms (comma-separated, ops.py names)"
    )
    parser.add_argument(
        "--shapes", default="", help="forward-ab: only these shapes (comma-separated, ROWSxCOLS)"
    )
    args = parser.parse_args()
    parts = args.parts or ["host", "sweep", "profile"]
    lib = ops.load_library()
    liger = ops.load_liger()
    if "host" in parts:
        host_costs(lib, liger)
    if "sweep" in parts:
        sweep_backward(lib, liger)
        sweep_rotary(lib, liger)
    if "sweep-fp32" in parts:
        sweep_backward_fp32(lib, liger)
    if "profile" in parts:
        device_profiles(lib, liger)
    if "ceiling" in parts:
        ceilings(lib, liger)
    if "widths" in parts:
        sweep_widths(lib, liger)
    if "timing" in parts:
        timing_methods(lib, liger)
    if "inductor" in parts:
        inductor_code(lib, liger)
    if "forward-ab" in parts:
        shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",") if s]
        forward_ab(lib, liger, [k for k in args.norms.split(",") if k], shapes)


if __name__ == "__main__":
    main()
