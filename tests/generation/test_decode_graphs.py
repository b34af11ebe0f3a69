"""DecodeGraphs' bookkeeping, through a backend that counts captures and can fail: which calls
are decode steps, one graph per key, warm-up, recapture when the cache's tensors move, eager
steps for what cannot be captured. The generators here decode greedy calls step by step
(``fused_steps=0``); test_fused_loop.py covers the fused loop."""

from __future__ import annotations

import logging

import pytest
import torch

from kernels.generation import CudaGraphGenerator
from kernels.generation.cache import capture_blocker, fingerprint
from tests.support.generation import (
    NEW_TOKENS,
    CountingBackend,
    eager_greedy,
    prompt,
    tiny_sliding_window_mistral,
)


def generate(generator, batch=2, new_tokens=NEW_TOKENS, **kwargs):
    ids, mask = prompt(batch, seed=batch)
    return generator.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, **kwargs)


def test_one_graph_per_batch_size_kept_across_calls(model):
    backend = CountingBackend()
    generator = CudaGraphGenerator(model, backend=backend, fused_steps=0)
    for batch in (2, 1, 2, 1):
        generate(generator, batch)
    assert backend.captured == 2 and generator._graphs.graph_count == 2
    # Per call NEW_TOKENS - 1 decode steps; the first call of each batch size warms up once.
    assert backend.replayed == 4 * (NEW_TOKENS - 1) - 2
    stats = generator.stats
    assert (stats.other_calls, stats.eager_steps, stats.replays) == (4, 2, backend.replayed)


@pytest.mark.parametrize("warmup_steps", [0, 2])
def test_warmup_steps_run_eagerly_before_the_capture(model, warmup_steps):
    backend = CountingBackend()
    generator = CudaGraphGenerator(model, backend=backend, warmup_steps=warmup_steps, fused_steps=0)
    generate(generator)
    assert generator.stats.eager_steps == warmup_steps
    assert backend.replayed == NEW_TOKENS - 1 - warmup_steps


def test_a_failed_capture_runs_its_key_eagerly_from_then_on(model, caplog):
    backend = CountingBackend(
        fail_with=RuntimeError("operation not permitted when stream is capturing")
    )
    generator = CudaGraphGenerator(model, backend=backend, fused_steps=0)
    ids, mask = prompt(2, seed=2)
    with caplog.at_level(logging.WARNING, logger="kernels.generation"):
        got = generator.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS)
        generator.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS)
    assert torch.equal(got, eager_greedy(model, ids, mask))
    stats = generator.stats
    assert stats.failed_captures == 1 and stats.captures == 0 and stats.replays == 0
    assert stats.eager_steps == 2 * (NEW_TOKENS - 1)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("capturing a decode step (batch 2) failed" in m for m in messages) == 1
    assert sum("its capture failed" in m for m in messages) == 1  # logged once, not per step


def test_the_graph_is_recaptured_when_the_cache_tensors_move(model):
    backend = CountingBackend()
    generator = CudaGraphGenerator(model, backend=backend, fused_steps=0)
    generate(generator)
    cache = generator._caches[2][0]
    before = fingerprint(cache)
    for layer in cache.layers:  # as if the cache had been re-allocated
        layer.keys = layer.keys.clone()
        layer.values = layer.values.clone()
    assert fingerprint(cache) != before
    ids, mask = prompt(2, seed=2)
    got = generator.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS)
    assert torch.equal(got, eager_greedy(model, ids, mask))
    assert backend.captured == 2 and generator._graphs.graph_count == 1


def test_calls_on_other_caches_and_prefills_are_not_decode_steps(model):
    backend = CountingBackend()
    generator = CudaGraphGenerator(model, backend=backend, fused_steps=0)
    generate(generator)
    ids, mask = prompt(2)
    with generator._decode_through_graphs():  # a forward of your own, no cache of ours
        model(input_ids=ids[:, :1], attention_mask=mask[:, :1])
        model(input_ids=ids, attention_mask=mask)
    assert generator.stats.other_calls == 3 and backend.captured == 1


def test_with_gradients_enabled_steps_run_eagerly(model, caplog):
    backend = CountingBackend()
    generator = CudaGraphGenerator(model, backend=backend, fused_steps=0)
    graphs = generator._graphs
    ids, mask = prompt(1)
    generate(generator, batch=1)
    cache = generator._caches[1][0]
    kwargs = dict(
        input_ids=ids[:, :1],
        past_key_values=cache,
        use_cache=True,
        cache_position=torch.tensor([7]),
    )
    kwargs = {graphs.cache_argument if k == "past_key_values" else k: v for k, v in kwargs.items()}
    with caplog.at_level(logging.WARNING, logger="kernels.generation"), torch.enable_grad():
        before = generator.stats.eager_steps
        graphs.run(model.forward, (), kwargs)
    assert generator.stats.eager_steps == before + 1
    assert any("gradients are enabled" in r.getMessage() for r in caplog.records)


def test_sliding_window_caches_are_not_captured():
    transformers = pytest.importorskip("transformers")
    config = tiny_sliding_window_mistral().config
    cache = transformers.StaticCache(config=config, max_cache_len=16)
    assert "not a StaticLayer" in capture_blocker(cache)


def test_an_empty_cache_is_not_captured(model):
    from kernels.generation.cache import new_static_cache

    assert "not been filled" in capture_blocker(new_static_cache(model, 16))
