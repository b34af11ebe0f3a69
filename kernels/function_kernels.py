"""Function kernels as kernel layers: a class whose `forward` calls the function.

`kernelize` swaps forwards, so a kernel that is a plain function (``apply_rotary_pos_emb`` of
a kernel package) is given a module class whose `forward` calls it. Both the repositories that
load function kernels (`kernels.repos`) and the decorators that make a function kernelizable
(`kernels.layer.func`) use it; it lives beside them so neither imports the other.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

from .errors import KernelLoadError

if TYPE_CHECKING:
    from torch import nn


@functools.cache
def function_layer(func: Callable) -> type[nn.Module]:
    """A module class whose `forward` calls `func`, with `func`'s signature after `self`.

    The same function always gives the same class, so a function kernel is validated and
    recognised once however often it is loaded.
    """
    from torch import nn

    def forward(self, *args, **kwargs):
        return func(*args, **kwargs)

    signature = inspect.signature(func)
    self_parameter = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    # Functions take any attribute; the checker knows only those every function has.
    forward.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[self_parameter, *signature.parameters.values()]
    )
    forward.__doc__ = func.__doc__
    # What it calls, for introspection (its signature is set above).
    forward.__wrapped__ = func  # type: ignore[attr-defined]
    name = getattr(func, "__name__", "function")
    forward.__qualname__ = f"{name}.forward"
    # A function declares what it supports the way a kernel layer does, as attributes.
    flags = {flag: getattr(func, flag) for flag in _FLAGS if hasattr(func, flag)}
    namespace = {"forward": forward, "__doc__": func.__doc__, **flags}
    # For pickling a module that runs it: the function is found again by its name.
    namespace[FUNCTION_ATTRIBUTE] = staticmethod(func)
    return type(name, (nn.Module,), namespace)


_FLAGS = ("has_backward", "can_torch_compile")
#: Class attribute of a `function_layer` class (and the function modules made over one): the
#: function it calls. A dunder, which the kernel layer rules allow.
FUNCTION_ATTRIBUTE = "__kernels_function__"


def function_kernel(package: ModuleType, func_name: str, repository: object) -> type:
    """The kernel layer wrapping function `func_name` of a kernel package."""
    func = getattr(package, func_name, None)
    if not callable(func):
        available = sorted(
            n for n, v in vars(package).items() if callable(v) and not n.startswith("_")
        )
        raise KernelLoadError(
            f"{repository} has no function '{func_name}'. Functions it provides: "
            f"{', '.join(available) or 'none'}."
        )
    return function_layer(func)
