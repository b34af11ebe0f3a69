"""A kernelized module's own forward: the one its class has without kernels.

`swap` binds most kernels on a class it makes over the module's own (a subclass whose
``forward`` is the kernel's), so ``type(module).forward`` is then the kernel's. What needs the
layer's own forward (verification, the fallback of a kernel on DTensors it has no rule for,
the library's tag conditions) asks here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch import nn

#: Class attributes of the classes `swap` makes: the kernel layer bound, the class subclassed.
KERNEL_ATTRIBUTE = "_kernels_kernel_layer"
BASE_ATTRIBUTE = "_kernels_original_class"


def own_forward(module: nn.Module) -> Callable:
    """The forward function of `module`'s class as it is without kernels: what
    ``type(module).forward`` is for a module kernelize did not bind on a class of its own."""
    for klass in type(module).__mro__:
        if KERNEL_ATTRIBUTE not in klass.__dict__ and "forward" in klass.__dict__:
            return klass.__dict__["forward"]
    raise TypeError(f"{type(module).__qualname__} has no forward")


def own_class(module: nn.Module) -> type:
    """`module`'s class as it is without kernels: ``type(module)``, unless kernelize bound a
    kernel on a class of its own, whose original this is."""
    cls = type(module)
    return cls.__dict__.get(BASE_ATTRIBUTE, cls)
