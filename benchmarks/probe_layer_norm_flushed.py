"""LayerNorm's chunked forward timed as ``ops.py`` times its CUDA-graph tables: one call captured
in a graph, replayed after L2 is cleared (H200 probe, 2026-11-24; results in
benchmarks/results/ops-2026-11-24c-h200/probe-ln-flushed.txt).

    python benchmarks/probe_layer_norm_flushed.py

In back-to-back probes LayerNorm at 8192x8192 runs at 96-97% of a copy of the same bytes, in
``ops.py`` at 95%, and without a bias at 100%. This times the kept kernel beside variants of its
L2 eviction hints and of its launch configuration, in rounds (every contender once a round, the
median of the rounds), with the bias-free layer and a copy of the same bytes as references;
unrolled chunk loops (the variants rewrite the kernel's source as it was at commit 1f6dc84,
before its normalising pass was unrolled; they are the record of what ran); and (with
PROBE_PIPELINED set) a forward software-pipelined across rows
(``ln_fwd_pipelined``).
"""

from __future__ import annotations

import functools
import os
import statistics
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ops  # noqa: E402
from diagnose import _swapped  # noqa: E402
from probe_forward_variants import source_variant  # noqa: E402

HINTS = {
    "weight, bias without hints": [
        (
            'w = tl.load(W + c, mask=mask, other=0.0, eviction_policy="evict_last")',
            "w = tl.load(W + c, mask=mask, other=0.0)",
        ),
        (
            'b = tl.load(B + c, mask=mask, other=0.0, eviction_policy="evict_last")',
            "b = tl.load(B + c, mask=mask, other=0.0)",
        ),
    ],  # fmt: skip
    "first pass without evict_last": [
        (
            'lane_mean = tl.load(x_row + cols, eviction_policy="evict_last")',
            "lane_mean = tl.load(x_row + cols)",
        ),
        (
            'x = tl.load(x_row + chunk * BLOCK_N + cols, eviction_policy="evict_last")',
            "x = tl.load(x_row + chunk * BLOCK_N + cols)",
        ),
    ],  # fmt: skip
    "both loops unrolled (static_range)": [
        ("for chunk in range(1, WHOLE):", "for chunk in tl.static_range(1, WHOLE):"),
        (
            "for start in range(0, CHUNKED_COLS, BLOCK_N):",
            "for start in tl.static_range(0, CHUNKED_COLS, BLOCK_N):",
        ),
    ],
    "second pass unrolled (static_range)": [
        (
            "for start in range(0, CHUNKED_COLS, BLOCK_N):",
            "for start in tl.static_range(0, CHUNKED_COLS, BLOCK_N):",
        ),
    ],
    "second pass without evict_first": [
        (
            'x = tl.load(x_row + c, mask=mask, other=0.0, eviction_policy="evict_first")',
            "x = tl.load(x_row + c, mask=mask, other=0.0)",
        ),
    ],  # fmt: skip
}


@triton.jit
def ln_fwd_pipelined(X, W, B, Y, MEAN, RSTD, n_rows, stride_x, eps, N: tl.constexpr,
                     BLOCK: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr):  # fmt: skip
    # A program normalises a run of ROWS_PER_PROGRAM rows (of whole chunks), software-pipelined
    # across rows: each chunk step reads the next row's chunk from HBM (its first pass: the
    # per-position Welford moments) and re-reads the previous row's chunk from L2 (its second
    # pass: normalise and store), so HBM is read in every step rather than idle while the
    # programs, which start in step, all run their second passes.
    WHOLE: tl.constexpr = N // BLOCK
    cols = tl.arange(0, BLOCK)
    first = tl.program_id(0).to(tl.int64) * ROWS_PER_PROGRAM
    last = tl.minimum(first + ROWS_PER_PROGRAM, n_rows) - 1
    mean = tl.full((), 0.0, tl.float32)
    rstd = tl.full((), 0.0, tl.float32)
    for row in range(first, last + 2):
        lane_mean = tl.zeros([BLOCK], dtype=tl.float32)
        lane_m2 = tl.zeros([BLOCK], dtype=tl.float32)
        ahead = tl.minimum(row, last)  # past the run: the last row again, from L2
        behind = row - 1
        for i in range(WHOLE):
            x = tl.load(X + ahead * stride_x + i * BLOCK + cols, eviction_policy="evict_last")
            x = x.to(tl.float32)
            delta = x - lane_mean
            lane_mean += delta / (i + 1.0)
            lane_m2 += delta * (x - lane_mean)
            if row > first:
                xp = tl.load(
                    X + behind * stride_x + i * BLOCK + cols, eviction_policy="evict_first"
                )
                w = tl.load(W + i * BLOCK + cols, eviction_policy="evict_last").to(tl.float32)
                b = tl.load(B + i * BLOCK + cols, eviction_policy="evict_last").to(tl.float32)
                y = (xp.to(tl.float32) - mean) * rstd * w + b
                tl.store(Y + behind * N + i * BLOCK + cols, y.to(Y.dtype.element_ty))
        mean = tl.sum(lane_mean, axis=0) / BLOCK
        spread = lane_mean - mean
        rstd = tl.rsqrt(tl.sum(lane_m2 + WHOLE * spread * spread, axis=0) / N + eps)
        tl.store(MEAN + ahead, mean)
        tl.store(RSTD + ahead, rstd)


