"""The norms' forward over its launch configurations: where ``_fwd_block`` comes from.

    python -m benchmarks.diagnose.norm_forward                       # the A/B, every case
    python -m benchmarks.diagnose.norm_forward --norms LayerNorm --shapes 8192x8192
    python -m benchmarks.diagnose.norm_forward --widths              # hidden 1024 to 65536

The A/B: for each case of ``FWD_AB_CASES`` (a norm of ``cases.NORM_OPS`` and a shape), ours as
configured and the candidate configurations of ``_fwd_candidates`` beside ``torch.compile``
and Liger, each back to back in a CUDA graph, the graphs replayed in interleaved rounds
(``timing.interleaved_graphs_ms``), so that a drift of the GPU's state hits every contender
alike. ``--widths``: each norm's forward launcher over ``FWD_CONFIGS`` at the widths of
``cases.WIDTH_SHAPES``, CUDA graphs back to back. The rule under test is ``_fwd_block`` of
``rms_norm.py`` and ``layer_norm.py``; the sweep swaps it and puts it back. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import functools
import sys

import torch

from benchmarks import cases, timing
from benchmarks.diagnose.launch import DT, load, norm_forward_call, norm_modules, swapped

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


def _sweep_forward(op, m, rows, cols):
    """Device time of one norm's forward at (rows, cols): ours as configured, then over the
    configurations of FWD_CONFIGS (CUDA graphs, back to back)."""
    from triton.testing import do_bench_cudagraph

    x, ours = norm_forward_call(op, m, rows, cols)
    moved = 2 * x.numel() * DT.itemsize

    def report(label, ms):
        print(f"{op} fwd {rows}x{cols} {label}: {ms * 1e3:7.1f} us {moved / ms / 1e6:6.0f} GB/s")

    ours()
    report("ours as configured", do_bench_cudagraph(ours, rep=30))
    timed = []
    for config in FWD_CONFIGS[cols]:
        with swapped(m, _fwd_block=lambda n, *_, config=config: config):
            ours()
            timed.append((do_bench_cudagraph(ours, rep=20), config))
    for ms, (one_pass, block_n, n_rows, warps) in sorted(timed)[:6]:
        kind = f"block {block_n:5d} x {n_rows:2d} rows" if one_pass else f"chunks of {block_n:5d}"
        report(f"  {kind}, {warps:2d} warps", ms)
    sys.stdout.flush()


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


# Cases of the A/B (a norm of cases.NORM_OPS, shapes): the square shapes of cases.NORM_SHAPES from
# 64M elements, and about 64M elements at the widths of real models' hidden sizes, for the two
# norms; the square shapes for the RMSNorm kernel's other uses (fp32 data, Gemma, fused add) and
# LayerNorm's (fp32 data, no bias); LayerNorm's widest rows.
_WIDE_SHAPES = [*cases.NORM_SHAPES[1:], (16384, 5120), (5461, 12288), (4096, 16384)]
FWD_AB_CASES = [("RMSNorm", s) for s in _WIDE_SHAPES] + [("LayerNorm", s) for s in _WIDE_SHAPES]
FWD_AB_CASES += [(k, s) for k in ("RMSNorm", "LayerNorm") for s in cases.WIDTH_SHAPES[:2]]
FWD_AB_CASES += [(k, s) for k in ("RMSNorm-fp32", "GemmaRMSNorm", "FusedAddRMSNorm",
                                  "LayerNorm-fp32", "LayerNorm-nobias")
                 for s in cases.NORM_SHAPES[1:]]  # fmt: skip
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
    (``timing.interleaved_graphs_ms``)."""
    modules = dict(norm_modules(lib))
    stream = torch.cuda.Stream()  # graphs cannot be captured on the default stream
    with torch.cuda.stream(stream):
        cases = [(op, shape) for op, shape in FWD_AB_CASES
                 if (not kinds or op in kinds) and (not shapes or shape in shapes)]  # fmt: skip
        for op, (rows, cols) in cases:
            m = modules["LayerNorm" if op.startswith("LayerNorm") else "RMSNorm"]
            torch._dynamo.reset()  # each case's torch.compile from scratch, not a recompile
            inputs, _, fns, moved, _ = cases.norm_case(op, lib, liger, rows, cols)
            graphs = {}
            with torch.no_grad():
                for impl in ("compile", "liger", "ours"):
                    if impl in fns:
                        graphs[impl] = timing.back_to_back_graph(
                            [functools.partial(fns[impl], *inputs)], 15.0
                        )
                for config in _fwd_candidates(cols):
                    one_pass, block_n, n_rows, warps = config
                    kind = f"block {block_n} x {n_rows}" if one_pass else f"chunks {block_n}"
                    with swapped(m, _fwd_block=lambda n, *_, config=config: config):
                        graphs[f"{kind}, {warps} warps"] = timing.back_to_back_graph(
                            [functools.partial(fns["ours"], *inputs)], 15.0
                        )
            times = timing.interleaved_graphs_ms(graphs)
            best = min(times["compile"], times.get("liger", float("inf")))
            for name, ms in sorted(times.items(), key=lambda t: t[1]):
                print(f"{op} fwd {rows}x{cols} {name:22s} {ms * 1e3:7.1f} us "
                      f"{moved / ms / 1e6:6.0f} GB/s  {best / ms:5.3f}x best peer")  # fmt: skip
            del graphs, inputs, fns
            torch.cuda.empty_cache()


def sweep_widths(lib):
    """The norms' forward at the widths of ``cases.WIDTH_SHAPES`` over ``FWD_CONFIGS``."""
    stream = torch.cuda.Stream()  # graphs cannot be captured on the default stream
    with torch.cuda.stream(stream):
        for op, m in norm_modules(lib):
            for rows, cols in cases.WIDTH_SHAPES:
                _sweep_forward(op, m, rows, cols)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", action="store_true", help="the shapes of cases.WIDTH_SHAPES")
    parser.add_argument(
        "--norms", default="", help="A/B: only these norms (benchmarks.cases.NORM_OPS names, a,b)"
    )
    parser.add_argument("--shapes", default="", help="A/B: only these shapes (ROWSxCOLS,...)")
    args = parser.parse_args()
    lib, liger = load()
    if args.widths:
        sweep_widths(lib)
        return
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",") if s]
    forward_ab(lib, liger, [k for k in args.norms.split(",") if k], shapes)


if __name__ == "__main__":
    main()
