"""A ``torch.compile`` backend that puts kernels into models nobody tagged.

Dynamo hands the backend each graph it captures; the backend finds known computations in it
(an RMSNorm written out as transformers writes it, ``F.silu(gate) * up``, ``nn.LayerNorm``, a
ReLU), replaces them with kernels from a `KernelRegistry` (our Triton kernels, and kernels you
register), then hands the graph to inductor (or runs it eagerly). See docs/compile-backend.md.

Example:
    ```python
    import torch
    from kernels.compile import KernelRegistry

    registry = KernelRegistry.library()      # our norms and activations

    @registry.register("relu")               # a kernel of your own
    def my_relu(x): ...

    backend = registry.backend(downstream="inductor", report="report.txt")
    model = torch.compile(model, backend=backend)
    ```
"""

from __future__ import annotations

from .backend import KernelsBackend
from .entry import KernelEntry
from .errors import (
    DownstreamError,
    DrawingUnavailableError,
    KernelOutputError,
    KernelRegistrationError,
    UnknownPatternError,
)
from .patterns import PATTERNS, Match, Pattern
from .policy import Policy
from .registry import KernelRegistry, kernels_backend
from .report import MatchRecord, RewriteReport

__all__ = [
    "PATTERNS",
    "DownstreamError",
    "DrawingUnavailableError",
    "KernelEntry",
    "KernelOutputError",
    "KernelRegistrationError",
    "KernelRegistry",
    "KernelsBackend",
    "Match",
    "MatchRecord",
    "Pattern",
    "Policy",
    "RewriteReport",
    "UnknownPatternError",
    "kernels_backend",
]
