"""A decode step's KV-cache writes as one kernel launch a layer.

transformers' ``StaticLayer.update`` writes a step's keys and values with two ``index_copy_``
calls at positions it computes on the device (5.x: ``arange`` plus the layer's counter, which
it then advances: five small kernels a layer; 4.57: the ``cache_position`` it is given, two).
For the length of a ``generate()`` call, `kernel_cache_writes` puts an ``update`` in front of
each ``StaticLayer`` of the generator's cache (an instance attribute, as `projections` does
with the q, k and v projections) that writes decode-size steps with our rotary library's
``write_kv_cache``: one launch, the same bits, the counter advanced on the device. The prefill,
and any call the kernel does not take (another dtype, more tokens, a backward), is
``StaticLayer.update`` itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .attributes import instance_attribute


def _takes(layer: Any, keys: torch.Tensor, values: torch.Tensor, kernels: Any) -> bool:
    if not layer.is_initialized or torch.compiler.is_compiling():
        return False
    if type(keys) is not torch.Tensor or type(values) is not torch.Tensor:
        return False
    if torch.is_grad_enabled() and (keys.requires_grad or values.requires_grad):
        return False
    if keys.dim() != 4 or values.dim() != 4:
        return False
    if keys.dtype != layer.keys.dtype or values.dtype != layer.values.dtype:
        return False
    return keys.device == layer.keys.device and kernels.takes_kv_write(keys, values)


def _update(layer: Any, original: Callable[..., Any], kernels: Any) -> Callable[..., Any]:
    """The ``update`` that stands in front of ``layer``'s: transformers 5.x's signature
    ``(keys, values, *args, **kwargs)`` with the layer's counter, 4.57's
    ``(keys, values, cache_kwargs)`` with ``cache_kwargs["cache_position"]``."""

    def update(key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if _takes(layer, key_states, value_states, kernels):
            counter = getattr(layer, "cumulative_length", None)
            if isinstance(counter, torch.Tensor):  # 5.x: the layer counts its positions
                kernels.write_kv_cache(
                    layer.keys, layer.values, key_states, value_states, counter=counter
                )
                return layer.keys, layer.values
            cache_kwargs = args[0] if args else kwargs.get("cache_kwargs")
            positions = None if cache_kwargs is None else cache_kwargs.get("cache_position")
            if isinstance(positions, torch.Tensor) and positions.device == key_states.device:
                kernels.write_kv_cache(
                    layer.keys, layer.values, key_states, value_states, positions=positions
                )
                return layer.keys, layer.values
        return original(key_states, value_states, *args, **kwargs)

    return update


@contextlib.contextmanager
def kernel_cache_writes(cache: Any, kernels: Any) -> Iterator[int]:
    """For the block, write decode steps into every ``StaticLayer`` of ``cache`` with
    ``kernels.write_kv_cache`` (our rotary library); yields how many layers write so.
    ``StaticLayer`` subclasses (sliding-window layers) are left alone."""
    from transformers.cache_utils import StaticLayer

    layers = [layer for layer in getattr(cache, "layers", ()) if type(layer) is StaticLayer]
    with contextlib.ExitStack() as stack:
        for layer in layers:
            update = _update(layer, layer.update, kernels)
            stack.enter_context(instance_attribute(layer, "update", update))
        yield len(layers)
