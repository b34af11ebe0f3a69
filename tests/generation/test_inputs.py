"""call_key and StaticInputs: when two calls can share a graph, and the buffers it reads."""

from __future__ import annotations

import pytest
import torch

from kernels.generation.graph import CudaGraphBackend, EagerBackend, default_backend
from kernels.generation.inputs import NotCapturable, StaticInputs, call_key

CPU = torch.device("cpu")


def step(token: int, batch: int = 2, **extra):
    return {
        "input_ids": torch.full((batch, 1), token),
        "cache_position": torch.tensor([token]),
        "use_cache": True,
        "logits_to_keep": 1,
        **extra,
    }


def test_calls_that_differ_in_values_only_share_a_key():
    assert call_key(step(3), {}, CPU) == call_key(step(9), {}, CPU)


@pytest.mark.parametrize(
    "other",
    [
        step(3, batch=4),  # batch size
        step(3, use_cache=False),  # a plain value
        {**step(3), "cache_position": torch.tensor([3], dtype=torch.int32)},  # dtype
        {**step(3), "input_ids": torch.full((1, 2), 3).t()},  # strides
        {k: v for k, v in step(3).items() if k != "logits_to_keep"},  # argument names
    ],
)
def test_calls_that_differ_in_shape_or_plain_values_do_not(other):
    assert call_key(other, {}, CPU) != call_key(step(3), {}, CPU)


def test_objects_are_keyed_by_identity():
    cache, other = object(), object()
    key = call_key(step(3, past_key_values=cache), {"past_key_values": cache}, CPU)
    assert key == call_key(step(5, past_key_values=cache), {"past_key_values": cache}, CPU)
    assert key != call_key(step(5, past_key_values=other), {"past_key_values": other}, CPU)


@pytest.mark.parametrize(
    "value,match",
    [
        (object(), "is a object, which a graph cannot take"),
        ([torch.ones(1)], "is a list"),
        (torch.ones(1, requires_grad=True), "requires gradients"),
        (torch.nn.Parameter(torch.ones(1), requires_grad=False), "tensor subclass"),
    ],
)
def test_what_a_graph_cannot_take_is_named(value, match):
    with pytest.raises(NotCapturable, match=match):
        call_key(step(3, extra=value), {}, CPU)


def test_tensors_on_another_device_are_refused():
    with pytest.raises(NotCapturable, match="is on cpu, not on meta"):
        call_key(step(3), {}, torch.device("meta"))


def test_static_inputs_copy_each_call_into_the_buffers_the_step_reads():
    first = step(3)
    inputs = StaticInputs(first)
    buffer = inputs.kwargs["input_ids"]
    assert buffer is not first["input_ids"] and torch.equal(buffer, first["input_ids"])
    assert inputs.kwargs["use_cache"] is True
    replay = EagerBackend().capture(lambda: inputs.kwargs["input_ids"] * 2)
    inputs.load(step(7))
    assert inputs.kwargs["input_ids"] is buffer
    assert torch.equal(replay.replay(), torch.full((2, 1), 14))


def test_backends_by_device():
    assert isinstance(default_backend(CPU), EagerBackend)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        CudaGraphBackend(CPU)
