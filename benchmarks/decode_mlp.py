"""Benchmark the decode-size gated MLP (library/activation ``gated_mlp_decode``) beside cuBLAS.

    python -m benchmarks.decode_mlp           # writes benchmarks/results/<device>/decode_mlp
    python -m benchmarks.decode_mlp --sweep   # sweep.md and sweep.json in the same folder

For each hidden/intermediate size (2048/5632, the 1.1B model of ``e2e.py``; 3072/8192;
4096/14336, Llama-3-8B) and token count (rows: 1 and 8), bf16, no biases, in one process on one
CUDA GPU, the Llama MLP ``down(silu(gate(x)) * up(x))`` as

- ``eager``: transformers' LlamaMLP formula, three ``F.linear`` and ``F.silu(gate) * up``;
- ``current``: our path before the decode kernels: ``F.linear`` (cuBLAS) for the projections
  and our ``silu_mul`` kernel between them;
- ``decode``: ``gated_mlp_decode`` (two matrix-vector kernels, split-K where its rule says);
- ``compile``: ``torch.compile`` of the eager formula (default mode), compiled before capture.

Timing, as decoding runs: each contender is captured in one CUDA graph of ``--calls`` (20)
back-to-back MLP calls, so host time is excluded. The calls cycle through copies of the
weights, as many as make 256 MB or more (at least two), so that no call finds its weights in
L2 (a model's layers each have their own); L2 is cleared before each replay and the replays run
in interleaved rounds (``timing.interleaved_samples``: every contender in turn, rotating order),
median over the rounds. Reported: microseconds per MLP call, the ratios of ``decode`` to each
peer (peer time / ours, > 1: ours faster, quartiles over the rounds in brackets), and the share
of ``--peak-gbps`` (default 3350, an H100 SXM's HBM3) that the bytes which must move reach:
the three weight matrices, x and the output (the ``[rows, intermediate]`` product is not
counted). Each contender's output is compared with eager's (max abs difference printed; ours
must be within bf16's rounding).

``--sweep`` times, instead, every candidate configuration of each decode kernel
(library/activation's ``candidate_configs``: the gate-up kernel and the down
projection, at each shape and row count) in the same kind of graphs and rounds, beside cuBLAS
doing the same work (``F.linear`` twice and ``silu_mul``; one ``F.linear``), and marks the rule's
pick (``gemv_config``) and the fastest: what the rule should be is read from one run.

Writes ``results.md`` and ``results.json`` (``--sweep``: ``sweep.md`` and ``sweep.json``) into
``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F

from benchmarks import timing
from benchmarks.results_io import default_out, save_results

SHAPES = [(2048, 5632), (3072, 8192), (4096, 14336)]  # (hidden, intermediate)
ROWS = [1, 8]
IMPLS = ["eager", "current", "decode", "compile"]
OURS = "decode"
CALLS = 20
ROTATION_BYTES = 256 * 2**20  # weights cycled through per graph, at least (L2 is 50 MB on an H100)
PEAK_GBPS = 3350.0  # H100 SXM HBM3
SWEEP_KERNELS = ("gate_up", "down")
CUBLAS = "cuBLAS"
DEVICE = "cuda"  # the CPU test of this script's plumbing runs it on "cpu" (Triton's interpreter)


def load_decode():
    """The activation package: ``gated_mlp_decode`` and its kernels' configurations
    (``candidate_configs``, ``gemv_config``, ``gemv``, ``gated_gemv``)."""
    from kernels.library import load_library_package

    return load_library_package("activation")


def multiprocessors(device: torch.device) -> int:
    """The SMs the decode kernels plan their grid for, counted as their launcher counts them
    (2 on the CPU, where Triton's interpreter runs the programs)."""
    if device.type != "cuda":
        return 2
    return torch.cuda.get_device_properties(device).multi_processor_count


# ---- shapes and bytes -----------------------------------------------------------------------


def mlp_bytes(hidden: int, inter: int, rows: int, itemsize: int = 2) -> int:
    """Bytes an MLP call must move: the three weights, x and the output."""
    return (3 * hidden * inter + 2 * rows * hidden) * itemsize


def kernel_bytes(kernel: str, hidden: int, inter: int, rows: int, itemsize: int = 2) -> int:
    """Bytes a decode kernel must move: gate_up reads two weights and x and writes the product;
    down reads its weight and the product and writes the output."""
    if kernel == "gate_up":
        return (2 * inter * hidden + rows * hidden + rows * inter) * itemsize
    return (hidden * inter + rows * inter + rows * hidden) * itemsize


def weight_sets(hidden: int, inter: int, dtype, calls: int) -> int:
    """How many copies of the weights a graph of ``calls`` calls cycles through: enough for
    ``ROTATION_BYTES``, at least 2, at most one per call."""
    one = 3 * hidden * inter * dtype.itemsize
    return min(calls, max(2, -(-ROTATION_BYTES // one)))


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"2048x5632,4096x14336"`` -> [(2048, 5632), (4096, 14336)]."""
    return [tuple(int(v) for v in item.split("x")) for item in text.split(",") if item]


# ---- contenders -----------------------------------------------------------------------------


def eager_mlp(x, gate_w, up_w, down_w):
    """transformers' LlamaMLP: ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` with SiLU."""
    return F.linear(F.silu(F.linear(x, gate_w)) * F.linear(x, up_w), down_w)


def contenders(package) -> dict:
    """{name: fn(x, gate_w, up_w, down_w)}."""

    def current(x, gate_w, up_w, down_w):
        return F.linear(package.silu_mul(F.linear(x, gate_w), F.linear(x, up_w)), down_w)

    def decode(x, gate_w, up_w, down_w):
        return package.gated_mlp_decode(x, gate_w, None, up_w, None, down_w, None, "silu")

    return {
        "eager": eager_mlp,
        "current": current,
        "decode": decode,
        "compile": torch.compile(eager_mlp, dynamic=False),
    }


def make_weights(hidden: int, inter: int, dtype, sets: int) -> list[tuple]:
    """``sets`` copies of (gate_w, up_w, down_w), scaled so that gate and up are O(1)."""
    out = []
    for i in range(sets):
        generator = torch.Generator(device=DEVICE).manual_seed(i)

        def w(n, k, generator=generator):
            t = torch.randn(n, k, device=DEVICE, generator=generator) * k**-0.5
            return t.to(dtype)

        out.append((w(inter, hidden), w(inter, hidden), w(hidden, inter)))
    return out


def rotating(fn, weights: list, calls: int):
    """A call that runs ``fn(*weights[i % len(weights)])`` for i < ``calls``, without
    gradients: back to back, as a model's layers run, each on weights L2 does not hold."""

    def call():
        with torch.no_grad():
            for i in range(calls):
                fn(*weights[i % len(weights)])

    return call


def graphs(calls: dict) -> dict:
    """{name: replay of ``calls[name]`` captured in a CUDA graph}; a contender that cannot be
    captured is reported and left out."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    replays = {}
    with torch.cuda.stream(stream):
        for name, call in calls.items():
            try:
                replays[name] = timing.captured(call, stream)
            except Exception as exc:  # noqa: BLE001  (report and go on without it)
                print(f"  {name}: CUDA graph capture failed: {exc}"[:300], flush=True)
                torch.cuda.synchronize()
    torch.cuda.current_stream().wait_stream(stream)
    return replays


def check(fns: dict, x, weights) -> dict:
    """{name: max abs difference from eager's output}; raises when ours is off by more than
    bf16's rounding allows (relative L2 error 2e-2)."""
    with torch.no_grad():
        ref = eager_mlp(x, *weights).float()
        diffs = {}
        for name, fn in fns.items():
            out = fn(x, *weights).float()
            diffs[name] = (out - ref).abs().max().item()
            rel = ((out - ref).norm() / ref.norm()).item()
            if name == OURS and not rel < 2e-2:
                raise AssertionError(f"{name} differs from eager: relative L2 error {rel:.3g}")
    return diffs


def run_shape(package, hidden, inter, rows, dtype, calls, rep_ms, peak_gbps) -> list:
    sets = make_weights(hidden, inter, dtype, weight_sets(hidden, inter, dtype, calls))
    x = torch.randn(rows, hidden, device=DEVICE).to(dtype)
    fns = contenders(package)
    diffs = check(fns, x, sets[0])
    replays = graphs(
        {name: rotating(lambda *w, f=fn: f(x, *w), sets, calls) for name, fn in fns.items()}
    )
    samples = timing.interleaved_samples(replays, rep_ms)
    moved = mlp_bytes(hidden, inter, rows, dtype.itemsize)
    rows_out = []
    for name in fns:
        row = {"hidden": hidden, "inter": inter, "rows": rows, "impl": name}
        row["max_abs_diff_vs_eager"] = diffs[name]
        if name in samples:
            row["us"] = timing.pooled_median(samples[name]) * 1e3 / calls
            row["rounds_us"] = [round(statistics.median(r) * 1e3 / calls, 4) for r in samples[name]]
            row["pct_hbm"] = 100 * moved / (row["us"] * 1e-6) / 1e9 / peak_gbps
        else:
            row["error"] = "CUDA graph capture failed"
        rows_out.append(row)
        print(
            f"{hidden}/{inter} rows {rows}  {name:8s} "
            + (
                f"{row['us']:8.2f} us {row['pct_hbm']:5.1f}% of HBM"
                if "us" in row
                else row["error"]
            )
            + f"  max |diff| vs eager {diffs[name]:.3g}",
            flush=True,
        )
    del replays, sets
    torch.cuda.empty_cache()
    return rows_out


# ---- the sweep ------------------------------------------------------------------------------


def sweep_calls(package, kernel, hidden, inter, rows, dtype, sets, calls) -> tuple:
    """``({label: call}, {label: config}, {label: error}, the rule's config)``: for each
    candidate configuration of ``kernel`` (``"gate_up"`` or ``"down"``) and for cuBLAS doing
    the same work, a call of ``calls`` back-to-back runs cycling through the weight ``sets``;
    each configuration's relative L2 error against cuBLAS's result (a configuration that is
    fast but wrong must not set the rule)."""
    x = torch.randn(rows, hidden, device=DEVICE).to(dtype)
    h = torch.randn(rows, inter, device=DEVICE).to(dtype)
    gated = kernel == "gate_up"
    n, k = (inter, hidden) if gated else (hidden, inter)
    sms = multiprocessors(x.device)
    configs = package.candidate_configs(rows, n, k, gated, sms)

    def run(config):
        if gated:
            return lambda g, u, d: package.gated_gemv(x, g, None, u, None, package.SILU, config)
        return lambda g, u, d: package.gemv(h, d, None, config)

    def cublas(g, u, d):
        if gated:
            return package.silu_mul(F.linear(x, g), F.linear(x, u))
        return F.linear(h, d)

    out, labels, errors = {CUBLAS: rotating(cublas, sets, calls)}, {}, {}
    with torch.no_grad():
        ref = cublas(*sets[0]).float()
        for config in configs:
            label = config_label(config)
            labels[label] = config
            out[label] = rotating(run(config), sets, calls)
            try:
                got = run(config)(*sets[0]).float()
                errors[label] = ((got - ref).norm() / ref.norm()).item()
            except Exception as exc:  # noqa: BLE001  (a configuration that does not launch)
                print(f"  {label}: {type(exc).__name__}: {exc}"[:300], flush=True)
                errors[label] = float("inf")
    return out, labels, errors, package.gemv_config(rows, n, k, gated, sms)


def config_label(config) -> str:
    """``n16 k256 s4 w4 st2 fma`` for a GemvConfig."""
    kind = "dot" if config.dot else "fma"
    return (
        f"n{config.block_n} k{config.block_k} s{config.split_k} w{config.num_warps} "
        f"st{config.num_stages} {kind}"
    )


def run_sweep(package, shapes, rows_list, dtype, calls, rep_ms, peak_gbps) -> list:
    """Rows of the sweep: each case's candidates and cuBLAS, timed in interleaved rounds."""
    results = []
    for hidden, inter in shapes:
        sets = make_weights(hidden, inter, dtype, weight_sets(hidden, inter, dtype, calls))
        for rows in rows_list:
            for kernel in SWEEP_KERNELS:
                calls_, labels, errors, rule = sweep_calls(
                    package, kernel, hidden, inter, rows, dtype, sets, calls
                )
                # Left out of the timing: configurations that failed or compute something else.
                calls_ = {k: c for k, c in calls_.items() if errors.get(k, 0.0) < 2e-2}
                replays = graphs(calls_)
                samples = timing.interleaved_samples(replays, rep_ms, block=3)
                moved = kernel_bytes(kernel, hidden, inter, rows, dtype.itemsize)
                for label in [CUBLAS, *labels]:
                    row = {"hidden": hidden, "inter": inter, "rows": rows, "kernel": kernel}
                    row["config"] = label
                    row["rule"] = label == config_label(rule)
                    if label in labels:
                        row["config_fields"] = labels[label]._asdict()
                        row["rel_err_vs_cublas"] = errors[label]
                    if label not in calls_:
                        row["error"] = f"wrong or failed: relative error {errors[label]:.3g}"
                    elif label in samples:
                        row["us"] = timing.pooled_median(samples[label]) * 1e3 / calls
                        row["pct_hbm"] = 100 * moved / (row["us"] * 1e-6) / 1e9 / peak_gbps
                    else:
                        row["error"] = "CUDA graph capture failed"
                    results.append(row)
                print(sweep_table(results, hidden, inter, rows, kernel, top=8), flush=True)
                del replays
        del sets
        torch.cuda.empty_cache()
    return results


def sweep_table(results, hidden, inter, rows, kernel, top=None) -> str:
    """One case of the sweep, fastest first: config, us, % of HBM, vs the fastest and cuBLAS;
    the rule's pick marked ``(rule)``, always shown; then the configurations left out (failed,
    or wrong)."""
    every = [
        r for r in results
        if (r["hidden"], r["inter"], r["rows"], r["kernel"]) == (hidden, inter, rows, kernel)
    ]  # fmt: skip
    case = [r for r in every if "us" in r]
    left_out = [
        f"{r['config']}{' (rule)' if r['rule'] else ''}: {r['error']}"
        for r in every
        if "error" in r
    ]
    if not case:
        return f"{kernel} {hidden}/{inter} rows {rows}: nothing timed"
    ranked = sorted(case, key=lambda r: r["us"])
    best = next((r for r in ranked if r["config"] != CUBLAS), ranked[0])
    cublas = next((r for r in ranked if r["config"] == CUBLAS), None)
    shown = ranked if top is None else ranked[:top]
    shown += [r for r in ranked if (r["rule"] or r["config"] == CUBLAS) and r not in shown]
    lines = [
        f"### {kernel}, {hidden}/{inter}, rows {rows}",
        "",
        "| config | us | % of HBM | best / it | cuBLAS / it |",
        "|---|---|---|---|---|",
    ]
    for r in shown:
        name = r["config"] + (" (rule)" if r["rule"] else "")
        cu = f"{cublas['us'] / r['us']:.2f}x" if cublas else "-"
        lines.append(
            f"| {name} | {r['us']:.2f} | {r['pct_hbm']:.1f}% | {best['us'] / r['us']:.2f}x | {cu} |"
        )
    if left_out:
        lines += ["", "Left out: " + "; ".join(left_out) + "."]
    return "\n".join(lines) + "\n"


def write_sweep(meta, results, path) -> None:
    cases = list(dict.fromkeys((r["hidden"], r["inter"], r["rows"], r["kernel"]) for r in results))
    lines = [
        "# Decode MLP kernels: configuration sweep",
        "",
        *_meta_lines(meta),
        "- every candidate configuration of each kernel (`decode_mlp.candidate_configs`), "
        "fastest first; `(rule)` marks `gemv_config`'s pick; 'best / it' is the fastest "
        "configuration's speed over this one's (1.00x: the fastest), 'cuBLAS / it' cuBLAS "
        "doing the same work (`F.linear` twice and `silu_mul`; one `F.linear`) over this one "
        "(> 1: the kernel faster). Labels: block_n, block_k, split_k, num_warps, num_stages, "
        "tl.dot or multiply-adds.",
        "",
    ]
    for case in cases:
        lines.append(sweep_table(results, *case))
    with open(path, "w") as f:
        f.write("\n".join(lines))


# ---- tables ---------------------------------------------------------------------------------


def _meta_lines(meta) -> list:
    return [
        f"- device: {meta['device']}",
        f"- date: {meta['date']}",
        f"- torch {meta['torch']}, triton {meta['triton']}",
        f"- dtype {meta['dtype']}; % of HBM is of {meta['peak_gbps']:.0f} GB/s",
        f"- timing: {meta['timing']}",
    ]


def _ratio(peer: dict, ours: dict) -> str:
    """peer us / ours us (> 1: ours faster), with the quartiles over the rounds."""
    if "us" not in peer or "us" not in ours:
        return "-"
    q1, _, q3 = timing.ratio_quartiles(
        [[t] for t in peer["rounds_us"]], [[t] for t in ours["rounds_us"]]
    )
    return f"{peer['us'] / ours['us']:.2f}x ({q1:.2f}-{q3:.2f})"


def results_table(results) -> str:
    """One row per shape and row count: each contender's us per MLP call (% of HBM), and ours
    against each peer."""
    impls = [i for i in IMPLS if any(r["impl"] == i for r in results)]
    peers = [i for i in impls if i != OURS]
    head = ["hidden/inter", "rows"] + [f"{i} us (% HBM)" for i in impls]
    head += [f"{OURS} vs {p}" for p in peers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keys = list(dict.fromkeys((r["hidden"], r["inter"], r["rows"]) for r in results))
    for hidden, inter, rows in keys:
        by = {
            r["impl"]: r
            for r in results
            if (r["hidden"], r["inter"], r["rows"]) == (hidden, inter, rows)
        }
        cells = [f"{hidden}/{inter}", str(rows)]
        for i in impls:
            r = by.get(i, {})
            cells.append(f"{r['us']:.1f} ({r['pct_hbm']:.0f}%)" if "us" in r else "-")
        ours = by.get(OURS, {})
        cells += [_ratio(by[p], ours) if p in by else "-" for p in peers]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_markdown(meta, results, path) -> None:
    diffs = [
        f"{r['hidden']}/{r['inter']} rows {r['rows']} {r['impl']}: {r['max_abs_diff_vs_eager']:.3g}"
        for r in results
        if r["impl"] != "eager"
    ]
    lines = [
        "# Decode-size gated MLP: microseconds per MLP call",
        "",
        *_meta_lines(meta),
        "- contenders: `eager` (three `F.linear`, `F.silu(gate) * up`), `current` (cuBLAS "
        "projections and our `silu_mul`), `decode` (`gated_mlp_decode`), `compile` "
        "(`torch.compile` of eager's formula, default mode). % of HBM counts the three weights, x "
        "and the output. Ratios: peer us / decode us (> 1: decode faster), quartiles over the "
        "rounds in brackets.",
        "",
        results_table(results),
        "",
        "Max abs difference from eager's output: " + "; ".join(diffs) + ".",
        "",
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines))


# ---- main -----------------------------------------------------------------------------------


def metadata(args, dtype) -> dict:
    import triton

    return {
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE,
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "dtype": str(dtype).replace("torch.", ""),
        "peak_gbps": args.peak_gbps,
        "calls_per_graph": args.calls,
        "timing": f"CUDA graphs of {args.calls} back-to-back calls cycling through copies of the "
        f"weights ({ROTATION_BYTES // 2**20} MB or more, at least two), L2 cleared (256 MB read) "
        "before each replay, replays in interleaved rounds (every contender in turn, rotating "
        "order), median over the rounds, divided by the calls",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        help="folder for results.md and results.json (default benchmarks/results/<device>/decode_mlp)",
    )
    parser.add_argument(
        "--shapes",
        default=",".join(f"{h}x{i}" for h, i in SHAPES),
        help="hidden x intermediate, comma-separated",
    )
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="token counts (<= 8)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--calls", type=int, default=CALLS, help="MLP calls per CUDA graph")
    parser.add_argument(
        "--rep-ms", type=float, default=300.0, help="time each case's rounds may take"
    )
    parser.add_argument(
        "--peak-gbps", type=float, default=PEAK_GBPS, help="HBM bandwidth the %% columns are of"
    )
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="time every candidate configuration of each decode kernel (sweep.md, sweep.json)",
    )
    parser.add_argument(
        "--sweep-rep-ms",
        type=float,
        default=20.0,
        help="--rep-ms of the sweep's cases (timing.interleaved_samples: ~8 rounds of ~90 graphs)",
    )
    args = parser.parse_args()
    if DEVICE == "cuda" and not torch.cuda.is_available():
        sys.exit("python -m benchmarks.decode_mlp needs a CUDA GPU")
    args.out = args.out or str(default_out("decode_mlp"))
    os.makedirs(args.out, exist_ok=True)
    dtype = getattr(torch, args.dtype)
    shapes = parse_shapes(args.shapes)
    rows_list = [int(r) for r in args.rows.split(",")]
    package = load_decode()
    meta = metadata(args, dtype)
    if args.sweep:
        results = run_sweep(
            package, shapes, rows_list, dtype, args.calls, args.sweep_rep_ms, args.peak_gbps
        )
        with open(os.path.join(args.out, "sweep.json"), "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
        write_sweep(meta, results, os.path.join(args.out, "sweep.md"))
        print(f"wrote {args.out}/sweep.md and sweep.json")
        return
    torch._dynamo.config.cache_size_limit = 64
    results = []
    for hidden, inter in shapes:
        for rows in rows_list:
            torch._dynamo.reset()
            results += run_shape(
                package, hidden, inter, rows, dtype, args.calls, args.rep_ms, args.peak_gbps
            )
            save_results(args.out, meta, results, write_markdown)
    with open(os.path.join(args.out, "results.md")) as f:
        print(f.read())


if __name__ == "__main__":
    main()
