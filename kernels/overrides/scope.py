"""Turning the overrides on and off: a scope (`use_aten_overrides`) and a process-wide switch
(`enable_aten_overrides`, `disable_aten_overrides`).

Scopes and the switch each hold the overrides they asked for; an override stays registered
while anything holds it, so scopes nest (an inner scope adds overrides, it never removes an
outer one's) and leaving the outermost holder restores PyTorch's dispatch table exactly. The
dispatcher is process-wide: a scope opened in one thread overrides the operators for every
thread until it closes, which no context manager can confine to its own thread.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Iterator

from ..errors import KernelMappingError
from . import registry
from .table import resolve_overrides

_switch_lock = threading.Lock()
_switch_held: tuple[registry.Key, ...] = ()


def _dispatch_keys(device_types: Iterable[str] | str | None) -> tuple[str, ...]:
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if device_types is None:
        # As library_mapping: CUDA, plus the CPU when Triton's interpreter runs the kernels there.
        device_types = ("cuda", "cpu") if interpreted else ("cuda",)
    elif isinstance(device_types, str):
        device_types = (device_types,)
    keys = []
    for device_type in device_types:
        if device_type not in registry.DISPATCH_KEYS:
            raise KernelMappingError(
                f"aten overrides run on {' and '.join(map(repr, registry.DISPATCH_KEYS))} "
                f"tensors, not {device_type!r}."
            )
        if device_type == "cpu" and not interpreted:
            raise KernelMappingError(
                "Our Triton kernels run on CPU tensors only through Triton's interpreter: set "
                "TRITON_INTERPRET=1 before triton is imported (slow; for checking numerics), "
                "or override for 'cuda' only."
            )
        keys.append(registry.DISPATCH_KEYS[device_type])
    return tuple(dict.fromkeys(keys))


def _operators(held: tuple[registry.Key, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(op for op, _ in held))


@contextlib.contextmanager
def use_aten_overrides(
    ops: Iterable[str] | str | None = None, device_types: Iterable[str] | str | None = None
) -> Iterator[tuple[str, ...]]:
    """Within the scope, our Triton kernels are PyTorch's kernels for the aten operators they
    implement, so unchanged model code (``nn.LayerNorm``, ``F.rms_norm``, ``F.silu``, ...) runs
    them, forward and backward.

    Inputs our kernels do not take (other dtypes, layouts, arguments) run PyTorch's own kernel.
    Scopes nest; on leaving the outermost scope (also through an exception) the dispatcher is
    exactly as it was. The dispatcher is process-wide: while a scope is open, every thread's
    calls are overridden. Code compiled by ``torch.compile`` (inductor) generates its own
    kernels for these operators and does not call ours (docs/overrides.md).

    Args:
        ops: aten operator names (``"native_layer_norm"``) or families (``"layer_norm"``,
            ``"rms_norm"``, ``"silu"``, ``"gelu"``: an operator and its backward). None: the
            operators where ours were faster than PyTorch's in the saved benchmarks
            (`kernels.overrides.OVERRIDES`, ``faster_than_aten``).
        device_types: ``"cuda"``; ``"cpu"`` only under Triton's interpreter
            (``TRITON_INTERPRET=1``). None: ``cuda``, plus ``cpu`` under the interpreter.

    Yields:
        The operators overridden by this scope (an operator that does not exist in the running
        torch, or that PyTorch has no kernel for on these devices, is left out and logged).

    Raises:
        KernelMappingError: an unknown operator, family or device type.

    Example:
        ```python
        from kernels.overrides import use_aten_overrides

        with use_aten_overrides(ops=["layer_norm", "rms_norm"]):
            loss = model(x).sum()  # nn.LayerNorm and nn.RMSNorm run our kernels
            loss.backward()
        ```
    """
    specs = resolve_overrides(ops)
    held = registry.acquire(specs, _dispatch_keys(device_types))
    try:
        yield _operators(held)
    finally:
        registry.release(held)


def enable_aten_overrides(
    ops: Iterable[str] | str | None = None, device_types: Iterable[str] | str | None = None
) -> tuple[str, ...]:
    """Override the aten operators process-wide until `disable_aten_overrides`.

    Takes the arguments of `use_aten_overrides`. Enabling again replaces the switch's set (the
    operators of both stay registered throughout); scopes opened meanwhile keep theirs.

    Returns:
        The operators the switch overrides.

    Example:
        ```python
        from kernels.overrides import disable_aten_overrides, enable_aten_overrides

        enable_aten_overrides(ops=["layer_norm"])
        ...  # every nn.LayerNorm on CUDA runs our kernels
        disable_aten_overrides()
        ```
    """
    global _switch_held
    specs = resolve_overrides(ops)
    keys = _dispatch_keys(device_types)
    with _switch_lock:
        held = registry.acquire(specs, keys)
        previous, _switch_held = _switch_held, held
        registry.release(previous)
    return _operators(held)


def disable_aten_overrides() -> None:
    """Undo `enable_aten_overrides` (nothing when it is off). Overrides that an open
    `use_aten_overrides` scope holds stay until it closes."""
    global _switch_held
    with _switch_lock:
        previous, _switch_held = _switch_held, ()
        registry.release(previous)


def active_aten_overrides() -> dict[str, tuple[str, ...]]:
    """The aten operators overridden now, by the switch or by open scopes.

    Returns:
        ``{operator: device types}``, e.g. ``{"native_layer_norm": ("cuda",)}``.
    """
    device_types = {key: device for device, key in registry.DISPATCH_KEYS.items()}
    return {
        op: tuple(device_types[key] for key in keys) for op, keys in registry.registered().items()
    }
