"""Build variants: the ``build/<variant>/`` folders of a kernel repository, and which one runs here.

A compiled variant is named for what its binaries need, e.g.
``torch28-cxx11-cu128-x86_64-linux`` (torch 2.8, C++11 ABI, CUDA 12.8, x86-64 Linux),
``torch27-cxx11-rocm63-x86_64-linux``, ``torch28-cxx11-xpu20251-x86_64-linux``,
``torch28-cxx11-cpu-aarch64-linux``, ``torch27-metal-aarch64-darwin`` or
``torch28-cu128-x86_64-windows`` (macOS and Windows builds name no C++ ABI). Pure-Python kernels
(Triton, for instance) use ``torch-universal``, or ``torch-<backend>`` (``torch-cuda``,
``torch-rocm``, ``torch-xpu``, ``torch-metal``, ``torch-cpu``) when they only run on one backend.

By default the exact compiled variant wins over ``torch-<backend>``, which wins over
``torch-universal``. A repository can say otherwise in a ``kernel-variants.json`` file at its
root: ``{"prefer": "noarch"}`` puts the pure-Python variants (``torch-<backend>``, then
``torch-universal``) before the compiled one, e.g. for a Triton kernel that ships compiled
builds only as a fallback; ``{"prefer": "compiled"}`` states the default.
"""

from __future__ import annotations

import json
import platform
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from packaging.version import Version

from ..errors import BuildVariantNotFoundError

UNIVERSAL_VARIANT = "torch-universal"

#: The optional file at a repository's root that states which kind of variant it prefers.
PREFERENCE_FILE = "kernel-variants.json"

#: Values of ``prefer`` in `PREFERENCE_FILE` ("universal" is accepted for "noarch").
PREFERENCES = ("compiled", "noarch")

#: Folder names under ``build/`` that are build variants (anything else is ignored).
VARIANT_PATTERN = re.compile(r"^(torch\d\d+-.+|torch-(universal|cpu|cuda|metal|rocm|xpu|npu))$")


@dataclass(frozen=True)
class MachineBuild:
    """What a compiled kernel must match to run in this process."""

    torch: str  # "torch28"
    cxx_abi: str | None  # "cxx11" / "cxx98"; None on macOS and Windows, whose variants omit it
    backend: str  # "cuda", "rocm", "xpu", "metal", "npu" or "cpu"
    runtime: str  # "cu128", "rocm63", "xpu20251", "metal", "npu" or "cpu"
    arch: str  # "x86_64", "aarch64"
    os: str  # "linux", "darwin", "windows"

    @property
    def compiled_variant(self) -> str:
        """The one compiled variant name that matches this machine exactly."""
        parts = [self.torch, self.cxx_abi, self.runtime, self.arch, self.os]
        return "-".join(p for p in parts if p)

    def acceptable_variants(self, prefer: str = "compiled") -> tuple[str, ...]:
        """Variant names that run here, best first: compiled, backend-only, universal.

        With ``prefer="noarch"`` the compiled variant comes last instead.
        """
        noarch = (f"torch-{self.backend}", UNIVERSAL_VARIANT)
        if check_preference(prefer) == "noarch":
            return (*noarch, self.compiled_variant)
        return (self.compiled_variant, *noarch)


@lru_cache(maxsize=1)
def machine_build() -> MachineBuild:
    """Describe the running torch, accelerator runtime, C++ ABI, CPU architecture and OS."""
    import torch

    return describe_machine(torch, system=platform.system(), machine=platform.machine())


def describe_machine(torch, *, system: str, machine: str) -> MachineBuild:
    """The `MachineBuild` of a torch module on an OS and CPU as `platform` names them.

    Names follow the build variants that Hugging Face's kernel-builder publishes, so that
    their compiled kernels are found: ``torch28-cxx11-cu128-x86_64-linux``,
    ``torch28-cxx11-rocm63-x86_64-linux``, ``torch28-cxx11-xpu20251-x86_64-linux``,
    ``torch28-metal-aarch64-darwin`` (``torch28-cpu-aarch64-darwin`` without MPS) and
    ``torch28-cu128-x86_64-windows``.
    """
    version = Version(torch.__version__.split("+")[0])
    backend, runtime = _backend_and_runtime(torch)
    system = system.lower()
    arch = machine.lower()
    arch = {"arm64": "aarch64", "amd64": "x86_64"}.get(arch, arch)
    cxx_abi = None
    # Only Linux builds name their C++ ABI; macOS and Windows variants have no ABI part.
    if system not in ("darwin", "windows"):
        cxx_abi = "cxx11" if torch.compiled_with_cxx11_abi() else "cxx98"
    return MachineBuild(
        torch=f"torch{version.major}{version.minor}",
        cxx_abi=cxx_abi,
        backend=backend,
        runtime=runtime,
        arch=arch,
        os=system,
    )


