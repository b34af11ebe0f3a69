"""What is known about a kernel: its build's ``metadata.json`` (`Metadata`) and where on the Hub
it came from (`RepoInfo`), as Hugging Face's `kernels` (2026) describes both.

A build variant folder (``build/<variant>/``) may hold ``metadata.json``, written by
kernel-builder, e.g.::

    {"id": "_activation_cuda_34605e1", "name": "activation", "version": 1,
     "license": "apache-2.0", "python-depends": [], "backend": {"type": "cuda"}}
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..errors import KernelMetadataError
from .bounded_json import MiB, json_type, load_json_file, parse_json, quoted

METADATA_FILE = "metadata.json"

#: The largest ``metadata.json`` read; kernel-builder's are under a few KiB.
MAX_METADATA_SIZE = 1 * MiB


@dataclass(frozen=True)
class RepoInfo:
    """The origin of a kernel loaded from the Hub: its repository and the revision loaded.

    ``revision`` is the commit the kernel was resolved to (a branch or tag names different
    code over time; the commit does not).

    Example:
        ```python
        from kernels import RepoInfo

        origin = RepoInfo(repo_id="kernels-community/activation", revision="0f3c1a...")
        print(f"{origin.repo_id}@{origin.revision[:12]}")
        ```
    """

    repo_id: str
    revision: str
    #: "kernel" (the Hub's kernel repositories), or "model" for a kernel published as a model.
    repo_type: str = "kernel"

    def __str__(self) -> str:
        kind = "" if self.repo_type == "kernel" else f"{self.repo_type} repository "
        return f"{kind}{self.repo_id} (revision {self.revision})"


class Backend(str, enum.Enum):
    """The backend a kernel build targets (``backend.type`` of its ``metadata.json``), named as
    Hugging Face's client names them. A ``str``: ``Backend.CUDA == "cuda"``."""

    CANN = "cann"
    CPU = "cpu"
    CUDA = "cuda"
    Metal = "metal"
    Neuron = "neuron"
    ROCm = "rocm"
    TPU = "tpu"
    XPU = "xpu"

    @staticmethod
    def from_str(name: str) -> Backend:
        """The backend named `name`, in any case (``"cuda"``, ``"ROCM"``).

        Raises:
            ValueError: no backend has that name.
        """
        try:
            return Backend(str(name).lower())
        except ValueError:
            known = ", ".join(b.value for b in Backend)
            raise ValueError(f"unknown backend {name!r}; known backends: {known}.") from None

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return f"Backend.{self.name}"


#: ``backend.type`` of builds that run on any backend (some SDKs): no `Backend`.
AGNOSTIC_BACKEND = "agnostic"


