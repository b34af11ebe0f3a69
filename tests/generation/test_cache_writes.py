"""`kernels.generation.cache_writes`: a static cache's decode writes through the rotary
library's one-launch ``write_kv_cache``: transformers 4.57's form (``cache_position``) here,
5.x's (the layer's counter) where tests/clients/transformers5 runs this module. The cache's contents
equal transformers' own update's."""

import copy

import pytest
import torch

from kernels.generation.cache import new_static_cache
from kernels.generation.cache_writes import kernel_cache_writes
from tests.support.generation import (
    cache_write_form,
    check_generator_writes_the_cache_in_one_launch,
    counting_cache_kernels,
    tiny_llama,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: Triton's interpreter
# 5.x's static layers count their positions (and ignore cache_position); 4.57's are told them.
FORM = cache_write_form()
COUNTS_ITSELF = FORM == ("counter",)


def _filled_cache(model, length=16, prompt=5):
    """A static cache of ``model`` after an eager prefill of ``prompt`` tokens."""
    cache = new_static_cache(model, length)
    ids = torch.randint(1, model.config.vocab_size, (2, prompt), device=DEVICE)
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, use_cache=True)
    return cache


def _step(heads=2, dim=16, dtype=torch.bfloat16):
    k = torch.randn(2, 1, heads, dim, device=DEVICE, dtype=dtype).transpose(1, 2)
    return k, torch.randn_like(k)


@pytest.fixture
def model():
    return tiny_llama(DEVICE, torch.bfloat16)


def test_a_decode_write_goes_through_the_kernel_and_equals_transformers(model):
    cache = _filled_cache(model)
    reference = copy.deepcopy(cache)
    kernels, calls = counting_cache_kernels()
    keys, values = _step()
    position = {"cache_position": torch.tensor([5], device=DEVICE)}
    with kernel_cache_writes(cache, kernels) as layers:
        assert layers == model.config.num_hidden_layers
        got = cache.update(keys, values, 1, position)
    expected = reference.update(keys, values, 1, position)
    assert calls == [FORM]
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert got[0] is cache.layers[1].keys  # the cache's own tensors, as transformers returns
    assert all("update" not in vars(layer) for layer in cache.layers)


@pytest.mark.parametrize("case", ["uninitialised", "grad", "other dtype", "no position"])
def test_other_calls_are_transformers_update(model, case):
    if case == "no position" and COUNTS_ITSELF:
        pytest.skip("transformers 5.x's static layers take no position: they count")
    cache = new_static_cache(model, 16) if case == "uninitialised" else _filled_cache(model)
    reference = copy.deepcopy(cache)
    kernels, calls = counting_cache_kernels()
    keys, values = _step(dtype=torch.float32 if case == "other dtype" else torch.bfloat16)
    position = {} if case == "no position" else {"cache_position": torch.tensor([5], device=DEVICE)}
    if case == "grad":
        keys.requires_grad_()
    outcome = {}
    for which, target in (("ours", cache), ("reference", reference)):
        try:
            with kernel_cache_writes(target, kernels) if which == "ours" else torch.no_grad():
                outcome[which] = target.update(keys, values, 0, position)
        except Exception as error:  # transformers' own error, for the reference too
            outcome[which] = type(error)
    assert calls == []
    if isinstance(outcome["reference"], type):
        assert outcome["ours"] is outcome["reference"]
    else:
        assert torch.equal(outcome["ours"][0], outcome["reference"][0])


def test_the_generator_writes_the_cache_in_one_launch_with_our_kernels(untagged, monkeypatch):
    # `untagged`: without it, transformers' Llama classes stayed tagged for our kernels, so every
    # tiny Llama built later in the process ran them through Triton's interpreter (the fused greedy
    # checks after this test took 50x as long).
    check_generator_writes_the_cache_in_one_launch(monkeypatch)
