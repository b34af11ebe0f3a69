"""benchmarks/e2e_report.py: how a run's rows are kept (one entry per setting in results.json, a
contender's rows at a shape replaced by its next run) and the report rendered from them."""

import json
import sys

import pytest

from benchmarks import e2e_report

OURS_FCE = "ours (kernelized, fused CE)"


def _row(shape, contender, train, host=None, transformers="4.57.6", vocab=32000):
    row = {
        "shape": shape, "contender": contender, "device": "GPU", "date": "2026-11-23",
        "torch": "2", "transformers": transformers, "triton": "3", "liger_kernel": "0.7",
        "config": {"vocab_size": vocab}, "train_ms": train, "prefill_ms": train / 3,
        "train_peak_gib": 1.0,
    }  # fmt: skip
    if host is not None:
        row["train_host_ms"] = host
    return row


def test_report_gives_host_time_beside_wall_time_when_recorded():
    rows = [_row("8x512", "eager", 70.0, 45.5), _row("8x512", "ours (kernelized)", 50.0, 48.25)]
    text = e2e_report.markdown(rows)
    assert "| eager | 70.0 ms (1.00x) | 23.3 ms (1.00x) | 1.0 |" in text
    assert "| ours (kernelized) | 50.0 ms (1.40x) |" in text
    assert "| contender | host / wall 8x512 |" in text
    assert "| eager | 45.5 / 70.0 ms |" in text
    assert "| ours (kernelized) | 48.2 / 50.0 ms |" in text


def test_report_of_runs_without_host_time_has_no_host_table():
    text = e2e_report.markdown(
        [_row("1x4096", "eager", 80.0), _row("1x4096", "ours (kernelized)", 60.0)]
    )
    assert "host / wall" not in text
    assert "| ours (kernelized) | 60.0 ms (1.33x) |" in text


def test_max_batch_table():
    meta = {"device": "GPU", "gpu_gib": 79.6, "config": {"vocab_size": 128256}}
    rows = [
        {**meta, "contender": "eager", "seq": 2048, "batch": 3, "tokens": 6144},
        {**meta, "contender": "ours (kernelized, fused CE)", "seq": 2048, "batch": 9},
        {**meta, "contender": "ours (kernelized, fused CE)", "seq": 4096, "batch": 4},
    ]
    rows[1]["tokens"], rows[2]["tokens"] = 9 * 2048, 4 * 4096
    lines = e2e_report.max_batch_table(rows)
    assert "Largest batch of a training step that fits (GPU, 80 GiB; vocab 128256):" in lines
    assert "| eager | 3 (6144 tokens) | — |" in lines
    assert "| ours (kernelized, fused CE) | 9 (18432 tokens) | 4 (16384 tokens) |" in lines
    assert e2e_report.max_batch_table([]) == []


def _store_shape(out, rows):
    e2e_report.store(out, rows[0], lambda entry: e2e_report.replace_rows(entry, rows))


def test_a_run_replaces_its_contenders_at_its_shapes_in_its_setting_and_keeps_the_others(tmp_path):
    """One folder for every setting: each (transformers line, vocabulary) is one entry of
    results.json, recorded as data; a new run replaces only the rows of the contenders and
    shapes it timed, in its own setting, whatever patch release of the line it ran on."""
    _store_shape(tmp_path, [_row("8x512", "eager", 70.0), _row("8x512", "ours (kernelized)", 50.0)])
    _store_shape(tmp_path, [_row("1x4096", "eager", 90.0)])
    _store_shape(tmp_path, [_row("8x512", "eager", 80.0, transformers="5.24.0")])
    _store_shape(tmp_path, [_row("8x512", "eager", 60.0, vocab=128256)])
    # The latest 8x512 run of eager on 4.57 (another patch release): ours' row stays.
    _store_shape(tmp_path, [_row("8x512", "eager", 75.0, transformers="4.57.1")])

    entries = json.loads((tmp_path / "results.json").read_text())["entries"]
    settings = [e["setting"] for e in entries]
    assert settings == [
        {"transformers": "4.57", "vocab": 32000},
        {"transformers": "4.57", "vocab": 128256},
        {"transformers": "5.24", "vocab": 32000},
    ]
    # Ordered by shape (llama.SHAPES) and contender (llama.CONTENDERS), whatever order they ran in.
    assert [(r["shape"], r["contender"], r["train_ms"]) for r in entries[0]["rows"]] == [
        ("8x512", "eager", 75.0),
        ("8x512", "ours (kernelized)", 50.0),
        ("1x4096", "eager", 90.0),
    ]
    text = (tmp_path / "results.md").read_text()
    for title in ("transformers 4.57, vocab 32000", "transformers 5.24, vocab 32000"):
        assert f"## {title}" in text
    assert text == e2e_report.report_text(entries)


