"""Function kernels: kernelizing a plain function, such as ``apply_rotary_pos_emb``.

`kernelize` replaces the forward of modules, so a function is made kernelizable by wrapping
it in a tiny module whose forward calls it (the decorated global). A layer class that calls
it is decorated with `use_kernelized_func(fn)`: each instance of the layer then holds a
private copy of the function module (``instance._kernel_funcs``, as in Hugging Face's kernels
0.19), `kernelize` swaps that copy, and while the layer's forward runs, calls of the global are
forwarded to it; so kernelizing one model changes no other. A model may also keep the global
as a submodule (``self.rotary_fn = apply_rotary_pos_emb``), which `kernelize` then swaps for
every caller. A kernel for it is a function in a kernel package, wrapped the same
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
from contextvars import ContextVar
from types import MethodType
from typing import TYPE_CHECKING

from ..function_kernels import FUNCTION_ATTRIBUTE, function_layer
from .tagging import Condition, replace_kernel_forward_from_hub, tag_of

if TYPE_CHECKING:
    from torch import nn


def function_module(func: Callable, name: str, condition: Condition | None = None) -> nn.Module:
    """The module instance that stands for `func`, tagged `name` (with `condition`).

    Its class forwards a call to the private copy of the module that the calling layer holds
    (see `use_kernelized_func`), or else calls `func`. The class pickles by `func`'s module and
    name, so the decorated global pickles as a reference and a private copy is rebuilt from it.
    """
    base = function_layer(func)
    dispatch = _dispatching_forward(func, base)
    namespace = {
        "forward": dispatch,
        "__module__": getattr(func, "__module__", None) or base.__module__,
        "__reduce__": _reduce_function_module,
        "__setstate__": _setstate_function_module,
    }
    layer = type(base.__name__, (base,), namespace)
    replace_kernel_forward_from_hub(layer, name, condition)  # checks the name
    instance = layer()
    instance.__wrapped__ = func
    return instance


def _dispatching_forward(func: Callable, base: type) -> Callable:
    def forward(self, *args, **kwargs):
        active = _ACTIVE.get()
        if active is not None:
            entry = active.get(id(self))
            if entry is not None:
                private, private_forward = entry
                import torch

                if torch.compiler.is_compiling():
                    # The selected forward, called directly: guarding on each layer's private
                    # copy would compile a graph per layer instead of one per kernel.
                    if private_forward is not forward:
                        return private_forward(self, *args, **kwargs)
                else:
                    return private(*args, **kwargs)
        return func(*args, **kwargs)

    own = vars(base)["forward"]
    forward.__signature__ = inspect.signature(own)  # type: ignore[attr-defined]
    forward.__doc__ = own.__doc__
    forward.__qualname__ = own.__qualname__
    forward.__wrapped__ = func  # type: ignore[attr-defined]
    return forward


def _reduce_function_module(self: nn.Module):
    from .own_forward import own_class

    func = getattr(own_class(self), FUNCTION_ATTRIBUTE)
    module_name = getattr(func, "__module__", None) or ""
    qualname = str(getattr(func, "__qualname__", None) or getattr(func, "__name__", ""))
    if _resolve(module_name, qualname) is self:
        return qualname  # the decorated global itself: pickled as a reference to it
    state = dict(self.__dict__)
    bound = state.pop("forward", None)
    forward = bound.__func__ if isinstance(bound, MethodType) and bound.__self__ is self else None
    if forward is None and bound is not None:
        state["forward"] = bound
    return (_rebuild_function_module, (module_name, qualname), (state, forward))


def _setstate_function_module(self: nn.Module, state) -> None:
    state, forward = state
    self.__dict__.update(state)
    if forward is not None:  # a forward bound on the instance, bound again to this copy
        self.forward = MethodType(forward, self)


def _rebuild_function_module(module_name: str, qualname: str) -> nn.Module:
    """A fresh private copy of the function module at `module_name`.`qualname` (for pickle)."""
    import importlib

    from .own_forward import own_class

    importlib.import_module(module_name)
    found = _resolve(module_name, qualname)
    if found is None or tag_of(type(found)) is None:
        raise TypeError(
            f"{module_name}.{qualname} is not a function decorated with "
            "@use_kernel_forward_from_hub, so a kernelized copy of it cannot be rebuilt."
        )
    return own_class(found)()


def _resolve(module_name: str, qualname: str):
    import sys

    found = sys.modules.get(module_name)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return found


class _ActiveFunctions:
    """Which private copy each decorated global runs while a layer's forward runs: id of the
    global -> (private copy, its forward function).

    A `ContextVar` in eager mode (threads and tasks each see their own); while torch.compile
    traces, a plain attribute, which it can follow, until the outermost reset.
    """

    def __init__(self) -> None:
        self._var: ContextVar[dict | None] = ContextVar("kernels_active_functions", default=None)
        self._traced: dict | None = None
        self._tracing = False

    def get(self) -> dict | None:
        if self._tracing or _compiling():
            return self._traced
        return self._var.get()

    def set(self, value: dict):
        if self._tracing or _compiling():
            previous = self._traced
            self._traced = value
            self._tracing = True
            return previous
        return self._var.set(value)

    def reset(self, token) -> None:
        if self._tracing:
            self._traced = token
            self._tracing = token is not None
        else:
            self._var.reset(token)


def _compiling() -> bool:
    import torch

    return torch.compiler.is_compiling()


_ACTIVE = _ActiveFunctions()


#: The class attribute `use_kernelized_func` fills: layer name -> the decorated global
#: function module. Subclasses inherit it.
ATTACHED_ATTRIBUTE = "_kernels_attached_funcs"
#: Each instance's private copies of those, in its ``__dict__``: layer name -> function
#: module. The name and the keys are Hugging Face's (kernels 0.19): transformers 5.x's
#: ``KernelConfig`` reads them to learn which function layer names a model has.
INSTANCE_ATTRIBUTE = "_kernel_funcs"
#: Where transformers 5.x's own (older) `use_kernelized_func` kept them, on each instance.
_TRANSFORMERS_ATTRIBUTE = "_hidden_kernels"
#: Marks the forward `attach_functions` wraps, so that it is wrapped once.
_DISPATCH_MARK = "_kernels_dispatches_functions"


class _InstanceFunctions:
    """``instance._kernel_funcs``: made on first access, then read from the instance's
    ``__dict__`` (a non-data descriptor). Reading it on the class gives the attached globals."""

    def __get__(self, instance, owner=None):
        if instance is None:
            return dict(attached_globals(owner))
        return instance_functions(instance)


def attached_globals(cls: type) -> dict[str, nn.Module]:
    """Layer name -> decorated global function module, attached to `cls` by
    `use_kernelized_func` (its own and its bases')."""
    return dict(getattr(cls, ATTACHED_ATTRIBUTE, None) or {})


def instance_functions(module: nn.Module) -> dict[str, nn.Module]:
    """`module`'s private copies of the functions attached to its class, made where missing.

    Each layer calls a decorated function by its global name; while the layer's forward runs,
    the global forwards the call to the layer's copy, which `kernelize` swaps: kernelizing one
    model leaves every other model built from the same classes as it was.
    """
    from .own_forward import own_class

    copies = module.__dict__.get(INSTANCE_ATTRIBUTE)
    if not isinstance(copies, dict):
        copies = {}
        module.__dict__[INSTANCE_ATTRIBUTE] = copies
    for name, fn in attached_globals(type(module)).items():
        if name not in copies:
            copies[name] = own_class(fn)()
    return copies


def attach_functions(cls: type, funcs: list[Callable]) -> None:
    """Record `funcs` on `cls` (what `use_kernelized_func` does), beside those already there,
    keyed by each function's layer name, and make the class's forward route calls of them to
    the instance's private copies. Subclasses inherit both."""
    attached = attached_globals(cls)
    for fn in funcs:
        layer_name = tag_of(type(fn))
        if layer_name is not None:
            attached[layer_name] = fn  # type: ignore[assignment]  # tagged: a module
    setattr(cls, ATTACHED_ATTRIBUTE, attached)
    if not isinstance(cls.__dict__.get(INSTANCE_ATTRIBUTE), _InstanceFunctions):
        setattr(cls, INSTANCE_ATTRIBUTE, _InstanceFunctions())
    forward = getattr(cls, "forward", None)
    if callable(forward) and not getattr(forward, _DISPATCH_MARK, False):
        cls.forward = _routing_forward(forward)  # type: ignore[attr-defined]


def _routing_forward(forward: Callable) -> Callable:
    @functools.wraps(forward)
    def routed(self, *args, **kwargs):
        copies = self.__dict__.get(INSTANCE_ATTRIBUTE)
        if not copies:
            # No copy was ever made (nothing kernelized or read them): the globals run their
            # functions, and a compiled forward does not trace the copies' creation.
            return forward(self, *args, **kwargs)
        active = dict(_ACTIVE.get() or {})
        for name, fn in attached_globals(type(self)).items():
            private = copies.get(name)
            if private is not None:
                active[id(fn)] = (private, private.forward.__func__)
        token = _ACTIVE.set(active)
        try:
            return forward(self, *args, **kwargs)
        finally:
            _ACTIVE.reset(token)

    setattr(routed, _DISPATCH_MARK, True)
    return routed


def is_attached(module: nn.Module, fn: nn.Module) -> bool:
    """Whether `fn` (a decorated global) is attached to `module`'s class, or kept by
    transformers' own decorator on `module`."""
    hidden = module.__dict__.get(_TRANSFORMERS_ATTRIBUTE)
    found = list(attached_globals(type(module)).values())
    if isinstance(hidden, dict):
        found.extend(hidden.values())
    return any(candidate is fn for candidate in found)


def attached_functions(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The function modules attached to `module` that `kernelize` swaps, with their names:
    its private copies (made here where missing) and what transformers 5.x's own decorator
    keeps on the instance (``_hidden_kernels``)."""
    from torch import nn

    named: dict[str, nn.Module] = {}
    if attached_globals(type(module)):
        for copy in instance_functions(module).values():
            named.setdefault(_attached_name(copy), copy)
    hidden = module.__dict__.get(_TRANSFORMERS_ATTRIBUTE)
    if isinstance(hidden, dict):
        for kept in hidden.values():
            if isinstance(kept, nn.Module):
                named.setdefault(_attached_name(kept), kept)
    return list(named.items())


def _attached_name(fn: nn.Module) -> str:
    """The function's own name (``apply_rotary_pos_emb``), for logs and `explain`."""
    from .own_forward import own_class

    func = getattr(own_class(fn), FUNCTION_ATTRIBUTE, None)
    if func is not None:
        return getattr(func, "__name__", None) or type(fn).__name__
    wrapped = getattr(fn, "__wrapped__", None)
    name = getattr(wrapped, "__name__", None)
    return name if isinstance(name, str) else type(fn).__name__
