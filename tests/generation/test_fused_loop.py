"""The fused loop on the CPU with transformers 4.57. Off CUDA a block's steps are plain
calls (`EagerBackend`), so everything around the graph runs as on CUDA: the inputs made on the
device, end tokens and padding, the cut where generate() stops, the rule that sends other calls
through generate()'s loop. tests/clients/transformers5/test_fused_loop.py runs the same checks on 5.x;
test_cuda_graph_generation_gpu.py runs the loop from real CUDA graphs."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from kernels.generation import CudaGraphGenerator
from tests.support import fused_loop as checks
from tests.support.generation import (
    CountingBackend,
    eager_greedy,
    prompt,
    tiny_llama,
    tiny_sliding_window_mistral,
)

K = checks.FUSED_STEPS


@pytest.mark.parametrize("new_tokens", checks.NEW_TOKENS_CASES)
@pytest.mark.parametrize("with_eos", [False, True], ids=["no end token", "early end token"])
@pytest.mark.parametrize("prompt_case", checks.PROMPT_CASES)
def test_tokens_are_generates(model, prompt_case, with_eos, new_tokens):
    checks.check_case(model, prompt_case, with_eos, new_tokens)


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="our kernels serve this CPU model only through Triton's interpreter (CPU-only "
    "machines); on a GPU machine test_cuda_graph_generation_gpu.py runs this check on CUDA",
)
def test_with_our_kernels_tokens_are_the_kernelized_models_own(untagged):
    # One decoder layer: the check is of the loop around the kernelized model, and each layer
    # adds its kernels' launches through the interpreter to every step.
    checks.check_kernelized(tiny_llama(num_hidden_layers=1))


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="our kernels serve this CPU model only through Triton's interpreter (CPU-only machines)",
)
def test_with_our_kernels_return_dict_is_the_kernelized_models_own(untagged):
    checks.check_dict_output_kernelized(tiny_llama(num_hidden_layers=1))


def test_our_attention_pads_on_the_device():
    checks.check_our_attention_pads_on_the_device()


def test_a_second_call_replays_its_blocks(model):
    ids, mask = checks.padded_prompt()
    eos = checks.early_end_token(model, ids, mask)
    checks.check_second_call_replays_its_blocks(model, ids, mask, eos)


def test_an_additive_mask_advances_too():
    checks.check_additive_mask()


def test_with_sdpa_the_boolean_mask_is_fed_additive():
    checks.check_sdpa_mask_is_fed_additive()


@pytest.mark.parametrize("setting", checks.FUSED_SETTING_CASES)
def test_settings_people_run_are_fused(model, setting, caplog):
    checks.check_fused_setting(model, setting, caplog)


def test_bad_words_and_biases_bite_in_the_loop(model, caplog):
    checks.check_bans_and_biases_bite(model, caplog)


@pytest.mark.parametrize("prompt_case", checks.PROMPT_CASES)
def test_stop_strings_are_fused(model, prompt_case, caplog):
    checks.check_stop_strings(model, prompt_case, caplog)


def test_max_time_stops_between_blocks(model, monkeypatch):
    checks.check_max_time_stops_between_blocks(model, monkeypatch)


@pytest.mark.parametrize("setting", checks.FALLBACK_CASES)
def test_other_settings_decode_step_by_step(model, setting, caplog):
    checks.check_falls_back(model, setting, caplog)


def test_max_length_and_input_ids_as_keywords(model):
    ids, mask = prompt(2)
    options = dict(input_ids=ids, attention_mask=mask, max_length=ids.shape[1] + K + 2)
    got = CudaGraphGenerator(model, fused_steps=K).generate(**options)
    assert torch.equal(got, model.generate(**options, do_sample=False))


def test_the_path_taken_is_logged_once(model, caplog):
    generator = CudaGraphGenerator(model, fused_steps=K)
    ids, mask = prompt(1)
    with caplog.at_level(logging.INFO, logger="kernels.generation"):
        for _ in range(2):
            generator.generate(ids, attention_mask=mask, max_new_tokens=K + 3)
    lines = [r.getMessage() for r in caplog.records if "generate():" in r.getMessage()]
    assert lines == ["generate(): the fused loop decodes (greedy), 4 steps per graph"]


def test_fused_steps_0_decodes_step_by_step(model, caplog):
    generator = CudaGraphGenerator(model, fused_steps=0)
    ids, mask = prompt(1)
    with caplog.at_level(logging.INFO, logger="kernels.generation"):
        got = generator.generate(ids, attention_mask=mask, max_new_tokens=K + 3)
    assert torch.equal(got, eager_greedy(model, ids, mask, K + 3))
    assert generator.stats.fused_calls == 0 and generator.stats.replays > 0
    assert any("fused_steps=0" in r.getMessage() for r in caplog.records)


def test_a_cache_too_short_for_whole_blocks_decodes_step_by_step(model, caplog):
    ids, mask = prompt(1)  # 7 tokens, then 7 new: 6 after the prefill's, in blocks of 4 -> 15
    generator = CudaGraphGenerator(model, fused_steps=K, max_cache_len=14)
    with caplog.at_level(logging.INFO, logger="kernels.generation"):
        got = generator.generate(ids, attention_mask=mask, max_new_tokens=7)
    assert torch.equal(got, eager_greedy(model, ids, mask, 7))
    assert generator.stats.fused_calls == 0
    assert any("too few for whole blocks" in r.getMessage() for r in caplog.records)


def test_a_failed_block_capture_finishes_eagerly_then_steps(model, caplog):
    backend = CountingBackend(fail_with=RuntimeError("operation not permitted when capturing"))
    generator = CudaGraphGenerator(model, fused_steps=K, backend=backend)
    ids, mask = prompt(1)
    expected = eager_greedy(model, ids, mask, 3 * K)
    with caplog.at_level(logging.INFO, logger="kernels.generation"):
        for _ in range(2):
            got = generator.generate(ids, attention_mask=mask, max_new_tokens=3 * K)
            assert torch.equal(got, expected)
    stats = generator.stats
    assert stats.fused_calls == 1 and stats.fused_captures == 0 and stats.failed_captures >= 1
    assert any("capturing its fused decode block failed" in r.getMessage() for r in caplog.records)


def test_sliding_window_models_decode_step_by_step():
    pytest.importorskip("transformers")
    model = tiny_sliding_window_mistral()
    ids, mask = prompt(1)
    ids = ids % model.config.vocab_size
    generator = CudaGraphGenerator(model, fused_steps=K)
    got = generator.generate(ids, attention_mask=mask, max_new_tokens=K + 3)
    assert torch.equal(got, eager_greedy(model, ids, mask, K + 3))
    assert generator.stats.fused_calls == 0


def test_a_call_makes_its_block_key_once(model, monkeypatch):
    """`blocker` makes the block's key (walking the step's arguments and the processors'
    attributes); `decode`, handed the same step, reuses it: one key a call, for each of two
    calls, with sampling's processors in it."""
    generator = CudaGraphGenerator(model, fused_steps=K)
    made = []
    real = generator._fused._key
    monkeypatch.setattr(generator._fused, "_key", lambda *a: made.append(1) or real(*a))
    ids, mask = prompt(2)
    for _ in range(2):
        generator.generate(ids, attention_mask=mask, max_new_tokens=7, do_sample=True, top_k=5)
    assert generator.stats.fused_calls == 2 and len(made) == 2


@pytest.mark.parametrize("prompt_case", checks.PROMPT_CASES)
@pytest.mark.parametrize("setting", checks.DICT_CASES)
def test_return_dict_scores_and_logits_are_generates(model, setting, prompt_case, caplog):
    checks.check_dict_output(model, setting, prompt_case, caplog)


def test_return_dict_without_scores_keeps_nothing(model):
    checks.check_dict_output_without_scores(model)


def test_a_call_that_keeps_scores_has_a_block_of_its_own(model):
    checks.check_scores_block_is_apart(model)


@pytest.mark.parametrize("setting", checks.PER_LAYER_CASES)
def test_per_layer_outputs_run_as_generate_itself(setting, caplog):
    checks.check_per_layer_outputs_run_as_generate(setting, caplog)
