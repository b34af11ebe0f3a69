"""Kernel packages are imported from their source files only, never from bytecode.

A lock verifies a kernel's files, but Python would also run bytecode from any
``__pycache__`` folder beside them: an unchecked-hash ``.pyc`` planted there (by anyone who
can write to a shared cache) runs instead of the verified source. So a kernel package and
every module under it are compiled from their ``.py`` files each time they are imported;
no ``.pyc`` is read or written for them. Extension modules (``.so``) load as usual: the
lock hashes them like any other file. A module that exists only as bytecode is refused.

`register` names a package's import name (`kernels.repos.loader` hands out one per folder)
and installs `SourceOnlyFinder` in ``sys.meta_path``, ahead of Python's own finders. It
answers for the registered names and the modules under them, however they are imported:
relative imports, ``importlib.import_module("<name>.sub")``, ``importlib.reload``.
`register_archive` does the same for a package imported from its archive in memory
(`kernels.repos.archive`): its modules come from the archive, and from the variant folder
beside it (compiled modules), in the order of its ``__path__``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path

from . import archive as _archive

_LOADERS = (
    (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
    (importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES),
    # Looked for only to refuse them with an error that names the file.
    (importlib.machinery.SourcelessFileLoader, importlib.machinery.BYTECODE_SUFFIXES),
)


class SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """A `SourceFileLoader` that compiles the source on every import and never touches
    ``__pycache__``: no bytecode is read, none is written."""

    def get_code(self, fullname: str):
        path = self.get_filename(fullname)
        # dont_inherit: the kernel's code must not pick up our own __future__ flags.
        return compile(self.get_data(path), path, "exec", dont_inherit=True)

    def set_data(self, path, data, *, _mode=0o666) -> None:
        """Never write bytecode (a no-op, in case a caller asks directly)."""

    def _cache_bytecode(self, source_path, cache_path, data) -> None:
        """Never write bytecode (a no-op, in case a caller asks directly)."""


class SourceOnlyFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of registered kernel packages, with `SourceOnlyLoader` for source."""

    def __init__(self) -> None:
        self._packages: dict[str, Callable[[], ModuleSpec]] = {}
        self._archives: dict[str, _archive.KernelArchive] = {}
        self._lock = threading.Lock()

    def register(self, name: str, package_dir: str) -> None:
        with self._lock:
            self._packages[name] = lambda: package_spec(name, package_dir)

    def register_archive(
        self, name: str, variant_dir: str, archive: _archive.KernelArchive
    ) -> None:
        with self._lock:
            self._archives[str(archive.path)] = archive
            self._packages[name] = lambda: _archive.package_spec(name, Path(variant_dir), archive)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target=None
    ) -> ModuleSpec | None:
        root, _, _ = fullname.partition(".")
        with self._lock:
            root_spec = self._packages.get(root)
            archives = dict(self._archives)
        if root_spec is None:
            return None
        if fullname == root:
            return root_spec()
        if path is None:
            # The import system passes the parent's __path__; without one there is no
            # parent package to look in, and no other finder may answer for our names.
            raise ImportError(f"No parent package to import {fullname} from.", name=fullname)
        return _submodule_spec(fullname, path, archives)


def package_spec(name: str, package_dir: str) -> ModuleSpec:
    """The spec of the package in `package_dir` (a folder with ``__init__.py``), imported as
    `name` from source only."""
    init = os.path.join(package_dir, "__init__.py")
    spec = importlib.util.spec_from_file_location(
        name,
        init,
        loader=SourceOnlyLoader(name, init),
        submodule_search_locations=[package_dir],
    )
    assert spec is not None  # a loader was given, so there is always a spec
    return spec


def _submodule_spec(
    fullname: str, path: Sequence[str], archives: dict[str, _archive.KernelArchive]
) -> ModuleSpec | None:
    portions: list[str] = []
    for entry in path:
        archive = _archive_of(str(entry), archives)
        if archive is not None:
            found = _archive.find_in_archive(archive, fullname, str(entry))
            if found is not None:
                return found
            continue
        finder = importlib.machinery.FileFinder(str(entry), *_LOADERS)
        spec = finder.find_spec(fullname)
        if spec is None:
            continue
        if spec.loader is None:  # a folder without __init__.py: a namespace package portion
            portions.extend(spec.submodule_search_locations or ())
            continue
        return _source_only(spec)
    if portions:
        spec = ModuleSpec(fullname, None, is_package=True)
        spec.submodule_search_locations = portions
        return spec
    return None


def _archive_of(
    entry: str, archives: dict[str, _archive.KernelArchive]
) -> _archive.KernelArchive | None:
    """The registered archive a ``__path__`` entry lies in (``<archive>`` or
    ``<archive>/<folder>``), if any."""
    for root, archive in archives.items():
        if entry == root or entry.startswith(root + "/"):
            return archive
    return None


def _source_only(spec: ModuleSpec) -> ModuleSpec:
    loader = spec.loader
    if isinstance(loader, importlib.machinery.ExtensionFileLoader):
        return spec
    if isinstance(loader, importlib.machinery.SourcelessFileLoader):
        raise ImportError(
            f"{spec.origin} is bytecode without its source; kernel packages are imported from "
            "source only (a .pyc could hold any code). Ship the .py file instead.",
            name=spec.name,
            path=spec.origin,
        )
    assert isinstance(loader, importlib.machinery.SourceFileLoader), loader  # see _LOADERS
    assert spec.origin is not None, spec  # a file loader's spec names its file
    spec.loader = SourceOnlyLoader(spec.name, spec.origin)
    return spec


_finder = SourceOnlyFinder()
_install_lock = threading.Lock()


def register(name: str, package_dir: str) -> ModuleSpec:
    """Import the package in `package_dir` as `name` from source only, and every module
    under it; returns the package's spec."""
    _finder.register(name, package_dir)
    _install()
    return package_spec(name, package_dir)


def register_archive(name: str, variant_dir: str, archive: _archive.KernelArchive) -> ModuleSpec:
    """Import the package of `archive` (unpacked in memory, `kernels.repos.archive`) as
    `name`, and every module under it, from source only; returns the package's spec."""
    _finder.register_archive(name, variant_dir, archive)
    _install()
    return _archive.package_spec(name, Path(variant_dir), archive)


def _install() -> None:
    with _install_lock:
        # Ahead of every finder, and back in place if something removed it.
        if not sys.meta_path or sys.meta_path[0] is not _finder:
            if _finder in sys.meta_path:
                sys.meta_path.remove(_finder)
            sys.meta_path.insert(0, _finder)
