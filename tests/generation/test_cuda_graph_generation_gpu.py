"""CudaGraphGenerator on a GPU: decode steps really captured in CUDA graphs and replayed, with
transformers' tokens, on any transformers the GPU machine has (4.57 or 5.x), with and without
our kernels. A capture that fails (a host synchronisation in the step) fails these tests through
the statistics, not only through the tokens (a failed capture falls back to eager decoding).

The fused loop's tests (at the end) run the default block of `DEFAULT_FUSED_STEPS` steps
on the model of a real decode step's shapes, batch 1 and 8, fp32 and bf16: its tokens are those
of transformers' eager greedy decoding with a static cache of the generator's length (the same
kernels on the same shapes, so the same roundings), and its blocks are graph replays. Nothing
here needs a side stream: decoding runs without autograd (the side-stream rule of
test_kernel_capture.py is about captured backwards).
"""

from __future__ import annotations

import pytest
import torch

from kernels.generation import (
    CACHE_LENGTH_STEP,
    DEFAULT_FUSED_STEPS,
    CudaGraphBackend,
    CudaGraphGenerator,
)
from tests.support.fused_loop import early_end_token, padded_prompt
from tests.support.generation import (
    NEW_TOKENS,
    check_greedy_matches_eager,
    check_sampling_matches_eager,
    check_second_call_replays,
    eager_greedy,
    eager_static_greedy,
    prompt,
    same_projections,
    tiny_llama,
)

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
    generator = CudaGraphGenerator(model, fused_steps=0)
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
    generator = CudaGraphGenerator(model, fused_steps=0)  # step by step: one graph per step
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
    generator = CudaGraphGenerator(model, kernels=kernels, fused_steps=0)
    ids, mask = prompt(4, device="cuda")
    got = generator.generate(ids, attention_mask=mask, max_new_tokens=16)
    with same_projections(generator, model):  # our kernels group q, k and v in bf16
        expected = eager_static_greedy(model, ids, mask, new_tokens=16, cache_len=CACHE_LENGTH_STEP)
    assert torch.equal(got, expected)
    assert generator.stats.captures == 1 and generator.stats.replays == 14


# ---- the fused loop -----------------------------------------------------------------

#: The prefill's token, then four blocks: a warm-up block, the captured one, two more replays.
FUSED_NEW_TOKENS = 4 * DEFAULT_FUSED_STEPS + 1
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def fused_reference(model, ids, mask, new_tokens=FUSED_NEW_TOKENS, **kwargs):
    """transformers' eager greedy tokens with a static cache as long as the generator's."""
    return eager_static_greedy(model, ids, mask, new_tokens, cache_len=CACHE_LENGTH_STEP, **kwargs)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("kernels", [False, True], ids=["eager layers", "our kernels"])
@pytest.mark.parametrize("batch", [1, 8])
def test_the_fused_loop_replays_blocks_with_eager_tokens(batch, kernels, dtype, untagged):
    pytest.importorskip("transformers")
    model = tiny_llama("cuda", DTYPES[dtype], **SMALL)
    generator = CudaGraphGenerator(model, kernels=kernels)
    assert isinstance(generator._fused.backend, CudaGraphBackend)
    assert generator._fused.backend is generator._graphs.backend  # one memory pool
    ids, mask = prompt(batch, device="cuda", seed=batch)
    with same_projections(generator, model):
        expected = fused_reference(model, ids, mask)
    got = generator.generate(ids, attention_mask=mask, max_new_tokens=FUSED_NEW_TOKENS)
    assert got.shape == expected.shape and torch.equal(got, expected)
    stats = generator.stats
    assert stats.failed_captures == 0 and stats.fused_captures == 1, stats
    assert stats.fused_replays == 3 and stats.eager_steps == DEFAULT_FUSED_STEPS, stats
    assert stats.fused_tokens == FUSED_NEW_TOKENS - 1 and stats.replays == 0, stats

    # A second call with other prompts replays all four blocks, nothing eager, no capture.
    other_ids, other_mask = prompt(batch, device="cuda", seed=batch + 100)
    got = generator.generate(other_ids, attention_mask=other_mask, max_new_tokens=FUSED_NEW_TOKENS)
    with same_projections(generator, model):
        assert torch.equal(got, fused_reference(model, other_ids, other_mask))
    after = generator.stats
    assert after.fused_replays == 3 + 4 and after.eager_steps == DEFAULT_FUSED_STEPS, after
    assert after.fused_captures == 1 and after.failed_captures == 0, after


