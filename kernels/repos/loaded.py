"""What this process has loaded: every imported kernel package, its metadata and its origin.

`get_loaded_kernels()` answers "which kernels run here, and where from?" for logs, bug
reports and tests. Every kernel package imported by `kernels` (from the Hub, a lock, a local
folder or our own library) is recorded once per folder; Hub loads, locked ones included, also
record the repository and the exact commit they came from.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType

logger = logging.getLogger(__name__)

#: The file kernel-builder writes into each build variant folder.
METADATA_FILE = "metadata.json"


@dataclass(frozen=True)
class RepoInfo:
    """Where a loaded kernel came from on the Hub.

    Attributes:
        repo_id: the Hub repository, e.g. ``"kernels-community/activation"``.
        revision: the commit that was loaded (a full hash, whatever tag or version was asked).
        repo_type: ``"kernel"``, or ``"model"`` for a kernel published as a model repository.
    """

    repo_id: str
    revision: str
    repo_type: str = "kernel"


@dataclass(frozen=True)
class Metadata:
    """A build variant's ``metadata.json``, as kernel-builder writes it; empty when absent.

    Attributes:
        id: the kernel's identifier, unique to its version and backend.
        name: the kernel's name.
        version: the kernel's version (an int N for the branch vN, as kernel-builder numbers it).
        license: the kernel's license.
        upstream: the repository the kernel was taken from, if any.
        source: the kernel-builder source repository.
        python_depends: Python packages the kernel needs.
        backend: what the build targets (e.g. ``{"type": "cuda", ...}``), as the file says.
    """

    id: str | None = None
    name: str | None = None
    version: int | str | None = None
    license: str | None = None
    upstream: str | None = None
    source: str | None = None
    python_depends: tuple[str, ...] = ()
    backend: dict | None = field(default=None, compare=False)

    @classmethod
    def from_variant(cls, variant_dir: Path) -> Metadata:
        """Read ``<variant_dir>/metadata.json``; a missing or unreadable file gives empty metadata."""
        path = Path(variant_dir) / METADATA_FILE
        if not path.is_file():
            return cls()
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            depends = data.get("python-depends", data.get("python_depends", []))
            return cls(
                id=data.get("id"),
                name=data.get("name"),
                version=data.get("version"),
                license=data.get("license"),
                upstream=data.get("upstream"),
                source=data.get("source"),
                python_depends=tuple(depends) if isinstance(depends, list) else (),
                backend=data.get("backend") if isinstance(data.get("backend"), dict) else None,
            )
        except (OSError, ValueError) as exc:
            logger.warning("ignoring the unreadable %s (%s)", path, exc)
            return cls()


@dataclass(frozen=True)
class LoadedKernel:
    """A kernel package imported in this process.

    Attributes:
        metadata: the build variant's `Metadata`.
        module: the imported kernel package.
        repo_info: where it came from on the Hub (`get_kernel`, `LayerRepository`, locks);
            None for local folders and our own library.
        path: the package folder that was imported.
    """

    metadata: Metadata
    module: ModuleType
    repo_info: RepoInfo | None = None
    path: Path | None = None


_lock = threading.Lock()
_loaded: dict[Path, LoadedKernel] = {}


def record_import(package_dir: Path, module: ModuleType) -> None:
    """Note a freshly imported package (by `kernels.repos.loader`)."""
    package_dir = Path(package_dir).resolve()
    # metadata.json sits in the variant folder: the package itself, or its parent.
    variant_dir = package_dir if (package_dir / METADATA_FILE).is_file() else package_dir.parent
    with _lock:
        _loaded[package_dir] = LoadedKernel(
            Metadata.from_variant(variant_dir), module, None, package_dir
        )


def record_origin(package_dir: Path, repo_info: RepoInfo) -> None:
    """Note where an imported package came from on the Hub."""
    package_dir = Path(package_dir).resolve()
    with _lock:
        loaded = _loaded.get(package_dir)
        if loaded is not None and loaded.repo_info != repo_info:
            _loaded[package_dir] = replace(loaded, repo_info=repo_info)


def get_loaded_kernels() -> list[LoadedKernel]:
    """Every kernel package loaded in this process, in the order they were first imported.

    The list is a snapshot: changing it changes nothing.

    Example:
        ```python
        from kernels import get_kernel, get_loaded_kernels

        get_kernel("kernels-community/activation", version=1)
        for loaded in get_loaded_kernels():
            print(loaded.metadata.name, loaded.repo_info)
        ```
    """
    with _lock:
        return list(_loaded.values())
