"""benchmarks/attention.py's parts that run without a GPU: FLOP counts and peaks, the varlen
documents and their padding, SDPA's contender functions against ours (same layouts, same GQA
grouping), and the report rendered from rows."""

import json
import sys

import pytest
import torch

from benchmarks import attention as bench
from tests.support.library import load


def test_flops_and_peaks():
    assert bench.visible_pairs(5, 5, False) == 25
    assert bench.visible_pairs(5, 5, True) == 15  # 1 + 2 + 3 + 4 + 5
    # Bottom-right causal with fewer queries: query i sees keys up to i + 3.
    assert bench.visible_pairs(2, 5, True) == 4 + 5
    assert bench.attention_flops(2, 5, 5, 64, False) == 4 * 2 * bench.HEADS * 64 * 25
    assert bench.peak_tflops("NVIDIA H100 80GB HBM3") == 989.4
    assert bench.peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert bench.peak_tflops("NVIDIA H200") == 989.4
    assert bench.peak_tflops("NVIDIA GeForce RTX 4090") is None


def test_varlen_documents_are_seeded_and_padding_round_trips():
    lengths = bench.varlen_lengths()
    assert lengths == bench.varlen_lengths() and len(lengths) == 64
    assert min(lengths) >= 128 and max(lengths) <= 4096 and len(set(lengths)) > 32
    packed = torch.randn(sum([3, 1, 2]), 2, 4)
    padded = bench.pad_documents(packed, [3, 1, 2])
    assert padded.shape == (3, 2, 3, 4)
    assert torch.equal(padded[1, :, 1:], torch.zeros(2, 2, 4))
    assert torch.equal(bench.unpad_documents(padded, [3, 1, 2]), packed)
    assert bench.cu_seqlens([3, 1, 2], "cpu").tolist() == [0, 3, 4, 6]


@pytest.mark.parametrize("gqa", ["enable_gqa", "repeat"])
def test_sdpa_contenders_compute_what_ours_does(gqa):
    # Ours in (batch, seq, heads, dim) and SDPA in (batch, heads, seq, dim), 4 query heads over
    # 2 kv heads, dense and padded-varlen: one attention, whichever the layout and grouping.
    attn = load("attention")
    q, k, v = torch.randn(1, 17, 4, 16), torch.randn(1, 17, 2, 16), torch.randn(1, 17, 2, 16)
    ours = attn.flash_attn_func(q, k, v, causal=True)
    sdpa = bench.sdpa_function("flash", gqa, True)
    theirs = sdpa(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)
    assert bench.relative_error(ours, theirs) < 1e-5
    lengths = [9, 8]
    cu = bench.cu_seqlens(lengths, "cpu")
    packed = attn.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 9, 9, causal=True)
    padded = sdpa(*(bench.pad_documents(t[0], lengths) for t in (q, k, v)))
    assert bench.relative_error(packed, bench.unpad_documents(padded, lengths)) < 1e-5


def test_padded_decode_contenders_compute_the_same_step():
    # Ours with the padding mask in the kernel and SDPA with it as a boolean mask (SDPA's own
    # backend choice on the CPU): one decode step of a left-padded batch.
    attn = load("attention")
    keep = bench.left_padding_mask(4, 40, "cpu")
    assert keep.sum(1).tolist() == [40, 35, 30, 25]  # b/4 x half the context padded
    q = torch.randn(4, 1, 4, 16)
    k_cache, v_cache = torch.randn(4, 40, 2, 16), torch.randn(4, 40, 2, 16)
    calls = bench.padded_decode_calls(attn, q, k_cache, v_cache, keep, {None: "enable_gqa"})
    assert list(calls) == [bench.OURS_PADDED, bench.OURS_PADDED_STEP, f"{bench.PADDED}None"]
    ours, sdpa = calls[bench.OURS_PADDED](), calls[f"{bench.PADDED}None"]()
    # As kernels_attention runs it, the key counts taken from the mask: the same output.
    assert torch.equal(calls[bench.OURS_PADDED_STEP](), ours)
    assert ours.shape == sdpa.shape == (4, 1, 4, 16)
    assert bench.relative_error(ours, sdpa) < 1e-5
    # The padding counts: the same step over the whole cache differs.
    assert bench.relative_error(attn.flash_attn_with_kvcache(q, k_cache, v_cache), sdpa) > 1e-2


def test_gqa_mode_reports_what_runs():
    assert bench.gqa_mode("flash", 64, True, device="cpu") == ("enable_gqa", "")
    mode, why = bench.gqa_mode("cudnn", 64, True, device="cpu")  # no cuDNN attention on a CPU
    assert mode is None and why


