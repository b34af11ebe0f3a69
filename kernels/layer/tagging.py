"""Tagging layer classes with the name kernels are registered under."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..errors import KernelMappingError

#: The class attribute that marks a layer class as extensible; the name matches Hugging
#: Face's `kernels`, so classes tagged by either package are recognised by both.
TAG_ATTRIBUTE = "kernel_layer_name"
#: The class attribute holding the per-instance condition of `use_kernel_forward_from_hub`
#: (kernels 0.17), stored next to the name; None when the class has no condition.
CONDITION_ATTRIBUTE = "kernel_layer_condition"

#: A per-instance condition: called with the module, False skips kernelization of it.
Condition = Callable[[object], bool]

ModuleClass = TypeVar("ModuleClass", bound=type)


def replace_kernel_forward_from_hub(cls: type, layer_name: str) -> None:
    """Make an existing layer class extensible with kernels registered as `layer_name`.

    Prefer the `use_kernel_forward_from_hub` decorator in code you maintain: it tells
    readers that the class keeps its `forward` signature compatible with kernels. This
    function is for classes you do not own. It only annotates the class.

    Example:
        ```python
        import torch.nn as nn
        from kernels import replace_kernel_forward_from_hub

        replace_kernel_forward_from_hub(nn.LayerNorm, "LayerNorm")
        ```
    """
    import torch.nn as nn

    if not isinstance(layer_name, str) or not layer_name:
        raise KernelMappingError(f"A layer name must be a non-empty string, got {layer_name!r}.")
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise KernelMappingError(
            f"Only torch.nn.Module subclasses can be kernelized, got {cls!r} for layer name "
            f"'{layer_name}'."
        )
    _tag(cls, layer_name, None)


def _tag(cls: type, layer_name: str, condition: Condition | None) -> None:
    if condition is not None and not callable(condition):
        raise KernelMappingError(
            f"The condition for layer name '{layer_name}' must be callable (it is called with "
            f"the module instance), got {condition!r}."
        )
    setattr(cls, TAG_ATTRIBUTE, layer_name)
    # Set (or reset) the condition with the name, so a subclass tagged anew does not inherit
    # its parent's condition; staticmethod keeps a function from becoming a bound method.
    setattr(cls, CONDITION_ATTRIBUTE, None if condition is None else staticmethod(condition))


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
            def forward(self, input: torch.Tensor) -> torch.Tensor:
                d = input.shape[-1] // 2
                return F.silu(input[..., :d]) * input[..., d:]


        # Only instances with an even width are kernelized:
        @use_kernel_forward_from_hub("RMSNorm", condition=lambda m: m.weight.shape[0] % 2 == 0)
        class RMSNorm(nn.Module): ...
        ```
    """

    def decorator(cls: ModuleClass) -> ModuleClass:
        if not isinstance(cls, type) and callable(cls):
            # Newer transformers decorate functions too; they become function kernels.
            from .func import _function_module

            return _function_module(cls, layer_name, condition)
        replace_kernel_forward_from_hub(cls, layer_name)  # checks the name and the class
        _tag(cls, layer_name, condition)
        return cls

    return decorator


def condition_of(cls: type) -> Condition | None:
    """The per-instance condition a tagged module class carries, or None."""
    condition = getattr(cls, CONDITION_ATTRIBUTE, None)
    return condition if callable(condition) else None


def tag_of(cls: type) -> str | None:
    """The layer name a module class is tagged with, or None."""
    name = getattr(cls, TAG_ATTRIBUTE, None)
    return name if isinstance(name, str) else None
