"""Tagging layer classes with the name kernels are registered under."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import KernelMappingError

#: The class attribute that marks a layer class as extensible; the name matches Hugging
#: Face's `kernels`, so classes tagged by either package are recognised by both.
TAG_ATTRIBUTE = "kernel_layer_name"
#: The class attribute holding the per-instance condition of `use_kernel_forward_from_hub`
#: (kernels 0.17), stored next to the name as a staticmethod; Hugging Face's name, and as in
#: their kernels 0.19 a class tagged without a condition gets one that always holds.
CONDITION_ATTRIBUTE = "kernel_condition"

#: A per-instance condition: called with the module, False skips kernelization of it.
Condition = Callable[[object], bool]


def replace_kernel_forward_from_hub(
    cls: type, layer_name: str, condition: Condition | None = None
) -> None:
    """Make an existing layer class extensible with kernels registered as `layer_name`.

    Prefer the `use_kernel_forward_from_hub` decorator in code you maintain: it tells
    readers that the class keeps its `forward` signature compatible with kernels. This
    function is for classes you do not own. It only annotates the class.

    `condition` (kernels 0.19), as for `use_kernel_forward_from_hub`: called with each
    instance every time `kernelize` runs; where it returns False that instance is skipped.

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
    tag(cls, layer_name, condition)


def always(module: object) -> bool:
    """The condition of a class tagged without one: every instance is kernelized."""
    return True


def tag(cls: type, layer_name: str, condition: Condition | None) -> None:
    """Mark `cls` as the layer `layer_name`, kernelized only where `condition` (if any) holds.

    The name is not checked here: `replace_kernel_forward_from_hub` checks it.
    """
    if condition is not None and not callable(condition):
        raise KernelMappingError(
            f"The condition for layer name '{layer_name}' must be callable (it is called with "
            f"the module instance), got {condition!r}."
        )
    setattr(cls, TAG_ATTRIBUTE, layer_name)
    # Set (or reset) the condition with the name, so a subclass tagged anew does not inherit
    # its parent's condition; staticmethod keeps a function from becoming a bound method.
    setattr(cls, CONDITION_ATTRIBUTE, staticmethod(always if condition is None else condition))


def condition_of(cls: type) -> Condition | None:
    """The per-instance condition a tagged module class carries, or None (also for `always`)."""
    condition = getattr(cls, CONDITION_ATTRIBUTE, None)
    return condition if callable(condition) and condition is not always else None


def tag_of(cls: type) -> str | None:
    """The layer name a module class is tagged with, or None."""
    name = getattr(cls, TAG_ATTRIBUTE, None)
    return name if isinstance(name, str) else None
