"""transformers' static KV cache, as decode graphs need it, for transformers 4.57 and 5.x.

A captured decode step writes into the cache's key and value tensors at the addresses they had
at capture, so the cache must be preallocated (``StaticCache``), filled by an eager prefill
before capture, and kept: `fingerprint` tells when its tensors moved. Its layers must keep
their position on the device: 4.57's ``StaticLayer`` is told it by ``cache_position``, 5.x's
counts in a device tensor (``cumulative_length``), and both replay; a layer that counts in
Python (sliding-window layers) would be frozen at capture, so `capture_blocker` refuses it.

transformers 5.x renamed the model's ``past_key_values`` argument ``cache``; `cache_argument`
says which name a model takes.

Example:
    ```python
    from kernels.generation.cache import cache_argument, new_static_cache

    cache = new_static_cache(model, max_cache_len=256)
    model.generate(input_ids, **{cache_argument(model): cache}, max_new_tokens=128)
    ```
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedModel


def cache_argument(model: nn.Module) -> str:
    """The name under which ``model``'s forward (and ``generate``) takes the KV cache:
    ``"cache"`` in transformers 5.x, ``"past_key_values"`` before."""
    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def new_static_cache(model: PreTrainedModel, max_cache_len: int) -> Any:
    """An empty ``transformers.StaticCache`` for ``model`` holding ``max_cache_len`` tokens.

    Its tensors are allocated at the first forward (the prefill), with that call's batch size,
    dtype and device.
    """
    from transformers import StaticCache

    return StaticCache(config=model.config, max_cache_len=max_cache_len)


def capture_blocker(cache: Any) -> str | None:
    """Why decode steps on ``cache`` cannot be captured now, or None when they can."""
    from transformers.cache_utils import StaticLayer

    layers = getattr(cache, "layers", None)
    if layers is None:
        return (
            f"the cache ({type(cache).__name__}) has no layers; transformers 4.57 or later "
            "is needed"
        )
    if getattr(cache, "offloading", False):
        return "the cache offloads layers to the CPU between steps"
    for i, layer in enumerate(layers):
        if type(layer) is not StaticLayer:
            return (
                f"cache layer {i} is a {type(layer).__name__}, not a StaticLayer: it may keep "
                "its position in Python, which a graph would freeze at capture (sliding-window "
                "and chunked attention are not captured)"
            )
        if not layer.is_initialized:
            return "the cache has not been filled by a prefill yet"
    return None


def fingerprint(cache: Any) -> tuple[int, ...]:
    """The addresses of the tensors a captured step writes in ``cache``: equal fingerprints
    mean a graph captured on the cache still writes where the cache reads."""
    pointers = []
    for layer in cache.layers:
        pointers += [layer.keys.data_ptr(), layer.values.data_ptr()]
        position = getattr(layer, "cumulative_length", None)  # transformers 5.x
        if position is not None and hasattr(position, "data_ptr"):
            pointers.append(position.data_ptr())
    return tuple(pointers)
