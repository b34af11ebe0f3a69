"""Build variants: the ``build/<variant>/`` folders of a kernel repository, and which one runs here.

Names are read by `kernels.repos.variant_names` (both spellings: ``torch210-cxx11-cu128-
x86_64-linux`` and ``torch-2.10-cxx11-cuda-12.8-cpython-3.9-abi3-x86_64-linux``). A build
runs here when:

* its CPU and OS are this machine's;
* its Python tag fits: the interpreter is at least the tag's version; ``abi3`` builds do not
  load in a free-threaded interpreter, ``abi3t`` ones need 3.15 (legacy names are
  ``cpython-3.9-abi3``);
* its framework fits: ``torch<XY>`` is the torch minor release here (and its C++ ABI tag, if
  it has one, is this torch's); ``torch-stable-abi<XY>`` needs torch X.Y or later;
  ``tvm-ffi<XY>`` is the installed tvm-ffi's minor release; ``mlx-<backend>`` needs MLX;
* its backend is the selected one (the accelerator torch was built for, or ``cpu`` when
  asked): a CUDA or ROCm build for X.Z runs on X.Y when Z <= Y (same major); XPU and CANN
  need their exact version; Metal builds with compiled parts need macOS 26 (they are built
  with ``-std=metal4.0``); ``torch-universal`` runs on any backend.

Among those that run, the best is, in order (Hugging Face's client's order): torch
stable-ABI builds (newest ABI first), per-torch builds (a name without the C++ ABI tag before
one with it), tvm-ffi builds, SDK builds with compiled parts (for this backend before
backend-agnostic ones), then ``torch-<backend>`` / ``mlx-<backend>``, ``torch-universal``,
``sdk-<backend>`` and ``sdk``. Within a kind the newest fitting backend release comes first,
then ``abi3`` before ``abi3t``, then the newest Python tag; names that still tie are ordered
by name. One deliberate difference: on a torch built with the old C++ ABI, a build tagged
``cxx98`` comes before an untagged one (untagged builds are C++11 ones). A repository can put
the pure-Python variants first with a ``kernel-variants.json`` at its root: ``{"prefer":
"noarch"}``; ``{"prefer": "compiled"}`` states the default.

`rank_variants` is the documented, stable entry point: names plus a described machine
(`MachineBuild`) give every decision, accepted ones best first. `decide_variants` does the
same for this machine; ``kernels check`` and the "no build variant" error list the reasons.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import platform
import re
import sys
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import lru_cache

from packaging.version import InvalidVersion, Version

from ..errors import BuildVariantNotFoundError, KernelMappingError, KernelMetadataError
from .bounded_json import MiB, json_type, load_json_file, parse_json, quoted
from .variant_names import (
    BACKEND,
    MAX_VARIANT_NAME_LENGTH,
    SDK,
    STABLE_ABI,
    TORCH,
    TVM_FFI,
    UNIVERSAL,
    UNIVERSAL_VARIANT,
    BuildVariant,
)

logger = logging.getLogger(__name__)

__all__ = [
    "BACKEND",
    "MAX_VARIANT_NAME_LENGTH",
    "SDK",
    "STABLE_ABI",
    "TORCH",
    "TVM_FFI",
    "UNIVERSAL",
    "UNIVERSAL_VARIANT",
    "BuildVariant",
    "MachineBuild",
    "VariantAccepted",
    "VariantRejected",
    "choose_variant",
    "decide_variants",
    "rank_variants",
]

#: The optional file at a repository's root that states which kind of variant it prefers.
PREFERENCE_FILE = "kernel-variants.json"

#: Values of ``prefer`` in `PREFERENCE_FILE` ("universal" is accepted for "noarch").
PREFERENCES = ("compiled", "noarch")

#: The largest `PREFERENCE_FILE` read; the real ones are a few dozen bytes.
MAX_PREFERENCE_FILE_SIZE = 1 * MiB

#: Backends that have a pure-Python ``torch-<backend>`` variant.
NOARCH_BACKENDS = ("cann", "cpu", "cuda", "metal", "neuron", "rocm", "tpu", "xpu")

#: Metal builds with compiled parts are built with ``-std=metal4.0``, which needs macOS 26.
METAL_MIN_MACOS = Version("26.0")

#: Folder names under ``build/`` that claim to be build variants. Names of this shape that
#: `BuildVariant.parse` cannot read are reported as rejected, never silently skipped.
VARIANT_PATTERN = re.compile(r"^(torch[0-9-][\w.-]*|tvm-ffi[\w.-]*|mlx-[\w.-]+|sdk(-[\w.-]+)?)$")

# What a variant name in a lock file may be: the shape above in ASCII, so that it is always
# one safe path component (it names ``build/<variant>/`` to download and verify).
_VARIANT_NAME = re.compile(r"(?:torch[0-9-]|tvm-ffi|mlx-|sdk-|sdk$)[A-Za-z0-9_.-]*")

# The kinds of variant, in the default order of preference; `rank` groups them so.
_GROUPS = (STABLE_ABI, TORCH, TVM_FFI, "sdk-compiled", "noarch", "sdk-backend", "sdk-bare")
_NOARCH_FIRST = ("noarch", STABLE_ABI, TORCH, TVM_FFI, "sdk-compiled", "sdk-backend", "sdk-bare")

# Runtime prefixes as legacy variant names spell them, by backend.
_RUNTIME_PREFIX = {"cuda": "cu", "rocm": "rocm", "xpu": "xpu", "cann": "cann"}
# Backends whose builds for X.Z run on X.Y when Z <= Y.
_MINOR_COMPATIBLE = {"cuda": "CUDA", "rocm": "ROCm"}


def is_variant_name(value: object) -> bool:
    """Whether `value` is shaped like a build variant name (ASCII, one path component).

    Unlike `BuildVariant.parse`, it accepts kinds this version cannot read, as a lock written
    by a newer tool may list them.
    """
    return (
        isinstance(value, str)
        and len(value) <= MAX_VARIANT_NAME_LENGTH
        and _VARIANT_NAME.fullmatch(value) is not None
    )


def _running_python() -> Version:
    return Version(f"{sys.version_info.major}.{sys.version_info.minor}")


def _free_threaded() -> bool:
    return bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


@dataclass(frozen=True)
class MachineBuild:
    """What a kernel build must match to run in a process: the machine `rank_variants` and
    `decide_variants` choose for.

    Example:
        ```python
        >>> from packaging.version import Version
        >>> h100 = MachineBuild(Version("2.10"), "cxx11", "cuda", Version("12.8"), "x86_64", "linux")
        >>> h100.runtime
        'cu128'
        ```
    """

    #: The torch minor release, e.g. 2.10; None where torch is not installed.
    torch: Version | None
    #: "cxx11" / "cxx98"; None on macOS and Windows (and without torch).
    cxx_abi: str | None
    #: "cuda", "rocm", "xpu", "cann", "metal", "neuron", "tpu" or "cpu".
    backend: str
    #: 12.8 for CUDA 12.8, 7.1 for ROCm 7.1, 2025.1 for oneAPI, 8.1 for CANN; None for the
    #: unversioned backends (and a CANN whose version is unknown).
    backend_version: Version | None
    cpu: str  # "x86_64", "aarch64"
    os: str  # "linux", "darwin", "windows"
    #: The installed tvm-ffi minor release, if any.
    tvm_ffi: Version | None = None
    #: The interpreter's minor release, e.g. 3.12.
    python: Version = field(default_factory=_running_python)
    #: Whether the interpreter is a free-threaded build (it loads only ``abi3t`` extensions).
    free_threaded: bool = field(default_factory=_free_threaded)
    #: The macOS release on macOS, e.g. 26.1; None elsewhere (or unknown).
    macos: Version | None = None
    #: Whether MLX is installed (``mlx-<backend>`` builds need it).
    mlx: bool = False

    @property
    def runtime(self) -> str:
        """The backend as legacy variant names spell it: ``cu128``, ``rocm63``, ``cpu``."""
        if self.backend_version is None or self.backend not in _RUNTIME_PREFIX:
            return self.backend
        v = self.backend_version
        return f"{_RUNTIME_PREFIX[self.backend]}{v.major}{v.minor}"

    @property
    def compiled_variant(self) -> str:
        """The per-torch variant name built exactly for this machine (legacy spelling)."""
        torch = self.torch or Version("0.0")
        parts = [f"torch{torch.major}{torch.minor}", self.cxx_abi, self.runtime]
        return "-".join(p for p in [*parts, self.cpu, self.os] if p)

    def rejection(self, variant: BuildVariant) -> str | None:
        """Why `variant` cannot run here, or None when it can."""
        if variant.kind in (UNIVERSAL, BACKEND):
            return self._noarch_rejection(variant)
        if variant.kind == SDK:
            return self._sdk_rejection(variant)
        return (
            self._python_rejection(variant)
            or self._system_rejection(variant)
            or self._framework_rejection(variant)
            or self._backend_rejection(variant)
        )

    def _noarch_rejection(self, variant: BuildVariant) -> str | None:
        if variant.framework == "mlx" and not self.mlx:
            return "MLX is not installed in the environment (pip install mlx)"
        if variant.kind == UNIVERSAL or variant.backend == self.backend:
            return None
        hint = ""
        if variant.backend == "npu" and self.backend == "cann":
            hint = "; Ascend NPU builds are named torch-cann"
        return (
            f"pure-Python build for {variant.backend}, which does not match system backend "
            f"({self.backend}){hint}"
        )

    def _sdk_rejection(self, variant: BuildVariant) -> str | None:
        if variant.has_binaries:
            reason = self._python_rejection(variant) or self._system_rejection(variant)
            if reason is not None or variant.backend is None:
                return reason
            return self._backend_rejection(variant)
        if variant.backend is not None and variant.backend != self.backend:
            return (
                f"SDK for {variant.backend}, which does not match system backend ({self.backend})"
            )
        return None

    def _python_rejection(self, variant: BuildVariant) -> str | None:
        needed, abi = variant.python_version, variant.python_abi
        assert needed is not None and abi is not None, variant  # builds with binaries have both
        if abi == "abi3" and self.free_threaded:
            return (
                "abi3 is not supported on free-threaded Python, abi3t is required: the build's "
                "extension modules need the GIL"
            )
        if self.python < needed:
            return (
                f"Python {needed} or later is required, system Python version is {self.python} "
                f"(the build is cpython-{needed}-{abi})"
            )
        return None

    def _system_rejection(self, variant: BuildVariant) -> str | None:
        if variant.cpu != self.cpu:
            return f"built for CPU {variant.cpu}, which does not match system CPU ({self.cpu})"
        if variant.os != self.os:
            return f"built for OS {variant.os}, which does not match system OS ({self.os})"
        return None

    def _framework_rejection(self, variant: BuildVariant) -> str | None:
        version = variant.framework_version
        assert version is not None, variant  # parse gives every compiled kind its version
        if variant.kind == STABLE_ABI:
            if self.torch is None:
                return f"needs torch >= {version} (torch's stable ABI); torch is not installed"
            if self.torch < version:
                return f"needs torch >= {version} (torch's stable ABI); torch here is {self.torch}"
            return None
        if variant.kind == TORCH:
            if self.torch is None:
                return f"built for torch {version}; torch is not installed"
            if version != self.torch:
                return f"built for torch {version}; torch here is {self.torch}"
            # A name without the ABI tag is accepted whatever this torch's ABI, as Hugging
            # Face's client does: builders dropped the tag once every torch used the C++11 ABI.
            if variant.cxx_abi is not None and variant.cxx_abi != self.cxx_abi:
                how = {"cxx11": "with", "cxx98": "without"}.get(self.cxx_abi or "")
                here = (
                    f"torch here was built {how} the CXX11 ABI"
                    if how
                    else "torch here has no C++ ABI tag"
                )
                return f"C++ ABI {variant.cxx_abi} does not match: {here} (CXX11 ABI mismatch)"
            return None
        if self.tvm_ffi is None:
            return f"built for tvm-ffi {version}, which is not installed"
        if version != self.tvm_ffi:
            return f"built for tvm-ffi {version}; tvm-ffi here is {self.tvm_ffi}"
        return None

    def _backend_rejection(self, variant: BuildVariant) -> str | None:
        built, have = variant.backend_version, self.backend_version
        if variant.backend != self.backend:
            return (
                f"built for backend {_spell(variant.backend, built)}, which does not match "
                f"selected backend ({_spell(self.backend, have)})"
            )
        label = _MINOR_COMPATIBLE.get(self.backend)
        if label is not None and built is not None:
            if have is None or built.major != have.major or built.minor > have.minor:
                need = f"{have.major}.x with x <= {have.minor}" if have else "a known version"
                return (
                    f"{label} version ({built}) is not compatible with system {label} version "
                    f"({have}): a build for {label} X.Z runs on X.Y when Z <= Y, so this "
                    f"machine needs {need}"
                )
        elif built != have:
            return (
                f"built for {self.backend} {built}; this machine has {self.backend} "
                f"{have if have is not None else '(version unknown)'}"
            )
        if self.backend == "metal" and (self.macos is None or self.macos < METAL_MIN_MACOS):
            return (
                f"Metal kernels require macOS {METAL_MIN_MACOS} or later (they are built with "
                f"-std=metal4.0), system macOS version is {self.macos or 'unknown'}"
            )
        return None

    def rank(self, variant: BuildVariant, prefer: str = "compiled") -> tuple:
        """Sort key of an accepted variant: lower is better (see the module docstring)."""
        order = _NOARCH_FIRST if check_preference(prefer) == "noarch" else _GROUPS
        group, detail = _group(variant, old_abi=self.cxx_abi == "cxx98")
        newest = -variant.backend_version.minor if variant.backend_version is not None else 0
        if group == "sdk-compiled" and variant.backend is None:
            newest = 1  # backend-agnostic after any backend's
        if group == "noarch":
            newest = int(variant.kind == UNIVERSAL)
        return (order.index(group), *detail, newest, *_python_order(variant))


def _spell(backend: str | None, version: Version | None) -> str:
    return f"{backend}-{version}" if version is not None else str(backend)


def _group(variant: BuildVariant, *, old_abi: bool) -> tuple[str, tuple[int, int]]:
    if variant.kind == STABLE_ABI:
        abi = variant.framework_version
        assert abi is not None, variant
        return STABLE_ABI, (-abi.major, -abi.minor)
    if variant.kind == TORCH:
        # Untagged names first, as Hugging Face's client orders them; but a torch with the
        # old ABI takes a build tagged for it first, since untagged builds are C++11 ones.
        tagged = variant.cxx_abi != "cxx98" if old_abi else variant.cxx_abi is not None
        return TORCH, (0, int(tagged))
    if variant.kind == TVM_FFI:
        return TVM_FFI, (0, 0)
    if variant.kind == SDK:
        if variant.has_binaries:
            return "sdk-compiled", (0, 0)
        return ("sdk-backend" if variant.backend else "sdk-bare"), (0, 0)
    return "noarch", (0, 0)


def _python_order(variant: BuildVariant) -> tuple[int, int, int]:
    # abi3 before abi3t (a GIL interpreter prefers it), then the newest Python tag.
    if variant.python_abi is None or variant.python_version is None:
        return (0, 0, 0)
    v = variant.python_version
    return (int(variant.python_abi == "abi3t"), -v.major, -v.minor)


@dataclass(frozen=True)
class VariantAccepted:
    """A build variant that runs on this machine; `rank` 0 is the one that is loaded."""

    variant: BuildVariant
    rank: int


@dataclass(frozen=True)
class VariantRejected:
    """A build variant that does not run on this machine, and why."""

    variant: BuildVariant
    reason: str


VariantDecision = VariantAccepted | VariantRejected


@lru_cache(maxsize=1)
def machine_build() -> MachineBuild:
    """Describe the running torch, accelerator runtime, C++ ABI, CPU, OS, Python, tvm-ffi,
    macOS release and MLX."""
    torch: object | None
    try:
        import torch
    except ImportError:
        torch = None
    macos = None
    if platform.system() == "Darwin" and platform.mac_ver()[0]:
        try:
            macos = Version(platform.mac_ver()[0])
        except InvalidVersion:
            macos = None
    return describe_machine(
        torch,
        system=platform.system(),
        machine=platform.machine(),
        tvm_ffi=_tvm_ffi_version(),
        macos=macos,
        mlx=importlib.util.find_spec("mlx") is not None,
    )


#: Other names accepted for a backend override.
_BACKEND_ALIASES = {"npu": "cann"}


def machine_for_backend(
    backend: object = None, machine: MachineBuild | None = None
) -> MachineBuild:
    """This machine (or `machine`), loading builds for `backend` instead of its accelerator.

    As in Hugging Face's client, `backend` is None (the accelerator torch was built for),
    ``"cpu"``, or the name of that accelerator backend (``"cuda"``, ``"rocm"``, ``"xpu"``,
    ``"metal"``, ``"cann"`` (``"npu"`` is accepted too), ``"neuron"``, ``"tpu"``).

    Raises:
        KernelMappingError: any other value (any object may be given).
    """
    machine = machine or machine_build()
    name = _BACKEND_ALIASES.get(backend, backend) if isinstance(backend, str) else backend
    if name is None or name == machine.backend:
        return machine
    if name == "cpu":
        return replace(machine, backend="cpu", backend_version=None)
    raise KernelMappingError(
        f"backend must be None, 'cpu' or {machine.backend!r} (the backend torch here was built "
        f"for), got {quoted(backend)}."
    )


def _tvm_ffi_version() -> Version | None:
    try:
        installed = Version(importlib.metadata.version("apache-tvm-ffi"))
    except (importlib.metadata.PackageNotFoundError, InvalidVersion):
        return None
    return Version(f"{installed.major}.{installed.minor}")


def describe_machine(
    torch,
    *,
    system: str,
    machine: str,
    tvm_ffi: Version | None = None,
    python: Version | None = None,
    free_threaded: bool | None = None,
    macos: Version | None = None,
    mlx: bool = False,
) -> MachineBuild:
    """The `MachineBuild` of a torch module (None: no torch) on an OS and CPU as `platform`
    names them.

    Names follow the build variants that Hugging Face's kernel-builder publishes, so that
    their compiled kernels are found: ``torch28-cxx11-cu128-x86_64-linux``,
    ``torch28-cxx11-rocm63-x86_64-linux``, ``torch28-cxx11-xpu20251-x86_64-linux``,
    ``torch28-metal-aarch64-darwin`` (``torch28-cpu-aarch64-darwin`` without MPS) and
    ``torch28-cu128-x86_64-windows``.
    """
    system = system.lower()
    cpu = machine.lower()
    cpu = {"arm64": "aarch64", "amd64": "x86_64"}.get(cpu, cpu)
    torch_version = cxx_abi = None
    backend, backend_version = "cpu", None
    if torch is not None:
        version = Version(torch.__version__.split("+")[0])
        torch_version = Version(f"{version.major}.{version.minor}")
        backend, backend_version = _backend_and_version(torch)
        # Only Linux builds name their C++ ABI; macOS and Windows variants have no ABI part.
        if system not in ("darwin", "windows"):
            cxx_abi = "cxx11" if torch.compiled_with_cxx11_abi() else "cxx98"
    return MachineBuild(
        torch=torch_version,
        cxx_abi=cxx_abi,
        backend=backend,
        backend_version=backend_version,
        cpu=cpu,
        os=system,
        tvm_ffi=tvm_ffi,
        python=python or _running_python(),
        free_threaded=_free_threaded() if free_threaded is None else free_threaded,
        macos=macos if system == "darwin" else None,
        mlx=mlx,
    )


def _minor(text: str) -> Version:
    v = Version(text.split("-")[0])
    return Version(f"{v.major}.{v.minor}")


def _backend_and_version(torch) -> tuple[str, Version | None]:
    # Hugging Face's client's order: TPU, Neuron (its extension loads into CUDA builds of
    # torch too), CUDA, ROCm, MPS, XPU, then an Ascend NPU.
    accelerator = getattr(torch, "accelerator", None)
    current = getattr(accelerator, "current_accelerator", None)
    try:
        device = current() if current is not None else None
    except Exception:  # noqa: BLE001 - a broken accelerator query is "no accelerator"
        device = None
    if device is not None and getattr(device, "type", None) == "tpu":
        return "tpu", None
    if hasattr(torch, "neuron"):
        return "neuron", None
    if torch.version.cuda is not None:
        return "cuda", _minor(torch.version.cuda)
    if torch.version.hip is not None:
        # The ROCm release, not HIP's (ROCm 10.0 ships HIP 7.15): torch.version.rocm exists
        # from torch 2.10; older ones only have HIP's.
        return "rocm", _minor(getattr(torch.version, "rocm", None) or torch.version.hip)
    mps = getattr(getattr(torch, "backends", None), "mps", None)
    if mps is not None and mps.is_available():
        # Metal only where MPS runs: an Intel Mac, or torch without MPS, loads CPU builds.
        return "metal", None
    xpu_version = getattr(torch.version, "xpu", None)
    if xpu_version is not None:
        # torch.version.xpu is oneAPI's build date ("20250101" for 2025.1); variants carry
        # the year and the minor release: xpu20251.
        return "xpu", Version(f"{xpu_version[0:4]}.{int(xpu_version[5:6])}")
    if _privateuse_backend(torch) == "npu" or hasattr(torch, "npu"):
        return "cann", _cann_version()
    return "cpu", None


def _privateuse_backend(torch) -> str | None:
    get_name = getattr(getattr(torch, "_C", None), "_get_privateuse1_backend_name", None)
    try:
        return get_name() if get_name is not None else None
    except Exception:  # noqa: BLE001
        return None


def _cann_version() -> Version | None:
    """The CANN release torch_npu runs on (compiled CANN builds need it); None if unknown."""
    try:
        from torch_npu.utils.collect_env import get_cann_version  # type: ignore[import-not-found]

        text = str(get_cann_version())
        return Version(f"{int(text[0])}.{int(text[2])}")
    except Exception:  # noqa: BLE001 - no torch_npu, or a version string we cannot read
        logger.debug("cannot read the CANN version; compiled CANN builds will not be chosen")
        return None


def variants_in(names: Iterable[str]) -> list[str]:
    """The names that claim to be build variants, sorted (others, like ``docs``, are not)."""
    return sorted(n for n in names if VARIANT_PATTERN.match(n))


def rank_variants(
    names: Iterable[str],
    machine: MachineBuild,
    *,
    backend: str | None = None,
    prefer: str = "compiled",
) -> list[VariantDecision]:
    """Every build variant among `names`, decided for a described machine.

    This is the stable entry point for choosing a variant without this process's torch:
    describe the machine (`MachineBuild`: torch, C++ ABI, backend and its version, CPU, OS,
    Python, free-threading, tvm-ffi, macOS, MLX) and pass the folder names under ``build/``.

    Args:
        names: variant folder names; names not shaped like variants (``docs``) are ignored,
            names shaped like one but unreadable are rejected with the reason.
        machine: the machine to decide for.
        backend: load builds for this backend instead of the machine's accelerator: None,
            ``"cpu"`` or the machine's backend (as Hugging Face's ``backend=``).
        prefer: "compiled" (default) or "noarch" (pure-Python builds first).

    Returns:
        Accepted variants first, best first (``rank`` 0 is the one to load), then the rejected
        ones with the reason each does not run.

    Raises:
        KernelMappingError: `backend` is not one the machine runs.
        BuildVariantNotFoundError: `prefer` is not "compiled" or "noarch".

    Example:
        ```python
        >>> from packaging.version import Version
        >>> h100 = MachineBuild(Version("2.10"), "cxx11", "cuda", Version("12.9"), "x86_64", "linux")
        >>> names = ["torch210-cu128-x86_64-linux", "torch210-cu130-x86_64-linux", "torch-cuda"]
        >>> [d.variant.variant_str for d in rank_variants(names, h100)][:2]
        ['torch210-cu128-x86_64-linux', 'torch-cuda']
        ```
    """
    machine = machine_for_backend(backend, machine)
    check_preference(prefer)
    accepted: list[BuildVariant] = []
    rejected: list[VariantRejected] = []
    for name in variants_in(names):
        try:
            variant = BuildVariant.parse(name)
        except KernelMetadataError as exc:
            rejected.append(VariantRejected(BuildVariant(name, "unknown"), exc.reason))
            continue
        reason = machine.rejection(variant)
        if reason is None:
            accepted.append(variant)
        else:
            rejected.append(VariantRejected(variant, reason))
    accepted.sort(key=lambda v: (machine.rank(v, prefer), v.variant_str))
    return [*(VariantAccepted(v, i) for i, v in enumerate(accepted)), *rejected]


def decide_variants(
    available: Iterable[str],
    *,
    machine: MachineBuild | None = None,
    prefer: str = "compiled",
    backend: str | None = None,
) -> list[VariantDecision]:
    """Every variant among `available`, accepted (best first) or rejected (with the reason),
    for this machine (or `machine`); see `rank_variants`."""
    return rank_variants(available, machine or machine_build(), backend=backend, prefer=prefer)


def check_preference(prefer: object, *, where: str = "prefer") -> str:
    """Validate a variant preference; returns "compiled" or "noarch".

    Raises:
        BuildVariantNotFoundError: anything else (any object may be given).
    """
    if isinstance(prefer, str):
        if prefer == "universal":
            return "noarch"
        if prefer in PREFERENCES:
            return prefer
    raise BuildVariantNotFoundError(
        f"{where} must be one of {', '.join(PREFERENCES)}, got {quoted(prefer)}."
    )


def parse_preference_file(text: str | bytes, *, where: str) -> str:
    """The ``prefer`` value of a `PREFERENCE_FILE`'s contents ("compiled" when absent).

    Args:
        text: the file's contents, as bytes (strict UTF-8) or text.
        where: the repository (and revision) it comes from, for messages.

    Raises:
        BuildVariantNotFoundError: the file is not UTF-8 JSON of at most
            `MAX_PREFERENCE_FILE_SIZE`, or states an unknown preference.
    """
    data = parse_json(
        text,
        where=f"{where}: {PREFERENCE_FILE}",
        error=BuildVariantNotFoundError,
        limit=MAX_PREFERENCE_FILE_SIZE,
    )
    return _preference_of(data, where)


def read_preference_file(path: str | os.PathLike[str], *, where: str) -> str:
    """The ``prefer`` value of the `PREFERENCE_FILE` at `path` (as `parse_preference_file`).

    The size is checked before the file is read.

    Raises:
        BuildVariantNotFoundError: as `parse_preference_file`, or the file cannot be read.
    """
    try:
        data = load_json_file(path, error=BuildVariantNotFoundError, limit=MAX_PREFERENCE_FILE_SIZE)
    except OSError as exc:
        raise BuildVariantNotFoundError(
            f"{where}: cannot read {PREFERENCE_FILE} at {path} ({exc.strerror or exc})."
        ) from exc
    return _preference_of(data, where)


def _preference_of(data: object, where: str) -> str:
    if not isinstance(data, dict):
        raise BuildVariantNotFoundError(
            f'{where}: {PREFERENCE_FILE} must hold an object such as {{"prefer": "noarch"}}, '
            f"not {json_type(data)}."
        )
    return check_preference(
        data.get("prefer", "compiled"), where=f"{where}: {PREFERENCE_FILE} prefer"
    )


def allow_patterns(variants: Iterable[str]) -> list[str]:
    """huggingface_hub ``allow_patterns`` that fetch just these variants (and the preference file)."""
    return [*(f"build/{v}/*" for v in variants), PREFERENCE_FILE]


def describe_decisions(decisions: Iterable[VariantDecision]) -> str:
    """One line per variant: ``name: loads here`` / ``runs here`` / ``rejected (reason)``."""
    lines = []
    for decision in decisions:
        name = decision.variant.variant_str
        if isinstance(decision, VariantAccepted):
            lines.append(f"  {name}: {'loads here' if decision.rank == 0 else 'runs here'}")
        else:
            lines.append(f"  {name}: rejected ({decision.reason})")
    return "\n".join(lines)


def choose_variant(
    available: Iterable[str],
    *,
    where: str,
    machine: MachineBuild | None = None,
    prefer: str = "compiled",
    backend: str | None = None,
) -> str:
    """The best variant among `available` for this machine.

    Args:
        available: folder names under ``build/`` (names not shaped like variants are ignored).
        where: how to name the repository in errors.
        machine: the machine to choose for (this one by default).
        prefer: "compiled" (default) or "noarch", as the repository's `PREFERENCE_FILE` says.
        backend: None, ``"cpu"`` or the machine's backend (see `machine_for_backend`).

    Raises:
        BuildVariantNotFoundError: none of them runs here; the message lists every variant
            with the reason it was rejected.
        KernelMappingError: `backend` is not one this machine runs.
    """
    machine = machine_for_backend(backend, machine)
    decisions = rank_variants(available, machine, prefer=prefer)
    for decision in decisions:
        if isinstance(decision, VariantAccepted):
            return decision.variant.variant_str
    offered = [d.variant.variant_str for d in decisions]
    listing = (
        f" It offers:\n{describe_decisions(decisions)}\n"
        if offered
        else " It offers no build variants at all (is there a build/ folder?)."
    )
    torch = f"torch {machine.torch}" if machine.torch is not None else "no torch"
    raise BuildVariantNotFoundError(
        f"{where} has no build variant for this machine.{listing}"
        f"This machine ({torch}, {machine.runtime}, {machine.cpu}-{machine.os}, Python "
        f"{machine.python}{' free-threaded' if machine.free_threaded else ''}) runs e.g. "
        f"{machine.compiled_variant}, torch-{machine.backend} or {UNIVERSAL_VARIANT}."
    )
