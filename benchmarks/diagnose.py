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

    python benchmarks/diagnose.py sweep       # one part: host, sweep, profile, widths or ceiling
"""

from __future__ import annotations

import argparse
import contextlib
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


SWEEP_SHAPES = ((4096, 2048), (4096, 4096), (16384, 4096), (8192, 8192), (32768, 8192))


def _norm_backward_call(op, module, liger, rows, cols):
    """(ours, liger): closures that run one backward of the norm at (rows, cols); ours is the
    launcher alone (kernel and partial sums), Liger's goes through its autograd function."""
    x = torch.randn(rows, cols, device="cuda", dtype=DT)
    dy = torch.randn_like(x)
    w = torch.randn(cols, device="cuda", dtype=DT)
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
            module._backward(dy, x, [cols], w, mean, rstd, True, True, DT)

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


BWD_GRID = ((4096, 8192, 16384), (1, 2), (8, 16))  # elements a step, programs per SM, warps


def _sweep_shape(op, m, liger, rows, cols, grid=BWD_GRID):
    """Time one norm's backward at (rows, cols): Liger's, ours as configured, and ours over the
    configurations of ``grid`` (on the current stream, which must not be the default one).
    For rows too wide for one pass, the elements a step are the width of a program's block of
    columns (taken 16384 elements a step)."""
    import itertools

    from triton.testing import do_bench_cudagraph

    moved = 3 * rows * cols * DT.itemsize  # x, dy read; dx written

    def report(label, ms):
        print(f"{op} {rows}x{cols} {label}: {ms * 1e3:7.1f} us {moved / ms / 1e6:6.0f} GB/s")

    ours, peer = _norm_backward_call(op, m, liger, rows, cols)
    for label, call in (("liger", peer), ("ours as configured", ours)):
        if call is not None:
            call()
            report(label, do_bench_cudagraph(call, rep=30))
    row_block = m.row_block
    timed = []
    for elements, per_sm, warps in itertools.product(*grid):

        def block(n, elements=elements, per_sm=per_sm, warps=warps):
            one_pass, block_n, n_rows, _ = row_block(n, elements)
            if one_pass:
                return one_pass, block_n, n_rows, warps, per_sm
            return False, elements, max(1, 16384 // elements), warps, per_sm

        with _swapped(m, _bwd_block=block):
            ours()
            timed.append((do_bench_cudagraph(ours, rep=20), elements, per_sm, warps))
    for ms, elements, per_sm, warps in sorted(timed)[:4]:
        report(f"  elements {elements:5d}, {per_sm}/SM, {warps:2d} warps", ms)
    sys.stdout.flush()


def sweep_backward(lib, liger):
    """Device time of the norm backward launchers over their launch configuration: elements a
    program handles per step, programs per SM and warps; CUDA graphs, so device time only.

    Prints, per norm and shape, Liger's backward, ours as configured, and the four fastest
    configurations. The configuration lives in each module's ``_bwd_block``; the sweep swaps
    it and puts it back (``_swapped``).
    """
    stream = torch.cuda.Stream()  # graphs cannot be captured on the default stream
    with torch.cuda.stream(stream):
        for op, m in norm_modules(lib):
            for rows, cols in SWEEP_SHAPES:
                _sweep_shape(op, m, liger, rows, cols)


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
        with _swapped(m, row_block=lambda n, elements=4096, config=config: config):
            ours()
            timed.append((do_bench_cudagraph(ours, rep=20), config))
    for ms, (one_pass, block_n, n_rows, warps) in sorted(timed)[:4]:
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
    from triton.testing import do_bench, do_bench_cudagraph

    fn()  # compile outside any capture
    graph = ops._graph_ms(fn, torch.cuda.current_stream(), 50)
    events = do_bench(fn, warmup=25, rep=100, return_mode="median")
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

        def block(n, _elements=4096, elements=elements, warps=warps):
            one_pass, block_n, n_rows, _ = row_block(n, elements)
            return one_pass, block_n, n_rows, warps

        with _swapped(m, row_block=block):
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
        choices=("host", "sweep", "profile", "ceiling", "widths"),
        help="what to run (default: host, sweep and profile)",
    )
    parts = parser.parse_args().parts or ["host", "sweep", "profile"]
    lib = ops.load_library()
    liger = ops.load_liger()
    if "host" in parts:
        host_costs(lib, liger)
    if "sweep" in parts:
        sweep_backward(lib, liger)
        sweep_rotary(lib, liger)
    if "profile" in parts:
        device_profiles(lib, liger)
    if "ceiling" in parts:
        ceilings(lib, liger)
    if "widths" in parts:
        sweep_widths(lib, liger)


if __name__ == "__main__":
    main()
