"""Pointing one module instance's `forward` at a kernel layer's, and back.

A kernelized module runs the kernel's `forward` with itself as ``self``; other instances of
its class keep their forward. The forward is bound through `dtensor.shard_aware_forward`,
which follows the kernel's shard rule when tensor parallelism hands the module DTensors.

Two ways of binding it, one chosen per module:

- **On a class of its own** (the default): the module's class becomes a subclass of it, made
  once per (class, kernel), whose ``forward`` is the kernel's; name, module and qualified
  name are the class's, and ``isinstance`` holds as before. A compiled model then reaches the
  forward through the class, which torch.compile guards by the class's identity alone: bound on
  each instance, every kernelized module cost the compiled frame Python guards of its own
  (``module is module.forward.__self__``), run at every call (benchmarks/results/h100/NOTES.md).
- **On the instance**, as an attribute holding the bound method (Hugging Face's `kernels`
  binds every kernel so): for a kernel whose forward looks up an attribute named ``forward``
  (``type(self).forward(self, ...)``, the layer's own forward, is how a kernel falls back,
  and on a subclass that would be the kernel itself), and for a module that already had a
  forward set on the instance (hook libraries), which a class's forward would not override.

Restoring puts the module back as it was: its class again, no instance attribute.
"""

from __future__ import annotations

import functools
import logging
import types
import weakref
from types import MethodType
from typing import TYPE_CHECKING

from .dtensor import shard_aware_forward
from .own_forward import BASE_ATTRIBUTE, KERNEL_ATTRIBUTE, own_class, own_forward

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch import nn

logger = logging.getLogger(__name__)

# Kernel forward function -> its kernel layer class, for every kernel kernelize has bound on an
# instance: tells our instance attribute apart from anyone else's.
_kernel_of_forward: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

# (class, kernel layer) -> the subclass binding that kernel, made once: every instance of a
# class kernelized with one kernel shares it (and a compiled graph's guard on it).
_subclasses: dict[tuple[type, type], type] = {}


def kernel_layer_of(module: nn.Module) -> type | None:
    """The kernel layer class whose forward `module` runs, or None if it runs its own."""
    forward = module.__dict__.get("forward")
    if forward is not None:  # an instance forward is what runs: ours, or someone else's
        if isinstance(forward, MethodType) and forward.__self__ is module:
            return _kernel_of_forward.get(forward.__func__)
        return None
    return getattr(type(module), KERNEL_ATTRIBUTE, None)  # also under a class made over ours


def use_kernel_forward(module: nn.Module, kernel: type, *, path: str) -> None:
    """Make `module` run `kernel.forward` with itself as `self`."""
    foreign = module.__dict__.get("forward")
    ours = foreign is not None and kernel_layer_of(module) is not None
    if foreign is not None and not ours:
        logger.warning(
            "%s had a forward set on the instance (%r, e.g. from a hook library); the kernel "
            "replaces it",
            path or "<model>",
            foreign,
        )
    forward = shard_aware_forward(kernel)
    if ours:
        del module.__dict__["forward"]
    original = _original_class(module)
    if (foreign is None or ours) and not _names_forward(forward) and original is not None:
        module.__class__ = _subclass(original, kernel, forward)
        return
    if original is not None and original is not type(module):
        module.__class__ = original
    _kernel_of_forward[forward] = kernel
    module.forward = MethodType(forward, module)


def use_original_forward(module: nn.Module) -> None:
    """Undo `use_kernel_forward`; a module kernelize never touched is left alone."""
    forward = module.__dict__.get("forward")
    if forward is not None and (kernel_layer_of(module) is not None or _is_function_module(module)):
        # A function module's copy has no forward of anyone else's to keep: whatever was bound
        # on it (by hand, or by another kernels package) goes, as in Hugging Face's kernels.
        del module.__dict__["forward"]
    original = _original_class(module)
    if original is None:
        # Someone made a class of their own over ours (FSDP2's fully_shard does, for the
        # modules it wraps): theirs is kept, and the instance gets the original forward back.
        module.forward = MethodType(own_forward(module), module)
    elif original is not type(module):
        module.__class__ = original


def _is_function_module(module: nn.Module) -> bool:
    from ..function_kernels import FUNCTION_ATTRIBUTE
    from .tagging import tag_of

    cls = own_class(module)
    return tag_of(cls) is not None and hasattr(cls, FUNCTION_ATTRIBUTE)


def _original_class(module: nn.Module) -> type | None:
    """`module`'s class without kernels (`own_class`); None when another class was made over
    ours, which swapping classes would lose."""
    cls = type(module)
    if KERNEL_ATTRIBUTE not in cls.__dict__ and hasattr(cls, KERNEL_ATTRIBUTE):
        return None
    return own_class(module)


