"""benchmarks/e2e.py's command without a GPU: its shapes, the command that resumes a stopped run,
and --profile (a tiny model on the CPU)."""

import json

import pytest

pytest.importorskip("transformers.models.llama.modeling_llama")
from benchmarks import e2e, llama  # noqa: E402  (after the skip: it times transformers' Llama)


def test_shapes_are_parsed_or_refused_with_their_form():
    assert e2e.parse_shapes("8x512, 4x2048,8x512") == ["8x512", "4x2048"]
    assert e2e.parse_shapes(",".join(llama.SHAPES)) == ["8x512", "4x2048", "1x4096"]
    for bad in ("8x", "8*512", "0x512", "8x512x2"):
        with pytest.raises(ValueError, match="is not batch x sequence in positive integers"):
            e2e.parse_shapes(bad)
    with pytest.raises(ValueError, match="no shape given"):
        e2e.parse_shapes(" , ")


def test_resume_command_names_what_is_left():
    left = llama.select_contenders("compile,ours-compile")
    assert e2e.resume_command(128256, ["4x2048", "1x4096"], left) == (
        "python -m benchmarks.e2e --vocab 128256 --shape 4x2048,1x4096 "
        "--contenders compile,ours-compile"
    )


# The best of ours against the best peer, and issue 38's targets, on made-up numbers.


def test_profile_summarises_each_contenders_steps(tiny, module_state, tmp_path, monkeypatch):
    """--profile on the CPU (tiny model, ours through the interpreter, one call of each step):
    a train and a prefill summary per contender, in the JSON it writes and in the tables it
    prints. (A compiled contender would add a minute of inductor's C++ builds on the CPU.)"""
    from kernels.library import untag

    monkeypatch.setattr(e2e, "PROFILE_WARMUP", 1)
    monkeypatch.setattr(e2e, "PROFILED_STEPS", 1)
    monkeypatch.setattr(e2e, "PROFILE_ROUNDS", 1)
    chosen = llama.select_contenders("eager,ours-fce")
    lines = []
    try:
        summaries = e2e.profile("1x6", tmp_path, chosen, lines.append)
    finally:
        untag()
    assert list(summaries) == ["eager", "ours (kernelized, fused CE)"]
    for steps in summaries.values():
        assert set(steps) == {"train", "prefill"}
        for summary in steps.values():
            assert summary["wall_ms_per_step"] > 0 and summary["host_ms_per_step"] > 0
            assert summary["profiled_cpu_ms_per_step"] > 0
            assert summary["device_ms_per_step"] == 0  # no CUDA kernels on the CPU
    written = json.loads((tmp_path / f"profile_v{llama.CONFIG['vocab_size']}_1x6.json").read_text())
    assert written["shape"] == "1x6" and written["device"] == "cpu"
    assert written["profiles"] == summaries
    text = "\n".join(lines)
    assert "train at 1x6" in text and "prefill at 1x6" in text
    assert "| ours (kernelized, fused CE) |" in text