def pipelined_call(module, x, block, rows_per_program, warps):
    n_rows, n = x.shape
    y = torch.empty_like(x)
    mean = torch.empty(n_rows, device=x.device, dtype=torch.float32)
    rstd = torch.empty_like(mean)

    def call():
        ln_fwd_pipelined[(triton.cdiv(n_rows, rows_per_program),)](
            x, module.weight, module.bias, y, mean, rstd, n_rows, n, module.eps, n, block,
            rows_per_program, num_warps=warps,
        )  # fmt: skip
        return y

    return call


PIPELINED = [(4096, 2, 8), (4096, 4, 8), (4096, 8, 8), (4096, 16, 8), (4096, 4, 4), (4096, 8, 4),
             (2048, 4, 8), (2048, 8, 8)]  # fmt: skip
CONFIGS = [(False, 4096, 1, 4), (False, 4096, 1, 16), (False, 2048, 1, 8), (True, 8192, 1, 8)]
SHAPES = [(8192, 8192), (16384, 4096), (32768, 8192), (5461, 12288), (16384, 5120)]


def flushed_rounds(calls: dict, module, stream, checked, expected, rounds: int = 5) -> dict:
    """Median ms of each ``name: (call, swap)`` of ``calls``, timed as ``ops.py`` times its
    CUDA-graph tables (``ops.graph_ms``), every contender once a round, with ``swap`` (attributes
    of ``module``: a kernel or launch configuration under test) in place; the outputs of those
    ``checked`` compared with ``expected`` (a tensor or a tuple of them) first."""
    samples = {name: [] for name in calls}
    for _ in range(rounds):
        for name, (call, swap) in calls.items():
            with _swapped(module, **swap):
                if name in checked:
                    out = call()
                    outs, wants = (
                        (out, expected) if isinstance(out, tuple) else ((out,), (expected,))
                    )
                    for o, e in zip(outs, wants, strict=True):
                        torch.testing.assert_close(o, e, rtol=2e-2, atol=2e-2)
                samples[name].append(ops.graph_ms(call, stream, 30))
    return {name: statistics.median(t) for name, t in samples.items()}


def print_times(label: str, times: dict, moved: int, width: int) -> None:
    """``times`` (ms) fastest first, in GB/s of ``moved`` bytes and against the contender named
    "copy of the same bytes"."""
    copy_ms = times["copy of the same bytes"]
    for name, ms in sorted(times.items(), key=lambda kv: kv[1]):
        print(f"{label} {name:{width}s} {ms * 1e3:7.1f} us {moved / ms / 1e6:6.0f} GB/s "
              f"{copy_ms / ms:6.3f}x copy", flush=True)  # fmt: skip


def main():
    lib = ops.load_library()
    ln = sys.modules[lib["norm"].__name__ + ".layer_norm"]
    variants = {
        name: source_variant(ln._layer_norm_fwd_kernel, r, "hint") for name, r in HINTS.items()
    }
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.no_grad():
        for rows, cols in SHAPES:
            inputs, _, fns, moved, _ = ops.norm_case("LayerNorm", lib, None, rows, cols)
            nobias, _, nobias_fns, _, _ = ops.norm_case("LayerNorm-nobias", lib, None, rows, cols)
            ours = functools.partial(fns["ours"], *inputs)
            expected = ours()
            calls = {
                "ours": (ours, {}),
                "no bias": (functools.partial(nobias_fns["ours"], *nobias), {}),
            }
            for name, kernel in variants.items():
                calls[name] = (ours, {"_layer_norm_fwd_kernel": kernel})
            block = ln._fwd_block(cols, 2)
            for config in CONFIGS:
                if (config[1] >= cols) == config[0] and config != block:  # one pass holds the row
                    calls[f"config {config}"] = (ours, {"_fwd_block": lambda n, *_, c=config: c})
            keep = []  # the probe calls' outputs must outlive their graphs
            for block, per_program, warps in PIPELINED if os.environ.get("PROBE_PIPELINED") else []:
                if block < cols and cols % block == 0:
                    call = pipelined_call(fns["eager"], inputs[0], block, per_program, warps)
                    keep.append(call)
                    calls[f"pipelined {block}, {per_program} rows, {warps}w"] = (call, {})
            copy = ops.same_bytes_calls(moved, 1)[0]
            calls["copy of the same bytes"] = (copy, {})
            checked = [name for name in calls if name not in ("no bias", "copy of the same bytes")]
            times = flushed_rounds(calls, ln, stream, checked, expected)
            print_times(f"LayerNorm fwd {rows}x{cols}", times, moved, 34)
            del inputs, fns, nobias, nobias_fns, calls, keep
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
