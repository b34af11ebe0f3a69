"""Whether a kernel build supports the GPU here, from the architectures its metadata declares.

kernel-builder writes ``"backend": {"type": "cuda", "archs": ["8.0", "9.0a", "10.0f+PTX"]}``
(or ``"rocm"`` with ``gfx`` names) in a build's ``metadata.json``. Loading a build whose
archs exclude this device would fail later, or crash the process, so it is refused (Hugging
Face's client does the same from 0.19); ``check_arch=False`` loads it anyway, for kernels
whose declared list is incomplete (a Triton fallback, for instance).

CUDA archs are compute capabilities ``X.Y`` with optional suffixes:

* ``X.Y``: runs on X.Z for Z >= Y (same major);
* ``X.Ya``: architecture-specific, only on X.Y;
* ``X.Yf``: family-specific, on X.Z for Z >= Y;
* ``+PTX``: without ``a``/``f``, also on any newer capability (the driver JIT-compiles it).

An entry in no known format matches nothing, but a list of only such entries (a newer
kernel-builder's, say) cannot be judged and is accepted. ROCm archs must name this device's
``gfx`` target exactly (its feature flags, ``:sramecc+:xnack-``, ignored).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import KernelArchError
from .bounded_json import quoted

_CUDA_ARCH = re.compile(r"([0-9]+)\.([0-9]+)([af]?)(\+PTX)?")


@dataclass(frozen=True)
class Device:
    """The accelerator a build must support: ``("cuda", (9, 0))`` or ``("rocm", "gfx942")``."""

    backend: str
    #: (major, minor) for CUDA; the gfx target for ROCm.
    arch: tuple[int, int] | str


def cuda_arch_supports(arch: str, capability: tuple[int, int]) -> bool | None:
    """Whether the CUDA arch `arch` (``"9.0a"``, ``"8.0+PTX"``) runs on `capability`; None when
    `arch` is in no known format."""
    match = _CUDA_ARCH.fullmatch(arch) if isinstance(arch, str) else None
    if match is None:
        return None
    built = (int(match[1]), int(match[2]))
    suffix, ptx = match[3], match[4] is not None
    if suffix == "a":
        return capability == built
    if ptx and not suffix:
        return capability >= built
    return capability[0] == built[0] and capability[1] >= built[1]


def supports_cuda_capability(archs: Sequence[str], capability: tuple[int, int]) -> bool:
    """Whether any of `archs` runs on `capability` (True when none can be read)."""
    verdicts = [cuda_arch_supports(arch, capability) for arch in archs]
    if all(v is None for v in verdicts):
        return True
    return any(verdicts)


def declared_archs(backend_info: Mapping[str, object] | None) -> list[str]:
    """The archs a metadata ``backend`` object declares (only CUDA and ROCm ones count)."""
    if not isinstance(backend_info, Mapping) or backend_info.get("type") not in ("cuda", "rocm"):
        return []
    archs = backend_info.get("archs")
    if not isinstance(archs, list):
        return []
    return [a for a in archs if isinstance(a, str)]


def current_device() -> Device | None:
    """This process's GPU, or None when torch sees no CUDA or ROCm device."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    if torch.version.hip is not None:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return Device("rocm", str(props.gcnArchName).split(":")[0])
    if torch.version.cuda is not None:
        major, minor = torch.cuda.get_device_capability()
        return Device("cuda", (int(major), int(minor)))
    return None


def arch_rejection(backend_info: Mapping[str, object] | None, device: Device | None) -> str | None:
    """Why a build with metadata ``backend`` `backend_info` cannot run on `device`, or None."""
    archs = declared_archs(backend_info)
    if not archs or device is None or device.backend != (backend_info or {}).get("type"):
        return None
    listed = ", ".join(archs)
    if device.backend == "cuda":
        assert isinstance(device.arch, tuple)
        if supports_cuda_capability(archs, device.arch):
            return None
        major, minor = device.arch
        return (
            f"CUDA capability {major}.{minor} of the current device is not supported by the "
            f"architectures of the build: {listed}"
        )
    if device.arch in archs:
        return None
    return (
        f"ROCm arch {device.arch} of the current device is not supported by the architectures "
        f"of the build: {listed}"
    )


def check_arch(
    backend_info: Mapping[str, object] | None,
    *,
    kernel: str,
    variant: str,
    check: bool = True,
    device: Device | None = None,
) -> None:
    """Refuse a build that does not support this device (see the module docstring).

    Args:
        backend_info: the ``backend`` object of the build's ``metadata.json``.
        kernel: how to name the kernel in the message (its name or repository).
        variant: the build variant it comes from.
        check: False skips the check (``check_arch=False``).
        device: the device to check for; this process's GPU when None.

    Raises:
        KernelArchError: the declared archs exclude the device (a ``RuntimeError``).
    """
    if not check or not declared_archs(backend_info):
        return
    reason = arch_rejection(backend_info, device or current_device())
    if reason is None:
        return
    raise KernelArchError(
        f"Kernel {quoted(kernel)} variant {quoted(variant)} does not support the current "
        f"device: {reason}. Nothing was imported. The declared architectures can be "
        "incomplete (e.g. when a kernel has a Triton fallback): pass check_arch=False to load "
        "it anyway; the kernel may then fail or crash the process when it runs."
    )
