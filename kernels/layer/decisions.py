"""What `kernelize` decides: a `Decision` per tagged module, gathered in a `Plan`.

These value types sit below `kernelize`, which makes plans, and `verify`, which checks one
and hands back a changed copy, so that both import them from here and not from each other.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from ..mapping.device import Device
from ..mapping.mode import Mode
from ..mapping.resolve import Resolution

if TYPE_CHECKING:
    import torch
    from torch import nn

#: Where to choose kernels for: a device type (``"cuda"``), a `Device` or a ``torch.device``.
DeviceSpec = Union[str, Device, "torch.device"]
#: Example inputs for `verify`: one tensor, a tuple of positional arguments, or a dict of
#: keyword arguments for the model.
ExampleInputs = Union["torch.Tensor", tuple, list, dict]


@dataclass(frozen=True)
class Target:
    """The device kind kernels are chosen for, and the capability read for it."""

    device_type: str
    capability: int | None


@dataclass(frozen=True)
class Decision:
    """What kernelize does with one tagged module: which kernel it runs, or why none."""

    path: str
    module: nn.Module
    layer_name: str
    resolution: Resolution
    #: The kernel layer class to run, or None to keep the module's own forward.
    kernel: type[nn.Module] | None
    #: Why the module keeps its own forward (None when it gets a kernel).
    fallback_reason: str | None = None
    #: How loudly to log the fallback: a kernel that failed to load is a WARNING.
    fallback_level: int = logging.INFO
    #: True when the layer's condition (`use_kernel_forward_from_hub(..., condition=)`)
    #: returned False for this instance, so kernelization was skipped for it.
    skipped_by_condition: bool = False


@dataclass(frozen=True)
class Plan:
    """What `kernelize` will do: the mode, the device it chose for, and a decision per module."""

    mode: Mode
    target: Target
    decisions: tuple[Decision, ...]
