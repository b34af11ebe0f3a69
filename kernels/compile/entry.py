"""One entry of a kernel registry: a pattern, the kernel that replaces it, and its settings."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .patterns import Match, Pattern
from .policy import Policy

#: The dtypes every kernel of the library takes, and a registered kernel by default.
DEFAULT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def default_device_types() -> tuple[str, ...]:
    """Where Triton kernels run: ``cuda``, and ``cpu`` when ``TRITON_INTERPRET=1`` is set (Triton's
    interpreter, slow, for checking numerics), read when a graph is rewritten, as
    `kernels.library.library_mapping` reads it."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return ("cuda", "cpu")
    return ("cuda",)


@dataclass(frozen=True)
class KernelEntry:
    """A kernel registered for a pattern.

    Attributes:
        pattern: the computation it replaces.
        kernel: what was registered: a user's function, or the library function it calls.
        label: how reports name the kernel (``"my_relu"``, ``"library norm.rms_norm"``).
        source: ``"user"`` or ``"library"``.
        policy: when it replaces matches (`Policy`).
        graph_call: the function a replacement node calls when a compiler follows (inductor,
            aot_eager): a ``torch.library`` op, or a function that calls only such ops, so that
            aot_autograd traces it as one node with its registered backward.
        eager_call: the function a replacement node calls when the graph runs eagerly
            (``downstream="eager"``); the same computation, with less host overhead per call.
        device_types: the device types it runs on; None: `default_device_types`.
        dtypes: the input dtypes it takes.
        min_cuda_capability: the oldest CUDA compute capability it runs on, or None.
        check: an extra test of a match's traced values (``(match, values) -> reason or
            None``); the library's norm kernels use it to refuse a missing weight.
    """

    pattern: Pattern
    kernel: Callable
    label: str
    source: str
    policy: Policy
    graph_call: Callable
    eager_call: Callable
    device_types: tuple[str, ...] | None = None
    dtypes: tuple[torch.dtype, ...] = DEFAULT_DTYPES
    min_cuda_capability: tuple[int, int] | None = None
    check: Callable[[Match, tuple], str | None] | None = None

    def with_policy(self, policy: Policy | str) -> KernelEntry:
        return dataclasses.replace(self, policy=Policy.parse(policy))

    def call_for(self, downstream: str) -> Callable:
        """The function a replacement node calls under ``downstream``: the eager one only when
        nothing traces the graph afterwards (``"eager"``; aot_eager traces it)."""
        return self.eager_call if downstream == "eager" else self.graph_call

    def resolved_device_types(self) -> tuple[str, ...]:
        return self.device_types if self.device_types is not None else default_device_types()
