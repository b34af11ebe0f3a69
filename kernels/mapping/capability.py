"""Reading the capability of the device a model runs on.

The reader is injectable (`use_capability_reader`) so that capability-range selection can
be tested, and explained, on machines without the GPU in question.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING

from .device import has_capability_ranges

if TYPE_CHECKING:
    import torch

#: Reads the capability (``10 * major + minor``) of a device of type "cuda" or "rocm", or
#: returns None when it cannot be known (no such device present, a meta model...).
CapabilityReader = Callable[[str, "int | None"], "int | None"]


def torch_capability(device_type: str, index: int | None) -> int | None:
    """The capability torch reports for the GPU `index` (the current one when None)."""
    import torch

    if device_type not in ("cuda", "rocm") or not torch.cuda.is_available():
        return None
    if index is None:
        index = torch.cuda.current_device()
    elif not 0 <= index < torch.cuda.device_count():
        return None  # e.g. a model meant for cuda:1 explained on a one-GPU machine
    major, minor = torch.cuda.get_device_capability(index)
    return 10 * major + minor


_READER: ContextVar[CapabilityReader] = ContextVar(
    "kernels_capability_reader", default=torch_capability
)


@contextlib.contextmanager
def use_capability_reader(reader: CapabilityReader) -> Iterator[None]:
    """Read device capabilities with `reader` inside the ``with`` block.

    Example:
        ```python
        from kernels.mapping.capability import use_capability_reader

        with use_capability_reader(lambda device_type, index: 86):
            kernelize(model, device="cuda", mode=Mode.INFERENCE)  # as on an RTX 3090
        ```
    """
    token = _READER.set(reader)
    try:
        yield
    finally:
        _READER.reset(token)


def read_capability(device_type: str, device: torch.device | None = None) -> int | None:
    """The capability of `device` (of kind `device_type`), or None for types without one."""
    if not has_capability_ranges(device_type):
        return None
    index = device.index if device is not None else None
    return _READER.get()(device_type, index)
