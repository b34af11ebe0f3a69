"""What every kind of kernel repository offers to the mapping and to `kernelize`."""

from __future__ import annotations

from types import ModuleType
from typing import Protocol, runtime_checkable


@runtime_checkable
class LayerRepositoryProtocol(Protocol):
    """A source of kernel layers: where the kernel comes from and which layer to take.

    `load()` returns the imported kernel package; its ``layers`` submodule holds the layer
    class named `layer_name`. Any object with these two members can be used in a mapping,
    so third-party repository kinds work with `kernelize` too. (A repository may instead
    return the kernel layer class itself from `load()`, as function repositories do.)
    """

    layer_name: str

    def load(self) -> ModuleType: ...


def is_repository(value: object) -> bool:
    """Whether `value` can stand as a repository in a kernel mapping."""
    return isinstance(getattr(value, "layer_name", None), str) and callable(
        getattr(value, "load", None)
    )
