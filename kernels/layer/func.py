"""Function kernels: kernelizing a plain function, such as ``apply_rotary_pos_emb``.

`kernelize` replaces the forward of modules, so a function is made kernelizable by wrapping
it in a tiny module whose forward calls it. The model keeps that module as an attribute of
one of its modules (``self.rotary_fn = apply_rotary_pos_emb``), which makes it a submodule
that `kernelize` finds; a kernel for it is a function in a kernel package, wrapped the same
way, so the usual kernel layer rules (signature included) apply to it. A kernel function
declares its support for backward and torch.compile as function attributes
(``apply_rotary_pos_emb.can_torch_compile = True``), as a kernel layer does as class attributes.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING

from .tagging import replace_kernel_forward_from_hub

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
    forward.__signature__ = signature.replace(
        parameters=[self_parameter, *signature.parameters.values()]
    )
    forward.__doc__ = func.__doc__
    name = getattr(func, "__name__", "function")
    forward.__qualname__ = f"{name}.forward"
    # A function declares what it supports the way a kernel layer does, as attributes.
    flags = {flag: getattr(func, flag) for flag in _FLAGS if hasattr(func, flag)}
    return type(name, (nn.Module,), {"forward": forward, "__doc__": func.__doc__, **flags})


_FLAGS = ("has_backward", "can_torch_compile")


def use_kernel_func_from_hub(func_name: str) -> Callable[[Callable], nn.Module]:
    """Decorator: make a function kernelizable under the name `func_name`.

    The decorated name becomes a module instance that behaves like the function (calling it
    calls the function). Store it as an attribute of a module in your model, so that
    `kernelize` can find it and swap in a kernel registered for `func_name`.

    Example:
        ```python
        import torch
        from kernels import use_kernel_func_from_hub

        @use_kernel_func_from_hub("rotary_pos_emb")
        def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
            ...

        class Attention(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.rotary_fn = apply_rotary_pos_emb  # a submodule kernelize can see

            def forward(self, q, k, cos, sin):
                return self.rotary_fn(q, k, cos, sin)
        ```
    """

    def decorator(func: Callable) -> nn.Module:
        layer = type(function_layer(func).__name__, (function_layer(func),), {})
        replace_kernel_forward_from_hub(layer, func_name)
        instance = layer()
        instance.__wrapped__ = func
        return instance

    return decorator
