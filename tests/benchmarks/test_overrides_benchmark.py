"""benchmarks/overrides.py: a quick run end to end (on the CPU through Triton's interpreter,
where no GPU is), and its report from saved rows."""

import json
import os

import pytest
import torch

from benchmarks import overrides
from kernels.overrides import active_aten_overrides  # noqa: E402


@pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs a GPU or Triton's interpreter",
)
def test_a_quick_run_writes_every_case_and_the_block(tmp_path):
    meta, results = overrides.run(str(tmp_path), list(overrides.OP_CASES), quick=True, rep_ms=1)
    assert active_aten_overrides() == {}
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["meta"]["quick"] is True and saved["results"] == results
    on_gpu = torch.cuda.is_available()
    for case in overrides.OP_CASES:
        rows = {r["impl"]: r for r in results if r["case"] == case}
        assert set(rows) == {"aten", "override"}
        for row in rows.values():
            assert row["fwd_ms"] > 0 and row["fwd_bwd_ms"] > 0
            assert ("graph_fwd_ms" in row) == on_gpu
        paths = rows["override"]["paths"]
        if case == "RMSNorm" and not on_gpu:
            assert paths == {}  # PyTorch has no CPU kernel for _fused_rms_norm to override
        else:
            assert any(key.endswith(": ours") for key in paths), (case, paths)
    block = [r for r in results if r["case"].startswith("LlamaBlock")]
    assert {(r["case"], r["impl"]) for r in block} == {
        (case, impl)
        for case in ("LlamaBlock-train", "LlamaBlock-inference")
        for impl in ("aten", *overrides.BLOCK_OVERRIDES)
    }
    silu = next(r for r in block if r["case"] == "LlamaBlock-train" and r["impl"].endswith("silu"))
    assert silu["paths"]["silu: ours"] == overrides.QUICK_BLOCK_CONFIG["layers"]
    text = (tmp_path / "results.md").read_text()
    for heading in ("## Decision", "## LayerNorm: layer_norm", "## Untagged Llama block"):
        assert heading in text


def _row(case, impl, fwd_ms, graph_ms=None, rounds=None):
    row = {
        "case": case,
        "shape": [64, 32],
        "impl": impl,
        "fwd_ms": fwd_ms,
        "fwd_bwd_ms": 2 * fwd_ms,
    }
    if graph_ms is not None:
        row["graph_fwd_ms"] = graph_ms
        row["graph_fwd_bwd_ms"] = 2 * graph_ms
    if rounds is not None:
        row["fwd_rounds_ms"] = rounds
    return row


def test_report_gives_pytorch_over_override_speed_and_the_calls(tmp_path):
    results = [
        _row("LayerNorm", "aten", 0.020, 0.010, rounds=[0.020, 0.022, 0.020, 0.024]),
        {**_row("LayerNorm", "override", 0.010, 0.008, rounds=[0.010] * 4),
         "paths": {"native_layer_norm: ours": 1, "native_layer_norm_backward: ours": 1}},
        _row("SiLU", "aten", 0.004),
        {**_row("SiLU", "override", 0.005), "paths": {"silu: non-contiguous input": 1}},
        {"case": "LlamaBlock-train", "shape": [8, 512], "impl": "aten", "ms": 10.0,
         "rounds_ms": [10.0, 10.0]},
        {"case": "LlamaBlock-train", "shape": [8, 512], "impl": "override rms_norm", "ms": 8.0,
         "rounds_ms": [8.0, 8.0], "paths": {"_fused_rms_norm: ours": 9}},
    ]  # fmt: skip
    meta = {"device": "GPU", "date": "d", "torch": "t", "triton": "tr", "dtype": "bfloat16",
            "timing": "rounds"}  # fmt: skip
    overrides.write_markdown(meta, results, tmp_path / "results.md")
    text = (tmp_path / "results.md").read_text()
    layer_norm = text.split("## LayerNorm")[1].split("##")[0]
    (row,) = [line for line in layer_norm.splitlines() if line.startswith("| 64x32")]
    cells = row.strip("| ").split(" | ")
    # PyTorch 20 us, the override 10 us: 2.00x; per-round ratios 2.0, 2.2, 2.0, 2.4.
    assert cells[1] == "20.0 / 10.0: 2.00x (2.00-2.25)"
    assert cells[3] == "10.0 / 8.0: 1.25x"
    assert cells[-1] == "native_layer_norm: ours 1; native_layer_norm_backward: ours 1"
    decision = text.split("## Decision")[1].split("##")[0]
    assert "| SiLU | silu | 0.80-0.80x |" in decision
    assert "| LlamaBlock-train | 8x512 | override rms_norm | 8.000 | 1.25x (1.25-1.25) |" in text
