"""The fused loop with transformers 5.x's generate(), on the CPU: the checks of
tests/generation/test_fused_loop.py (transformers 4.57) on 5.x, whose decode steps pass no
cache_position (its static cache counts positions in a device tensor that each forward
increments) and whose 4D decode mask is made before the forward."""

from __future__ import annotations

import pytest

from tests.generation.test_fused_loop import (  # noqa: F401  (collected here as well)
    test_a_call_makes_its_block_key_once,
    test_a_call_that_keeps_scores_has_a_block_of_its_own,
    test_an_additive_mask_advances_too,
    test_bad_words_and_biases_bite_in_the_loop,
    test_max_time_stops_between_blocks,
    test_other_settings_decode_step_by_step,
    test_per_layer_outputs_run_as_generate_itself,
    test_return_dict_scores_and_logits_are_generates,
    test_return_dict_without_scores_keeps_nothing,
    test_settings_people_run_are_fused,
    test_stop_strings_are_fused,
    test_with_sdpa_the_boolean_mask_is_fed_additive,
)
from tests.support import fused_loop as checks
from tests.support.generation import tiny_llama


@pytest.fixture
def model():
    return tiny_llama()


@pytest.mark.parametrize("new_tokens", checks.NEW_TOKENS_CASES)
@pytest.mark.parametrize("with_eos", [False, True], ids=["no end token", "early end token"])
@pytest.mark.parametrize("prompt_case", checks.PROMPT_CASES)
def test_tokens_are_generates(model, prompt_case, with_eos, new_tokens):
    checks.check_case(model, prompt_case, with_eos, new_tokens)


def test_with_our_kernels_tokens_are_the_kernelized_models_own(model, clean_kernels):
    # clean_kernels: on 5.x kernelize sets the rotary function module's forward process-wide.
    checks.check_kernelized(model)


def test_with_our_kernels_return_dict_is_the_kernelized_models_own(model, clean_kernels):
    checks.check_dict_output_kernelized(model)


def test_our_attention_pads_on_the_device():
    checks.check_our_attention_pads_on_the_device()


def test_a_second_call_replays_its_blocks(model):
    """The cache's position counter ran past the last token in the first call's last block;
    the second call starts from a reset cache all the same."""
    ids, mask = checks.padded_prompt()
    generator = checks.check_second_call_replays_its_blocks(model, ids, mask)
    layer = generator._caches[len(ids)][0].layers[0]
    fed = 3 * checks.FUSED_STEPS  # three blocks
    assert int(layer.cumulative_length) == ids.shape[1] + fed


def test_with_our_kernels_q_k_v_are_one_launch(clean_kernels, monkeypatch):
    from tests.support.generation import check_generator_groups_q_k_v

    check_generator_groups_q_k_v(monkeypatch)


def test_with_our_kernels_the_cache_writes_are_one_launch(clean_kernels, monkeypatch):
    from tests.support.generation import check_generator_writes_the_cache_in_one_launch

    check_generator_writes_the_cache_in_one_launch(monkeypatch)
