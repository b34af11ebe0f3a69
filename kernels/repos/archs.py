"""Whether a kernel build supports this machine's GPU architecture (``check_arch=``).

A build's ``metadata.json`` may list the architectures it was compiled for
(``backend.archs``: CUDA compute capabilities such as ``"9.0"``, ``"9.0a"``, ``"10.0f"`` or
``"8.0+PTX"``; ROCm ``gfx`` names). Loading refuses a build whose list leaves out the device
in use, as Hugging Face's client does, unless the caller passes ``check_arch=False``
(a kernel with a Triton fallback may run on more than it declares).

The rules for a CUDA arch ``X.Y``:

* plain ``X.Y``: devices ``X.Y'`` of the same major with ``Y' >= Y``;
* ``X.Ya`` (architecture-specific): exactly ``X.Y``;
* ``X.Yf`` (family-specific): the same major, ``Y' >= Y``;
* ``X.Y+PTX``: any device at least ``X.Y`` (the PTX is compiled for it when loaded).

A list none of whose entries can be parsed (a newer kernel-builder's notation) is not held
against the build.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import BuildVariantNotFoundError
from .info import Backend, Metadata
from .loaded import read_metadata, variant_folder
from .signatures import check_signature

_CUDA_ARCH = re.compile(r"(\d+)\.(\d+)([af]?)(\+PTX)?")


def cuda_arch_runs_on(arch: str, capability: tuple[int, int]) -> bool | None:
    """Whether code built for the CUDA arch `arch` runs on a device of `capability`;
    None when `arch` is not in a notation this module knows."""
    match = _CUDA_ARCH.fullmatch(arch)
    if match is None:
        return None
    built = (int(match.group(1)), int(match.group(2)))
    suffix, ptx = match.group(3), match.group(4) is not None
    if suffix == "a":
        return capability == built
    if suffix != "f" and ptx:
        return capability >= built
    return capability[0] == built[0] and capability[1] >= built[1]


def cuda_archs_run_on(archs: list[str], capability: tuple[int, int]) -> bool:
    """Whether any of `archs` runs on `capability` (True when none can be parsed)."""
    verdicts = [cuda_arch_runs_on(arch, capability) for arch in archs]
    return all(v is None for v in verdicts) or any(verdicts)


def device_arch(backend: Backend | None) -> tuple[int, int] | str | None:
    """The architecture of the current device for `backend`: a CUDA capability, a ROCm
    ``gfx`` name (feature flags removed), or None when torch has no such device here."""
    import torch

    if not torch.cuda.is_available():
        return None
    if backend is Backend.CUDA and torch.version.cuda is not None:
        major, minor = torch.cuda.get_device_capability()
        return (major, minor)
    if backend is Backend.ROCm and getattr(torch.version, "hip", None) is not None:
        name = torch.cuda.get_device_properties(torch.cuda.current_device()).gcnArchName
        return str(name).split(":")[0]
    return None


def unsupported_arch(metadata: Metadata) -> str | None:
    """Why the build `metadata` describes cannot run on the current device, or None when it
    can (or the build declares no archs, or the device is not of its backend)."""
    info = metadata.backend
    if info is None:
        return None
    archs = info.archs
    if not archs:
        return None
    backend = info.backend_type  # archs is None for an unknown backend: no ValueError here
    arch = device_arch(backend)
    if arch is None:
        return None
    if isinstance(arch, tuple):
        if cuda_archs_run_on(archs, arch):
            return None
        return (
            f"CUDA capability {arch[0]}.{arch[1]} of the current device is not among the "
            f"architectures of the build ({', '.join(archs)})"
        )
    if arch in archs:
        return None
    return f"ROCm arch {arch} of the current device is not among the architectures of the build ({', '.join(archs)})"


def check_arch(metadata: Metadata, *, where: str) -> None:
    """Refuse a build that does not declare the current device's architecture.

    Raises:
        BuildVariantNotFoundError: it does not; the message names the device, the build's
            archs, and ``check_arch=False``.
    """
    reason = unsupported_arch(metadata)
    if reason is None:
        return
    raise BuildVariantNotFoundError(
        f"{where} does not support the current device: {reason}. Nothing was imported. The "
        "declared architectures can be incomplete (e.g. a kernel with a Triton fallback): "
        "pass check_arch=False to load it anyway, at the risk of it failing or crashing the "
        "process when it runs."
    )


def check_package_arch(package_dir: Path, *, where: str) -> None:
    """`check_arch` for the build a package folder belongs to, before it is imported.

    The signature (when required) is checked first: a forged ``metadata.json`` should meet
    no parser of ours (`kernels.repos.signatures`).

    Raises:
        BuildVariantNotFoundError: as `check_arch`.
        KernelLoadError: the metadata.json is malformed; KernelSignatureError as
            `check_signature`.
    """
    check_signature(variant_folder(package_dir))
    check_arch(read_metadata(package_dir), where=where)