def _rows():
    key = {"section": "dense", "batch": 4, "seqlen": 4096, "dim": 128, "causal": True}
    flops = bench.attention_flops(4, 4096, 4096, 128, True)

    def row(impl, fwd_ms, rounds=None, **extra):
        r = {**key, "impl": impl, "fwd_flops": flops, "fwd_bwd_flops": 3.5 * flops, **extra}
        if fwd_ms is not None:
            r.update(fwd_ms=fwd_ms, fwd_rounds=rounds or [fwd_ms] * 4, fwd_bwd_ms=3 * fwd_ms,
                     fwd_bwd_rounds=[3 * fwd_ms] * 4)  # fmt: skip
        return r

    varlen = {"section": "varlen", "docs": 64, "tokens": 1000, "longest": 40, "dim": 128,
              "causal": True, "fwd_flops": 1e12, "fwd_bwd_flops": 3.5e12}  # fmt: skip
    decode = {"section": "decode", "batch": 1, "context": 4096, "dim": 128}
    return [
        row("ours", 1.0, rel_err_vs_sdpa=0.004),
        row("flash", 1.2, rounds=[1.1, 1.2, 1.2, 1.3], gqa="enable_gqa"),
        row("cudnn", 0.9, gqa="enable_gqa"),
        row("efficient", None, gqa=None, error="RuntimeError: No available kernel"),
        {**varlen, "impl": "ours", "fwd_ms": 5.0, "fwd_rounds": [5.0] * 4, "fwd_bwd_ms": 15.0,
         "fwd_bwd_rounds": [15.0] * 4, "peak_extra_gib": 1.0, "inputs_gib": 0.5},
        {**varlen, "impl": "flash", "gqa": "enable_gqa", "fwd_ms": 10.0, "fwd_rounds": [10.0] * 4,
         "fwd_bwd_ms": 30.0, "fwd_bwd_rounds": [30.0] * 4, "peak_extra_gib": 3.0,
         "inputs_gib": 2.0},
        {**decode, "impl": "ours", "step_ms": 0.02, "step_rounds": [0.02] * 4, "num_splits": 16,
         "rel_err_vs_sdpa": 0.05},
        {**decode, "impl": "flash", "gqa": "enable_gqa", "step_ms": 0.013,
         "step_rounds": [0.013] * 4},
        {**decode, "impl": "ours-splits-8", "num_splits": 8, "step_ms": 0.025,
         "step_rounds": [0.025] * 4},
        {**decode, "batch": 8, "impl": "ours-padded", "step_ms": 0.04, "step_rounds": [0.04] * 4,
         "rel_err_vs_sdpa": 0.003, "padding_share": 0.5},
        {**decode, "batch": 8, "impl": "ours-padded-step", "step_ms": 0.05,
         "step_rounds": [0.05] * 4},
        {**decode, "batch": 8, "impl": "masked-flash", "error": "RuntimeError: No kernel"},
        {**decode, "batch": 8, "impl": "masked-efficient", "step_ms": 0.06,
         "step_rounds": [0.06] * 4},
    ]  # fmt: skip


def test_report_tables(tmp_path):
    meta = {"device": "NVIDIA H100 80GB HBM3", "peak_tflops": 989.4, "date": "today",
            "torch": "t", "triton": "tr", "timing": "rounds"}  # fmt: skip
    bench.write_markdown(meta, _rows(), tmp_path / "results.md")
    text = (tmp_path / "results.md").read_text()
    dense = next(line for line in text.splitlines() if line.startswith("| 4x4096 | 128 | yes"))
    cells = dense.strip("| ").split(" | ")
    tf = bench.attention_flops(4, 4096, 4096, 128, True) / 1e-3 / 1e12
    assert cells[3:6] == ["1.000", f"{tf:.0f}", f"{100 * tf / 989.4:.0f}%"]
    assert cells[6:9] == ["1.200", "0.900", "failed"]
    # The best peer is cuDNN (0.9 ms): ours is 0.90x of it.
    assert cells[9].endswith("(cudnn)") and cells[10] == "0.90x [0.90-0.90]"
    assert "efficient: RuntimeError: No available kernel" in text
    varlen = next(line for line in text.splitlines() if line.startswith("| SDPA flash, padded"))
    assert varlen.endswith("| 3.00 | 2.00 | 2.00x [2.00-2.00] | 2.00x [2.00-2.00] |")
    decode = next(line for line in text.splitlines() if line.startswith("| 1 | 4096 |"))
    # Ours 20 us with 16 splits, flagged: its error 0.05 is over 2e-2.
    assert "| 20.0 (16) **(ours off by 0.05)** | 13.0 |" in decode
    assert decode.endswith("| 0.65x [0.65-0.65] (flash) |")
    # The split sweep: the rule chose 16; 8 forced took 25 us; the other counts did not run.
    assert "| 1 | 16 | — | — | — | 25.0 | — | — | — |" in text
    # The padded batch: ours 40 us (50 with the mask's preparation) against the masked
    # efficient backend's 60 (flash failed).
    assert "| 8 | 4096 | 40.0 | 50.0 | failed | — | 60.0 | 1.50x [1.50-1.50] (efficient) |" in text


