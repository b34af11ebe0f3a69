"""benchmarks/ops.py's model-card tables (``card_tables``), which need no GPU."""

import json

from benchmarks import ops, timing


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
    q1, q2, q3 = timing.ratio_quartiles(peer, ours)
    assert (round(q1, 3), round(q2, 3), round(q3, 3)) == (1.075, 1.15, 1.225)
    assert timing.pooled_median(ours) == 10
    assert timing.pooled_median([[1, 2], [3, 4, 5]]) == 3


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
