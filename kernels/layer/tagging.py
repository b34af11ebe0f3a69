"""Tagging layer classes with the name kernels are registered under."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..errors import KernelMappingError

#: The class attribute that marks a layer class as extensible; the name matches Hugging
#: Face's `kernels`, so classes tagged by either package are recognised by both.
TAG_ATTRIBUTE = "kernel_layer_name"

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
    setattr(cls, TAG_ATTRIBUTE, layer_name)


def use_kernel_forward_from_hub(layer_name: str) -> Callable[[ModuleClass], ModuleClass]:
    """Class decorator: let `kernelize` replace this layer's `forward` with kernels named `layer_name`.

    The decorator does not change the class's behaviour; it records the name that
    `kernelize` looks up in the kernel mapping. Applied to a function, it acts as
    `use_kernel_func_from_hub`.

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
        ```
    """

    def decorator(cls: ModuleClass) -> ModuleClass:
        if not isinstance(cls, type) and callable(cls):
            # Newer transformers decorate functions too; they become function kernels.
            from .func import use_kernel_func_from_hub

            return use_kernel_func_from_hub(layer_name)(cls)
        replace_kernel_forward_from_hub(cls, layer_name)
        return cls

    return decorator


def tag_of(cls: type) -> str | None:
    """The layer name a module class is tagged with, or None."""
    name = getattr(cls, TAG_ATTRIBUTE, None)
    return name if isinstance(name, str) else None
