"""`benchmarks.e2e`'s results: kept in <out>/results.json, one entry per setting (the
transformers line and the vocabulary, `setting_of`), a run's rows replacing those of the same
contenders and shapes (`replace_rows`, `store`); rendered as <out>/results.md (`report_text`:
per setting its timing table, `markdown`, the verdict of `benchmarks.e2e_verdict` and its
largest batches) and one plot per setting (`plot`, ``e2e-<setting>.png``). `report` renders them
again from results.json, without a GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.e2e_verdict import verdict_lines
from benchmarks.llama import BY_NAME, SHAPES
from benchmarks.results_io import (
    entry_for,
    read_entries,
    replace_entry,
    transformers_line,
    write_entries,
)


def setting_of(meta: dict) -> dict:
    """What a run's results are kept under: its transformers line and vocabulary (a new run of
    the same setting replaces the old one's rows)."""
    return {
        "transformers": transformers_line(meta["transformers"]),
        "vocab": meta["config"]["vocab_size"],
    }


def replace_rows(entry: dict, rows: list[dict]) -> dict:
    """``entry`` with ``rows`` in place of its rows of the same shape and contender, so that a
    run of a few contenders or shapes keeps the others'. Rows of a contender no longer built
    (renamed or retired from ``CONTENDERS``) are dropped: no table shows a configuration the
    benchmark no longer measures beside the ones it does. Rows are ordered by shape (``SHAPES``
    first) and contender (``CONTENDERS``' order)."""
    ran = {(r["shape"], r["contender"]) for r in rows}
    kept = [
        r
        for r in entry.get("rows", [])
        if (r["shape"], r["contender"]) not in ran and r["contender"] in BY_NAME
    ]
    merged = kept + list(rows)
    shapes = list(dict.fromkeys([*SHAPES, *(r["shape"] for r in merged)]))
    names = list(dict.fromkeys([*BY_NAME, *(r["contender"] for r in merged)]))
    merged.sort(key=lambda r: (shapes.index(r["shape"]), names.index(r["contender"])))
    return {**entry, "rows": merged}


def store(out: Path, meta: dict, update) -> dict:
    """Put ``update(entry)`` in place of the entry of ``meta``'s setting in <out>/results.json,
    and write results.md; returns the new entry."""
    path = out / "results.json"
    entries = read_entries(path)
    entry = update(entry_for(entries, setting_of(meta)))
    entries = replace_entry(entries, entry)
    write_entries(path, entries)
    (out / "results.md").write_text(report_text(entries))
    return entry


def max_batch_table(rows: list[dict]) -> list[str]:
    """Lines of results.md: the largest batch x sequence of a training step (``--max-batch``)."""
    if not rows:
        return []
    seqs = sorted({r["seq"] for r in rows})
    by = {(r["contender"], r["seq"]): r for r in rows}
    lines = [
        "",
        f"Largest batch of a training step that fits ({rows[0]['device']}, "
        f"{rows[0]['gpu_gib']:.0f} GiB; vocab {rows[0]['config']['vocab_size']}):",
        "",
        "| contender | " + " | ".join(f"seq {s}" for s in seqs) + " |",
        "|---|" + "---|" * len(seqs),
    ]
    for c in dict.fromkeys(r["contender"] for r in rows):
        cells = [
            "—" if (c, s) not in by else f"{by[(c, s)]['batch']} ({by[(c, s)]['tokens']} tokens)"
            for s in seqs
        ]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return lines


def _host_table(shapes, contenders, by) -> list[str]:
    """Lines of results.md: per training step, the host time to issue it beside its wall time (runs
    before that column was recorded have none)."""
    if not any("train_host_ms" in r for r in by.values()):
        return []
    lines = [
        "",
        "Host time to issue a training step (the forward and backward calls, until they return) of",
        "its wall time: a step whose host time is close to its wall time was bound by the host,",
        "which differs from one VM to the next, so its wall time compares hosts more than kernels.",
        "",
        "| contender | " + " | ".join(f"host / wall {s}" for s in shapes) + " |",
        "|---|" + "---|" * len(shapes),
    ]
    for c in contenders:
        cells = []
        for s in shapes:
            r = by.get((s, c))
            host = None if r is None else r.get("train_host_ms")
            cells.append("—" if host is None else f"{host:.1f} / {r['train_ms']:.1f} ms")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return lines


def _index(rows: list[dict]) -> tuple[list[str], list[str], dict]:
    """(shapes, contenders, {(shape, contender): row}), both lists in the order first met."""
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    contenders = list(dict.fromkeys(r["contender"] for r in rows))
    return shapes, contenders, {(r["shape"], r["contender"]): r for r in rows}


