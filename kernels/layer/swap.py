"""Pointing one module instance's `forward` at a kernel layer's, and back.

A kernelized module carries the kernel's `forward`, bound to the module itself, as an
instance attribute; its class is untouched, so other instances keep their forward.
Restoring removes that attribute again, leaving the module exactly as it was. The forward is
bound through `dtensor.shard_aware_forward`, which follows the kernel's shard rule when tensor
parallelism hands the module DTensors.
"""

from __future__ import annotations

import logging
import weakref
from types import MethodType
from typing import TYPE_CHECKING

from .dtensor import shard_aware_forward

if TYPE_CHECKING:
    from torch import nn

logger = logging.getLogger(__name__)

# Kernel forward function -> its kernel layer class, for every kernel kernelize has bound:
# tells our instance attribute apart from anyone else's.
_kernel_of_forward: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def kernel_layer_of(module: nn.Module) -> type | None:
    """The kernel layer class whose forward `module` runs, or None if it runs its own."""
    forward = module.__dict__.get("forward")
    if isinstance(forward, MethodType) and forward.__self__ is module:
        return _kernel_of_forward.get(forward.__func__)
    return None


def use_kernel_forward(module: nn.Module, kernel: type, *, path: str) -> None:
    """Make `module` run `kernel.forward` with itself as `self`."""
    foreign = module.__dict__.get("forward")
    if foreign is not None and kernel_layer_of(module) is None:
        logger.warning(
            "%s had a forward set on the instance (%r, e.g. from a hook library); the kernel "
            "replaces it",
            path or "<model>",
            foreign,
        )
    forward = shard_aware_forward(kernel)
    _kernel_of_forward[forward] = kernel
    module.forward = MethodType(forward, module)


def use_original_forward(module: nn.Module) -> None:
    """Undo `use_kernel_forward`; a module kernelize never touched is left alone."""
    if kernel_layer_of(module) is not None:
        del module.__dict__["forward"]
