"""Benchmark our library kernels beside eager PyTorch, torch.compile and Liger-Kernel.

    python -m benchmarks.ops              # writes benchmarks/results/<device>/ops

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
import json
import os
import re
import statistics
import sys

import torch
import triton

from benchmarks.cases import (
    NORM_SHAPES,
    OPS,
    ROTARY_SHAPES,
    WIDTH_SHAPES,
    load_library,
    load_liger,
    make_case,
)
from benchmarks.results_io import default_out, save_results
from benchmarks.timing import (
    COPY,
    TIMED_KEYS,
    copy_bandwidth,
    outputs,
    pooled_median,
    ratio_quartiles,
    same_bytes_pair,
    time_cases,
)

IMPLS = ["eager", "compile", "liger", "ours"]


# ---- correctness spot check (the test suite does the real checking) --------------------------


def spot_check(name, inputs, fns):
    with torch.no_grad():
        ref = outputs(fns["eager"](*inputs))
        got = outputs(fns["ours"](*inputs))
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
    parser.add_argument(
        "--out",
        help="folder for results.md, results.json and the PNGs "
        "(default benchmarks/results/<device>/ops; required with --card, --summary, --merge)",
    )
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
    if args.out is None and (args.card or args.summary or args.merge):
        parser.error("--out is required with --card, --summary and --merge")
    if args.card or args.summary:
        with open(os.path.join(args.out, "results.json")) as f:
            results = json.load(f)["results"]
        if args.summary:
            print(summary_table(results, os.path.relpath(args.out, os.path.dirname(__file__))))
            return
        for op in args.ops.split(","):
            print(f"### {op}\n\n{card_tables(results, op)}")
        return
    if not args.merge and not torch.cuda.is_available():
        sys.exit("python -m benchmarks.ops needs a CUDA GPU (--card, --summary, --merge do not)")
    args.out = args.out or str(default_out("ops"))
    os.makedirs(args.out, exist_ok=True)

    def save(meta, results):
        save_results(args.out, meta, results, write_markdown)

    if args.merge:
        meta, results = merge(args.merge)
    else:
        meta, results = run(args.ops.split(","), args.rep_ms, save)
    save(meta, results)
    write_plots(meta, results, args.out)
    with open(os.path.join(args.out, "results.md")) as f:
        print(f.read())


if __name__ == "__main__":
    main()
