"""``kernels._internals.variants``: build variant names read and chosen among by our
`kernels.repos.variants` (`BuildVariant.parse`, `rank_variants` with a described
`MachineBuild`), in their data types.

Their variants are values made of parts (framework, backend, Python tag, system); ours is one
`BuildVariant`. The classes below are those parts, built from what our parser read; their
rules that concern the parts alone (a legacy Python tag is ``cpython-3.9-abi3``, an SDK with a
versioned backend has a system) are the classes' own, the tag rules are ours
(`variant_names.check_python_tag`). The spelling a part was read in takes no part in
equality, so a legacy and a new name of one build are equal, as their identities are in ours.
"""

from __future__ import annotations

import importlib
from collections import defaultdict, deque
from dataclasses import dataclass, field, replace

from packaging.version import Version

from kernels.repos import variant_names
from kernels.repos.variant_names import (
    BACKEND,
    SDK,
    STABLE_ABI,
    TORCH,
    TVM_FFI,
    UNIVERSAL,
    BuildVariant,
)
from kernels.repos.variants import MachineBuild, VariantAccepted, VariantRejected, rank_variants
from tests.hf_suite.gaps import gaps_for

# Through the served name, so that the backend classes are the ones their tests import (the
# package's `__getattr__` would answer `from kernels._internals import backends` with a gap).
backends = importlib.import_module("kernels._internals.backends")
Backend = backends.Backend

__getattr__ = gaps_for(__name__)

__all__ = ["VariantAccepted", "VariantRejected"]

_MARKER = "cpython"
# Their defaults where a call leaves the interpreter out: a GIL-enabled Python 3.15, which
# loads both abi3 and abi3t builds, with MLX installed.
_DEFAULT_PYTHON = Version("3.15")


def _dotted(version: Version, legacy: bool) -> str:
    return f"{version.major}{version.minor}" if legacy else f"-{version.major}.{version.minor}"


@dataclass(frozen=True)
class Torch:
    """One torch minor release (``torch210``, ``torch-2.10``), with its C++ ABI tag if named."""

    version: Version
    cxx11_abi: bool | None
    legacy: bool = field(default=True, compare=False)

    @property
    def variant_str(self) -> str:
        tag = {True: "-cxx11", False: "-cxx98", None: ""}[self.cxx11_abi]
        return f"torch{_dotted(self.version, self.legacy)}{tag}"


@dataclass(frozen=True)
class TorchStableAbi:
    """torch's stable ABI of a release and later ones (``torch-stable-abi211``)."""

    version: Version
    legacy: bool = field(default=True, compare=False)

    @property
    def variant_str(self) -> str:
        return f"torch-stable-abi{_dotted(self.version, self.legacy)}"


@dataclass(frozen=True)
class TvmFfi:
    """One tvm-ffi minor release (``tvm-ffi01``, ``tvm-ffi-0.1``)."""

    version: Version
    legacy: bool = field(default=True, compare=False)

    @property
    def variant_str(self) -> str:
        return f"tvm-ffi{_dotted(self.version, self.legacy)}"


@dataclass(frozen=True)
class TorchNoarch:
    variant_str = "torch"


@dataclass(frozen=True)
class MlxNoarch:
    variant_str = "mlx"


@dataclass(frozen=True)
class Python:
    """A build's Python tag: the oldest Python its extension modules load in, and their ABI.
    Legacy names have none: they are ``cpython-3.9-abi3``."""

    version: Version = variant_names.LEGACY_PYTHON
    abi: str = "abi3"
    legacy: bool = field(default=True, compare=False)

    def __post_init__(self) -> None:
        if self.legacy and (self.version, self.abi) != (variant_names.LEGACY_PYTHON, "abi3"):
            raise ValueError(
                f"a legacy name is cpython-{variant_names.LEGACY_PYTHON}-abi3, "
                f"not {self.version} {self.abi}"
            )
        variant_names.check_python_tag(self.version, self.abi)

    @property
    def variant_str(self) -> str:
        if self.legacy:
            return ""
        return f"{_MARKER}-{self.version.major}.{self.version.minor}-{self.abi}"

    @staticmethod
    def parse(parts: list[str]) -> Python:
        version, abi = variant_names.parse_python_tag(parts)
        return Python(version=version, abi=abi, legacy=False)


@dataclass(frozen=True)
class System:
    """The CPU and OS a build's binaries are for."""

    platform: str
    os: str

    @property
    def variant_str(self) -> str:
        return f"{self.platform}-{self.os}"


@dataclass(frozen=True)
class Noarch:
    """The backend of a pure-Python build or of an SDK without binaries: only its name."""

    backend_name: str

    @property
    def variant_str(self) -> str:
        return self.backend_name


@dataclass(frozen=True)
class ArchVariant:
    """A build with compiled parts for one framework version."""

    framework: Torch | TorchStableAbi | TvmFfi
    backend: Backend
    python: Python
    system: System

    @property
    def variant_str(self) -> str:
        parts = [self.framework.variant_str, self.backend.variant_str, self.python.variant_str]
        return "-".join(p for p in [*parts, self.system.variant_str] if p)


@dataclass(frozen=True)
class NoarchVariant:
    """A pure-Python build: ``torch-cuda``, ``mlx-metal``, ``torch-universal``."""

    framework: TorchNoarch | MlxNoarch
    backend: Noarch

    @property
    def variant_str(self) -> str:
        return f"{self.framework.variant_str}-{self.backend.variant_str}"


