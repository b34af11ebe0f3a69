"""What a build's ``metadata.json`` demands of the process that loads it, enforced before any
of the kernel's code runs, as Hugging Face's `kernels` client does.

* ``python-depends``: Python packages the kernel imports. Only the packages of an allow-list
  may be named (the list of Hugging Face's client, `ALLOWED_PYTHON_DEPENDS`: a kernel cannot
  make its users install arbitrary packages), and each must be installed here.
* ``kernels-minver``: the oldest `kernels` that can load the build (``X.Y.Z``).
* ``backend``: ``{"type": "cuda"}``; it must be the backend of the variant folder the build
  sits in (``torch-cuda``, ``torch28-cxx11-cu128-x86_64-linux``...). ``torch-universal``
  variants run on any backend, so they may declare any (our own library's say ``cuda``,
  since Hugging Face's client rejects ``universal``).
* ``provenance``: where the build came from; a build from a git tree with uncommitted
  changes ("dirty") loads, with a warning, because its recorded revision does not identify
  its sources.

The file digests (``digest``) are checked by `kernels.repos.digests`.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from .._version import __version__
from ..errors import KernelLoadError, KernelMetadataError
from . import variants
from .bounded_json import quoted
from .info import Metadata
from .variants import UNIVERSAL, BuildVariant

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PythonPackage:
    """A package that satisfies a ``python-depends`` entry."""

    #: The name ``pip install`` takes.
    pip_name: str
    #: The top-level module it provides; None for packages with no Python code (oneDNN's
    #: libraries), which cannot be checked without importing anything and are not.
    import_name: str | None


def _packages(*pairs: tuple[str, str | None]) -> tuple[PythonPackage, ...]:
    return tuple(PythonPackage(pip, module) for pip, module in pairs)


#: The ``python-depends`` entries a kernel may name, and the packages each stands for: those
#: of every backend, then those of one backend (keyed by ``backend.type``). Copied from
#: Hugging Face's `kernels` 0.17.2 (``python_depends.json``): a kernel that loads there loads
#: here, and one refused there is refused here.
ALLOWED_PYTHON_DEPENDS: Mapping[str, Mapping[str, tuple[PythonPackage, ...]]] = {
    "general": {
        "einops": _packages(("einops", "einops")),
        "helion": _packages(("helion", "helion")),
        "tvm-ffi": _packages(("apache-tvm-ffi", "tvm_ffi")),
    },
    "cuda": {"nvidia-cutlass-dsl": _packages(("nvidia-cutlass-dsl", "cutlass"))},
    "neuron": {"nki": _packages(("nki", "nki"))},
    "xpu": {"onednn": _packages(("onednn-devel", None))},
}

#: ``backend.type`` values of Hugging Face's metadata format.
BACKEND_TYPES = ("cann", "cpu", "cuda", "metal", "neuron", "rocm", "tpu", "xpu")

# Variant names spell Ascend's backend "npu"; metadata.json names it after its runtime, CANN.
_TYPES_OF_VARIANT_BACKEND = {"npu": ("cann", "npu")}

# kernel-builder writes X.Y.Z; Hugging Face's client refuses anything else.
_MINVER = re.compile(r"(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,8})")


def check_requirements(
    metadata: Metadata, variant_dir: Path, *, machine_backend: str | None = None
) -> None:
    """Refuse a build whose ``metadata.json`` demands what this process cannot give.

    Args:
        metadata: the build's metadata (`Metadata.load_from_variant`).
        variant_dir: the variant folder it was read from; its name says the backend the
            build must declare.
        machine_backend: the backend whose ``python-depends`` entries a ``torch-universal``
            build may name; this machine's when None.

    Raises:
        KernelMetadataError: ``python-depends`` names a package outside the allow-list,
            ``kernels-minver`` is not ``X.Y.Z``, or ``backend.type`` is not the variant's.
        KernelLoadError: a package the kernel needs is not installed, or this `kernels`
            is older than ``kernels-minver``. Each message names the command that fixes it.
    """
    kernel = describe_kernel(metadata, variant_dir)
    variant = _variant_of(variant_dir)
    _check_backend(metadata, variant, kernel)
    _check_minver(metadata, kernel)
    if metadata.python_depends:
        backend = variant.backend if variant is not None else None
        _check_python_depends(metadata, kernel, backend or machine_backend or _machine_backend())
    if _is_dirty(metadata.extra.get("provenance")):
        logger.warning(
            "%s was built from a git tree with uncommitted changes (its metadata.json "
            "'provenance' says dirty): its recorded revision does not identify the sources it "
            "was built from, so the build may not be reproducible.",
            kernel,
        )


def describe_kernel(metadata: Metadata, variant_dir: Path) -> str:
    """How messages name a kernel: its name, if its metadata says one, and its folder."""
    name = f"kernel {quoted(metadata.name)}" if metadata.name else "the kernel"
    return f"{name} in {variant_dir}"


def _variant_of(variant_dir: Path) -> BuildVariant | None:
    """The variant a folder's name says it is; None for a folder outside ``build/`` (a local
    package), whose name says nothing."""
    try:
        return BuildVariant.parse(variant_dir.name)
    except KernelMetadataError:
        return None


def _machine_backend() -> str:
    backend = variants.machine_build().backend  # looked up late: tests stand in a machine
    return "cann" if backend == "npu" else backend


def _check_backend(metadata: Metadata, variant: BuildVariant | None, kernel: str) -> None:
    declared = metadata.backend.get("type") if metadata.backend is not None else None
    # A universal build (the only kind without a backend) runs on every backend.
    if declared is None or variant is None or variant.kind == UNIVERSAL or variant.backend is None:
        return
    expected = _TYPES_OF_VARIANT_BACKEND.get(variant.backend, (variant.backend,))
    if declared not in expected:
        raise KernelMetadataError(
            f"Refusing to load {kernel}: its metadata.json declares backend "
            f"{quoted(declared)}, but it sits in the {variant.variant_str} variant, which is "
            f"built for {variant.backend} (expected backend.type {expected[0]!r}). Nothing was "
            "imported. The build is mislabelled: rebuild it with kernel-builder, or report it "
            "to the kernel's authors."
        )


def _check_minver(metadata: Metadata, kernel: str) -> None:
    minver = metadata.kernels_minver
    if minver is None:
        return
    match = _MINVER.fullmatch(minver)
    if match is None:
        raise KernelMetadataError(
            f"Refusing to load {kernel}: its metadata.json 'kernels-minver' is "
            f"{quoted(minver)}, not a version X.Y.Z of numbers. Nothing was imported. The "
            "build is malformed: rebuild it with kernel-builder, or report it to its authors."
        )

    needed = tuple(int(part) for part in match.groups())
    if _release(__version__) < needed:
        raise KernelLoadError(
            f"Refusing to load {kernel}: it needs kernels>={minver}, and kernels {__version__} "
            "is installed. Nothing was imported. Upgrade with: pip install --upgrade kernels"
        )


def _release(version: str) -> tuple[int, ...]:
    """The release numbers of a version, padded to three: ``0.18.0.dev1`` -> (0, 18, 0).

    A development build of a release counts as that release, as in Hugging Face's client:
    metadata names releases only.
    """
    try:
        release = Version(version).release
    except InvalidVersion:  # a VCS checkout's version: assume it is new enough
        return (sys.maxsize,)
    return (*release, 0, 0, 0)[: max(3, len(release))]


def _check_python_depends(metadata: Metadata, kernel: str, backend: str) -> None:
    general = ALLOWED_PYTHON_DEPENDS["general"]
    specific = ALLOWED_PYTHON_DEPENDS.get(backend, {})
    for entry in metadata.python_depends:
        packages = general.get(entry) or specific.get(entry)
        if packages is None:
            allowed = ", ".join(sorted({*general, *specific}))
            raise KernelMetadataError(
                f"Refusing to load {kernel}: its metadata.json 'python-depends' names "
                f"{quoted(entry)}, which a kernel for {backend} may not depend on (allowed: "
                f"{allowed}). Nothing was imported. A kernel cannot make its users install "
                "arbitrary packages; ask its authors to drop the dependency."
            )
        for package in packages:
            if package.import_name is not None and not _installed(package.import_name):
                raise KernelLoadError(
                    f"Refusing to load {kernel}: it needs the Python package "
                    f"{package.pip_name!r} (its metadata.json 'python-depends' names "
                    f"{entry!r}), which is not installed. Nothing was imported. Install it "
                    f"with: pip install {package.pip_name}"
                )


def _installed(module: str) -> bool:
    """Whether a top-level module can be imported, found without importing it."""
    if module in sys.modules:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken installation counts as none
        return False


def _is_dirty(provenance: object) -> bool:
    """Whether ``provenance`` says a build came from a dirty git tree: its ``kernel`` (the
    kernel's sources) or ``kernel-builder.git`` has ``"dirty": true``. Any other shape says
    nothing; provenance informs, it does not gate the load."""
    if not isinstance(provenance, Mapping):
        return False
    builder = provenance.get("kernel-builder")
    states = [
        provenance.get("kernel"),
        builder.get("git") if isinstance(builder, Mapping) else None,
    ]
    return any(isinstance(s, Mapping) and s.get("dirty") is True for s in states)
