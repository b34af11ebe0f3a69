"""benchmarks/ops.py's model-card tables (``card_tables``), which need no GPU."""

import json
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

import ops  # noqa: E402


def _row(impl, fwd_ms, graph_fwd_bwd_ms, moved_fwd=3e6, moved_fb=8e6, copy_gbs=3000.0):
    row = {"op": "SiluAndMul", "shape": [64, 32], "impl": impl}
    for key, ms, moved in (
        ("fwd", fwd_ms, moved_fwd),
        ("fwd_bwd", 2 * fwd_ms, moved_fb),
        ("graph_fwd", fwd_ms, moved_fwd),
        ("graph_fwd_bwd", graph_fwd_bwd_ms, moved_fb),
    ):
        row[key + "_ms"] = ms
        row[key + "_gbs"] = moved / (ms * 1e-3) / 1e9
        row[key + "_pct"] = 100 * row[key + "_gbs"] / copy_gbs
    return row


def test_card_compares_ours_with_the_fastest_peer_of_each_column():
    results = [
        _row("eager", fwd_ms=0.004, graph_fwd_bwd_ms=0.020),
        _row("compile", fwd_ms=0.002, graph_fwd_bwd_ms=0.009),
        _row("liger", fwd_ms=0.003, graph_fwd_bwd_ms=0.006),
        _row("ours", fwd_ms=0.001, graph_fwd_bwd_ms=0.008),
        {**_row("ours", 1, 1), "op": "RMSNorm"},  # another op's row is not in this card
    ]
    lines = ops.card_tables(results, "SiluAndMul").splitlines()
    rows = [line for line in lines if line.startswith("| 64x32")]
    assert len(rows) == 2  # eager calls, then CUDA graph
    eager, graph = (line.strip("| ").split(" | ") for line in rows)
    assert eager[0] == "64x32 (in 64x64)"
    # forward: ours 3 MB in 1 us = 3000 GB/s = 100% of copy; best peer compile at 2 us, 1500 GB/s
    assert eager[1:4] == ["3000 (100%)", "compile 1500", "2.00x"]
    # forward+backward under CUDA graph: Liger is fastest (6 us), ours takes 8 us
    assert graph[4:7] == ["1000 (33%)", "liger 1333", "0.75x"]
    assert lines.index("Eager calls:") < lines.index("CUDA graph:")


def test_merge_keeps_each_runs_rows_and_copy_bandwidth(tmp_path):
    """``ops.py --merge``: a benchmark split over several runs (one GPU command each) becomes one
    result set whose rows keep the % of their own run's copy bandwidth, and whose tables name
    every run's bandwidth."""
    meta = {"device": "GPU", "date": "2026-11-24", "torch": "t", "triton": "tr", "liger": "l",
            "dtype": "bf16", "timing": "graphs"}  # fmt: skip
    runs = [
        (["SiluAndMul"], 4000.0, [_row("ours", 0.001, 0.008, copy_gbs=4000.0)]),
        (["RMSNorm"], 4200.0, [{**_row("ours", 0.002, 0.009, copy_gbs=4200.0), "op": "RMSNorm"}]),
    ]
    folders = []
    for i, (op_names, copy_gbs, rows) in enumerate(runs):
        folder = tmp_path / f"part{i}"
        folder.mkdir()
        run_meta = {**meta, "copy_gbs": copy_gbs, "ops": op_names}
        (folder / "results.json").write_text(json.dumps({"meta": run_meta, "results": rows}))
        folders.append(str(folder))
    merged_meta, results = ops.merge(folders)
    assert [r["op"] for r in results] == ["SiluAndMul", "RMSNorm"]
    assert results[0]["fwd_pct"] == runs[0][2][0]["fwd_pct"]  # 3000 GB/s of 4000: 75%
    assert results[0]["fwd_pct"] == 75.0
    assert [p["copy_gbs"] for p in merged_meta["parts"]] == [4000.0, 4200.0]
    ops.write_markdown(merged_meta, results, tmp_path / "results.md")
    header = (tmp_path / "results.md").read_text()
    assert "4000 GB/s (SiluAndMul); 4200 GB/s (RMSNorm)" in header


def test_ratio_quartiles_pair_each_rounds_medians():
    # Round medians: peer 10, 11, 12, 13 ms; ours 10 ms in every round (the odd call out of
    # each round is ignored by the median). Per-round ratios 1.0, 1.1, 1.2, 1.3.
    peer = [[10, 10, 99], [11, 11, 0], [12, 12, 12], [13, 1, 13]]
    ours = [[10, 10, 10]] * 4
    q1, q2, q3 = ops.ratio_quartiles(peer, ours)
    assert (round(q1, 3), round(q2, 3), round(q3, 3)) == (1.075, 1.15, 1.225)
    assert ops.pooled_median(ours) == 10
    assert ops.pooled_median([[1, 2], [3, 4, 5]]) == 3