@dataclass(frozen=True)
class SdkVariant:
    """A build without a framework: ``sdk``, ``sdk-<backend>``, or one with binaries
    (``sdk[-<backend>[-X.Y]]-cpython-<X.Y>-<abi>-<cpu>-<os>``)."""

    backend: Backend | Noarch | None
    python: Python | None
    system: System | None

    def __post_init__(self) -> None:
        if (self.python is None) != (self.system is None):
            raise ValueError("an SDK with binaries has both a Python tag and a system")
        binaries = self.system is not None
        if isinstance(self.backend, Noarch) and binaries:
            raise ValueError("an SDK with binaries names its backend with its version")
        if isinstance(self.backend, Backend) and not binaries:
            raise ValueError("an SDK for a versioned backend has binaries, so a system")

    @property
    def variant_str(self) -> str:
        parts = [self.backend, self.python, self.system]
        return "-".join(["sdk", *(p.variant_str for p in parts if p and p.variant_str)])


Variant = ArchVariant | NoarchVariant | SdkVariant


def _from_ours(build: BuildVariant) -> Variant:
    """Our reading of a name, in their parts."""
    if build.kind in (BACKEND, UNIVERSAL):
        framework = MlxNoarch() if build.framework == "mlx" else TorchNoarch()
        return NoarchVariant(framework, Noarch(build.backend or "universal"))
    if build.kind == SDK:
        if not build.has_binaries:
            return SdkVariant(Noarch(build.backend) if build.backend else None, None, None)
        return SdkVariant(
            _backend(build) if build.backend else None,
            _python(build),
            System(build.cpu or "", build.os or ""),
        )
    version = build.framework_version
    assert version is not None, build  # every compiled kind has one
    framework: Torch | TorchStableAbi | TvmFfi
    if build.kind == TORCH:
        cxx11 = {"cxx11": True, "cxx98": False, None: None}[build.cxx_abi]
        framework = Torch(version, cxx11, legacy=build.legacy)
    elif build.kind == STABLE_ABI:
        framework = TorchStableAbi(version, legacy=build.legacy)
    else:
        assert build.kind == TVM_FFI, build
        framework = TvmFfi(version, legacy=build.legacy)
    return ArchVariant(
        framework, _backend(build), _python(build), System(build.cpu or "", build.os or "")
    )


def _backend(build: BuildVariant) -> Backend:
    assert build.backend is not None, build
    return backends.from_ours(build.backend, build.backend_version, legacy=build.legacy)


def _python(build: BuildVariant) -> Python:
    assert build.python_version is not None and build.python_abi is not None, build
    if build.legacy:
        return Python()
    return Python(build.python_version, build.python_abi, legacy=False)


def parse_variant(variant_str: str) -> Variant:
    """Read any build variant name (a ValueError names what is wrong)."""
    return _from_ours(BuildVariant.parse(variant_str))


def parse_sdk_variant(variant_str: str) -> SdkVariant:
    """Read an SDK build variant name."""
    if variant_str.split("-")[0] != "sdk":
        raise ValueError(f"{variant_str!r} is not an SDK variant name (sdk...)")
    variant = parse_variant(variant_str)
    assert isinstance(variant, SdkVariant), variant
    return variant


def _split_system(parts: list[str]) -> tuple[list[str], System]:
    """The CPU and OS: the last two parts, in both spellings."""
    if len(parts) < 2:
        raise ValueError(f"{'-'.join(parts)!r} does not end in <cpu>-<os>")
    return parts[:-2], System(parts[-2], parts[-1])


def _split_python(parts: list[str], *, legacy: bool) -> tuple[list[str], Python | None]:
    """The Python tag, from its ``cpython`` marker on (None without one); implicit in legacy
    names."""
    if legacy:
        return parts, Python()
    if _MARKER not in parts:
        return parts, None
    i = parts.index(_MARKER)
    return parts[:i], Python.parse(parts[i:])


def _resolve_variant_for_system(
    variants: list[Variant],
    selected_backend: Backend,
    cpu: str,
    os: str,
    torch_version: Version | None,
    torch_cxx11_abi: bool | None,
    tvm_ffi_version: Version | None,
    macos_version: Version | None = None,
    python_version: Version = _DEFAULT_PYTHON,
    free_threaded: bool = False,
    has_mlx: bool = True,
) -> tuple[list[Variant], list[VariantAccepted | VariantRejected]]:
    """Their described machine as our `MachineBuild`, decided by our `rank_variants`: the
    accepted variants best first, and every decision (accepted first) on their values."""
    machine = MachineBuild(
        torch=torch_version,
        cxx_abi={True: "cxx11", False: "cxx98", None: None}[torch_cxx11_abi],
        backend=selected_backend.name,
        backend_version=getattr(selected_backend, "version", None),
        cpu=cpu,
        os=os,
        tvm_ffi=tvm_ffi_version,
        python=python_version,
        free_threaded=free_threaded,
        macos=macos_version,
        mlx=has_mlx,
    )
    # Our decisions are on names; each goes back to the value it was made for.
    by_name: dict[str, deque[Variant]] = defaultdict(deque)
    for variant in variants:
        by_name[variant.variant_str].append(variant)
    trace = [
        replace(decision, variant=by_name[decision.variant.variant_str].popleft())
        for decision in rank_variants([v.variant_str for v in variants], machine)
    ]
    accepted = [d.variant for d in trace if isinstance(d, VariantAccepted)]
    return accepted, trace
