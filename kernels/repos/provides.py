"""What a kernel package provides under a name: a kernel layer class, or a kernel function.

A layer repository names what it serves with ``layer_name``. Hugging Face's `kernels` (and
transformers 5.x, which reads ``__module__`` and ``__name__`` of what ``repo.load()`` returns)
expects ``load()`` to hand over that object itself, not the package: a class from the
package's ``layers`` module, or, for function kernels such as transformers'
``apply_rotary_transformers``, a function. `provided_kernel` finds it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import ModuleType

from ..errors import KernelLoadError


def provided_kernel(package: ModuleType, name: str, repository: object) -> type | Callable:
    """The kernel layer class or kernel function `package` provides as `name`.

    Looked up first in the package's ``layers`` module (classes, and functions kept there),
    then among the package's top-level functions.

    Raises:
        KernelLoadError: the package provides nothing callable under `name`; the message
            lists what it does provide.

    Example:
        ```python
        from kernels import get_local_kernel
        from kernels.repos.provides import provided_kernel

        rms_norm_layer = provided_kernel(get_local_kernel("library/norm"), "RMSNorm", "norm")
        ```
    """
    layers = getattr(package, "layers", None)
    for source in (layers, package):
        found = getattr(source, name, None) if source is not None else None
        # Classes, Python functions, and functions of compiled extensions (not submodules).
        if callable(found) and not inspect.ismodule(found):
            return found
    raise KernelLoadError(
        f"{repository} has no layer or function '{name}'. Layers it provides: "
        f"{', '.join(_layer_names(layers)) or 'none'}; functions: "
        f"{', '.join(_function_names(package)) or 'none'}."
    )


def _layer_names(layers: ModuleType | None) -> list[str]:
    if layers is None:
        return []
    return sorted(
        n for n, v in vars(layers).items() if inspect.isclass(v) and v.__module__ == layers.__name__
    )


def _function_names(package: ModuleType) -> list[str]:
    return sorted(
        n
        for n, v in vars(package).items()
        if not n.startswith("_") and callable(v) and not inspect.isclass(v)
    )
