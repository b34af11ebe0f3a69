"""Build variant names: the ``build/<variant>/`` folder names of a kernel repository, read.

Two spellings of compiled builds exist side by side on the Hub (kernels 0.19 reads both):

* the legacy one, ``torch210-cxx11-cu128-x86_64-linux``: versions without dots (the last
  digit is the minor one: ``cu128`` is CUDA 12.8, ``rocm101`` ROCm 10.1, ``xpu20252`` oneAPI
  2025.2; ``rocm714`` is ROCm 7.14 and torch has a one-digit major), and no Python tag: such
  builds are ``cpython-3.9-abi3``;
* the new one, ``torch-2.10-cxx11-cuda-12.8-cpython-3.12-abi3-x86_64-linux``: dotted versions,
  backends spelled out (``cuda``, ``rocm``, ``xpu``, ``cann``; ``cpu``, ``metal``,
  ``neuron``, ``tpu`` carry no version), and a mandatory ``cpython-<X.Y>-<abi3|abi3t>`` tag
  (the oldest Python the build's extension modules load in, and their stable ABI; ``abi3t``,
  the free-threaded one, needs Python 3.15).

Frameworks of compiled builds: ``torch<XY>`` / ``torch-X.Y`` (one torch minor release, with
an optional ``cxx11``/``cxx98`` C++ ABI tag), ``torch-stable-abi<XY>`` /
``torch-stable-abi-X.Y`` (torch's stable ABI: torch X.Y and later), ``tvm-ffi<XY>`` /
``tvm-ffi-X.Y``. Pure-Python builds are ``torch-<backend>`` and ``mlx-<backend>``
(``torch-universal`` runs on any backend). SDK builds (kernel dependencies without a
framework) are ``sdk``, ``sdk-<backend>``, ``sdk-cpython-...-<cpu>-<os>`` and
``sdk-<backend>[-X.Y]-cpython-...-<cpu>-<os>``, in the new spelling only. The two spellings
never mix within one name.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from packaging.version import Version

from ..errors import KernelMetadataError
from .bounded_json import quoted

#: The longest variant name read: a folder name (255 bytes on common file systems).
MAX_VARIANT_NAME_LENGTH = 255

UNIVERSAL_VARIANT = "torch-universal"

# The kinds of variant.
STABLE_ABI, TORCH, TVM_FFI, SDK, BACKEND, UNIVERSAL = (
    "stable-abi",
    "torch",
    "tvm-ffi",
    "sdk",
    "backend",
    "universal",
)
_COMPILED_KINDS = (STABLE_ABI, TORCH, TVM_FFI)

#: Python ABIs of compiled builds: the stable ABI with a GIL, and the free-threaded one.
PYTHON_ABIS = ("abi3", "abi3t")
#: What a legacy name (which has no Python tag) means.
LEGACY_PYTHON = Version("3.9")
#: The oldest Python with the free-threaded stable ABI (PEP 803).
ABI3T_MIN_PYTHON = Version("3.15")

_UNVERSIONED_BACKENDS = ("cpu", "metal", "neuron", "tpu")
_VERSIONED_BACKENDS = ("cuda", "rocm", "xpu", "cann")
_CXX_ABIS = ("cxx11", "cxx98")
_PYTHON_MARKER = "cpython"

_VARIANT_CHARS = re.compile(r"[A-Za-z0-9_.-]+")
_DOTTED = re.compile(r"([0-9]+)\.([0-9]+)")
# Legacy backends: greedy major, so the last digit is the minor release (cu128 is 12.8,
# rocm101 is 10.1); ROCm 7.14 is the one two-digit minor the builders published.
_LEGACY_BACKEND = {
    "cuda": re.compile(r"cu([0-9]+)([0-9])"),
    "rocm": re.compile(r"rocm(7(?=14$)|[0-9]+)([0-9]+)"),
    "xpu": re.compile(r"xpu([0-9]+)([0-9])"),
    "cann": re.compile(r"cann([0-9]+)([0-9])"),
}
# Legacy names spell CUDA "cu"; the other versioned backends keep their name.
_LEGACY_PREFIX = {"cuda": "cu"}
_NOARCH_BACKEND = re.compile(r"[a-z0-9_.]+(?:-[a-z0-9_.]+)*")


@dataclass(frozen=True)
class BuildVariant:
    """A build variant's folder name, read into what it needs to run.

    Two names for the same build (a legacy and a new spelling) differ as values (they name
    different folders) but share their `identity`.

    Example:
        ```python
        >>> BuildVariant.parse("torch-stable-abi29-cu128-x86_64-linux").kind
        'stable-abi'
        >>> BuildVariant.parse("torch-2.10-cuda-12.8-cpython-3.12-abi3-x86_64-linux").python_version
        <Version('3.12')>
        ```
    """

    variant_str: str
    #: "stable-abi", "torch", "tvm-ffi", "sdk", "backend" (``torch-<backend>``,
    #: ``mlx-<backend>``) or "universal".
    kind: str
    #: torch X.Y for "torch" (exact) and "stable-abi" (minimum); tvm-ffi X.Y for "tvm-ffi".
    framework_version: Version | None = None
    #: "cxx11" / "cxx98" when the name carries the C++ ABI tag.
    cxx_abi: str | None = None
    #: "cuda", "rocm", "xpu", "cann", "cpu", "metal", "neuron", "tpu"; for pure-Python builds
    #: whatever follows the framework (``torch-npu`` says "npu"); None for universal and for
    #: backend-agnostic SDKs.
    backend: str | None = None
    backend_version: Version | None = None
    cpu: str | None = None
    os: str | None = None
    #: The oldest Python the build's compiled parts load in (3.9 for legacy names); None for
    #: builds without compiled parts.
    python_version: Version | None = None
    #: "abi3" or "abi3t" for builds with compiled parts.
    python_abi: str | None = None
    #: The framework: "torch", "tvm-ffi", "mlx"; None for SDKs.
    framework: str | None = None
    #: Whether the name uses the legacy spelling (``torch210-cu128-...``).
    legacy: bool = False

    @property
    def compiled(self) -> bool:
        """Whether the build holds compiled code for one framework version, CPU and OS."""
        return self.kind in _COMPILED_KINDS

    @property
    def has_binaries(self) -> bool:
        """Whether the build holds extension modules (compiled builds, SDKs with a system)."""
        return self.cpu is not None

    @property
    def identity(self) -> tuple:
        """What the name says, whatever its spelling: ``torch210-cxx11-cu128-x86_64-linux``
        and ``torch-2.10-cxx11-cuda-12.8-cpython-3.9-abi3-x86_64-linux`` share it."""
        return (
            self.kind,
            self.framework,
            self.framework_version,
            self.cxx_abi,
            self.backend,
            self.backend_version,
            self.python_version,
            self.python_abi,
            self.cpu,
            self.os,
        )

    @classmethod
    def parse(cls, name: str) -> BuildVariant:
        """Read a variant folder name.

        Raises:
            KernelMetadataError: the name is not a build variant (a ``ValueError``; its
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
            return _parse(name)
        except ValueError as exc:  # our reasons, and packaging's InvalidVersion
            raise _bad_variant(name, str(exc)) from None


def _bad_variant(name: object, reason: str) -> KernelMetadataError:
    return KernelMetadataError(
        f"{quoted(name)} is not a build variant name: {reason}.", reason=reason
    )


def _version(major: str, minor: str) -> Version:
    return Version(f"{int(major)}.{int(minor)}")


def _dotted(token: str, what: str) -> Version:
    match = _DOTTED.fullmatch(token)
    if match is None:
        raise ValueError(f"{what} {token!r} is not <major>.<minor>, such as 2.10")
    return _version(match[1], match[2])


def _legacy(pattern: str, token: str, what: str) -> Version:
    match = re.fullmatch(pattern, token)
    if match is None:
        raise ValueError(f"{token!r} is not {what}")
    return _version(match[1], match[2])


def _parse(name: str) -> BuildVariant:
    parts = name.split("-")
    head = parts[0]
    if head == "sdk":
        return _parse_sdk(name, parts[1:])
    if name.startswith("torch-stable-abi"):
        legacy = not (len(parts) > 3 and parts[2] == "abi")
        if legacy:
            version = _legacy(r"abi([0-9])([0-9]+)", parts[2], "abi<X><Y> (torch X.Y's stable ABI)")
            return _compiled(name, STABLE_ABI, "torch", version, None, parts[3:], legacy=True)
        version = _dotted(parts[3], "the torch stable ABI version")
        return _compiled(name, STABLE_ABI, "torch", version, None, parts[4:], legacy=False)
    if head == "torch" and len(parts) >= 2 and parts[1][:1].isdigit():
        version = _dotted(parts[1], "the torch version")
        cxx_abi = parts[2] if len(parts) > 2 and parts[2] in _CXX_ABIS else None
        rest = parts[3:] if cxx_abi else parts[2:]
        return _compiled(name, TORCH, "torch", version, cxx_abi, rest, legacy=False)
    if head in ("torch", "mlx") and len(parts) >= 2 and not parts[1][:1].isdigit():
        return _noarch(name, head, "-".join(parts[1:]))
    if head == "mlx":
        raise ValueError("compiled MLX builds (mlx-<version>-...) are not supported yet")
    if head.startswith("torch"):
        version = _legacy(r"torch([0-9])([0-9]+)", head, "torch<X><Y> (torch X.Y)")
        cxx_abi = parts[1] if len(parts) > 1 and parts[1] in _CXX_ABIS else None
        rest = parts[2:] if cxx_abi else parts[1:]
        return _compiled(name, TORCH, "torch", version, cxx_abi, rest, legacy=True)
    if head == "tvm" and len(parts) >= 2 and parts[1].startswith("ffi"):
        if len(parts) > 2 and parts[1] == "ffi":
            version = _dotted(parts[2], "the tvm-ffi version")
            return _compiled(name, TVM_FFI, "tvm-ffi", version, None, parts[3:], legacy=False)
        version = _legacy(r"ffi([0-9]+?)([0-9]+)", parts[1], "ffi<X><Y> (tvm-ffi X.Y)")
        return _compiled(name, TVM_FFI, "tvm-ffi", version, None, parts[2:], legacy=True)
    raise ValueError(
        "unknown framework; variant names start with torch<XY>, torch-X.Y, "
        "torch-stable-abi, tvm-ffi, torch-<backend>, mlx-<backend> or sdk"
    )


def _noarch(name: str, framework: str, backend: str) -> BuildVariant:
    if not _NOARCH_BACKEND.fullmatch(backend):
        raise ValueError(f"{backend!r} is not a backend name (lowercase letters and digits)")
    if backend == "universal":
        return BuildVariant(name, UNIVERSAL, framework=framework)
    return BuildVariant(name, BACKEND, backend=backend, framework=framework)


def _split_system(rest: list[str]) -> tuple[list[str], str, str]:
    if len(rest) < 2:
        raise ValueError("the name does not end in <cpu>-<os>, such as x86_64-linux")
    return rest[:-2], rest[-2], rest[-1]


def _split_python(rest: list[str]) -> tuple[list[str], Version, str]:
    """Take ``cpython-X.Y-abi3`` off the end of `rest` (new spelling)."""
    if _PYTHON_MARKER not in rest:
        raise ValueError(
            "Missing Python version and ABI: names in the new spelling carry "
            "cpython-<X.Y>-<abi3|abi3t> before the CPU and OS"
        )
    i = rest.index(_PYTHON_MARKER)
    tag = rest[i:]
    if len(tag) != 3:
        raise ValueError(
            f"the Python tag {'-'.join(tag)!r} is not cpython-<X.Y>-<abi3|abi3t> "
            "followed by the CPU and OS"
        )
    python, abi = parse_python_tag(tag)
    return rest[:i], python, abi


def parse_python_tag(parts: Sequence[str]) -> tuple[Version, str]:
    """A new-spelling name's Python tag, ``["cpython", "3.12", "abi3"]``: the oldest Python
    the build's extension modules load in, and their stable ABI.

    Raises:
        ValueError: not ``cpython-<X.Y>-<abi3|abi3t>``, or an ABI the version lacks.
    """
    if len(parts) != 3 or parts[0] != _PYTHON_MARKER:
        raise ValueError(f"the Python tag {'-'.join(parts)!r} is not cpython-<X.Y>-<abi3|abi3t>")
    python = _dotted(parts[1], "the Python version")
    check_python_tag(python, parts[2])
    return python, parts[2]


def check_python_tag(version: Version, abi: str) -> None:
    """Check that a build can be for `abi` from Python `version` on.

    Raises:
        ValueError: `abi` is neither "abi3" nor "abi3t", or it is "abi3t" (PEP 803's
            free-threaded stable ABI) before Python 3.15.
    """
    if abi not in PYTHON_ABIS:
        raise ValueError(f"unknown Python ABI {abi!r} (abi3 or abi3t)")
    if abi == "abi3t" and version < ABI3T_MIN_PYTHON:
        raise ValueError(f"abi3t needs Python {ABI3T_MIN_PYTHON} or later, not {version}")


def _compiled(
    name: str,
    kind: str,
    framework: str,
    version: Version,
    cxx_abi: str | None,
    rest: list[str],
    *,
    legacy: bool,
) -> BuildVariant:
    rest, cpu, os = _split_system(rest)
    if legacy:
        python, abi = LEGACY_PYTHON, "abi3"
        if _PYTHON_MARKER in rest:
            raise ValueError("legacy names (torch210-...) carry no cpython-<X.Y>-<abi> tag")
    else:
        rest, python, abi = _split_python(rest)
    if not rest:
        raise ValueError(
            "Missing backend: a compiled build names one (cu128 or cuda-12.8, rocm-7.1, cpu, "
            "metal...) before the CPU and OS"
        )
    backend, backend_version = parse_backend(rest, legacy=legacy)
    return BuildVariant(
        name,
        kind,
        framework_version=version,
        cxx_abi=cxx_abi,
        backend=backend,
        backend_version=backend_version,
        cpu=cpu,
        os=os,
        python_version=python,
        python_abi=abi,
        framework=framework,
        legacy=legacy,
    )


def parse_backend(parts: list[str], *, legacy: bool) -> tuple[str, Version | None]:
    """A backend as a variant name spells it: ``["cu128"]`` (legacy) or ``["cuda", "12.8"]``.

    Returns the backend's name ("cuda", "rocm", "xpu", "cann", "cpu", "metal", "neuron",
    "tpu") and its version (None for the unversioned ones).

    Raises:
        ValueError: anything else, including one spelling's backend in the other's name.
    """
    if legacy:
        if len(parts) != 1:
            raise ValueError(
                f"backend {'-'.join(parts)!r}: legacy names spell it in one part (cu128, rocm63)"
            )
        token = parts[0]
        if token in _UNVERSIONED_BACKENDS:
            return token, None
        for backend, pattern in _LEGACY_BACKEND.items():
            match = pattern.fullmatch(token)
            if match is not None:
                return backend, _version(match[1], match[2])
        raise ValueError(
            f"unknown backend {token!r} (cu<XY>, rocm<XY>, xpu<YYYYM>, cann<XY>, cpu, metal, "
            "neuron, tpu)"
        )
    backend = parts[0] if parts else ""
    if backend in _UNVERSIONED_BACKENDS:
        if len(parts) != 1:
            raise ValueError(f"backend {backend!r} has no version, got {'-'.join(parts)!r}")
        return backend, None
    if backend in _VERSIONED_BACKENDS:
        if len(parts) != 2:
            raise ValueError(f"backend {backend!r} needs one version X.Y, got {'-'.join(parts)!r}")
        return backend, _dotted(parts[1], f"the {backend} version")
    raise ValueError(
        f"unknown backend {'-'.join(parts)!r} (cuda-X.Y, rocm-X.Y, xpu-X.Y, cann-X.Y, cpu, "
        "metal, neuron, tpu)"
    )


def spell_backend(backend: str, version: Version | None, *, legacy: bool) -> str:
    """A backend as a variant name spells it, the inverse of `parse_backend`: ``cu128`` and
    ``rocm63`` in legacy names, ``cuda-12.8`` and ``rocm-6.3`` in new ones; an unversioned
    backend (``cpu``, ``metal``, ``neuron``, ``tpu``) is its name in both."""
    if version is None:
        return backend
    if legacy:
        return f"{_LEGACY_PREFIX.get(backend, backend)}{version.major}{version.minor}"
    return f"{backend}-{version.major}.{version.minor}"


def _parse_sdk(name: str, rest: list[str]) -> BuildVariant:
    if _PYTHON_MARKER not in rest:
        if not rest:
            return BuildVariant(name, SDK)
        if len(rest) != 1:
            raise ValueError(
                "an SDK without compiled parts is sdk or sdk-<backend>; one with them ends in "
                "cpython-<X.Y>-<abi>-<cpu>-<os>"
            )
        if not _NOARCH_BACKEND.fullmatch(rest[0]):
            raise ValueError(f"{rest[0]!r} is not a backend name")
        return BuildVariant(name, SDK, backend=rest[0])
    rest, cpu, os = _split_system(rest)
    rest, python, abi = _split_python(rest)
    backend, backend_version = parse_backend(rest, legacy=False) if rest else (None, None)
    return BuildVariant(
        name,
        SDK,
        backend=backend,
        backend_version=backend_version,
        cpu=cpu,
        os=os,
        python_version=python,
        python_abi=abi,
    )
