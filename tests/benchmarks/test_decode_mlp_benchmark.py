"""benchmarks/decode_mlp.py's plumbing without a GPU: the whole run and the sweep on the CPU
(tiny shapes, Triton's interpreter), with CUDA-graph capture and the timing replaced by stand-ins,
then the tables and files they write."""

import json
import os
import sys

import pytest
import torch

from benchmarks import decode_mlp as bench

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="the script runs here on the CPU, whose tensors the kernels take only through "
    "Triton's interpreter (TRITON_INTERPRET=1)",
)


@pytest.fixture
def on_cpu(monkeypatch):
    """The script on the CPU: no capture (a replay is the call), timings made up from each
    contender's name (ms per replay: 1.0 for ``decode``, else 2.0; configurations: their
    block_n / 16), no torch.compile."""
    calls = []
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "graphs", lambda c: c)
    monkeypatch.setattr(bench.torch, "compile", lambda fn, **_: fn)

    def samples(replays, rep_ms, block=6):
        calls.append(sorted(replays))
        for replay in replays.values():
            replay()
        return {name: [[_made_up_ms(name)] * 2] * 3 for name in replays}

    monkeypatch.setattr(bench.timing, "interleaved_samples", samples)
    return calls


def _made_up_ms(name: str) -> float:
    if name.startswith("n"):  # a configuration label: n<block_n> ...
        return int(name.split()[0][1:]) / 16
    return 1.0 if name == bench.OURS else 2.0


def _run(monkeypatch, tmp_path, *extra):
    argv = ["decode_mlp.py", "--out", str(tmp_path), "--shapes", "32x48", "--rows", "1,3"]
    monkeypatch.setattr(sys, "argv", [*argv, "--calls", "2", *extra])
    bench.main()


def test_run_writes_times_ratios_and_bandwidth(on_cpu, monkeypatch, tmp_path):
    _run(monkeypatch, tmp_path)
    assert on_cpu == [sorted(bench.IMPLS)] * 2  # one interleaved timing per shape and row count
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    assert [(r["rows"], r["impl"]) for r in results] == [
        (rows, impl) for rows in (1, 3) for impl in bench.IMPLS
    ]
    ours = results[2]
    assert ours["impl"] == "decode" and ours["us"] == 1e3 / 2  # 1 ms a replay of 2 calls
    moved = bench.mlp_bytes(32, 48, 1)
    assert ours["pct_hbm"] == pytest.approx(100 * moved / 500e-6 / 1e9 / bench.PEAK_GBPS)
    assert max(r["max_abs_diff_vs_eager"] for r in results) < 0.1  # bf16, O(1) values
    text = (tmp_path / "results.md").read_text()
    (row,) = [line for line in text.splitlines() if line.startswith("| 32/48 | 1 |")]
    # eager, current, decode, compile us; then decode against each peer: twice as fast
    assert row.strip("| ").split(" | ")[2:] == [
        "1000.0 (0%)", "1000.0 (0%)", "500.0 (0%)", "1000.0 (0%)",
        "2.00x (2.00-2.00)", "2.00x (2.00-2.00)", "2.00x (2.00-2.00)",
    ]  # fmt: skip


def test_sweep_times_every_candidate_and_marks_the_rule(on_cpu, monkeypatch, tmp_path, request):
    decode = bench.load_decode()  # the activation package, whose decode functions the run calls
    configs = [decode.GemvConfig(16, 32, 1, 4, 1, False), decode.GemvConfig(32, 32, 2, 4, 2, True)]
    broken = decode.GemvConfig(64, 32, 1, 4, 1, True)  # made to compute zeros below

    def candidates(m, n, k, gated, sms):
        rule = decode.gemv_config(m, n, k, gated, sms)
        return [rule, *configs, broken]

    monkeypatch.setattr(decode, "candidate_configs", candidates)
    for name in ("gemv", "gated_gemv"):
        kernel = getattr(decode, name)

        def wrong_when_broken(*args, kernel=kernel):
            out = kernel(*args)
            return out.zero_() if args[-1] == broken else out

        monkeypatch.setattr(decode, name, wrong_when_broken)
    _run(monkeypatch, tmp_path, "--sweep")
    assert len(on_cpu) == 2 * len(bench.SWEEP_KERNELS)  # per row count and kernel
    assert all(bench.CUBLAS in names and len(names) == 4 for names in on_cpu)
    results = json.loads((tmp_path / "sweep.json").read_text())["results"]
    rules = [r for r in results if r["rule"]]
    assert len(rules) == 4 and all(r["config_fields"]["split_k"] >= 1 for r in rules)
    text = (tmp_path / "sweep.md").read_text()
    assert "### gate_up, 32/48, rows 3" in text and "(rule)" in text
    assert text.count("Left out: n64 k32 s1 w4 st1 dot: wrong or failed: relative error 1.") == 4
    # The fastest first: block_n 16 (1 ms a replay), then cuBLAS and block_n 32 (2 ms), then the
    # rule's pick for 3 rows (tl.dot with block_n 64: 4 ms).
    section = text.split("### down, 32/48, rows 3")[1].split("###")[0]
    rows = [line for line in section.splitlines() if line.startswith(("| n", "| cuBLAS"))]
    assert len(rows) == 4 and "(rule)" in rows[3] and "| n64 " in rows[3]
    assert rows[0] == "| n16 k32 s1 w4 st1 fma | 500.00 | 0.0% | 1.00x | 2.00x |"
    assert all(row.endswith("| 0.50x | 1.00x |") for row in rows[1:3])
    assert rows[3].endswith("| 0.25x | 0.50x |")


def test_weight_copies_outgrow_l2_but_not_the_graph():
    bf16 = torch.bfloat16
    assert bench.weight_sets(2048, 5632, bf16, 20) == 4  # 66 MiB a copy: 4 make 256 MiB
    assert bench.weight_sets(4096, 14336, bf16, 20) == 2  # one is past 256 MiB: still two
    assert bench.weight_sets(32, 48, bf16, 3) == 3  # tiny: one copy per call
    assert bench.parse_shapes("2048x5632,4096x14336") == [(2048, 5632), (4096, 14336)]
    assert bench.kernel_bytes("down", 2048, 5632, 1) == (2048 * 5632 + 5632 + 2048) * 2
