"""The rules a kernel layer must follow to stand in for a layer's `forward`.

`kernelize` binds the kernel layer's `forward` to the user's module instance, so the kernel
sees the module's own parameters and attributes through `self`. That is only safe when the
kernel layer adds no state and no behaviour of its own (no `__init__`, no members besides
`forward`, `has_backward` and `can_torch_compile`) and when its `forward` accepts exactly
what the original `forward` accepts.
"""

from __future__ import annotations

import inspect
import threading
from typing import TYPE_CHECKING, Any

from ..errors import KernelLayerError

if TYPE_CHECKING:
    from torch import nn

ALLOWED_MEMBERS = frozenset({"forward", "has_backward", "can_torch_compile"})

_validated: set[tuple[type, type]] = set()
_validated_lock = threading.Lock()


def validate_kernel_layer(
    kernel: Any, original: type[nn.Module], *, kernel_source: str, layer_name: str
) -> None:
    """Raise `KernelLayerError` unless `kernel` may replace `original.forward`.

    Args:
        kernel: the kernel layer class found in the repository.
        original: the class of the module being kernelized.
        kernel_source: how to name where the kernel came from, for errors.
        layer_name: the tag the module class carries.
    """
    import torch.nn as nn

    key = (kernel, original)
    with _validated_lock:
        if key in _validated:
            return

    who = (
        f"Kernel layer {getattr(kernel, '__qualname__', kernel)!s} from {kernel_source}, registered "
        f"for layer '{layer_name}' ({original.__module__}.{original.__qualname__}),"
    )
    if not (isinstance(kernel, type) and issubclass(kernel, nn.Module)):
        raise KernelLayerError(f"{who} is not a torch.nn.Module subclass.")

    own_classes = kernel.__mro__[: kernel.__mro__.index(nn.Module)]
    for cls in own_classes:
        if "__init__" in vars(cls):
            raise KernelLayerError(
                f"{who} defines __init__ (in {cls.__qualname__}); kernel layers must be stateless: "
                "remove the constructor and read what you need from the module through `self`."
            )
    extra = sorted(
        {
            name
            for cls in own_classes
            for name in vars(cls)
            if name not in ALLOWED_MEMBERS and not (name.startswith("__") and name.endswith("__"))
        }
    )
    if extra:
        raise KernelLayerError(
            f"{who} has class members {', '.join(extra)}; a kernel layer may only define "
            f"{', '.join(sorted(ALLOWED_MEMBERS))}. Move helpers to module-level functions."
        )
    for flag in ("has_backward", "can_torch_compile"):
        value = getattr(kernel, flag, None)
        if value is not None and not isinstance(value, bool):
            raise KernelLayerError(f"{who} sets {flag} = {value!r}; it must be True or False.")

    difference = signature_difference(kernel.forward, original.forward)
    if difference is not None:
        raise KernelLayerError(
            f"{who} has a forward signature that does not match: {difference}. Kernel: "
            f"forward{_signature(kernel.forward)}; layer: forward{_signature(original.forward)}."
        )

    with _validated_lock:
        _validated.add(key)


def signature_difference(kernel_forward: Any, original_forward: Any) -> str | None:
    """Describe the first difference between two forward signatures, or None if they match.

    Parameters must agree in number, order, name, kind (positional, keyword-only, ``*args``,
    ``**kwargs``) and default value. Annotations are not compared.
    """
    kernel_params = list(_parameters(kernel_forward))
    original_params = list(_parameters(original_forward))
    for position, (k, o) in enumerate(zip(kernel_params, original_params, strict=False), start=1):
        if k.name != o.name:
            return f"parameter {position} is '{k.name}' in the kernel but '{o.name}' in the layer"
        if k.kind != o.kind:
            return (
                f"parameter '{k.name}' is {k.kind.description} in the kernel but "
                f"{o.kind.description} in the layer"
            )
        if not _same_default(k.default, o.default):
            kd = "no default" if k.default is inspect.Parameter.empty else f"default {k.default!r}"
            od = "no default" if o.default is inspect.Parameter.empty else f"default {o.default!r}"
            return f"parameter '{k.name}' has {kd} in the kernel but {od} in the layer"
    if len(kernel_params) != len(original_params):
        longer, side = (
            (kernel_params, "kernel")
            if len(kernel_params) > len(original_params)
            else (original_params, "layer")
        )
        missing = ", ".join(p.name for p in longer[min(len(kernel_params), len(original_params)) :])
        return f"only the {side} has parameter(s) {missing}"
    return None


def _parameters(forward: Any):
    return inspect.signature(forward).parameters.values()


def _signature(forward: Any) -> str:
    try:
        return str(inspect.signature(forward))
    except (TypeError, ValueError):
        return "(?)"


def _same_default(a: object, b: object) -> bool:
    if a is b:
        return True
    try:
        return bool(type(a) is type(b) and a == b)
    except Exception:  # e.g. tensors, whose == is element-wise
        return False