class BackendInfo(Mapping[str, object]):
    """The ``backend`` object of a ``metadata.json``: `backend_type` and `archs` as Hugging
    Face's client reads them, and the raw keys as a read-only mapping (``info["type"]``)."""

    def __init__(self, data: Mapping[str, object]) -> None:
        self._data = MappingProxyType(dict(data))

    def __getitem__(self, key: str) -> object:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):  # a plain dict of the same keys is equal, as before 0.19
            return dict(self._data) == dict(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal by content, which may change type

    @property
    def backend_type(self) -> Backend | None:
        """The backend the build targets; None for a backend-agnostic build (or none declared).

        Raises:
            ValueError: the build targets a backend this version does not know (a newer one).
        """
        kind = self._data.get("type")
        if kind is None or kind == AGNOSTIC_BACKEND:
            return None
        try:
            return Backend.from_str(str(kind))
        except ValueError:
            raise ValueError(
                f"the kernel was built for an unknown backend {kind!r}; a newer kernels may "
                "know it (pip install --upgrade kernels)."
            ) from None

    @property
    def archs(self) -> list[str] | None:
        """The architectures the build targets (CUDA capabilities such as ``"9.0"``, ROCm
        ``gfx`` names); None when it declares none, or its backend is unknown."""
        archs = self._data.get("archs")
        if archs is None or not self._known():
            return None
        assert isinstance(archs, list)  # checked when read (_backend)
        return list(archs)

    def _known(self) -> bool:
        try:
            _ = self.backend_type
        except ValueError:
            return False
        return True

    def __repr__(self) -> str:
        if not self._known():
            return f"BackendInfo(backend_type=Unknown({self._data.get('type')!r}), archs=None)"
        kind = self.backend_type
        return f"BackendInfo(backend_type={kind!r}, archs={self.archs!r})"


# metadata.json keys -> Metadata fields, where they differ.
_RENAMED = {"python-depends": "python_depends", "kernels-minver": "kernels_minver"}


@dataclass(frozen=True)
class Metadata:
    """The metadata of one build of a kernel, read from its variant's ``metadata.json``.

    Every field is optional (None, or empty for ``python_depends``): builds made before
    kernel-builder wrote metadata have none, and `Metadata.load_from_variant` then returns an
    empty `Metadata`. Keys this class does not know are kept, unread, in ``extra`` (among
    them ``provenance`` and ``digest``). Loading a kernel enforces what its metadata demands
    (``python-depends``, ``kernels-minver``, ``backend``, ``digest``): see
    `kernels.repos.requirements` and `kernels.repos.digests`.

    Attributes:
        id: identifier unique to the kernel's version and backend (its Python module name).
        name: the kernel's name.
        version: the kernel's major version (the ``v<N>`` branch it is published on).
        license: its license, e.g. ``"apache-2.0"``.
        upstream: the original upstream repository of the kernel, if it is a port.
        source: the kernel-builder source repository it was built from.
        python_depends: Python packages the kernel needs, as requirement strings (a list).
        backend: the backend it was built for (`BackendInfo`: ``backend.backend_type``,
            ``backend.archs``, and the raw keys, e.g. ``backend["type"] == "cuda"``).
        kernels_minver: the oldest `kernels` version that can load it.

    Example:
        ```python
        from kernels import Metadata

        meta = Metadata.load_from_variant("activation/build/torch-universal")
        print(meta.name, meta.version, meta.python_depends)
        ```
    """

    id: str | None = None
    name: str | None = None
    version: int | None = None
    license: str | None = None
    upstream: str | None = None
    source: str | None = None
    python_depends: list[str] = field(default_factory=list)
    backend: BackendInfo | None = None
    kernels_minver: str | None = None
    extra: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        # Built directly (not read from a file): take a plain dict / tuple as from_dict would.
        if self.backend is not None and not isinstance(self.backend, BackendInfo):
            object.__setattr__(self, "backend", BackendInfo(self.backend))
        if not isinstance(self.python_depends, list):
            object.__setattr__(self, "python_depends", list(self.python_depends))

    @classmethod
    def from_dict(cls, data: object, *, where: str = "metadata") -> Metadata:
        """Metadata from the parsed JSON object of a ``metadata.json``.

        Raises:
            KernelMetadataError: `data` is not a mapping, or a known key has a value of the
                wrong type (named with `where`).
        """
        if not isinstance(data, Mapping):
            raise KernelMetadataError(f"{where} must hold a JSON object, not {json_type(data)}.")
        # Any: each value has passed its field's check in _CHECKS, which the checker cannot see.
        values: dict[str, Any] = {}
        extra: dict[str, object] = {}
        for key, value in data.items():
            if not isinstance(key, str):
                raise KernelMetadataError(f"{where}: keys must be strings, got {quoted(key)}.")
            name = _RENAMED.get(key, key)
            if name in _CHECKS:
                values[name] = _CHECKS[name](value, f"{where}: '{key}'")
            else:
                extra[key] = value
        return cls(**values, extra=MappingProxyType(extra))

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str = "metadata.json") -> Metadata:
        """Metadata from the bytes of a ``metadata.json`` (as Hugging Face's client reads them).

        Raises:
            KernelMetadataError (a ValueError): as `read_from_file`, for the bytes.
        """
        if isinstance(data, (bytearray, memoryview)):
            data = bytes(data)
        parsed = parse_json(data, where=where, error=KernelMetadataError, limit=MAX_METADATA_SIZE)
        return cls.from_dict(parsed, where=where)

    @classmethod
    def read_from_file(cls, path: str | os.PathLike[str]) -> Metadata:
        """Read a ``metadata.json`` file.

        Raises:
            FileNotFoundError: there is no such file.
            KernelMetadataError: it cannot be read, is larger than `MAX_METADATA_SIZE`, is not
                UTF-8 JSON (nested at most 64 deep, without duplicate keys), or a value has
                the wrong type.
        """
        path = Path(path)
        try:
            data = load_json_file(path, error=KernelMetadataError, limit=MAX_METADATA_SIZE)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise KernelMetadataError(
                f"Cannot read {path} ({exc.strerror or exc}); check its permissions."
            ) from exc
        return cls.from_dict(data, where=str(path))

    @classmethod
    def load_from_variant(cls, variant_path: str | os.PathLike[str]) -> Metadata:
        """The metadata of the build variant folder `variant_path`; empty when it has no
        ``metadata.json`` (builds from before kernel-builder wrote one).

        Raises:
            KernelMetadataError: as `read_from_file`.
        """
        path = Path(variant_path) / METADATA_FILE
        return cls.read_from_file(path) if path.is_file() else cls()


def _optional(kind: type, label: str):
    def check(value: object, where: str):
        if value is None or (isinstance(value, kind) and not isinstance(value, bool)):
            return value
        raise KernelMetadataError(f"{where} must be {label} or null, got {quoted(value)}.")

    return check


def _python_depends(value: object, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise KernelMetadataError(
        f"{where} must be a list of requirement strings, got {quoted(value)}."
    )


def _backend(value: object, where: str) -> BackendInfo | None:
    if value is None:
        return None
    if isinstance(value, str):  # a bare backend name
        return BackendInfo({"type": value})
    if isinstance(value, Mapping):
        kind = value.get("type")
        if kind is not None and not isinstance(kind, str):
            raise KernelMetadataError(
                f"{where}: 'type' must be a backend name such as 'cuda', got {quoted(kind)}."
            )
        archs = value.get("archs")
        if archs is not None and not (
            isinstance(archs, list) and all(isinstance(a, str) for a in archs)
        ):
            raise KernelMetadataError(
                f"{where}: 'archs' must be a list of architecture names such as "
                f'["9.0", "10.0"], got {quoted(archs)}.'
            )
        return BackendInfo(value)
    raise KernelMetadataError(
        f'{where} must be an object such as {{"type": "cuda"}} (or a backend name), '
        f"got {quoted(value)}."
    )


_CHECKS = {
    "id": _optional(str, "a string"),
    "name": _optional(str, "a string"),
    "version": _optional(int, "an integer"),
    "license": _optional(str, "a string"),
    "upstream": _optional(str, "a string"),
    "source": _optional(str, "a string"),
    "python_depends": _python_depends,
    "backend": _backend,
    "kernels_minver": _optional(str, "a string"),
}