def test_rows_of_retired_contenders_are_dropped_and_mixed_runs_are_named():
    """The compiled contender of ours without the fused loss is no longer built: its old rows
    go at the next run, not beside the new ones. Rows kept from another run say so."""
    old = {**_row("8x512", "ours (kernelized + compile)", 60.0), "run": "2026-11-23T10:00:00"}
    kept = {**_row("8x512", "eager", 70.0), "run": "2026-11-23T10:00:00"}
    new = {**_row("8x512", "ours (kernelized, fused CE)", 50.0), "run": "2026-11-26T09:00:00"}
    entry = e2e_report.replace_rows({"setting": {}, "rows": [old, kept]}, [new])
    assert [r["contender"] for r in entry["rows"]] == ["eager", "ours (kernelized, fused CE)"]
    text = e2e_report.markdown(entry["rows"])
    assert "Rows from 2 runs (2026-11-23T10:00:00, 2026-11-26T09:00:00)" in text
    assert "Rows from" not in e2e_report.markdown([kept])


def test_max_batch_run_is_kept_in_its_setting(tmp_path):
    meta = {"device": "GPU", "gpu_gib": 80.0, "transformers": "4.57.6"}
    meta["config"] = {"vocab_size": 128256}
    rows = [{**meta, "contender": "eager", "seq": 2048, "batch": 3, "tokens": 6144}]
    e2e_report.store(tmp_path, rows[0], lambda entry: {**entry, "max_batch": rows})
    _store_shape(tmp_path, [_row("8x512", "eager", 60.0, vocab=128256)])
    (entry,) = json.loads((tmp_path / "results.json").read_text())["entries"]
    assert entry["max_batch"] == rows and [r["shape"] for r in entry["rows"]] == ["8x512"]
    assert "| eager | 3 (6144 tokens) |" in (tmp_path / "results.md").read_text()


def test_report_without_results_says_what_to_run(tmp_path):
    with pytest.raises(SystemExit, match="run a shape first"):
        e2e_report.report(tmp_path)


def test_report_without_matplotlib_writes_results_md_and_says_there_are_no_plots(
    tmp_path, monkeypatch, capsys
):
    """--report where matplotlib is not installed (neither of the test environments has it):
    results.md again, and a line naming what to install, not a traceback."""
    rows = [_row("8x512", "eager", 70.0), _row("8x512", "ours (kernelized)", 50.0)]
    _store_shape(tmp_path, rows)
    (tmp_path / "results.md").unlink()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    e2e_report.report(tmp_path)
    entries = json.loads((tmp_path / "results.json").read_text())["entries"]
    assert (tmp_path / "results.md").read_text() == e2e_report.report_text(entries)
    assert (
        "no plots: matplotlib is not installed (pip install matplotlib" in capsys.readouterr().out
    )
    assert not list(tmp_path.glob("*.png"))


def test_report_shows_best_of_ours_and_a_line_per_target_and_shape():
    rows = [
        {**_row("8x512", "eager", 90.0), "prefill_peak_gib": 3.0},
        {**_row("8x512", OURS_FCE, 60.0), "train_peak_gib": 0.5, "prefill_peak_gib": 2.0},
        {**_row("1x4096", "eager", 80.0), "prefill_peak_gib": 3.0},
    ]
    text = e2e_report.report_text(
        [{"setting": {"transformers": "5.24", "vocab": 32000}, "rows": rows}]
    )
    assert (
        "| 8x512 | train | ours (kernelized, fused CE) | 60.0 | 0.5 | eager | 90.0 | 1.0 | 1.50x "
        "| 1.0 (eager) |" in text
    )
    assert "| 1x4096 | prefill | — | — | — | eager | 26.7 | 3.0 | — | 3.0 (eager) |" in text
    lines = [line for line in text.splitlines() if line.startswith("- ")]
    assert [line.split(": ")[0:3:2] for line in lines] == [
        ["- 8x512", "N/A (train"],
        ["- 8x512", "PASS (train 60.0 ms (ours-fce) vs 90.0 ms (eager)"],
        ["- 1x4096", "N/A (train"],
        ["- 1x4096", "N/A (train"],
    ]
