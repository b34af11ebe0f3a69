"""Build variants: the ``build/<variant>/`` folders of a kernel repository, and which one runs here.

Kernel builds on today's Hub come in five kinds of variant name:

* ``torch-stable-abi<X><Y>-<backend>-<cpu>-<os>``, e.g. ``torch-stable-abi29-cu128-x86_64-linux``:
  built against torch's stable ABI, so one build serves every torch from X.Y on (X is one
  digit);
* ``torch<X><Y>[-cxx11|-cxx98]-<backend>-<cpu>-<os>``, e.g. ``torch28-cxx11-cu128-x86_64-linux``
  or ``torch211-cu130-x86_64-linux``: built for one torch minor release; the C++ ABI tag is
  absent on macOS and Windows and in newer Linux builds, and a name without it runs whatever
  the ABI of torch here (Hugging Face's rule: only a tag is checked);
* ``tvm-ffi<X><Y>-<backend>-<cpu>-<os>``: built against that tvm-ffi release, for any torch;
* ``torch-<backend>`` (``torch-cuda``, ``torch-rocm``, ``torch-xpu``, ``torch-metal``,
  ``torch-cpu``, ``torch-npu``, ``torch-neuron``): pure Python for one backend;
* ``torch-universal``: pure Python (Triton, for instance) for any backend.

``<backend>`` carries the runtime version: ``cu128`` (CUDA 12.8), ``rocm63``, ``xpu20251``
(oneAPI 2025.1), ``cpu``, ``metal``, ``npu``. A CUDA build for ``cuX.Z`` runs where torch was
built with CUDA X.Y for Z <= Y (same major): CUDA keeps its minor releases compatible. Other
backends need their exact version.

When several fit, the best is chosen in this order: stable-ABI builds (newest ABI first),
per-torch builds (without the ABI tag before with it), tvm-ffi builds, each with the highest
fitting runtime version; then ``torch-<backend>``, then ``torch-universal``. A repository can
put the pure-Python variants first with a ``kernel-variants.json`` at its root:
``{"prefer": "noarch"}`` (e.g. a Triton kernel that ships compiled builds only as a fallback);
``{"prefer": "compiled"}`` states the default.

`decide_variants` says, for every folder, whether it runs here and, if not, why:
``kernels check`` and the "no build variant" error list those reasons.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import lru_cache

from packaging.version import InvalidVersion, Version

from ..errors import BuildVariantNotFoundError, KernelMappingError, KernelMetadataError
from .bounded_json import MiB, json_type, load_json_file, parse_json, quoted

UNIVERSAL_VARIANT = "torch-universal"

#: The optional file at a repository's root that states which kind of variant it prefers.
PREFERENCE_FILE = "kernel-variants.json"

#: Values of ``prefer`` in `PREFERENCE_FILE` ("universal" is accepted for "noarch").
PREFERENCES = ("compiled", "noarch")

#: The largest `PREFERENCE_FILE` read; the real ones are a few dozen bytes.
MAX_PREFERENCE_FILE_SIZE = 1 * MiB

#: The longest variant name read: a folder name (255 bytes on common file systems).
MAX_VARIANT_NAME_LENGTH = 255

#: Backends that have a pure-Python ``torch-<backend>`` variant.
NOARCH_BACKENDS = ("cpu", "cuda", "metal", "neuron", "npu", "rocm", "xpu")

#: Folder names under ``build/`` that claim to be build variants. Names of this shape that
#: `BuildVariant.parse` cannot read are reported as rejected, never silently skipped.
VARIANT_PATTERN = re.compile(r"^(torch[0-9-][\w.-]*|tvm-ffi[\w.-]*)$")

# What a variant name in a lock file may be: the shape above in ASCII, so that it is always
# one safe path component (it names ``build/<variant>/`` to download and verify).
_VARIANT_NAME = re.compile(r"(?:torch[0-9-]|tvm-ffi)[A-Za-z0-9_.-]*")
_VARIANT_CHARS = re.compile(r"[A-Za-z0-9_.-]+")

# The kinds of variant, in the default order of preference.
STABLE_ABI, TORCH, TVM_FFI, BACKEND, UNIVERSAL = (
    "stable-abi",
    "torch",
    "tvm-ffi",
    "backend",
    "universal",
)
_COMPILED_KINDS = (STABLE_ABI, TORCH, TVM_FFI)

# Runtime prefixes as variant names spell them, by backend.
_RUNTIME_PREFIX = {"cuda": "cu", "rocm": "rocm", "xpu": "xpu"}
_RUNTIME = re.compile(r"(cu|rocm|xpu)([0-9]+)|(cpu|metal|npu|neuron)")


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


def _split_version(digits: str, *, major_digits: int) -> Version:
    """``"211"`` -> 2.11 with one major digit; ``"128"`` (CUDA, two) -> 12.8."""
    return Version(f"{int(digits[:major_digits])}.{int(digits[major_digits:])}")


def _parse_runtime(token: str) -> tuple[str, Version | None]:
    """``cu128`` -> ("cuda", 12.8); ``rocm63`` -> ("rocm", 6.3); ``xpu20251`` -> ("xpu", 2025.1)."""
    match = _RUNTIME.fullmatch(token)
    if match is None:
        raise ValueError(f"unknown backend {token!r}")
    prefix, digits, plain = match.groups()
    if plain:
        return plain, None
    backend = {"cu": "cuda", "rocm": "rocm", "xpu": "xpu"}[prefix]
    # CUDA minors are one digit (cu118, cu128, cu130); ROCm majors are one digit (rocm63,
    # rocm70); oneAPI's years are four (xpu20251).
    major_digits = {"cuda": len(digits) - 1, "rocm": 1, "xpu": 4}[backend]
    if len(digits) <= major_digits or major_digits < 1:
        raise ValueError(f"backend {token!r} has no minor version")
    return backend, _split_version(digits, major_digits=major_digits)


@dataclass(frozen=True)
class BuildVariant:
    """A build variant's folder name, read into what it needs to run.

    Example:
        ```python
        >>> BuildVariant.parse("torch-stable-abi29-cu128-x86_64-linux").kind
        'stable-abi'
        ```
    """

    variant_str: str
    #: "stable-abi", "torch", "tvm-ffi", "backend" (``torch-<backend>``) or "universal".
    kind: str
    #: torch X.Y for "torch" (exact) and "stable-abi" (minimum); tvm-ffi X.Y for "tvm-ffi".
    framework_version: Version | None = None
    #: "cxx11" / "cxx98" when the name carries the C++ ABI tag.
    cxx_abi: str | None = None
    #: "cuda", "rocm", "xpu", "cpu", "metal", "npu", "neuron"; None for universal.
    backend: str | None = None
    backend_version: Version | None = None
    cpu: str | None = None
    os: str | None = None

    @property
    def compiled(self) -> bool:
        return self.kind in _COMPILED_KINDS

    @classmethod
    def parse(cls, name: str) -> BuildVariant:
        """Read a variant folder name.

        Raises:
            KernelMetadataError: the name is not one of the five kinds (a ``ValueError``; its
                ``reason`` attribute says why, without the name).
        """
        if not isinstance(name, str):
            raise _bad_variant(name, f"a variant name is a string, not {type(name).__name__}")
        if len(name) > MAX_VARIANT_NAME_LENGTH:
            raise _bad_variant(
                name, f"longer than the {MAX_VARIANT_NAME_LENGTH} characters a folder name has"
            )
        if not _VARIANT_CHARS.fullmatch(name):
            raise _bad_variant(
                name, "variant names are made of ASCII letters, digits, '-', '_' and '.'"
            )
        try:
            return cls._parse(name)
        except ValueError as exc:  # our reasons, and packaging's InvalidVersion
            raise _bad_variant(name, str(exc)) from None

    @classmethod
    def _parse(cls, name: str) -> BuildVariant:
        parts = name.split("-")
        if name == UNIVERSAL_VARIANT:
            return cls(name, UNIVERSAL)
        if len(parts) == 2 and parts[0] == "torch":
            if parts[1] not in NOARCH_BACKENDS:
                raise ValueError(f"unknown backend {parts[1]!r}")
            return cls(name, BACKEND, backend=parts[1])
        if parts[:2] == ["torch", "stable"] and len(parts) == 6:
            abi = re.fullmatch(r"abi([0-9])([0-9]+)", parts[2])
            if abi is None:
                raise ValueError(f"{parts[2]!r} is not abi<X><Y>")
            return cls._compiled(name, STABLE_ABI, Version(f"{abi[1]}.{abi[2]}"), None, parts[3:])
        if parts[0] == "tvm" and len(parts) == 5:
            ffi = re.fullmatch(r"ffi([0-9])([0-9]+)", parts[1])
            if ffi is None:
                raise ValueError(f"{parts[1]!r} is not ffi<X><Y>")
            return cls._compiled(name, TVM_FFI, Version(f"{ffi[1]}.{ffi[2]}"), None, parts[2:])
        torch = re.fullmatch(r"torch([0-9])([0-9]+)", parts[0])
        if torch is not None and len(parts) in (4, 5):
            cxx_abi = parts[1] if len(parts) == 5 else None
            if cxx_abi not in (None, "cxx11", "cxx98"):
                raise ValueError(f"{cxx_abi!r} is not a C++ ABI tag (cxx11, cxx98)")
            rest = parts[2:] if cxx_abi else parts[1:]
            return cls._compiled(name, TORCH, Version(f"{torch[1]}.{torch[2]}"), cxx_abi, rest)
        raise ValueError(
            "not a build variant name (torch<XY>[-cxx11]-<backend>-<cpu>-<os>, "
            "torch-stable-abi<XY>-..., tvm-ffi<XY>-..., torch-<backend> or torch-universal)"
        )

    @classmethod
    def _compiled(
        cls, name: str, kind: str, version: Version, abi: str | None, rest: list[str]
    ) -> BuildVariant:
        runtime, cpu, os = rest
        backend, backend_version = _parse_runtime(runtime)
        return cls(name, kind, version, abi, backend, backend_version, cpu, os)


def _bad_variant(name: object, reason: str) -> KernelMetadataError:
    return KernelMetadataError(
        f"{quoted(name)} is not a build variant name: {reason}.", reason=reason
    )


@dataclass(frozen=True)
class MachineBuild:
    """What a kernel build must match to run in this process."""

    torch: Version  # the torch minor release, e.g. 2.8
    cxx_abi: str | None  # "cxx11" / "cxx98"; None on macOS and Windows, whose variants omit it
    backend: str  # "cuda", "rocm", "xpu", "metal", "npu" or "cpu"
    backend_version: Version | None  # 12.8 for CUDA 12.8; None for cpu, metal, npu
    cpu: str  # "x86_64", "aarch64"
    os: str  # "linux", "darwin", "windows"
    tvm_ffi: Version | None = None  # the installed tvm-ffi minor release, if any

    @property
    def runtime(self) -> str:
        """The backend as variant names spell it: ``cu128``, ``rocm63``, ``cpu``."""
        if self.backend_version is None:
            return self.backend
        v = self.backend_version
        return f"{_RUNTIME_PREFIX[self.backend]}{v.major}{v.minor}"

    @property
    def compiled_variant(self) -> str:
        """The per-torch variant name built exactly for this machine (as kernel-builder names it)."""
        parts = [f"torch{self.torch.major}{self.torch.minor}", self.cxx_abi, self.runtime]
        return "-".join(p for p in [*parts, self.cpu, self.os] if p)

    def rejection(self, variant: BuildVariant) -> str | None:
        """Why `variant` cannot run here, or None when it can."""
        if variant.kind == UNIVERSAL:
            return None
        if variant.kind == BACKEND:
            if variant.backend != self.backend:
                return f"pure-Python build for {variant.backend}; this machine runs {self.backend}"
            return None
        if variant.cpu != self.cpu:
            return f"CPU {variant.cpu} does not match this machine's ({self.cpu})"
        if variant.os != self.os:
            return f"OS {variant.os} does not match this machine's ({self.os})"
        version = variant.framework_version
        assert version is not None, variant  # parse gives every compiled kind its version
        if variant.kind == STABLE_ABI and self.torch < version:
            return f"needs torch >= {version}; torch here is {self.torch}"
        if variant.kind == TORCH:
            if version != self.torch:
                return f"built for torch {version}; torch here is {self.torch}"
            # A name without the ABI tag is accepted whatever this torch's ABI, as Hugging
            # Face's client does: builders dropped the tag once every torch used the C++11 ABI.
            if variant.cxx_abi is not None and variant.cxx_abi != self.cxx_abi:
                return f"C++ ABI {variant.cxx_abi} does not match this torch's ({self.cxx_abi or 'none'})"
        if variant.kind == TVM_FFI:
            if self.tvm_ffi is None:
                return f"built for tvm-ffi {version}, which is not installed"
            if version != self.tvm_ffi:
                return f"built for tvm-ffi {version}; tvm-ffi here is {self.tvm_ffi}"
        return self._runtime_rejection(variant)

    def _runtime_rejection(self, variant: BuildVariant) -> str | None:
        if variant.backend != self.backend:
            return f"backend {variant.backend} does not match this machine's ({self.backend})"
        have, built = self.backend_version, variant.backend_version
        if built == have:
            return None
        if self.backend == "cuda" and built is not None and have is not None:
            # CUDA minor-version compatibility: a cuX.Z build runs on cuX.Y for Z <= Y.
            if built.major == have.major and built.minor <= have.minor:
                return None
            return f"built for CUDA {built}; torch here runs CUDA {have} (needs {have.major}.x, x <= {have.minor})"
        return f"built for {variant.backend} {built}; this machine has {self.backend} {have}"

    def rank(self, variant: BuildVariant, prefer: str = "compiled") -> tuple:
        """Sort key of an accepted variant: lower is better (see the module docstring)."""
        order = [STABLE_ABI, TORCH, TVM_FFI, BACKEND, UNIVERSAL]
        if check_preference(prefer) == "noarch":
            order = [BACKEND, UNIVERSAL, STABLE_ABI, TORCH, TVM_FFI]
        newest_first = tuple(-n for n in (variant.backend_version or Version("0")).release)
        if variant.kind == STABLE_ABI:
            abi = variant.framework_version
            assert abi is not None, variant  # parse gives every stable-ABI build its version
            return (order.index(STABLE_ABI), -abi.major, -abi.minor, *newest_first)
        if variant.kind == TORCH:
            # Untagged names first, as Hugging Face's client orders them; but a torch with the
            # old ABI takes a build tagged for it first, since untagged builds are C++11 ones.
            old_abi = self.cxx_abi == "cxx98"
            tag_rank = variant.cxx_abi != "cxx98" if old_abi else variant.cxx_abi is not None
            return (order.index(TORCH), tag_rank, *newest_first)
        return (order.index(variant.kind), *newest_first)


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
    """Describe the running torch, accelerator runtime, C++ ABI, CPU, OS and tvm-ffi."""
    import torch

    return describe_machine(
        torch, system=platform.system(), machine=platform.machine(), tvm_ffi=_tvm_ffi_version()
    )


def machine_for_backend(backend: object = None) -> MachineBuild:
    """This machine, or this machine loading builds for `backend` instead of its accelerator.

    As in Hugging Face's client, `backend` is None (the accelerator torch was built for),
    ``"cpu"``, or the name of that accelerator backend (``"cuda"``, ``"rocm"``, ``"xpu"``,
    ``"metal"``, ``"npu"``, for which ``"cann"`` is accepted too).

    Raises:
        KernelMappingError: any other value (any object may be given).
    """
    machine = machine_build()
    if backend is None or backend == machine.backend:
        return machine
    if backend == "cpu":
        return replace(machine, backend="cpu", backend_version=None)
    if backend == "cann" and machine.backend == "npu":
        return machine
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
    torch, *, system: str, machine: str, tvm_ffi: Version | None = None
) -> MachineBuild:
    """The `MachineBuild` of a torch module on an OS and CPU as `platform` names them.

    Names follow the build variants that Hugging Face's kernel-builder publishes, so that
    their compiled kernels are found: ``torch28-cxx11-cu128-x86_64-linux``,
    ``torch28-cxx11-rocm63-x86_64-linux``, ``torch28-cxx11-xpu20251-x86_64-linux``,
    ``torch28-metal-aarch64-darwin`` (``torch28-cpu-aarch64-darwin`` without MPS) and
    ``torch28-cu128-x86_64-windows``.
    """
    version = Version(torch.__version__.split("+")[0])
    backend, backend_version = _backend_and_version(torch)
    system = system.lower()
    cpu = machine.lower()
    cpu = {"arm64": "aarch64", "amd64": "x86_64"}.get(cpu, cpu)
    cxx_abi = None
    # Only Linux builds name their C++ ABI; macOS and Windows variants have no ABI part.
    if system not in ("darwin", "windows"):
        cxx_abi = "cxx11" if torch.compiled_with_cxx11_abi() else "cxx98"
    return MachineBuild(
        torch=Version(f"{version.major}.{version.minor}"),
        cxx_abi=cxx_abi,
        backend=backend,
        backend_version=backend_version,
        cpu=cpu,
        os=system,
        tvm_ffi=tvm_ffi,
    )


def _backend_and_version(torch) -> tuple[str, Version | None]:
    # The order is kernel-builder's: a CUDA or ROCm build wins, then MPS, then XPU.
    if torch.version.cuda is not None:
        v = Version(torch.version.cuda)
        return "cuda", Version(f"{v.major}.{v.minor}")
    if torch.version.hip is not None:
        v = Version(torch.version.hip.split("-")[0])
        return "rocm", Version(f"{v.major}.{v.minor}")
    mps = getattr(getattr(torch, "backends", None), "mps", None)
    if mps is not None and mps.is_available():
        # Metal only where MPS runs: an Intel Mac, or torch without MPS, loads CPU builds.
        return "metal", None
    xpu_version = getattr(torch.version, "xpu", None)
    if xpu_version is not None:
        # torch.version.xpu is oneAPI's build date ("20250101" for 2025.1); variants carry
        # the year and the minor release: xpu20251.
        return "xpu", Version(f"{xpu_version[0:4]}.{int(xpu_version[5:6])}")
    if hasattr(torch, "npu"):
        return "npu", None
    return "cpu", None


def variants_in(names: Iterable[str]) -> list[str]:
    """The names that claim to be build variants, sorted (others, like ``docs``, are not)."""
    return sorted(n for n in names if VARIANT_PATTERN.match(n))


def decide_variants(
    available: Iterable[str], *, machine: MachineBuild | None = None, prefer: str = "compiled"
) -> list[VariantDecision]:
    """Every variant among `available`, accepted (best first) or rejected (with the reason)."""
    machine = machine or machine_build()
    accepted: list[BuildVariant] = []
    rejected: list[VariantRejected] = []
    for name in variants_in(available):
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
) -> str:
    """The best variant among `available` for this machine.

    Args:
        available: folder names under ``build/`` (names not shaped like variants are ignored).
        where: how to name the repository in errors.
        machine: the machine to choose for (this one by default).
        prefer: "compiled" (default) or "noarch", as the repository's `PREFERENCE_FILE` says.

    Raises:
        BuildVariantNotFoundError: none of them runs here; the message lists every variant
            with the reason it was rejected.
    """
    machine = machine or machine_build()
    decisions = decide_variants(available, machine=machine, prefer=prefer)
    for decision in decisions:
        if isinstance(decision, VariantAccepted):
            return decision.variant.variant_str
    offered = [d.variant.variant_str for d in decisions]
    listing = (
        f" It offers:\n{describe_decisions(decisions)}\n"
        if offered
        else " It offers no build variants at all (is there a build/ folder?)."
    )
    raise BuildVariantNotFoundError(
        f"{where} has no build variant for this machine.{listing}"
        f"This machine (torch {machine.torch}, {machine.runtime}, {machine.cpu}-{machine.os}) "
        f"runs e.g. {machine.compiled_variant}, torch-{machine.backend} or {UNIVERSAL_VARIANT}."
    )
