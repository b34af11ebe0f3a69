"""benchmarks/loss.py's tables and result merging, which need no GPU."""

import sys

from benchmarks import loss as bench


def _row(impl, ms, gib, rounds=None, **shape):
    shape = {"tokens": 4096, "hidden": 2048, "vocab": 32000, **shape}
    row = {**shape, "impl": impl, "ours_plan": [256, 32000], "liger_chunk_rows": 256}
    if ms is None:
        return {**row, "error": "out of memory"}
    return {**row, "fwd_bwd_ms": ms, "rounds_ms": rounds or [ms] * 4, "peak_extra_gib": gib}


def test_card_table_gives_times_memory_and_ratios():
    results = [
        _row("eager", None, None),
        _row("compile", 12.0, 3.0),
        _row("liger", 10.0, 1.2, rounds=[9.0, 10.0, 10.0, 11.0]),
        _row("ours", 8.0, 1.1),
        _row("ours", 1.0, 1.0, vocab=128256),  # another shape, no peers
    ]
    lines = bench.card_table(results).splitlines()
    assert lines[0].startswith("| tokens x hidden -> vocab | eager ms | compile ms | liger ms")
    row = next(line for line in lines if line.startswith("| 4096 x 2048 -> 32000"))
    cells = row.strip("| ").split(" | ")
    assert cells[1:5] == ["OOM", "12.00", "10.00", "8.00"]
    assert cells[5:9] == ["OOM", "3.00", "1.20", "1.10"]
    assert cells[9] == "1.25x [1.22-1.28]"  # liger 10 ms / ours 8 ms, quartiles over rounds
    assert cells[10].startswith("1.50x")
    other = next(line for line in lines if line.startswith("| 4096 x 2048 -> 128256"))
    assert other.endswith("| — | — |")


def test_merge_replaces_rows_of_the_same_shape_and_contender():
    old = [_row("ours", 9.0, 1.0), _row("liger", 10.0, 1.2)]
    new = [_row("ours", 8.0, 1.0)]
    merged = bench._merge(old, new)
    assert [(r["impl"], r["fwd_bwd_ms"]) for r in merged] == [("liger", 10.0), ("ours", 8.0)]


def test_results_md_lists_the_plans(tmp_path):
    meta = dict(
        device="GPU", date="today", torch="t", triton="tr", liger="l", dtype="bfloat16",
        timing="rounds", memory="peak",
    )  # fmt: skip
    results = [_row("ours", 8.0, 1.1), _row("liger", 10.0, 1.2)]
    bench.write_markdown(meta, results, tmp_path / "results.md")
    text = (tmp_path / "results.md").read_text()
    assert "| 4096 x 2048 -> 32000 | 256 x 32000 | 256 x 32000 |" in text


def test_merge_joins_runs_into_one_table(tmp_path, monkeypatch):
    import json

    meta = dict(
        device="GPU", date="today", torch="t", triton="tr", liger="l", dtype="bfloat16",
        timing="rounds", memory="peak",
    )  # fmt: skip
    for name, rows in (("a", [_row("ours", 8.0, 1.1)]), ("b", [_row("ours", 2.0, 1.0, vocab=5)])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps({"meta": meta, "results": rows}))
    out = tmp_path / "all"
    argv = ["loss.py", "--out", str(out), "--merge", str(tmp_path / "a"), str(tmp_path / "b")]
    monkeypatch.setattr(sys, "argv", argv)
    bench.main()
    merged = json.loads((out / "results.json").read_text())["results"]
    assert sorted(r["vocab"] for r in merged) == [5, 32000]
    assert "| 4096 x 2048 -> 5 |" in (out / "results.md").read_text()