def setting_title(setting: dict) -> str:
    """``transformers 4.57, vocab 32000``: a setting's heading in results.md."""
    return f"transformers {setting['transformers']}, vocab {setting['vocab']}"


def setting_slug(setting: dict) -> str:
    """``tf4.57-v32000``: a setting in file names (its plot)."""
    return f"tf{setting['transformers']}-v{setting['vocab']}"


def report_text(entries: list[dict]) -> str:
    """results.md: for each setting, its timing table (``markdown``), the best of ours against
    the best peer with issue 38's targets (``verdict_lines``) and its largest batches."""
    lines = [
        "# End-to-end: Llama-style 1.1B model, bf16",
        "",
        "The latest run of each setting (transformers line, vocabulary); earlier runs are in git",
        "history.",
    ]
    for entry in entries:
        lines += ["", f"## {setting_title(entry['setting'])}", ""]
        if entry.get("rows"):
            lines.append(markdown(entry["rows"]).rstrip("\n"))
            lines += ["", *verdict_lines(entry["rows"])]
        lines += max_batch_table(entry.get("max_batch", []))
    return "\n".join(lines) + "\n"


def markdown(rows: list[dict]) -> str:
    """One setting's tables in results.md: speedups over eager and peak memory per shape, and
    the host time of the training steps."""
    shapes, contenders, by = _index(rows)
    meta = rows[0]
    liger = meta.get("liger_kernel") or "not installed"
    runs = list(dict.fromkeys(r.get("run", r["date"]) for r in rows))
    lines = [
        f"{meta['device']}, {meta['date']}; torch {meta['torch']}, transformers {meta['transformers']}, "
        f"triton {meta['triton']}, liger-kernel {liger}. Config: {meta['config']}, SDPA attention.",
        "Training step: forward + backward of the causal-LM loss, no optimizer. Prefill: forward without grad,",
        "logits of the last position only. Each contender's step between CUDA events, in rounds that run every",
        f"contender once in rotating order ({meta.get('timing', 'median of 10 after warm-up')}); speedup over eager.",
        "",
        "| contender | "
        + " | ".join(f"train {s}" for s in shapes)
        + " | "
        + " | ".join(f"prefill {s}" for s in shapes)
        + " | "
        + " | ".join(f"peak GiB {s}" for s in shapes)
        + " |",
        "|---|" + "---|" * (3 * len(shapes)),
    ]
    if len(runs) > 1:  # a run of a few contenders or shapes keeps the others' rows
        lines[4:4] = [
            f"Rows from {len(runs)} runs ({', '.join(runs)}); the line above names the first. "
            "Contenders of different runs were timed on different machines or at different times.",
            "",
        ]
    for c in contenders:
        cells = []
        for key in ("train_ms", "prefill_ms"):
            for s in shapes:
                r, base = by.get((s, c)), by.get((s, "eager"))
                cells.append(
                    "—"
                    if r is None or base is None
                    else f"{r[key]:.1f} ms ({base[key] / r[key]:.2f}x)"
                )
        for s in shapes:
            r = by.get((s, c))
            cells.append("—" if r is None else f"{r['train_peak_gib']:.1f}")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    lines += _host_table(shapes, contenders, by)
    return "\n".join(lines) + "\n"


def report(out: Path) -> None:
    """results.json -> results.md (``report_text``) and, per setting, e2e-<setting>.png (where
    matplotlib is installed: without it, results.md alone, and a line saying so)."""
    entries = read_entries(out / "results.json")
    if not entries:
        sys.exit(f"{out / 'results.json'} holds no results: run a shape first")
    (out / "results.md").write_text(report_text(entries))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(
            f"wrote {out / 'results.md'}; no plots: matplotlib is not installed "
            "(pip install matplotlib, or this package's bench extra)"
        )
        return
    for entry in entries:
        if entry.get("rows"):
            plot(entry["rows"], out / f"e2e-{setting_slug(entry['setting'])}.png")


def plot(rows: list[dict], path: Path) -> None:
    """Speedups over eager of one setting's rows, training step and prefill, to ``path``."""
    shapes, contenders, by = _index(rows)
    meta = rows[0]

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(contenders)
    for ax, key, title in (
        (axes[0], "train_ms", "training step"),
        (axes[1], "prefill_ms", "prefill"),
    ):
        for i, c in enumerate(contenders):
            speedups = [
                by[(s, "eager")][key] / by[(s, c)][key]
                if (s, c) in by and (s, "eager") in by
                else 0
                for s in shapes
            ]
            ax.bar([x + i * width for x in range(len(shapes))], speedups, width, label=c)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(shapes))], shapes)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_title(
            f"{title}: speedup over eager ({meta['device']}, transformers "
            f"{meta['transformers']}, vocab {meta['config']['vocab_size']})",
            fontsize=9,
        )
        ax.set_xlabel("batch x sequence")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