def _pickled_as_the_original(self: nn.Module, protocol: int):
    """A kernelized module pickles as an instance of its original class (the class kernelize
    made exists only in this process), with a reference to its kernel: unpickled where that
    kernel is loaded (this process), it runs the kernel again; elsewhere it runs its own
    forward until kernelized again, and does not claim a kernel (``_kernel_repo`` dropped)."""
    cls = type(self)
    if KERNEL_ATTRIBUTE not in cls.__dict__:  # a class made over ours: pickled by its own name
        return object.__reduce_ex__(self, protocol)
    base = cls.__dict__[BASE_ATTRIBUTE]
    if "__reduce__" in vars(base):
        # A class that pickles itself (function modules, by their function's name): it is
        # given the instance as an instance of its own class, so that it sees its own forward.
        self.__class__ = base
        try:
            reduced = base.__reduce__(self)
        finally:
            self.__class__ = cls
        return _with_kernel(reduced, cls.__dict__[KERNEL_ATTRIBUTE])
    reduced = object.__reduce_ex__(self, protocol)
    state = reduced[2] if len(reduced) > 2 else None
    repository = None
    if isinstance(state, dict) and "_kernel_repo" in state:
        state = dict(state)
        repository = state.pop("_kernel_repo")
    return (
        _rebuild_kernelized,
        (base, _kernel_reference(cls.__dict__[KERNEL_ATTRIBUTE]), repository),
        state,
        *reduced[3:],
    )


def _with_kernel(reduced, kernel: type):
    """`reduced` (a class's own reduction) rebuilt with `kernel` bound again where it can be."""
    if isinstance(reduced, str) or len(reduced) < 2:
        return reduced
    rebuild, args, *rest = reduced
    return (_rebuild_with_kernel, (rebuild, args, _kernel_reference(kernel)), *rest)


def _rebuild_with_kernel(rebuild, args, reference) -> nn.Module:
    module = rebuild(*args)
    kernel = _resolve_kernel(reference)
    if kernel is not None:
        use_kernel_forward(module, kernel, path="")
    return module


def _kernel_reference(kernel: type) -> tuple[str, str, str]:
    """How to find `kernel` again in this process: ("class" or "function", module, name)."""
    function = getattr(kernel, "__kernels_function__", None)
    target, kind = (function, "function") if function is not None else (kernel, "class")
    return (
        kind,
        getattr(target, "__module__", "") or "",
        getattr(target, "__qualname__", "") or "",
    )


def _resolve_kernel(reference: tuple[str, str, str]) -> type | None:
    """The kernel `reference` names if its module is loaded here, else None (nothing imported:
    a kernel is loaded by kernelize, never by unpickling)."""
    import sys

    from ..function_kernels import function_layer

    kind, module_name, qualname = reference
    found: object = sys.modules.get(module_name)
    for part in qualname.split(".") if found is not None and qualname else ():
        found = getattr(found, part, None)
    if found is None or found is sys.modules.get(module_name):
        return None
    if kind == "function":
        return function_layer(found) if callable(found) else None
    return found if isinstance(found, type) else None


def _rebuild_kernelized(base: type, reference: tuple[str, str, str], repository) -> nn.Module:
    """An instance of `base` (its state follows), running the kernel `reference` names where
    that kernel is loaded in this process."""
    module: nn.Module = object.__new__(base)
    kernel = _resolve_kernel(reference)
    if kernel is None:
        if repository is not None:
            logger.info(
                "An unpickled %s ran kernel %s from %s, which is not loaded in this process; it "
                "runs its own forward until kernelized again",
                base.__qualname__,
                reference[2],
                repository,
            )
        return module
    use_kernel_forward(module, kernel, path="")
    if repository is not None:
        module.__dict__["_kernel_repo"] = repository
    return module


def _deep_copied_kernelized(self: nn.Module, memo: dict) -> nn.Module:
    """`copy.deepcopy` of a kernelized module: copied as its original class is, then given the
    kernel's class (a deep copy of a model runs what the model runs)."""
    import copy

    cls = type(self)
    if KERNEL_ATTRIBUTE not in cls.__dict__:  # a class made over ours: copied as it is
        return copy._reconstruct(self, memo, *object.__reduce_ex__(self, 4))  # type: ignore[attr-defined]
    self.__class__ = cls.__dict__[BASE_ATTRIBUTE]
    try:
        duplicate = copy.deepcopy(self, memo)
    finally:
        self.__class__ = cls
    duplicate.__class__ = cls
    return duplicate


def _subclass(cls: type, kernel: type, forward: Callable) -> type:
    subclass = _subclasses.get((cls, kernel))
    if subclass is None:
        namespace = {
            "forward": forward,
            "__reduce_ex__": _pickled_as_the_original,
            "__deepcopy__": _deep_copied_kernelized,
            KERNEL_ATTRIBUTE: kernel,
            BASE_ATTRIBUTE: cls,
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__,
        }
        subclass = types.new_class(cls.__name__, (cls,), {}, lambda ns: ns.update(namespace))
        _subclasses[cls, kernel] = subclass
    return subclass


@functools.cache  # per kernel forward: kernelize asks once for each module it binds
def _names_forward(function: Callable) -> bool:
    """Whether `function` looks up a name ``forward``: the one way a kernel reaches the layer's
    own forward, which binding on a subclass would make its own. Followed into the functions
    it wraps (``__wrapped__``), closes over and nests."""
    pending: list = [function]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, types.CodeType):
            if "forward" in current.co_names:
                return True
            pending.extend(c for c in current.co_consts if isinstance(c, types.CodeType))
            continue
        code = getattr(current, "__code__", None)
        if not isinstance(code, types.CodeType):  # not a Python function: assume it may
            return True
        pending.append(code)
        if hasattr(current, "__wrapped__"):
            pending.append(current.__wrapped__)
        for cell in current.__closure__ or ():
            try:
                content = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if isinstance(content, types.FunctionType):
                pending.append(content)
    return False