def test_ratio_cells_show_the_rounds_quartiles_when_kept(tmp_path):
    ours = _row("ours", 0.001, 0.008)
    liger = _row("liger", 0.001, 0.008)
    compile_ = _row("compile", 0.002, 0.008)
    # Level on the pooled medians, but liger slower in 3 rounds out of 5: quartiles 1.00-1.10.
    liger["graph_fwd_rounds_ms"] = [0.001, 0.0011, 0.0011, 0.0011, 0.001]
    ours["graph_fwd_rounds_ms"] = [0.001] * 5
    meta = {"device": "GPU", "date": "d", "torch": "t", "triton": "tr", "liger": "l",
            "dtype": "bf16", "timing": "rounds", "copy_gbs": 3000.0}  # fmt: skip
    ops.write_markdown(meta, [compile_, liger, ours], tmp_path / "results.md")
    text = (tmp_path / "results.md").read_text()
    graph_fwd = text.split("## SiluAndMul: forward, CUDA graph")[1].split("##")[0]
    (row,) = [line for line in graph_fwd.splitlines() if line.startswith("| 64x32")]
    # ours vs compile: no rounds kept, the ratio alone; ours vs liger with its quartiles
    assert row.strip("| ").split(" | ")[-2:] == ["2.00x", "1.00x (1.00-1.10)"]


# ---- the kept results: what the README and the model cards show comes from them -------------

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"


def _results(folder: Path) -> list:
    return json.loads((folder / "results.json").read_text())["results"]


def _table_rows(text: str) -> list:
    """The body rows of the markdown tables in ``text`` (no header or separator lines)."""
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    return [line for line in lines if not line.startswith(("| shape |", "| op |", "| contender |"))]


def rendered_columns(lines: set[str]) -> int:
    """The number of ``|`` in the rows of a rendered table (its header's)."""
    return max((line.count("|") for line in lines), default=0)


def test_model_cards_render_from_the_kept_results():
    """Every benchmark row of a model card is a row ``ops.py --card`` prints from the results
    folder the card names: moving or re-running results cannot leave a card behind."""
    import loss

    for card in sorted((ROOT / "library").glob("*/README.md")):
        text = card.read_text()
        match = re.search(r"(ops|loss)\.py\s+--card\s+--out\s+(benchmarks/results/\S+?)`", text)
        assert match, f"{card} does not name the results its tables come from"
        command, folder = match.groups()
        if command == "loss":  # the fused loss's card: loss.py's table of its own results
            with open(ROOT / folder / "results.json") as f:
                rendered = set(loss.card_table(json.load(f)["results"]).splitlines())
            rows = [
                row
                for row in _table_rows(text)
                if re.match(r"\| \d+ x \d+ -> \d+", row)
                and "GiB" not in row
                and row.count("|") == rendered_columns(rendered)
            ]
            assert rows, f"{card} has no benchmark table"
            assert [row for row in rows if row not in rendered] == []
            continue
        results = _results(ROOT / folder)
        rendered = {
            line for op in dict.fromkeys(r["op"] for r in results)
            for line in ops.card_tables(results, op).splitlines()
        }  # fmt: skip
        rows = [row for row in _table_rows(text) if re.match(r"\| \d+x\d+", row)]
        assert rows, f"{card} has no benchmark table"
        assert [row for row in rows if row not in rendered] == []


def test_readme_shows_each_devices_latest_results():
    """benchmarks/README.md's tables are ``ops.py --summary`` of each device's kept ops run
    and the table of its kept e2e run."""
    readme = (BENCHMARKS / "README.md").read_text()
    devices = sorted(p.name for p in (BENCHMARKS / "results").iterdir() if p.is_dir())
    assert devices == ["h100", "h200"]
    for device in devices:
        folder = BENCHMARKS / "results" / device
        assert (folder / "NOTES.md").is_file()
        table = ops.summary_table(_results(folder / "ops"), f"results/{device}/ops")
        assert table in readme, f"README's {device} table differs from ops.py --summary"
        if (folder / "e2e").is_dir():
            e2e = (folder / "e2e" / "e2e.md").read_text()
            first = e2e[e2e.index("| contender | train") :].split("\n\n")[0]
            assert first in readme, f"README's {device} end-to-end table differs from e2e.md"


def test_benchmark_pages_link_to_what_exists():
    """Relative links of the benchmark pages and the pages that cite them resolve, anchors into
    a results.md included."""
    pages = [BENCHMARKS / "README.md", *sorted((BENCHMARKS / "results").glob("*/NOTES.md"))]
    pages += [
        *sorted((ROOT / "library").glob("*/README.md")),
        *sorted((ROOT / "docs").glob("*.md")),
    ]
    broken = []
    for page in pages:
        # Code is not a link: ``kernel[grid](...)`` in a code span is not one.
        text = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", page.read_text(), flags=re.S))
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if "://" in target or target.startswith("#"):
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve()
            if not resolved.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and resolved.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", resolved.read_text(), re.M)
                slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
                if anchor not in slugs:
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []
