"""What this process has loaded: every imported kernel package, its metadata and its origin.

`get_loaded_kernels()` answers "which kernels run here, and where from?" for logs, bug
reports and tests. Every kernel package imported by `kernels` (from the Hub, a lock, a local
folder or our own library) is recorded once per folder; Hub loads, locked ones included, also
record the repository and the exact commit they came from.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType

from ..errors import KernelLoadError, KernelsError
from .info import METADATA_FILE, Metadata, RepoInfo


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


def variant_folder(package_dir: Path) -> Path:
    """The build variant folder a package folder belongs to. In a Hub snapshot, the fetched
    ``build/<variant>`` folder whatever the layout inside it (`hub_variant_of`: an unsigned
    build must not pass for a local folder by moving its ``metadata.json``); elsewhere the
    package itself (the newer, flat layout) when it holds ``metadata.json``, else its parent."""
    from .digests import hub_variant_of

    package_dir = Path(package_dir)
    hub = hub_variant_of(package_dir)
    if hub is not None:
        return hub
    return package_dir if (package_dir / METADATA_FILE).is_file() else package_dir.parent


def read_metadata(package_dir: Path) -> Metadata:
    """The metadata of the variant a package folder belongs to, read before the package is
    imported: ``metadata.json`` sits in the variant folder, which is the package itself
    or its parent. Empty when there is none.

    Raises:
        KernelLoadError: the file is malformed; it names the file.
    """
    package_dir = Path(package_dir)
    variant_dir = variant_folder(package_dir)
    try:
        return Metadata.load_from_variant(variant_dir)
    except KernelsError as exc:
        problem = str(exc)
    except Exception as exc:  # a parser's own failure is still a malformed file
        problem = f"{type(exc).__name__}: {exc}"
    raise KernelLoadError(
        f"Refusing to import the kernel package in {package_dir}: its "
        f"{variant_dir / METADATA_FILE} is malformed ({problem}). Nothing was imported. Fix or "
        "remove the file (kernel-builder writes it), or download the kernel again."
    )


def record_import(package_dir: Path, module: ModuleType, metadata: Metadata) -> None:
    """Note a freshly imported package and the metadata `read_metadata` gave for it (by
    `kernels.repos.loader`, once the import succeeded)."""
    package_dir = Path(package_dir).resolve()
    with _lock:
        _loaded[package_dir] = LoadedKernel(metadata, module, None, package_dir)


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
