"""The KV-cache write (library/rotary ``write_kv_cache``) against transformers' own update
(``index_copy_`` at the positions, the counter advanced), bit for bit: both position forms,
strided keys (transformers' transposed projections), head dims that are not powers of two,
keys and values of different head dims, more rows than one step of the kernel's loop, positions
past the cache, the PyTorch path for large writes, and the errors."""

import sys

import pytest
import torch

from tests.support.library import DEVICE, randn

# (batch, kv heads, steps, key head dim, value head dim)
SHAPES = [
    (1, 4, 1, 64, 64),
    (3, 2, 1, 40, 40),
    (2, 5, 3, 72, 72),
    (1, 1, 2, 16, 24),
    # 8 x 8 rows of 128: two steps of the kernel's loop (32 rows of 128 a step).
    (8, 8, 1, 128, 128),
]
CACHE_LEN = 11


def _module(rotary):
    return sys.modules[f"{rotary.__name__}.kv_cache"]


def _caches(batch, heads, k_dim, v_dim, dtype):
    return randn(batch, heads, CACHE_LEN, k_dim, dtype=dtype), randn(
        batch, heads, CACHE_LEN, v_dim, dtype=dtype
    )


def _states(batch, heads, steps, dim, dtype):
    # transformers' layout: the projection's [batch, steps, heads, dim] transposed.
    return randn(batch, steps, heads, dim, dtype=dtype).transpose(1, 2)


def _reference(key_cache, value_cache, keys, values, positions):
    expected_k, expected_v = key_cache.clone(), value_cache.clone()
    expected_k.index_copy_(2, positions, keys)
    expected_v.index_copy_(2, positions, values)
    return expected_k, expected_v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_counter_form_writes_and_advances_as_transformers_5(rotary, shape, dtype):
    batch, heads, steps, k_dim, v_dim = shape
    key_cache, value_cache = _caches(batch, heads, k_dim, v_dim, dtype)
    keys, values = (
        _states(batch, heads, steps, k_dim, dtype),
        _states(batch, heads, steps, v_dim, dtype),
    )
    counter = torch.tensor(5, dtype=torch.int64, device=DEVICE)
    expected_k, expected_v = _reference(
        key_cache, value_cache, keys, values, torch.arange(steps, device=DEVICE) + 5
    )
    assert rotary.takes_kv_write(keys, values)
    rotary.write_kv_cache(key_cache, value_cache, keys, values, counter=counter)
    assert torch.equal(key_cache, expected_k)
    assert torch.equal(value_cache, expected_v)
    assert counter.item() == 5 + steps


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("shape", SHAPES)
def test_positions_form_writes_as_transformers_4_57(rotary, shape, index_dtype):
    batch, heads, steps, k_dim, v_dim = shape
    key_cache, value_cache = _caches(batch, heads, k_dim, v_dim, torch.bfloat16)
    keys = _states(batch, heads, steps, k_dim, torch.bfloat16)
    values = _states(batch, heads, steps, v_dim, torch.bfloat16)
    # Positions out of order: each step goes to its own position, not start + step.
    positions = torch.tensor([7, 2, 9][:steps], dtype=index_dtype, device=DEVICE)
    expected_k, expected_v = _reference(key_cache, value_cache, keys, values, positions.long())
    rotary.write_kv_cache(key_cache, value_cache, keys, values, positions=positions)
    assert torch.equal(key_cache, expected_k)
    assert torch.equal(value_cache, expected_v)


def test_contiguous_states_and_a_strided_batch_of_caches(rotary):
    # Contiguous [b, h, s, d] keys, and caches that are every other batch entry of a larger one.
    big_k = randn(4, 2, CACHE_LEN, 32, dtype=torch.float16)
    big_v = randn(4, 2, CACHE_LEN, 32, dtype=torch.float16)
    key_cache, value_cache = big_k[::2], big_v[::2]
    keys, values = randn(2, 2, 1, 32, dtype=torch.float16), randn(2, 2, 1, 32, dtype=torch.float16)
    positions = torch.tensor([3], device=DEVICE)
    expected_k, expected_v = _reference(key_cache, value_cache, keys, values, positions)
    untouched = big_k[1::2].clone()
    rotary.write_kv_cache(key_cache, value_cache, keys, values, positions=positions)
    assert torch.equal(key_cache, expected_k) and torch.equal(value_cache, expected_v)
    assert torch.equal(big_k[1::2], untouched)


