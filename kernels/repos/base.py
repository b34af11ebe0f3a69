"""What every kind of kernel repository offers to the mapping and to `kernelize`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType
from typing import Protocol, TypeGuard, runtime_checkable

logger = logging.getLogger(__name__)


def warn_function_repository_deprecated(name: str, replacement: str) -> None:
    """The WARNING of Hugging Face's client for its three function repositories, deprecated
    since 0.17: a layer repository takes a function's name as ``layer_name`` too."""
    logger.warning(
        "%s is deprecated and will be removed in kernels 0.17. Use %s instead (its layer_name "
        "may name a function of the kernel package).",
        name,
        replacement,
        stacklevel=3,
    )


@runtime_checkable
class LayerRepositoryProtocol(Protocol):
    """A source of kernel layers: where the kernel comes from and which layer to take.

    `load()` returns the kernel layer class named `layer_name` (or, for a function kernel,
    the function), as Hugging Face's `kernels` does and transformers 5.x expects. Any object
    with these two members can be used in a mapping, so third-party repository kinds work
    with `kernelize` too; `kernelize` also accepts a `load()` that returns the imported
    kernel package, in which it looks `layer_name` up (``layers.<name>``, else a function).
    """

    # Read-only, so that a property satisfies it too.
    @property
    def layer_name(self) -> str: ...

    def load(self) -> type | Callable | ModuleType: ...


class PackageSource(Protocol):
    """A repository that downloads (if needed) and imports a kernel package."""

    def load_package(self) -> ModuleType: ...


class PackageFunction:
    """What a function kernel from a package repository is, given `func_name` and `_package`
    (a repository with ``load_package()``): `FuncRepository` and `LockedFuncRepository`."""

    func_name: str
    _package: PackageSource

    @property
    def layer_name(self) -> str:
        return self.func_name

    def load(self) -> type:
        """Download (if needed) and import the kernel package; its function as a kernel layer."""
        from ..function_kernels import function_kernel

        return function_kernel(self._package.load_package(), self.func_name, self)

    def __deepcopy__(self, memo: dict) -> PackageFunction:
        return self  # an immutable value; the loaded package must not be copied

    def __str__(self) -> str:
        described = str(self._package)
        return described[: described.rindex(", layer ")] + f", function {self.func_name}"


def is_repository(value: object) -> TypeGuard[LayerRepositoryProtocol]:
    """Whether `value` can stand as a repository in a kernel mapping."""
    return isinstance(getattr(value, "layer_name", None), str) and callable(
        getattr(value, "load", None)
    )
