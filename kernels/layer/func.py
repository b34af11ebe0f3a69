"""Function kernels: kernelizing a plain function, such as ``apply_rotary_pos_emb``.

`kernelize` replaces the forward of modules, so a function is made kernelizable by wrapping
it in a tiny module whose forward calls it. The model keeps that module as an attribute of
one of its modules (``self.rotary_fn = apply_rotary_pos_emb``), which makes it a submodule
that `kernelize` finds; a kernel for it is a function in a kernel package, wrapped the same
way, so the usual kernel layer rules (signature included) apply to it. A kernel function
declares its support for backward and torch.compile as function attributes
(``apply_rotary_pos_emb.can_torch_compile = True``), as a kernel layer does as class attributes.

The decorators that use this (`use_kernel_func_from_hub`, `use_kernelized_func`) are in
`decorators`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING

from .tagging import Condition, replace_kernel_forward_from_hub, tag, tag_of

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
    return type(name, (nn.Module,), {"forward": forward, "__doc__": func.__doc__, **flags})


_FLAGS = ("has_backward", "can_torch_compile")


def function_module(func: Callable, name: str, condition: Condition | None = None) -> nn.Module:
    """The module instance that stands for `func`, tagged `name` (with `condition`)."""
    layer = type(function_layer(func).__name__, (function_layer(func),), {})
    replace_kernel_forward_from_hub(layer, name)  # checks the name
    tag(layer, name, condition)
    instance = layer()
    instance.__wrapped__ = func
    return instance


#: The class attribute `use_kernelized_func` fills: layer name -> function module. The name
#: and the keys are Hugging Face's (kernels 0.18): transformers 5.x's ``KernelConfig`` reads
#: them to learn which function layer names a model has.
ATTACHED_ATTRIBUTE = "_kernel_funcs"
#: Where transformers 5.x's own `use_kernelized_func` keeps them, on each instance.
_TRANSFORMERS_ATTRIBUTE = "_hidden_kernels"


def attach_functions(cls: type, funcs: list[Callable]) -> None:
    """Record `funcs` on `cls` (what `use_kernelized_func` does), beside those already there,
    keyed by each function's layer name; untagged plain functions are skipped (nothing to
    kernelize). Subclasses inherit the record."""
    attached = dict(getattr(cls, ATTACHED_ATTRIBUTE, None) or {})
    for fn in funcs:
        layer_name = tag_of(type(fn))
        if layer_name is not None:
            attached[layer_name] = fn
    setattr(cls, ATTACHED_ATTRIBUTE, attached)


def _attached_name(fn: Callable) -> str:
    wrapped = getattr(fn, "__wrapped__", None)
    for source in (wrapped, fn):
        name = getattr(source, "__name__", None)
        if isinstance(name, str):
            return name
    name = getattr(fn, "kernel_layer_name", None)
    return name if isinstance(name, str) else type(fn).__name__


def attached_functions(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The function modules attached to `module` that `kernelize` can swap, with their names.

    Reads what our `use_kernelized_func` attached to the module's class and what
    transformers 5.x's own decorator keeps on the instance (``_hidden_kernels``).
    """
    from torch import nn

    found = list((getattr(type(module), ATTACHED_ATTRIBUTE, None) or {}).values())
    hidden = module.__dict__.get(_TRANSFORMERS_ATTRIBUTE)
    if isinstance(hidden, dict):
        found.extend(hidden.values())
    named: dict[str, nn.Module] = {}
    for fn in found:
        if isinstance(fn, nn.Module):
            named.setdefault(_attached_name(fn), fn)
    return list(named.items())