def test_rows_of_a_later_run_replace_their_own(tmp_path, monkeypatch):
    rows = _rows()
    newer = {**rows[0], "fwd_ms": 0.5}
    merged = bench.merge(rows, [newer])
    assert len(merged) == len(rows) and merged[-1]["fwd_ms"] == 0.5
    meta = {"device": "GPU", "peak_tflops": None, "date": "d", "torch": "t", "triton": "tr",
            "timing": "rounds"}  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps({"meta": meta, "results": merged}))
    bench.main(["--report", "--out", str(tmp_path)])
    assert "| 4x4096 | 128 | yes | 0.500 |" in (tmp_path / "results.md").read_text()


def test_tma_rows_get_a_table_of_their_own(tmp_path):
    rows = _rows()
    meta = {"device": "GPU", "peak_tflops": None, "date": "d", "torch": "t", "triton": "tr",
            "timing": "rounds"}  # fmt: skip
    bench.write_markdown(meta, rows, tmp_path / "results.md")
    assert "tensor descriptors" not in (tmp_path / "results.md").read_text()
    # TMA at 0.8 ms against the pointer loads' 1.0: 1.25x, its output 3e-3 off ours.
    tma = {**rows[0], "impl": bench.OURS_TMA, "fwd_ms": 0.8, "fwd_rounds": [0.8] * 4,
           "fwd_bwd_ms": 2.5, "fwd_bwd_rounds": [2.5] * 4, "rel_err_vs_ours": 0.003}  # fmt: skip
    del tma["rel_err_vs_sdpa"]
    bench.write_markdown(meta, [*rows, tma], tmp_path / "results.md")
    text = (tmp_path / "results.md").read_text()
    line = next(
        x for x in text.splitlines() if x.startswith("| 4x4096 | 128 | yes | 1.000 | 0.800")
    )
    assert line == (
        "| 4x4096 | 128 | yes | 1.000 | 0.800 | 1.25x [1.25-1.25] | 3.000 | 2.500 "
        "| 1.20x [1.20-1.20] | 3.0e-03 |"
    ), line
    # The dense tables still compare ours (the pointer loads) with the SDPA backends alone.
    dense = next(x for x in text.splitlines() if x.startswith("| 4x4096 | 128 | yes | 1.000 |"))
    assert dense.endswith("| 0.90x [0.90-0.90] |"), dense
    # With ours forced to pointer loads timed too (1.1 ms), the table compares the two forced
    # ways (1.375x), and the dense table keeps ours, the library's default, alone.
    pointer = {**tma, "impl": bench.OURS_POINTER, "fwd_ms": 1.1, "fwd_rounds": [1.1] * 4}
    del pointer["rel_err_vs_ours"]
    bench.write_markdown(meta, [*rows, tma, pointer], tmp_path / "results.md")
    text = (tmp_path / "results.md").read_text()
    assert "| 4x4096 | 128 | yes | 1.100 | 0.800 | 1.38x [1.38-1.38] | 2.500 | 2.500 " in text
    dense = next(x for x in text.splitlines() if x.startswith("| 4x4096 | 128 | yes | 1.000 |"))
    assert dense.endswith("| 0.90x [0.90-0.90] |"), dense


def test_sections_of_a_later_run_keep_their_own_dates(tmp_path):
    # Results kept before sections were dated: every section from the kept date, then decode
    # re-run today.
    dates = bench.section_dates({"date": "2026-11-26"}, ["decode"], "2026-11-27")
    assert dates == {"dense": "2026-11-26", "varlen": "2026-11-26", "decode": "2026-11-27"}
    # A later dense run keeps decode's date.
    later = bench.section_dates({"date": "2026-11-27", "section_dates": dates}, ["dense"], "x")
    assert later == {"dense": "x", "varlen": "2026-11-26", "decode": "2026-11-27"}
    assert bench.section_dates(None, ["dense"], "x") == {"dense": "x"}
    meta = {"device": "GPU", "peak_tflops": None, "date": "2026-11-27", "torch": "t",
            "triton": "tr", "timing": "rounds", "section_dates": dates}  # fmt: skip
    bench.write_markdown(meta, _rows(), tmp_path / "results.md")
    text = (tmp_path / "results.md").read_text()
    assert "- dates: dense 2026-11-26, varlen 2026-11-26, decode 2026-11-27" in text, text
    meta["section_dates"] = dict.fromkeys(dates, "2026-11-27")
    bench.write_markdown(meta, _rows(), tmp_path / "results.md")
    assert "- date: 2026-11-27\n" in (tmp_path / "results.md").read_text()


def test_command_line_errors(monkeypatch, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--only", "dense,nonsense"])
    assert "unknown sections ['nonsense']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--shapes", "4by4096"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        bench.main([])
    assert sys.modules["benchmarks.attention"] is bench
