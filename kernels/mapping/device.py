"""Device types that kernels are registered for, and the capability ranges of GPU devices."""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass

from ..errors import KernelMappingError


@dataclass(frozen=True)
class CapabilityRange:
    """An inclusive range of device capabilities, written as ``10 * major + minor`` (8.6 is 86).

    Use one of its subclasses, `CUDAProperties` or `ROCMProperties`, which say which kind of
    device the numbers refer to.
    """

    min_capability: int
    max_capability: int

    def __post_init__(self) -> None:
        kind = type(self).__name__
        for field in ("min_capability", "max_capability"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise KernelMappingError(
                    f"{kind}.{field} must be a non-negative int such as 80 for capability 8.0, "
                    f"got {value!r}."
                )
        if self.min_capability > self.max_capability:
            raise KernelMappingError(
                f"{kind} has min_capability={self.min_capability} above "
                f"max_capability={self.max_capability}; the range is inclusive, so for a single "
                "capability give the same number twice."
            )

    def validate_capability_range(self) -> None:
        """Raise if the range is empty (Hugging Face's method; ours checks when constructed)."""
        if self.min_capability > self.max_capability:
            raise KernelMappingError(
                f"min_capability ({self.min_capability}) must be <= max_capability "
                f"({self.max_capability})"
            )

    def __contains__(self, capability: int) -> bool:
        return self.min_capability <= capability <= self.max_capability

    @property
    def width(self) -> int:
        """How many capabilities the range spans; narrower ranges win when several match."""
        return self.max_capability - self.min_capability

    def __str__(self) -> str:
        upper = "max" if self.max_capability >= sys.maxsize else str(self.max_capability)
        return f"capability {self.min_capability}..{upper}"


@dataclass(frozen=True)
class CUDAProperties(CapabilityRange):
    """Restricts a kernel to CUDA devices whose compute capability lies in an inclusive range.

    Example:
        ```python
        import sys
        from kernels import CUDAProperties, Device

        hopper_and_newer = Device(
            type="cuda", properties=CUDAProperties(min_capability=90, max_capability=sys.maxsize)
        )
        ```
    """


@dataclass(frozen=True)
class ROCMProperties(CapabilityRange):
    """Restricts a kernel to ROCm devices whose capability (as torch reports it) lies in a range."""


# Which device types have capability ranges is data, not a class per device type.
_PROPERTIES_OF_TYPE: dict[str, type[CapabilityRange] | None] = {
    "cuda": CUDAProperties,
    "rocm": ROCMProperties,
    "xpu": None,
    "mps": None,
    "npu": None,
    "cpu": None,
    # AWS Neuron, and Google TPUs through torch-tpu (Hugging Face's kernels 0.19 lists both).
    "neuron": None,
    "tpu": None,
}

# Names people reach for that torch does not use.
_ALIASES = {"metal": "mps", "gpu": "cuda", "hip": "rocm", "amd": "rocm", "nvidia": "cuda"}


def has_capability_ranges(device_type: str) -> bool:
    """Whether kernels for `device_type` can be restricted to capability ranges."""
    return _PROPERTIES_OF_TYPE.get(device_type) is not None


def supported_device_types() -> tuple[str, ...]:
    """The device types kernels can be registered for by name (torch may accept more)."""
    return tuple(_PROPERTIES_OF_TYPE)


def validate_device_type(device_type: object) -> str:
    """Return `device_type` if it names a device type, else raise with the likely fix."""
    if not isinstance(device_type, str) or not device_type:
        raise KernelMappingError(
            f"A device type must be a string such as 'cuda', got {device_type!r}."
        )
    if device_type in _PROPERTIES_OF_TYPE:
        return device_type
    if device_type == "meta":
        # torch knows it, but nothing runs there: a meta model is kernelized (or explained)
        # for the device it will be moved to.
        raise KernelMappingError(
            "'meta' is not a device kernels run on: name the device the model will run on, "
            "e.g. device='cuda'."
        )
    # Checked before torch's own types: torch knows "hip", but reports ROCm GPUs as "cuda",
    # so kernels registered for "hip" would never be chosen.
    hint = _ALIASES.get(device_type.lower())
    if hint is None and ":" not in device_type and _torch_knows_device_type(device_type):
        return device_type
    if hint is None:
        close = difflib.get_close_matches(device_type.lower(), _PROPERTIES_OF_TYPE, n=1)
        hint = close[0] if close else None
    suggestion = f" Did you mean '{hint}'?" if hint else ""
    raise KernelMappingError(
        f"Unknown device type '{device_type}'.{suggestion} Supported device types are: "
        f"{', '.join(supported_device_types())} (and other types torch itself knows, without "
        "an index such as ':0')."
    )


def _torch_knows_device_type(device_type: str) -> bool:
    import torch

    try:
        return torch.device(device_type).type == device_type
    except (RuntimeError, ValueError):
        return False


@dataclass(frozen=True)
class Device:
    """A device type, optionally with the capability range a kernel supports on it.

    Mapping keys can be a device-type string (``"cuda"``) or a `Device`. Capability ranges
    exist for ``cuda`` (`CUDAProperties`) and ``rocm`` (`ROCMProperties`); a `Device`
    without properties covers every capability of its type.

    Example:
        ```python
        from kernels import CUDAProperties, Device

        ampere_and_ada = Device(type="cuda", properties=CUDAProperties(80, 89))
        ```
    """

    type: str
    properties: CapabilityRange | None = None

    def __post_init__(self) -> None:
        validate_device_type(self.type)
        if self.properties is None:
            return
        expected = _PROPERTIES_OF_TYPE.get(self.type)
        if expected is None:
            raise KernelMappingError(
                f"Device type '{self.type}' has no capability ranges, but properties="
                f"{self.properties!r} was given; drop `properties` for this device type."
            )
        if type(self.properties) is not expected:
            raise KernelMappingError(
                f"Device type '{self.type}' takes {expected.__name__} as properties, got "
                f"{type(self.properties).__name__}."
            )

    def __str__(self) -> str:
        return self.type if self.properties is None else f"{self.type} ({self.properties})"


def as_device(device: object) -> Device:
    """Turn a mapping key or `kernelize(device=...)` value into a `Device`."""
    if isinstance(device, Device):
        return device
    if isinstance(device, str):
        return Device(type=device)
    raise KernelMappingError(
        f"Expected a device-type string such as 'cuda' or a kernels.Device, got {device!r}."
    )
