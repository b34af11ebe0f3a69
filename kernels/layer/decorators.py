"""The decorators a model's code applies to make its layers and functions kernelizable.

They only record names on what they decorate; `kernelize` reads them later. Classes are
tagged by `tagging`, functions become modules by `func`: these decorators sit above both.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ..errors import KernelTaggingError
from .func import attach_functions, function_module
from .tagging import Condition, replace_kernel_forward_from_hub

if TYPE_CHECKING:
    from torch import nn

ModuleClass = TypeVar("ModuleClass", bound=type)

logger = logging.getLogger(__name__)


def use_kernel_forward_from_hub(
    layer_name: str, condition: Condition | None = None
) -> Callable[[ModuleClass], ModuleClass]:
    """Class decorator: let `kernelize` replace this layer's `forward` with kernels named `layer_name`.

    The decorator does not change the class's behaviour; it records the name that
    `kernelize` looks up in the kernel mapping. Applied to a function, it acts as
    `use_kernel_func_from_hub`; attach such a function to a layer with `use_kernelized_func`
    so that `kernelize` finds it.

    `condition` (kernels 0.17) is called with each instance of the layer every time
    `kernelize` runs; where it returns False, that instance is not kernelized and keeps (or
    gets back) its own forward, while other instances may still get a kernel.

    Example:
        ```python
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
        from kernels import use_kernel_forward_from_hub

        @use_kernel_forward_from_hub("SiluAndMul")
        class SiluAndMul(nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                d = x.shape[-1] // 2
                return F.silu(x[..., :d]) * x[..., d:]


        # Only instances with an even width are kernelized:
        @use_kernel_forward_from_hub("RMSNorm", condition=lambda m: m.weight.shape[0] % 2 == 0)
        class RMSNorm(nn.Module): ...
        ```
    """

    _check_name("use_kernel_forward_from_hub", layer_name, "layer_name")

    def decorator(cls: ModuleClass) -> ModuleClass:
        if not isinstance(cls, type) and callable(cls):
            # Newer transformers decorate functions too; they become function kernels.
            return function_module(cls, layer_name, condition)
        replace_kernel_forward_from_hub(cls, layer_name, condition)  # checks name and class
        return cls

    return decorator


def use_kernel_func_from_hub(func_name: str) -> Callable[[Callable], nn.Module]:
    """Decorator: make a function kernelizable under the name `func_name`.

    Deprecated (as in Hugging Face's kernels 0.19, which logs a warning): use
    `use_kernel_forward_from_hub`, which does the same on a function.

    The decorated name becomes a module instance that behaves like the function (calling it
    calls the function). Store it as an attribute of a module in your model, so that
    `kernelize` can find it and swap in a kernel registered for `func_name`.

    Example:
        ```python
        import torch
        from kernels import use_kernel_func_from_hub

        @use_kernel_func_from_hub("rotary_pos_emb")
        def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
            ...

        class Attention(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.rotary_fn = apply_rotary_pos_emb  # a submodule kernelize can see

            def forward(self, q, k, cos, sin):
                return self.rotary_fn(q, k, cos, sin)
        ```
    """

    _check_name("use_kernel_func_from_hub", func_name, "func_name")
    # Hugging Face's words (kernels 0.19), on the logger as theirs, not a DeprecationWarning.
    logger.warning(
        "use_kernel_func_from_hub is deprecated and will be removed in kernels 0.17. Use "
        "[`use_kernel_forward_from_hub`] instead.",
        stacklevel=2,
    )

    def decorator(func: Callable) -> nn.Module:
        return function_module(func, func_name)

    return decorator


def _check_name(decorator: str, name: object, parameter: str) -> None:
    """Refuse a decorator used bare (``@decorator`` over a class or function), which would
    otherwise silently replace the decorated object with the inner decorator function."""
    if isinstance(name, str):
        return  # an empty name is refused where the class or function is tagged
    if callable(name):
        what = "class" if isinstance(name, type) else "function"
        bare = getattr(name, "__name__", "Name")
        raise KernelTaggingError(
            f"@{decorator} needs the name kernels are registered under: write "
            f'@{decorator}("{bare}") above {what} {bare}, not @{decorator} alone.'
        )
    raise KernelTaggingError(
        f"{decorator}({parameter}=...) takes the layer name as a string, got "
        f"{type(name).__name__} {name!r}."
    )


def use_kernelized_func(*funcs: Callable | list[Callable] | tuple[Callable, ...]):
    """Class decorator (kernels 0.16): attach kernelizable functions to a layer class.

    Each function must be one decorated with `use_kernel_forward_from_hub(name)` (or the
    deprecated `use_kernel_func_from_hub(name)`), so that it is a module instance standing for
    the function; any other raises `ValueError`, as in Hugging Face's kernels 0.19. Each
    instance of the class gets a private copy of each function module
    (``instance._kernel_funcs``, layer name -> module, made on first use), which `kernelize`
    finds as if it were a submodule and swaps like any tagged layer; while the layer's
    forward runs, the function called by its global name runs the layer's copy. Kernelizing
    one model therefore leaves other models of the same classes as they were. The copies are
    not submodules: ``state_dict``, ``named_modules`` and ``repr`` of the layer are unchanged.
    Functions may be passed as several arguments or as one list (transformers uses both
    spellings). Subclasses inherit the attachments; decorating a subclass adds to them.

    Example:
        ```python
        import torch
        import torch.nn as nn
        from kernels import use_kernel_forward_from_hub, use_kernelized_func

        @use_kernel_forward_from_hub("rotary_pos_emb")
        def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
            ...

        @use_kernelized_func(apply_rotary_pos_emb)
        class Attention(nn.Module):
            def forward(self, q, k, cos, sin):
                return apply_rotary_pos_emb(q, k, cos, sin)  # swapped by kernelize
        ```
    """
    from .tagging import tag_of

    flat: list[Callable] = []
    for item in funcs:
        flat.extend(item if isinstance(item, (list, tuple)) else [item])
    for fn in flat:
        if not callable(fn):
            raise TypeError(f"use_kernelized_func takes functions, got {fn!r}.")
        if tag_of(type(fn)) is None:
            name = getattr(fn, "__name__", None) or repr(fn)
            raise ValueError(
                f"Function `{name}` is not decorated with @use_kernel_forward_from_hub and "
                "cannot be used with @use_kernelized_func: decorate it with "
                f'@use_kernel_forward_from_hub("{name}") first, or leave it out.'
            )

    def decorator(cls: type) -> type:
        attach_functions(cls, flat)
        return cls

    return decorator