def _backend_and_runtime(torch) -> tuple[str, str]:
    # The order is kernel-builder's: a CUDA or ROCm build wins, then MPS, then XPU.
    if torch.version.cuda is not None:
        v = Version(torch.version.cuda)
        return "cuda", f"cu{v.major}{v.minor}"
    if torch.version.hip is not None:
        v = Version(torch.version.hip.split("-")[0])
        return "rocm", f"rocm{v.major}{v.minor}"
    mps = getattr(getattr(torch, "backends", None), "mps", None)
    if mps is not None and mps.is_available():
        # Metal only where MPS runs: an Intel Mac, or torch without MPS, loads CPU builds.
        return "metal", "metal"
    xpu_version = getattr(torch.version, "xpu", None)
    if xpu_version is not None:
        # torch.version.xpu is oneAPI's build date ("20250101" for 2025.1); variants carry
        # the year and the minor release: xpu20251.
        return "xpu", f"xpu{xpu_version[0:4]}{xpu_version[5:6]}"
    if hasattr(torch, "npu"):
        return "npu", "npu"
    return "cpu", "cpu"


def variants_in(names: Iterable[str]) -> list[str]:
    """The names that are build variants, sorted."""
    return sorted(n for n in names if VARIANT_PATTERN.match(n))


def check_preference(prefer: object, *, where: str = "prefer") -> str:
    """Validate a variant preference; returns "compiled" or "noarch"."""
    if prefer == "universal":
        return "noarch"
    if prefer not in PREFERENCES:
        raise BuildVariantNotFoundError(
            f"{where} must be one of {', '.join(PREFERENCES)}, got {prefer!r}."
        )
    return prefer  # type: ignore[return-value]


def parse_preference_file(text: str, *, where: str) -> str:
    """The ``prefer`` value of a `PREFERENCE_FILE`'s contents ("compiled" when absent).

    Raises:
        BuildVariantNotFoundError: the file is not JSON, or states an unknown preference.
    """
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise BuildVariantNotFoundError(f"{where}: {PREFERENCE_FILE} is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BuildVariantNotFoundError(
            f'{where}: {PREFERENCE_FILE} must hold an object such as {{"prefer": "noarch"}}.'
        )
    return check_preference(
        data.get("prefer", "compiled"), where=f"{where}: {PREFERENCE_FILE} prefer"
    )


def allow_patterns(variants: Iterable[str]) -> list[str]:
    """huggingface_hub ``allow_patterns`` that fetch just these variants (and the preference file)."""
    return [*(f"build/{v}/*" for v in variants), PREFERENCE_FILE]


def choose_variant(
    available: Iterable[str],
    *,
    where: str,
    machine: MachineBuild | None = None,
    prefer: str = "compiled",
) -> str:
    """The best variant among `available` for this machine.

    Args:
        available: folder names under ``build/`` (non-variants are ignored).
        where: how to name the repository in errors.
        machine: the machine to choose for (this one by default).
        prefer: "compiled" (default) or "noarch", as the repository's `PREFERENCE_FILE` says.

    Raises:
        BuildVariantNotFoundError: none of them runs here; the message lists what `where`
            offers and what this machine needs.
    """
    machine = machine or machine_build()
    offered = variants_in(available)
    for wanted in machine.acceptable_variants(prefer):
        if wanted in offered:
            return wanted
    raise BuildVariantNotFoundError(
        f"{where} has no build variant for this machine. It offers: "
        f"{', '.join(offered) or 'no build variants at all (is there a build/ folder?)'}. "
        f"This machine runs any of: {', '.join(machine.acceptable_variants(prefer))}."
    )
