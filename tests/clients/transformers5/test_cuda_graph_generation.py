"""CudaGraphGenerator with transformers 5.x's generate(), on the CPU: the checks of
tests/generation (transformers 4.57) on 5.x, whose forward takes the KV cache as ``cache``,
whose static cache counts positions in a device tensor, and which builds the decode mask
before the forward."""

from __future__ import annotations

import pytest
import torch

from kernels.generation import CudaGraphGenerator
from kernels.generation.cache import cache_argument
from tests.support.generation import (
    NEW_TOKENS,
    check_greedy_matches_eager,
    check_kernelized_matches_its_own_eager,
    check_our_attention_replays_padded_steps,
    check_sampling_matches_eager,
    check_second_call_replays,
    prompt,
    tiny_llama,
)


@pytest.fixture
def model():
    return tiny_llama()


def test_the_cache_is_passed_as_cache(model):
    assert cache_argument(model) == "cache"


def test_greedy_tokens_are_transformers_tokens(model):
    check_greedy_matches_eager(model)


def test_a_second_call_replays_every_decode_step(model):
    check_second_call_replays(model)


def test_our_attention_replays_padded_decode_steps():
    check_our_attention_replays_padded_steps()


def test_sampling_draws_the_tokens_transformers_draws(model):
    check_sampling_matches_eager(model)


def test_with_our_kernels_tokens_are_the_kernelized_models_own(model, clean_kernels):
    # clean_kernels: on 5.x kernelize sets the rotary function module's forward process-wide.
    check_kernelized_matches_its_own_eager(model)


def test_the_position_counter_is_reset_between_calls(model):
    """5.x's StaticLayer counts positions in a device tensor the graph increments; each call
    starts from a reset cache, so the second call's tokens are the first's (step by step: the
    fused loop runs whole blocks, past the last token)."""
    generator = CudaGraphGenerator(model, fused_steps=0)
    ids, mask = prompt(1)
    first = generator.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS)
    second = generator.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS)
    assert torch.equal(first, second)
    layer = generator._caches[1][0].layers[0]
    assert int(layer.cumulative_length) == ids.shape[1] + NEW_TOKENS - 1
