"""The norms' backward over its launch configurations: where ``bwd_block`` comes from.

    python -m benchmarks.diagnose.norm_backward            # bf16, the benchmark's shapes
    python -m benchmarks.diagnose.norm_backward --fp32     # float32 rows from 64M elements
    python -m benchmarks.diagnose.norm_backward --widths   # hidden 1024 to 65536

Each norm's backward launcher alone (kernel and partial sums) is timed under CUDA graphs
(device time, ``triton.testing.do_bench_cudagraph``) over elements a step, programs per SM
and warps (and LayerNorm's look-ahead where the dtype gives it a choice), beside Liger's
backward through its autograd function. Prints, per norm and shape, Liger, ours as configured
and the six fastest configurations. The rule under test is ``bwd_block`` of the norm package's
``_library.py`` (``_bwd_config`` in ``layer_norm.py``); the sweep swaps it and puts it back.
Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import sys

import torch

from benchmarks import cases
from benchmarks.diagnose.launch import DT, load, norm_modules, swapped

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
            with swapped(m, **swap):
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
    it and puts it back (``swapped``).
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
    """``sweep_backward`` for fp32 data at the square shapes of cases.NORM_SHAPES from 64M
    elements, with up to 32 warps (an fp32 row holds twice the registers of a bf16 one)."""
    stream = torch.cuda.Stream()  # graphs cannot be captured on the default stream
    with torch.cuda.stream(stream):
        for op, m in norm_modules(lib):
            for rows, cols in cases.NORM_SHAPES[1:]:
                _sweep_shape(op, m, liger, rows, cols, FP32_BWD_GRID, torch.float32)


# Backward grids (elements a step or chunk, programs per SM, warps) per width.
BWD_GRIDS = {
    65536: ((2048, 4096, 8192), (1, 2, 4), (4, 8, 16)),
}
BWD_GRID_NARROW = ((8192, 16384, 32768), (1, 2, 4), (4, 8, 16))


def sweep_widths(lib, liger):
    """The norms' backward at the widths of ``cases.WIDTH_SHAPES`` over ``BWD_GRIDS``."""
    stream = torch.cuda.Stream()  # graphs cannot be captured on the default stream
    with torch.cuda.stream(stream):
        for op, m in norm_modules(lib):
            for rows, cols in cases.WIDTH_SHAPES:
                _sweep_shape(op, m, liger, rows, cols, BWD_GRIDS.get(cols, BWD_GRID_NARROW))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--fp32", action="store_true", help="float32 rows from 64M elements")
    which.add_argument("--widths", action="store_true", help="the shapes of cases.WIDTH_SHAPES")
    args = parser.parse_args()
    lib, liger = load()
    if args.fp32:
        sweep_backward_fp32(lib, liger)
    elif args.widths:
        sweep_widths(lib, liger)
    else:
        sweep_backward(lib, liger)


if __name__ == "__main__":
    main()