def test_positions_past_the_cache_are_not_written(rotary):
    key_cache, value_cache = _caches(1, 2, 16, 16, torch.float32)
    before_k, before_v = key_cache.clone(), value_cache.clone()
    keys, values = _states(1, 2, 3, 16, torch.float32), _states(1, 2, 3, 16, torch.float32)
    counter = torch.tensor(CACHE_LEN - 1, device=DEVICE)
    rotary.write_kv_cache(key_cache, value_cache, keys, values, counter=counter)
    # The first step lands in the last slot; the two past the end are dropped.
    assert torch.equal(key_cache[:, :, -1], keys[:, :, 0])
    assert torch.equal(value_cache[:, :, -1], values[:, :, 0])
    assert torch.equal(key_cache[:, :, :-1], before_k[:, :, :-1])
    assert torch.equal(value_cache[:, :, :-1], before_v[:, :, :-1])
    assert counter.item() == CACHE_LEN + 2


def test_large_writes_take_index_copy(rotary, monkeypatch):
    module = _module(rotary)
    monkeypatch.setattr(module, "MAX_ELEMENTS", 64)
    launches = []
    monkeypatch.setattr(module, "launch", lambda *a, **k: launches.append(a))
    key_cache, value_cache = _caches(2, 2, 16, 16, torch.float32)
    keys, values = _states(2, 2, 3, 16, torch.float32), _states(2, 2, 3, 16, torch.float32)
    counter = torch.tensor(1, device=DEVICE)
    expected_k, expected_v = _reference(
        key_cache, value_cache, keys, values, torch.arange(3, device=DEVICE) + 1
    )
    assert not rotary.takes_kv_write(keys, values)
    rotary.write_kv_cache(key_cache, value_cache, keys, values, counter=counter)
    assert launches == []
    assert torch.equal(key_cache, expected_k) and torch.equal(value_cache, expected_v)
    assert counter.item() == 4


def test_a_decode_write_is_one_launch(rotary, monkeypatch):
    module = _module(rotary)
    launches = []
    original = module.launch

    def counting(*args, **kwargs):
        launches.append(args[0])
        original(*args, **kwargs)

    monkeypatch.setattr(module, "launch", counting)
    key_cache, value_cache = _caches(2, 4, 64, 64, torch.bfloat16)
    keys, values = _states(2, 4, 1, 64, torch.bfloat16), _states(2, 4, 1, 64, torch.bfloat16)
    rotary.write_kv_cache(
        key_cache, value_cache, keys, values, counter=torch.tensor(0, device=DEVICE)
    )
    assert launches == [module._kv_cache_write_kernel]


@pytest.mark.parametrize(
    "change, error, message",
    [
        ({"positions": "both"}, ValueError, "exactly one of positions= and counter="),
        ({"counter": None}, ValueError, "exactly one of positions= and counter="),
        ({"keys": "dtype"}, TypeError, "must agree"),
        ({"keys": "heads"}, ValueError, "do not fit a cache"),
        ({"keys": "3d"}, ValueError, "head dim]"),
        ({"counter": "float"}, TypeError, "int32 or int64"),
        ({"counter": "two"}, ValueError, "must hold one position"),
    ],
)
def test_errors_name_the_cause(rotary, change, error, message):
    key_cache, value_cache = _caches(1, 2, 16, 16, torch.float32)
    keys, values = _states(1, 2, 1, 16, torch.float32), _states(1, 2, 1, 16, torch.float32)
    kwargs = {"counter": torch.tensor(0, device=DEVICE)}
    if change.get("positions") == "both":
        kwargs["positions"] = torch.tensor([0], device=DEVICE)
    if "counter" in change and change["counter"] is None:
        kwargs = {}
    if change.get("counter") == "float":
        kwargs = {"counter": torch.tensor(0.0, device=DEVICE)}
    if change.get("counter") == "two":
        kwargs = {"counter": torch.tensor([0, 1], device=DEVICE)}
    if change.get("keys") == "dtype":
        keys = keys.half()
    if change.get("keys") == "heads":
        keys = _states(1, 3, 1, 16, torch.float32)
    if change.get("keys") == "3d":
        keys = keys[0]
    before = key_cache.clone()
    with pytest.raises(error, match=message):
        rotary.write_kv_cache(key_cache, value_cache, keys, values, **kwargs)
    assert torch.equal(key_cache, before)