def prompt_with_a_late_end_token(model, batch: int):
    """(ids, mask, end token) of the first prompt seed whose first sequence emits a token in the
    second block that it had not emitted before (random weights often settle into a loop)."""
    for seed in range(batch, batch + 20):
        ids, mask = prompt(batch, device="cuda", seed=seed)
        try:
            first_index = DEFAULT_FUSED_STEPS + 1
            eos = early_end_token(model, ids, mask, first_index, new_tokens=FUSED_NEW_TOKENS)
        except AssertionError:
            continue
        return ids, mask, eos
    raise AssertionError("no prompt seed gives a late end token")


@pytest.mark.parametrize("batch", [1, 8])
def test_the_fused_loop_stops_at_an_end_token_as_generate_does(batch, model):
    """An end token the first sequence emits in the second block: a single sequence stops there
    (the output is cut inside a replayed block), a batch's other sequences go on and the first
    emits the pad token."""
    ids, mask, eos = prompt_with_a_late_end_token(model, batch)
    generator = CudaGraphGenerator(model)
    options = dict(max_new_tokens=FUSED_NEW_TOKENS, eos_token_id=eos)
    expected = fused_reference(model, ids, mask, eos_token_id=eos)
    got = generator.generate(ids, attention_mask=mask, **options)
    assert got.shape == expected.shape and torch.equal(got, expected)
    stats = generator.stats
    decoded = expected.shape[1] - ids.shape[1] - 1
    blocks = -(-decoded // DEFAULT_FUSED_STEPS)
    assert stats.fused_calls == 1 and stats.fused_tokens == decoded, stats
    assert stats.fused_replays == blocks - 1 and stats.failed_captures == 0, stats
    assert stats.fused_captures == (1 if blocks > 1 else 0), stats


def test_the_fused_loop_with_a_left_padded_batch(model):
    ids, mask = padded_prompt(lengths=(7, 3, 5, 6, 2, 7, 4, 1), device="cuda")
    generator = CudaGraphGenerator(model)
    got = generator.generate(ids, attention_mask=mask, max_new_tokens=FUSED_NEW_TOKENS)
    assert torch.equal(got, fused_reference(model, ids, mask))
    assert generator.stats.fused_replays == 3 and generator.stats.failed_captures == 0


#: What a chat model is usually served with: sampling with temperature and top-p, a repetition
#: penalty, min_new_tokens (its end token banned on the device for the first steps).
CHAT_SAMPLING = dict(
    do_sample=True, temperature=0.7, top_p=0.9, repetition_penalty=1.1, min_new_tokens=3
)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("batch", [1, 8])
def test_the_fused_loop_samples_what_generate_samples(batch, dtype):
    """Sampling with a chat model's processors is captured in the fused loop's graph (no
    failed capture: nothing reads the device from the host) and draws, from the same seed,
    the tokens transformers' own sampling draws with a static cache of the same length: the
    captured draws take the default generator's state as eager ones do."""
    pytest.importorskip("transformers")
    from kernels.generation.cache import cache_argument, new_static_cache

    model = tiny_llama("cuda", DTYPES[dtype], **SMALL)
    ids, mask = padded_prompt(lengths=(7, 3, 5, 6, 2, 7, 4, 1)[:batch], device="cuda")
    options = dict(attention_mask=mask, max_new_tokens=FUSED_NEW_TOKENS, **CHAT_SAMPLING)
    torch.manual_seed(7)
    cache = new_static_cache(model, CACHE_LENGTH_STEP)
    expected = model.generate(
        ids, disable_compile=True, **{cache_argument(model): cache}, **options
    )
    generator = CudaGraphGenerator(model)
    for _ in range(2):  # the first call captures, the second replays every block
        torch.manual_seed(7)
        got = generator.generate(ids, **options)
        assert got.shape == expected.shape and torch.equal(got, expected)
    stats = generator.stats
    assert stats.failed_captures == 0 and stats.fused_captures == 1, stats
    assert stats.fused_calls == 2 and stats.replays == 0, stats
    assert stats.fused_replays == 3 + 4, stats


def test_the_fused_loop_captures_bad_words_biases_and_eta():
    """Bad words (single and multi-token), sequence biases and ``eta_cutoff`` are captured in
    the fused loop's graph (no failed capture: their prefixes are matched on the device, eta's
    Categorical checks nothing on the host) and sample transformers' tokens from the same seed;
    a second call with other words of the same shape replays the same graph with its own
    words loaded."""
    pytest.importorskip("transformers")
    from kernels.generation.cache import cache_argument, new_static_cache

    model = tiny_llama("cuda", **SMALL)
    ids, mask = padded_prompt(lengths=(7, 3, 5, 6, 2, 7, 4, 1), device="cuda")
    generator = CudaGraphGenerator(model)
    for words, bias in (([[5], [7, 9], [3, 4, 6]], 2.5), ([[8], [1, 2], [6, 4, 3]], -1.5)):
        options = dict(
            attention_mask=mask,
            max_new_tokens=FUSED_NEW_TOKENS,
            do_sample=True,
            eta_cutoff=0.001,
            bad_words_ids=words,
            sequence_bias=[[[11], bias], [[12, 13], 3.0]],
        )
        torch.manual_seed(11)
        cache = new_static_cache(model, CACHE_LENGTH_STEP)
        expected = model.generate(
            ids, disable_compile=True, **{cache_argument(model): cache}, **options
        )
        torch.manual_seed(11)
        got = generator.generate(ids, **options)
        assert got.shape == expected.shape and torch.equal(got, expected)
    stats = generator.stats
    assert stats.failed_captures == 0 and stats.fused_captures == 1, stats
    assert stats.fused_calls == 2 and stats.replays == 0 and stats.fused_replays == 3 + 4, stats


@pytest.mark.parametrize(
    "fused_steps", [DEFAULT_FUSED_STEPS, 0], ids=["fused-loop", "step-by-step"]
)
def test_our_attention_captures_a_padded_batch(fused_steps):
    """With our attention a padded batch's decode steps read the padding mask on the device
    (kernels.library.attention.padded_decode_step) and the generator widens transformers' 2D
    mask to the cache's length, so they are captured and replayed: no failed capture, tokens of
    the same model decoded eagerly with a static cache."""
    pytest.importorskip("transformers")
    from kernels.library.attention import ATTENTION_IMPLEMENTATION, register_attention

    register_attention()
    model = tiny_llama("cuda", **SMALL)
    model.set_attn_implementation(ATTENTION_IMPLEMENTATION)
    ids, mask = padded_prompt(lengths=(7, 3, 5, 6, 2, 7, 4, 1), device="cuda")
    generator = CudaGraphGenerator(model, fused_steps=fused_steps)
    got = generator.generate(ids, attention_mask=mask, max_new_tokens=FUSED_NEW_TOKENS)
    assert torch.equal(got, fused_reference(model, ids, mask))
    stats = generator.stats
    assert stats.failed_captures == 0, stats
    if fused_steps:
        assert stats.fused_captures == 1 and stats.fused_replays == 3, stats
    else:
        decode_steps = FUSED_NEW_TOKENS - 1
        assert stats.captures == 1 and stats.replays == decode_steps - 1, stats
