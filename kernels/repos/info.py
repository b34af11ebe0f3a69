"""What is known about a kernel: its build's ``metadata.json`` (`Metadata`) and where on the Hub
it came from (`RepoInfo`), as Hugging Face's `kernels` (2026) describes both.

A build variant folder (``build/<variant>/``) may hold ``metadata.json``, written by
kernel-builder, e.g.::

    {"id": "_activation_cuda_34605e1", "name": "activation", "version": 1,
     "license": "apache-2.0", "python-depends": [], "backend": {"type": "cuda"}}
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..errors import KernelMetadataError
from .bounded_json import MiB, json_type, load_json_file, quoted

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
        python_depends: Python packages the kernel needs, as requirement strings.
        backend: information about the backend it was built for, e.g. ``{"type": "cuda"}``.
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
    python_depends: tuple[str, ...] = ()
    backend: Mapping[str, object] | None = None
    kernels_minver: str | None = None
    extra: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))

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


def _python_depends(value: object, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise KernelMetadataError(
        f"{where} must be a list of requirement strings, got {quoted(value)}."
    )


def _backend(value: object, where: str) -> Mapping[str, object] | None:
    if value is None:
        return None
    if isinstance(value, str):  # a bare backend name
        return MappingProxyType({"type": value})
    if isinstance(value, Mapping):
        kind = value.get("type")
        if kind is not None and not isinstance(kind, str):
            raise KernelMetadataError(
                f"{where}: 'type' must be a backend name such as 'cuda', got {quoted(kind)}."
            )
        return MappingProxyType(dict(value))
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
