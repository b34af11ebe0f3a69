"""benchmarks/compile_backend.py: its quick mode runs end to end on the CPU (our kernels through
Triton's interpreter, eager downstream), and its tables render from results."""

import json

from benchmarks import compile_backend


def test_quick_mode_runs_and_writes_results(tmp_path):
    meta, results = compile_backend.main(["--quick", "--models", "llama", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["meta"]["quick"] is True
    quick = compile_backend.LLAMA_QUICK
    name = f"llama {quick['batch']}x{quick['seq']}"
    assert saved["meta"]["configs"][name]["layers"] == quick["layers"]
    rows = {(r["contender"], r["mode"]): r for r in saved["results"]}
    ours = rows[("ours, eager downstream", "train")]
    # Two blocks of two norms, and the final norm; one gated MLP a block.
    assert ours["replaced"] == {"rms_norm": 5, "silu_mul": 2}
    assert ours["kept"] == {}
    assert ours["max_abs_diff"] < 1e-4
    assert rows[("eager", "train")]["vs_eager"][1] == 1.0
    assert {mode for _, mode in rows} == {"train", "infer"}
    text = (tmp_path / "results.md").read_text()
    assert f"## {name}" in text
    assert "| ours, eager downstream | train |" in text
    assert "rms_norm 5, silu_mul 2" in text


def _row(model, contender, mode, ms, vs_eager, vs_compile=None):
    return dict(model=model, mode=mode, contender=contender, ms=ms, rounds_ms=[ms],
                vs_eager=vs_eager, vs_compile=vs_compile, first_call_s=1.0, max_abs_diff=0.0,
                peak_gib=2.5 if mode == "train" else None, replaced={"rms_norm": 9}, kept={})  # fmt: skip


def test_markdown_and_merging_keep_other_models(tmp_path):
    meta = {"device": "GPU", "date": "d", "torch": "t", "triton": "tr", "timing": "rounds",
            "configs": {"resnet18": {"batch": 64}}}  # fmt: skip
    old = [_row("resnet18", "eager", "train", 30.0, [1, 1, 1])]
    (tmp_path / "results.json").write_text(json.dumps({"meta": meta, "results": old}))
    new = [_row("llama", "ours", "train", 10.0, [1.4, 1.5, 1.6], [0.9, 1.0, 1.1])]
    merged_meta, merged = compile_backend.merge_results(
        str(tmp_path / "results.json"), {**meta, "configs": {"llama": {"layers": 4}}}, new
    )
    assert [r["model"] for r in merged] == ["resnet18", "llama"]
    assert merged_meta["configs"] == {"resnet18": {"batch": 64}, "llama": {"layers": 4}}
    compile_backend.write_markdown(merged_meta, merged, str(tmp_path / "results.md"))
    text = (tmp_path / "results.md").read_text()
    assert "config: layers=4" in text
    row = next(line for line in text.splitlines() if line.startswith("| ours |"))
    assert row.split(" | ")[3:5] == ["1.50x (1.40-1.60)", "1.00x (0.90-1.10)"]
    assert "| 2.50 |" in row and "rms_norm 9" in row
