"""Getting the kernel layer class a repository provides."""

from __future__ import annotations

import inspect

from ..errors import KernelLoadError
from ..function_kernels import function_layer
from ..repos.base import LayerRepositoryProtocol
from ..repos.provides import provided_kernel

#: Attribute of a `KernelLoadError` made here: the exception a repository's load() raised.
_REPOSITORY_ERROR = "repository_error"


def repository_error(error: KernelLoadError) -> Exception | None:
    """What a third-party repository's ``load()`` raised, where `error` wraps it; else None.

    `kernelize` raises it as it was raised (a ``FileNotFoundError`` stays one), as Hugging
    Face's kernels does; our own repositories raise `KernelLoadError` subclasses themselves.
    """
    original = getattr(error, _REPOSITORY_ERROR, None)
    return original if isinstance(original, Exception) else None


def load_kernel_layer(repository: LayerRepositoryProtocol) -> type:
    """Load `repository` and return its kernel layer class (not yet validated).

    `repository.load()` may return the kernel layer class, a kernel function (wrapped here
    as a layer whose forward calls it), or the kernel package, in which the layer or function
    named ``repository.layer_name`` is looked up.

    Raises:
        KernelLoadError: the repository could not be loaded, or it has no such layer.
            Whatever a third-party repository raises while loading is wrapped in it.
    """
    try:
        loaded = repository.load()
    except KernelLoadError:
        raise
    except Exception as exc:
        error = KernelLoadError(f"{type(exc).__name__}: {exc}")
        setattr(error, _REPOSITORY_ERROR, exc)
        raise error from exc

    if inspect.ismodule(loaded):
        loaded = provided_kernel(loaded, repository.layer_name, repository)
    if inspect.isclass(loaded):
        return loaded
    if callable(loaded):
        return function_layer(loaded)
    raise KernelLoadError(
        f"{repository}.load() returned {loaded!r}; a repository's load() returns the kernel "
        "layer class, a kernel function, or the kernel package."
    )
