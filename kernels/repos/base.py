"""What every kind of kernel repository offers to the mapping and to `kernelize`."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Protocol, runtime_checkable


@runtime_checkable
class LayerRepositoryProtocol(Protocol):
    """A source of kernel layers: where the kernel comes from and which layer to take.

    `load()` returns the kernel layer class named `layer_name` (or, for a function kernel,
    the function), as Hugging Face's `kernels` does and transformers 5.x expects. Any object
    with these two members can be used in a mapping, so third-party repository kinds work
    with `kernelize` too; `kernelize` also accepts a `load()` that returns the imported
    kernel package, in which it looks `layer_name` up (``layers.<name>``, else a function).
    """

    layer_name: str

    def load(self) -> type | Callable | ModuleType: ...


def is_repository(value: object) -> bool:
    """Whether `value` can stand as a repository in a kernel mapping."""
    return isinstance(getattr(value, "layer_name", None), str) and callable(
        getattr(value, "load", None)
    )
