"""The keyword arguments of one decode call, as a captured graph sees them.

A graph replays fixed kernels on fixed memory, so a call can reuse a graph only when it looks
exactly like the call the graph was captured from: the same argument names, tensors of the same
shape, strides, dtype and device, and the same plain values (``use_cache=True``,
``logits_to_keep=1``, ...). `call_key` turns the arguments into a hashable key that says so, or
raises `NotCapturable` naming the argument a graph cannot take. `StaticInputs` holds the buffers
a graph reads: each call's tensors are copied into them before a replay.

Example:
    ```python
    import torch
    from kernels.generation.inputs import StaticInputs, call_key

    first = {"input_ids": torch.tensor([[5]]), "use_cache": True}
    inputs = StaticInputs(first)  # step = capture(lambda: model(**inputs.kwargs))
    later = {"input_ids": torch.tensor([[7]]), "use_cache": True}
    assert call_key(later, {}, torch.device("cpu")) == call_key(first, {}, torch.device("cpu"))
    inputs.load(later)  # inputs.kwargs["input_ids"] now holds 7; replay the step
    ```
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

# Values that a graph may see as constants: equal values mean the same computation.
_PLAIN_TYPES = (type(None), bool, int, float, str)


def widen_padding_mask(kwargs: dict[str, Any], position: int, capacity: int) -> dict[str, Any]:
    """``kwargs`` with a 2D padding mask ``[batch, position + 1]`` (generate()'s, a column for each
    token so far) widened to the cache's ``capacity`` columns, the new ones closed; other
    arguments as they are. The step's attention sees the same keys either way (the closed
    columns are cache rows not yet written)."""
    mask = kwargs.get("attention_mask")
    if (
        not isinstance(mask, torch.Tensor)
        or mask.dim() != 2
        or mask.shape[1] != position + 1
        or capacity <= position + 1
    ):
        return kwargs
    wide = torch.zeros(mask.shape[0], capacity, dtype=mask.dtype, device=mask.device)
    wide[:, : position + 1] = mask
    return {**kwargs, "attention_mask": wide}


class NotCapturable(Exception):
    """A call a graph cannot replay; the message says which argument and why."""


#: A `call_key` key: one tuple per argument, ``(name, kind, ...)``; kind is ``"object"`` (then
#: the object's id), ``"tensor"`` (then its layout) or ``"value"`` (then its type and value).
CallKey = tuple[tuple[object, ...], ...]


def call_key(
    kwargs: Mapping[str, Any], objects: Mapping[str, object], device: torch.device
) -> CallKey:
    """A key equal for two calls exactly when one graph can run both.

    Args:
        kwargs: the call's keyword arguments.
        objects: arguments passed by identity (the KV cache): the key holds the object's id,
            so the caller must keep the object alive as long as it keeps the key.
        device: where the graph runs; tensors elsewhere would be read once, at capture.

    Raises:
        NotCapturable: an argument is a tensor that needs gradients, lives on another device
            or is a tensor subclass, or a value that is neither a tensor, a number, a string,
            None, nor one of ``objects``.
    """
    items: list[tuple[object, ...]] = []
    for name in sorted(kwargs):
        value = kwargs[name]
        if name in objects and value is objects[name]:
            items.append((name, "object", id(value)))
        elif isinstance(value, torch.Tensor):
            _check_tensor(name, value, device)
            items.append(
                (name, "tensor", tuple(value.shape), value.stride(), value.dtype, value.device)
            )
        elif isinstance(value, _PLAIN_TYPES):
            items.append((name, "value", type(value).__name__, value))
        else:
            raise NotCapturable(
                f"argument {name!r} is a {type(value).__name__}, which a graph cannot take as "
                "an input (it takes tensors, numbers, strings, None and the static cache)"
            )
    return tuple(items)


def _check_tensor(name: str, value: torch.Tensor, device: torch.device) -> None:
    if type(value) is not torch.Tensor:
        raise NotCapturable(
            f"argument {name!r} is a tensor subclass ({type(value).__name__}); a graph copies "
            "plain tensors only"
        )
    if value.requires_grad:
        raise NotCapturable(
            f"argument {name!r} requires gradients; decode steps are captured without autograd"
        )
    if value.device != device:
        raise NotCapturable(
            f"argument {name!r} is on {value.device}, not on {device} where the graph runs: a "
            "graph would keep the values it had at capture"
        )


class StaticInputs:
    """The buffers a captured step reads: a copy of each tensor argument of the first call.

    ``kwargs`` is the first call's arguments with its tensors replaced by the buffers: the
    captured function is called with it. `load` copies a later call's tensors in.
    """

    def __init__(self, kwargs: Mapping[str, Any]):
        # Allocated before capture, with the ordinary allocator: a graph's private pool may
        # hand memory of one graph's temporaries to another graph, never these buffers.
        self.buffers = {
            name: value.clone() for name, value in kwargs.items() if isinstance(value, torch.Tensor)
        }
        self.kwargs = {**kwargs, **self.buffers}

    def load(self, kwargs: Mapping[str, Any]) -> None:
        """Copy the tensors of ``kwargs`` (a call with the same key) into the buffers."""
        for name, buffer in self.buffers.items():
            buffer.copy_(kwargs[name])
