"""CudaGraphGenerator on a GPU: decode steps really captured in CUDA graphs and replayed, with
transformers' tokens, on any transformers the GPU machine has (4.57 or 5.x), with and without
our kernels. A capture that fails (a host synchronisation in the step) fails these tests through
the statistics, not only through the tokens (a failed capture falls back to eager decoding)."""

from __future__ import annotations

import pytest
import torch
from generation_checks import (
    NEW_TOKENS,
    check_greedy_matches_eager,
    check_sampling_matches_eager,
    check_second_call_replays,
    eager_greedy,
    eager_static_greedy,
    prompt,
    tiny_llama,
    undo_kernelize,
)

from kernels.generation import CACHE_LENGTH_STEP, CudaGraphBackend, CudaGraphGenerator

pytestmark = pytest.mark.gpu

# Small, but with the shapes of a real model's decode step (GQA, head dim 64).
SMALL = dict(
    hidden_size=512,
    intermediate_size=1408,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
)


@pytest.fixture
def model():
    pytest.importorskip("transformers")
    return tiny_llama("cuda", **SMALL)


@pytest.fixture
def untagged():
    yield
    undo_kernelize()


def test_the_backend_is_cuda_graphs(model):
    assert isinstance(CudaGraphGenerator(model)._graphs.backend, CudaGraphBackend)


def test_greedy_tokens_are_transformers_tokens(model):
    check_greedy_matches_eager(model, device="cuda", batches=(1, 4))


def test_greedy_with_our_kernels(model, untagged):
    CudaGraphGenerator(model, kernels=True)  # kernelizes the model
    check_greedy_matches_eager(model, device="cuda", batches=(1, 4))


def test_a_second_call_replays_every_decode_step(model):
    check_second_call_replays(model, device="cuda")


def test_sampling_draws_the_tokens_transformers_draws(model):
    check_sampling_matches_eager(model, device="cuda")


def test_batch_sizes_sharing_the_pool_keep_their_own_results(model):
    """Graphs of batch 1 and 4 share a memory pool; alternating them must not mix results."""
    generator = CudaGraphGenerator(model)
    prompts = {batch: prompt(batch, device="cuda", seed=batch) for batch in (1, 4)}
    expected = {batch: eager_greedy(model, *prompts[batch]) for batch in prompts}
    for batch in (1, 4, 1, 4, 1):
        ids, mask = prompts[batch]
        got = generator.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS)
        assert torch.equal(got, expected[batch]), f"batch {batch}"
    assert generator.stats.captures == 2 and generator.stats.failed_captures == 0


def test_without_an_attention_mask_or_pad_token(model):
    """generate() then makes the mask itself (the end token stands in for padding) and builds
    each step's 4D decode mask before the forward: the graph takes it as an input."""
    model.generation_config.pad_token_id = None
    model.config.pad_token_id = None
    model.generation_config.eos_token_id = 2
    ids, _ = prompt(2, device="cuda")
    options = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)  # never stop early
    generator = CudaGraphGenerator(model)
    got = generator.generate(ids, **options)
    assert torch.equal(got, model.generate(ids, do_sample=False, **options))
    assert generator.stats.captures == 1 and generator.stats.replays == NEW_TOKENS - 2


@pytest.mark.parametrize("kernels", [False, True], ids=["eager layers", "our kernels"])
def test_bf16_tokens_are_the_eager_static_cache_tokens(kernels, untagged):
    """In bf16 the cache layout changes roundings, so the reference is transformers' own
    static-cache decoding with the same layers and cache length, which the graph replays
    exactly."""
    pytest.importorskip("transformers")
    model = tiny_llama("cuda", torch.bfloat16, **SMALL)
    generator = CudaGraphGenerator(model, kernels=kernels)
    ids, mask = prompt(4, device="cuda")
    got = generator.generate(ids, attention_mask=mask, max_new_tokens=16)
    expected = eager_static_greedy(model, ids, mask, new_tokens=16, cache_len=CACHE_LENGTH_STEP)
    assert torch.equal(got, expected)
    assert generator.stats.captures == 1 and generator.stats.replays == 14
