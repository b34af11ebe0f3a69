"""How a decode step is captured once and replayed: CUDA graphs, or plain calls off CUDA.

A backend turns a function of no arguments (one decode step reading its static input buffers)
into a `CapturedCall` whose ``replay()`` runs that step again and returns its output. On CUDA,
`CudaGraphBackend` records the step's kernels into a ``torch.cuda.CUDAGraph`` and replays them
without Python; every graph of one backend allocates from one memory pool. Elsewhere,
`EagerBackend` keeps the function and calls it at each replay, so everything around the graph
(static buffers, keys, invalidation; `kernels.generation.decode`) runs and can be tested on the
CPU, and gives the same tokens.

Example:
    ```python
    import torch
    from kernels.generation.graph import CudaGraphBackend

    x = torch.zeros(8, device="cuda")
    backend = CudaGraphBackend(torch.device("cuda"))
    step = backend.capture(lambda: x * 2)  # x was used eagerly once before (warm-up)
    x.copy_(torch.arange(8.0, device="cuda"))
    print(step.replay())  # tensor([0., 2., 4., ...]): the captured kernels read x's new values
    ```
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch


class CapturedCall(Protocol):
    """One captured step; ``replay()`` runs it on the current contents of its input buffers."""

    def replay(self) -> Any: ...


class GraphBackend(Protocol):
    """Captures steps. ``name`` says how, for logs and statistics."""

    name: str

    def capture(self, fn: Callable[[], Any]) -> CapturedCall: ...


class _GraphedCall:
    def __init__(self, graph: torch.cuda.CUDAGraph, output: Any):
        self.graph = graph
        self.output = output

    def replay(self) -> Any:
        # The output tensors were allocated during capture, in the graph's pool: each replay
        # writes the new step's values into them.
        self.graph.replay()
        return self.output


class CudaGraphBackend:
    """Captures each step into a ``torch.cuda.CUDAGraph``, all sharing one memory pool.

    The graphs of one backend share ``torch.cuda.graph_pool_handle()``'s pool, so a graph per
    batch size costs little more memory than the largest of them. Two graphs of one pool must
    not run at once, and one graph's outputs are only valid until another graph of the pool
    replays: decoding replays one step at a time and copies the logits it needs before the next.

    The captured function must have run eagerly at least once with the same shapes (Triton and
    cuBLAS do their first-call work then, which a capture cannot contain); `DecodeGraphs` does
    that warm-up.
    """

    name = "cuda graph"

    def __init__(self, device: torch.device):
        if device.type != "cuda":
            raise ValueError(f"CudaGraphBackend needs a CUDA device, got {device}")
        self.device = device
        # The type graph_pool_handle returns (torch's own annotation; private by name only).
        self._pool: torch.cuda._POOL_HANDLE | None = None

    def capture(self, fn: Callable[[], Any]) -> CapturedCall:
        with torch.cuda.device(self.device):
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                output = fn()
        return _GraphedCall(graph, output)


class _EagerCall:
    def __init__(self, fn: Callable[[], Any]):
        self.fn = fn

    def replay(self) -> Any:
        return self.fn()


class EagerBackend:
    """Stands in for CUDA graphs where there are none: ``capture`` keeps the function and each
    ``replay`` calls it. The step still reads its static input buffers, so what surrounds the
    graph is exercised exactly as on CUDA."""

    name = "eager"

    def capture(self, fn: Callable[[], Any]) -> CapturedCall:
        return _EagerCall(fn)


def default_backend(device: torch.device) -> GraphBackend:
    """`CudaGraphBackend` for a CUDA device, `EagerBackend` for any other."""
    return CudaGraphBackend(device) if device.type == "cuda" else EagerBackend()
