"""benchmarks/decode.py's parts that run without a GPU: merging runs, the report, token checks."""

import pytest
import torch

from benchmarks import decode

META = {
    "device": "GPU",
    "date": "2026-11-25",
    "torch": "t",
    "transformers": "4.57.6",
    "triton": "tr",
    "prompt": 128,
    "new_tokens": 128,
}


def decode_row(contender, batch, ms, same=128):
    return {
        "contender": contender,
        "batch": batch,
        "decode_ms_per_token": ms,
        "call_ms_per_token": ms + 0.1,
        "prefill_ms": 10.0,
        "cold_first_token_s": 0.1,
        "cold_first_decode_token_s": 30.0,
        "cold_call_s": 31.0,
        "same_tokens_as_eager": same,
    }


def host_row(op, pass_name, impl, host_us):
    return {"op": op, "pass": pass_name, "impl": impl, "host_us": host_us, "wall_us": 50.0,
            "device_us": 40.0}  # fmt: skip


def test_a_later_run_replaces_its_own_rows_and_keeps_the_others():
    first = decode.merge(
        {}, META, [decode_row("eager", 1, 17.0), decode_row("static + compile", 1, 6.0)], []
    )
    second = decode.merge(first, {**META, "date": "later"}, [decode_row("eager", 1, 18.0)], [])
    assert [r["decode_ms_per_token"] for r in second["decode"]] == [6.0, 18.0]
    assert [m["date"] for m in second["runs"]] == ["2026-11-25", "later"]


def test_report_compares_with_the_static_compiled_path_and_aten():
    results = decode.merge(
        {},
        META,
        [
            decode_row("eager", 1, 17.0),
            decode_row("static + compile", 1, 6.0),
            decode_row("ours kernelized + CUDA graphs", 1, 3.0, same=97),
        ],
        [
            host_row("RMSNorm", "forward", "aten", 10.0),
            host_row("RMSNorm", "forward", "ours", 15.0),
        ],
    )
    text = decode.markdown([{"setting": {"transformers": "4.57"}, **results}])
    assert "## transformers 4.57" in text
    assert "| ours kernelized + CUDA graphs | 3.00 (0.50x) | 30.0 s / 31.0 s | 97/128 |" in text
    assert "| eager | 17.00 (2.83x) |" in text
    assert "| RMSNorm | forward | 10.0 / 50.0 / 40.0 | 15.0 / 50.0 / 40.0 | 1.50x |" in text


def test_same_leading_tokens_counts_up_to_the_first_difference():
    prompt = torch.zeros(2, decode.PROMPT, dtype=torch.long)
    expected = torch.cat([prompt, torch.arange(8).repeat(2, 1)], dim=1)
    got = expected.clone()
    assert decode.same_leading_tokens(got, expected) == 8
    got[1, decode.PROMPT + 5] = 99
    assert decode.same_leading_tokens(got, expected) == 5


def test_token_times_skip_the_prompt():
    times = decode.TokenTimes(batch=2)
    times.put(torch.zeros(2, decode.PROMPT))
    times.put(torch.zeros(2))
    times.put(torch.zeros(2))
    assert len(times.times) == 2


def test_groups_split_compiled_contenders_from_the_others():
    assert set(decode.GROUPS["compiled"]) == {
        "static + compile",
        "static + compile, sampling",
        "static + compile, penalties",
        "ours kernelized + static + compile",
    }
    assert set(decode.GROUPS["eager"]) | set(decode.GROUPS["compiled"]) == set(decode.CONTENDERS)


def test_the_fused_loop_contenders_run_without_compiling_and_take_no_streamer():
    fused = [name for name, (_, how, _) in decode.CONTENDERS.items() if how == "fused"]
    assert fused == [
        "ours CUDA graphs + fused greedy loop",
        "ours kernelized + CUDA graphs + fused greedy loop",
        "ours kernelized + fused loop, layers unfolded",
        "ours kernelized + fused loop, our attention",
        "ours kernelized + fused loop, sampling",
        "ours kernelized + fused loop, penalties",
    ]
    assert set(fused) <= set(decode.GROUPS["eager"])
    row = {**decode_row(fused[1], 1, 2.0), "cold_first_token_s": None}
    row["cold_first_decode_token_s"] = None
    results = decode.merge({}, META, [decode_row("static + compile", 1, 6.0), row], [])
    text = decode.markdown([{"setting": {"transformers": "4.57"}, **results}])
    assert f"| {fused[1]} | 2.00 (0.33x) | — / 31.0 s | 128/128 |" in text


def test_a_fused_contender_generates_on_the_cpu():
    """Contender.generate for the fused loop on a tiny model: a streamer is not passed on (it
    would send the call through generate()'s loop), and the tokens are generate()'s."""
    from kernels.generation import CudaGraphGenerator
    from tests.support.generation import eager_greedy, prompt, tiny_llama

    model = tiny_llama()
    contender = decode.Contender(model, "fused", generator=CudaGraphGenerator(model))
    ids, mask = prompt(2)
    streamer = decode.TokenTimes(batch=2)
    got = contender.generate(ids, mask, 12, streamer)
    assert torch.equal(got, eager_greedy(model, ids, mask, 12))
    assert not contender.streams and streamer.times == []
    assert contender.generator.stats.fused_calls == 1


@pytest.mark.parametrize("setting", ["sampling", "penalties"])
def test_each_setting_is_fused_with_generates_tokens(setting):
    """The sampling and penalties contenders' calls go through the fused loop, with the tokens
    generate() makes in that setting (sampled ones from the same seed)."""
    from kernels.generation import CudaGraphGenerator
    from tests.support.generation import prompt, tiny_llama

    model = tiny_llama()
    model.generation_config.eos_token_id = None
    fused = decode.Contender(model, "fused", setting, generator=CudaGraphGenerator(model))
    plain = decode.Contender(model, "dynamic", setting)
    ids, mask = prompt(2)
    torch.manual_seed(decode.SEED)
    got = fused.generate(ids, mask, 12)
    torch.manual_seed(decode.SEED)
    assert torch.equal(got, plain.generate(ids, mask, 12))
    assert got.shape[1] == ids.shape[1] + 12
    assert fused.generator.stats.fused_calls == 1


def test_ratios_are_over_the_static_contender_of_the_same_setting():
    rows = [
        decode_row("static + compile", 1, 6.0),
        {**decode_row("static + compile, sampling", 1, 8.0), "setting": "sampling"},
        {**decode_row("ours kernelized + fused loop, sampling", 1, 2.0), "setting": "sampling"},
    ]
    results = decode.merge({}, META, rows, [])
    text = decode.markdown([{"setting": {"transformers": "5.25"}, **results}])
    assert "| ours kernelized + fused loop, sampling | 2.00 (0.25x) |" in text


def test_each_transformers_line_has_its_own_section():
    """One results folder for both transformers lines: each line's latest run is an entry of
    results.json and a section of results.md, in the order of the lines."""
    entries = [
        {
            "setting": {"transformers": line},
            **decode.merge({}, meta, [decode_row("eager", 1, ms)], []),
        }
        for line, meta, ms in (
            ("4.57", META, 17.0),
            ("5.24", {**META, "transformers": "5.24.0"}, 15.0),
        )
    ]
    text = decode.markdown(entries)
    assert text.index("## transformers 4.57") < text.index("## transformers 5.24")
    assert "transformers 5.24.0" in text.split("## transformers 5.24")[1]
    assert "| eager | 15.00 |" in text and "| eager | 17.00 |" in text
