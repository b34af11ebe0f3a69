"""Decode steps run from captured graphs: which calls, which graph, when to capture or recapture.

`DecodeGraphs.run` stands between ``generate()`` and the model's forward. A call is a decode
step when it passes one of the static caches `DecodeGraphs` was given (`add_cache`) and one new
token per sequence; any other call (the prefill, a forward of your own) runs as it would
without it. A decode step's arguments give a key (`kernels.generation.inputs.call_key`: batch
size, shapes, dtypes, plain values, the cache); per key:

1. the first ``warmup_steps`` steps run eagerly: Triton compiles, cuBLAS picks its kernels;
2. the next step is captured (`kernels.generation.graph`) on static copies of its inputs, and
   replayed;
3. every later step copies its tensors into those buffers and replays.

A graph is dropped when its cache's tensors move (`kernels.generation.cache.fingerprint`) or
the cache is removed; a step that cannot be captured (the reason is logged once) and a key
whose capture failed run eagerly from then on.

Example:
    ```python
    import functools

    from kernels.generation.cache import cache_argument
    from kernels.generation.decode import DecodeGraphs
    from kernels.generation.graph import default_backend

    graphs = DecodeGraphs(default_backend(model.device), cache_argument=cache_argument(model))
    graphs.add_cache(cache)
    forward = model.forward
    model.forward = functools.wraps(forward)(lambda *a, **kw: graphs.run(forward, a, kw))
    model.generate(input_ids, past_key_values=cache, disable_compile=True)
    del model.forward
    print(graphs.stats)  # DecodeStats(other_calls=1, eager_steps=1, captures=1, replays=..., ...)
    ```
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .cache import capture_blocker, fingerprint
from .graph import CapturedCall, GraphBackend
from .inputs import CallKey, NotCapturable, StaticInputs, call_key, widen_padding_mask

logger = logging.getLogger(__name__)


@dataclass
class DecodeStats:
    """What `DecodeGraphs` did with the calls it saw."""

    #: Calls that were not decode steps on a cache of ours (prefill, other forwards): eager.
    other_calls: int = 0
    #: Decode steps run eagerly: warm-ups, and steps that cannot be captured.
    eager_steps: int = 0
    #: Graphs captured.
    captures: int = 0
    #: Decode steps run by replaying a graph (the step that captured a graph included).
    replays: int = 0
    #: Captures that raised: their key runs eagerly from then on.
    failed_captures: int = 0
    #: generate() calls decoded by the fused loop (`kernels.generation.fused_loop`).
    fused_calls: int = 0
    #: Tokens those calls got from the fused loop (all but the first, which the prefill makes).
    fused_tokens: int = 0
    #: Fused blocks (K decode steps in one graph) captured.
    fused_captures: int = 0
    #: Fused blocks run by replaying their graph (K decode steps each).
    fused_replays: int = 0


@dataclass
class _Graph:
    inputs: StaticInputs  # its kwargs hold the cache, which keeps it alive
    step: CapturedCall
    fingerprint: tuple[int, ...]


class DecodeGraphs:
    """Runs a causal LM's decode steps from graphs: one per key (batch size and the rest of the
    call's shape), all from one backend (and so, on CUDA, one memory pool).

    Args:
        backend: how steps are captured (`CudaGraphBackend` on CUDA, `EagerBackend` elsewhere).
        cache_argument: the forward's name for the KV cache (``past_key_values``, or ``cache``
            in transformers 5.x).
        device: where the model runs; tensor arguments must be there to be captured.
        warmup_steps: eager decode steps per key before its capture (at least 1 on CUDA).
    """

    def __init__(
        self,
        backend: GraphBackend,
        *,
        cache_argument: str,
        device: torch.device,
        warmup_steps: int = 1,
    ):
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.backend = backend
        self.cache_argument = cache_argument
        self.device = device
        self.warmup_steps = warmup_steps
        self.stats = DecodeStats()
        self._caches: dict[int, Any] = {}  # id -> cache
        self._capacities: dict[int, int] = {}  # id -> tokens the cache holds, where given
        self._graphs: dict[CallKey, _Graph] = {}
        self._warm: dict[CallKey, int] = {}  # key -> eager warm-up steps run
        self._failed: dict[CallKey, str] = {}
        self._logged: set[str] = set()

    # ---- caches and graphs ---------------------------------------------------------------------

    def add_cache(self, cache: Any, capacity: int | None = None) -> None:
        """Treat calls that pass ``cache`` with one token per sequence as decode steps. With its
        ``capacity`` (tokens it holds), a step's 2D padding mask, a column a token so far, is
        widened to that many columns (`widen_padding_mask`), so that every step of a call has
        the same shapes and one graph replays them all."""
        self._caches[id(cache)] = cache
        if capacity is not None:
            self._capacities[id(cache)] = capacity

    def remove_cache(self, cache: Any) -> None:
        """Forget ``cache`` and drop the graphs captured on it."""
        self._caches.pop(id(cache), None)
        self._capacities.pop(id(cache), None)
        self._forget(lambda key: key_cache_id(key) == id(cache))

    def clear(self) -> None:
        """Drop every graph and cache (their memory goes when nothing else holds it)."""
        self._caches.clear()
        self._capacities.clear()
        self._forget(lambda key: True)

    @property
    def graph_count(self) -> int:
        """How many graphs are held now."""
        return len(self._graphs)

    def _forget(self, matches: Callable[[CallKey], bool]) -> None:
        for table in (self._graphs, self._warm, self._failed):
            for key in [k for k in table if matches(k)]:
                del table[key]

    # ---- calls -----------------------------------------------------------------------------------

    def is_decode_step(self, args: tuple, kwargs: dict[str, Any]) -> bool:
        """Whether a forward call is a decode step: keyword arguments only, one of our caches,
        one new token per sequence."""
        cache = kwargs.get(self.cache_argument)
        return not args and id(cache) in self._caches and _new_tokens(kwargs) == 1

    def run(self, forward: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        """``forward(*args, **kwargs)``, from a graph when it is a decode step that can be."""
        if not self.is_decode_step(args, kwargs):
            self.stats.other_calls += 1
            return forward(*args, **kwargs)
        cache = kwargs[self.cache_argument]
        capacity = self._capacities.get(id(cache))
        mask = kwargs.get("attention_mask")
        if capacity is not None and isinstance(mask, torch.Tensor) and mask.dim() == 2:
            kwargs = widen_padding_mask(kwargs, mask.shape[1] - 1, capacity)
        key, reason = self._key(cache, kwargs)
        if key is None:
            self._log_once(f"decode steps run eagerly: {reason}")
            return self._eager_step(forward, kwargs)

        graph = self._graphs.get(key)
        if graph is not None and graph.fingerprint != fingerprint(cache):
            logger.info("the static cache's tensors moved; recapturing its decode graph")
            del self._graphs[key]
            graph = None
        if graph is None:
            # Checked before a capture only: a cache's layers keep their types, and a layer
            # re-allocated since a capture changes the fingerprint.
            blocker = capture_blocker(cache)
            if blocker is not None:
                self._log_once(f"decode steps run eagerly: {blocker}")
                return self._eager_step(forward, kwargs)
            if self._warm.get(key, 0) < self.warmup_steps:
                self._warm[key] = self._warm.get(key, 0) + 1
                return self._eager_step(forward, kwargs)
            graph = self._capture(key, forward, cache, kwargs)
            if graph is None:
                return self._eager_step(forward, kwargs)
        else:
            graph.inputs.load(kwargs)
        self.stats.replays += 1
        return graph.step.replay()

    def _key(self, cache: Any, kwargs: dict[str, Any]) -> tuple[CallKey | None, str | None]:
        """The call's key, or None and why it cannot be captured."""
        if torch.is_grad_enabled():
            return None, "gradients are enabled (generate() runs under torch.no_grad())"
        try:
            key = call_key(kwargs, {self.cache_argument: cache}, self.device)
        except NotCapturable as exc:
            return None, str(exc)
        if key in self._failed:
            return None, f"its capture failed: {self._failed[key]}"
        return key, None

    def _capture(self, key: CallKey, forward: Callable, cache: Any, kwargs: dict) -> _Graph | None:
        inputs = StaticInputs(kwargs)
        started = time.perf_counter()
        try:
            step = self.backend.capture(lambda: forward(**inputs.kwargs))
        except Exception as exc:  # a capture can fail in any op; the step then runs eagerly
            self._failed[key] = f"{type(exc).__name__}: {exc}"
            self.stats.failed_captures += 1
            logger.warning(
                "capturing a decode step (batch %s) failed, so it runs eagerly: %s: %s. A "
                "layer synchronising with the host (.item(), .cpu(), a Python branch on a "
                "tensor) cannot be captured: `kernels explain MODEL` lists such layers.",
                _batch_size(kwargs),
                type(exc).__name__,
                exc,
            )
            return None
        graph = _Graph(inputs, step, fingerprint(cache))
        self._graphs[key] = graph
        self.stats.captures += 1
        logger.info(
            "captured the decode step for batch %s (%s) in %.2f s",
            _batch_size(kwargs),
            self.backend.name,
            time.perf_counter() - started,
        )
        return graph

    def _eager_step(self, forward: Callable, kwargs: dict) -> Any:
        self.stats.eager_steps += 1
        return forward(**kwargs)

    def _log_once(self, message: str) -> None:
        if message not in self._logged:
            self._logged.add(message)
            logger.warning(message)

    def stats_snapshot(self) -> DecodeStats:
        """A copy of `stats`."""
        return dataclasses.replace(self.stats)


def _new_tokens(kwargs: dict[str, Any]) -> int | None:
    """How many positions per sequence the call feeds, from ``input_ids`` or ``inputs_embeds``."""
    for name in ("input_ids", "inputs_embeds"):
        value = kwargs.get(name)
        if isinstance(value, torch.Tensor) and value.dim() >= 2:
            return value.shape[1]
    return None


def _batch_size(kwargs: dict[str, Any]) -> int | str:
    for name in ("input_ids", "inputs_embeds"):
        value = kwargs.get(name)
        if isinstance(value, torch.Tensor):
            return value.shape[0]
    return "?"


def key_cache_id(key: CallKey) -> int | None:
    """The id of the cache a `call_key` key was made with, or None."""
    for item in key:
        if item[1] == "object" and isinstance(item[2], int):
            return item[2]
    return None
