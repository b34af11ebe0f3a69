"""CudaGraphGenerator on the CPU with transformers 4.57: the static cache, the keys and buffers
of `DecodeGraphs` and the forward wrapper run as on CUDA, with a backend that calls the step
instead of replaying a graph; generated tokens are transformers' own. tests/clients/transformers5 runs
the same checks with transformers 5.x."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from kernels.generation import (
    CudaGraphGenerator,
    EagerBackend,
    UnsupportedGenerationError,
    fast_generate,
)
from kernels.generation import generator as generator_module
from kernels.layer.swap import kernel_layer_of
from tests.support.generation import (
    NEW_TOKENS,
    check_greedy_matches_eager,
    check_kernelized_matches_its_own_eager,
    check_our_attention_replays_padded_steps,
    check_sampling_matches_eager,
    check_second_call_replays,
    eager_greedy,
    prompt,
)


def test_greedy_tokens_are_transformers_tokens(model):
    check_greedy_matches_eager(model)


def test_a_second_call_replays_every_decode_step(model):
    check_second_call_replays(model)


def test_our_attention_replays_padded_decode_steps():
    check_our_attention_replays_padded_steps()


def test_sampling_draws_the_tokens_transformers_draws(model):
    check_sampling_matches_eager(model)


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="our kernels serve this CPU model only through Triton's interpreter (CPU-only "
    "machines); on a GPU machine test_cuda_graph_generation_gpu.py runs this check on CUDA",
)
def test_with_our_kernels_tokens_are_the_kernelized_models_own(model, untagged):
    check_kernelized_matches_its_own_eager(model)
    # The swapped forwards are kernel layers' (bound to the modules by kernelize).
    mlp = model.model.layers[0].mlp
    assert kernel_layer_of(mlp) is not None and type(mlp).__name__ == "LlamaMLP"


def test_off_cuda_it_says_so_once(model, caplog):
    with caplog.at_level(logging.WARNING, logger="kernels.generation"):
        generator = CudaGraphGenerator(model)
        ids, mask = prompt(1)
        generator.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "CUDA graphs need a CUDA device" in lines[0], lines
    assert isinstance(generator._graphs.backend, EagerBackend)


def test_a_longer_generation_gets_a_longer_cache_and_a_new_graph(model, monkeypatch):
    monkeypatch.setattr(generator_module, "CACHE_LENGTH_STEP", 16)
    generator = CudaGraphGenerator(model, max_cache_len=None, fused_steps=0)
    ids, mask = prompt(1)
    generator.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS)
    first_cache = generator._caches[1][0]
    assert generator._caches[1][1] == 16  # 7 + 6 tokens, rounded up
    long = 12  # 7 + 12 tokens: beyond the first cache
    got = generator.generate(ids, attention_mask=mask, max_new_tokens=long)
    assert torch.equal(got, eager_greedy(model, ids, mask, new_tokens=long))
    assert generator._caches[1][0] is not first_cache and generator._caches[1][1] == 32
    assert generator.stats.captures == 2 and generator._graphs.graph_count == 1


def test_a_fixed_cache_too_short_is_an_error(model):
    generator = CudaGraphGenerator(model, max_cache_len=10)
    ids, mask = prompt(1)
    with pytest.raises(UnsupportedGenerationError, match="max_cache_len is 10"):
        generator.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS)


@pytest.mark.parametrize(
    "options,match",
    [
        (dict(num_beams=2), "beam search"),
        (dict(use_cache=False), "use_cache=False"),
        (dict(cache_implementation="dynamic"), "cache_implementation='dynamic'"),
        (dict(prompt_lookup_num_tokens=3), "assisted decoding"),
    ],
)
def test_unsupported_settings_say_what_to_do(model, options, match):
    generator = CudaGraphGenerator(model)
    ids, mask = prompt(1)
    with pytest.raises(UnsupportedGenerationError, match=match):
        generator.generate(ids, attention_mask=mask, **options)
    assert "forward" not in vars(model)


def test_a_cache_of_your_own_is_refused(model):
    from transformers import StaticCache

    ids, _ = prompt(1)
    with pytest.raises(UnsupportedGenerationError, match="brings its own static cache"):
        CudaGraphGenerator(model).generate(
            ids, past_key_values=StaticCache(config=model.config, max_cache_len=32)
        )


def test_cache_implementation_static_is_accepted(model):
    ids, mask = prompt(1)
    got = CudaGraphGenerator(model).generate(
        ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, cache_implementation="static"
    )
    assert torch.equal(got, eager_greedy(model, ids, mask))


def test_the_forward_is_restored_when_generate_raises(model):
    generator = CudaGraphGenerator(model)
    ids, _ = prompt(1)
    with pytest.raises(Exception):  # noqa: B017  (whatever transformers raises for it)
        generator.generate(ids, max_new_tokens=NEW_TOKENS, no_such_argument=1)
    assert "forward" not in vars(model) and "_get_logits_processor" not in vars(model)


def test_an_encoder_decoder_model_is_refused():
    transformers = pytest.importorskip("transformers")
    config = transformers.T5Config(
        d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8, vocab_size=50
    )
    with pytest.raises(UnsupportedGenerationError, match="encoder-decoder"):
        CudaGraphGenerator(transformers.T5ForConditionalGeneration(config))


def test_fast_generate_keeps_its_generator_on_the_model(model):
    ids, mask = prompt(1)
    first = fast_generate(model, ids, attention_mask=mask, max_new_tokens=NEW_TOKENS)
    generator = model._kernels_cuda_graph_generator
    second = fast_generate(model, ids, attention_mask=mask, max_new_tokens=NEW_TOKENS)
    assert model._kernels_cuda_graph_generator is generator
    assert torch.equal(first, second) and torch.equal(first, eager_greedy(model, ids, mask))
    assert generator.stats.fused_captures == 1 and generator.stats.fused_calls == 2


def test_reset_drops_graphs_and_caches(model):
    with CudaGraphGenerator(model, fused_steps=2) as generator:
        ids, mask = prompt(1)
        generator.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS)  # fused
        from transformers import LogitsProcessorList

        from tests.support.fused_loop import BanToken

        processors = LogitsProcessorList([BanToken()])
        options = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, logits_processor=processors)
        generator.generate(ids, **options)  # a processor of the user's: step by step
        assert generator._graphs.graph_count == 1 and generator._fused.graph_count == 1
    assert generator._graphs.graph_count == 0 and generator._fused.graph_count == 0
    assert not generator._caches
