"""Importing a kernel package from a folder, once, under a name that cannot clash.

Kernel packages are imported under a module name derived from their folder (and, for Hub
kernels, from the commit the folder holds), never under their bare package name: two
repositories that both ship a package called ``activation``, or two versions of one kernel,
load side by side in one process. Importing the same folder again returns the same module.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import re
import sys
import threading
from pathlib import Path
from types import ModuleType

from ..errors import KernelLoadError
from . import archive, source_import
from .digests import check_digests
from .loaded import read_metadata, record_import, variant_folder
from .requirements import check_requirements
from .signatures import check_signature

logger = logging.getLogger(__name__)

_lock = threading.RLock()
_loaded: dict[Path, ModuleType] = {}


def _reset_locks_after_fork() -> None:
    """In a forked child, make every lock of the loading path free again.

    A thread of the parent may have held one at the fork (the import lock while it imported
    a kernel, for as long as the kernel's import runs): that thread does not exist in the
    child, so its lock would stay taken for ever and the child's next load would hang (a
    dataloader worker forked while another thread imports a kernel). What they guarded is
    kept: the modules already imported, the registered packages. (`kernels.repos.load_locks`
    resets its own.)
    """
    global _lock
    from . import hashing, loaded

    _lock = threading.RLock()
    loaded._lock = threading.Lock()
    hub = sys.modules.get(f"{__package__}.hub")  # not imported here: hub imports this module
    if hub is not None:
        setattr(hub, "_publish_lock", threading.Lock())  # noqa: B010 (typed as a module)
    hashing._verified_lock = threading.Lock()
    source_import._install_lock = threading.Lock()
    source_import._finder._lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_reset_locks_after_fork)


def unique_module_name(package_name: str, package_dir: Path) -> str:
    """The ``sys.modules`` name a package folder is imported under."""
    digest = hashlib.sha256(str(package_dir).encode()).hexdigest()[:16]
    safe = re.sub(r"\W", "_", package_name) or "kernel"
    return f"_kernels_{safe}_{digest}"


def import_package(package_dir: Path, package_name: str) -> ModuleType:
    """Import the package in `package_dir` (a folder with ``__init__.py``, or a variant folder
    in the zip build layout, `kernels.repos.archive`), once per folder.

    The package and every module under it are imported from source only
    (`kernels.repos.source_import`). Its variant's ``metadata.json`` is read first and what
    it demands is checked (`kernels.repos.requirements`), and so are the file digests it
    records (`kernels.repos.digests`) and, when ``KERNELS_REQUIRE_SIGNATURES=1``, the
    signature of a Hub build (`kernels.repos.signatures`); the package is recorded as loaded
    only once all of it succeeded.

    Raises:
        KernelLoadError: the folder is no package, its metadata.json is malformed or
            demands what is not here (`KernelMetadataError` for a malformed demand), a file
            differs from its digest there (`KernelHashMismatchError`), a required signature
            does not verify (`KernelSignatureError`), or
            importing it raised (any exception, ``SystemExit`` included; only
            ``KeyboardInterrupt`` passes through as it is). Nothing of a failed import is
            left in ``sys.modules``.
    """
    package_dir = Path(package_dir).resolve()
    with _lock:
        module = _loaded.get(package_dir)
        if module is not None:
            return module
        variant_dir = variant_folder(package_dir)
        # A variant folder without __init__.py may be in the zip layout: its metadata says.
        if package_dir != variant_dir and not (package_dir / "__init__.py").is_file():
            raise KernelLoadError(f"{package_dir} is not a Python package: it has no __init__.py.")
        # Before the metadata is parsed: a forged file should meet no parser of ours.
        check_signature(variant_dir)
        metadata = read_metadata(package_dir)
        check_requirements(metadata, variant_dir)
        check_digests(metadata, variant_dir)
        name = unique_module_name(package_name, package_dir)
        if archive.build_layout(metadata, where=str(variant_dir / "metadata.json")) == archive.ZIP:
            # Read, checked and unpacked in memory only now that the files are verified.
            unpacked = archive.read_archive(archive.archive_path(metadata, variant_dir), metadata)
            spec = source_import.register_archive(name, str(variant_dir), unpacked)
        elif not (package_dir / "__init__.py").is_file():
            raise KernelLoadError(
                f"{package_dir} is not a Python package: it has no __init__.py, and its "
                'metadata.json does not say "build-layout": "zip".'
            )
        else:
            spec = source_import.register(name, str(package_dir))
        assert spec.loader is not None  # register gives its package a source loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:
            # Kernel code that calls sys.exit() or raises its own BaseException at import is a
            # kernel that failed to load, to fall back from like any other; only the user's
            # Ctrl-C is theirs to see. GeneratorExit counts as a failure too: our caller is
            # not a generator being closed while this runs, so the kernel raised it itself.
            _forget(name)
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise KernelLoadError(
                f"Importing kernel package '{package_name}' from {package_dir} failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        logger.debug("imported kernel package %s from %s as %s", package_name, package_dir, name)
        _loaded[package_dir] = module
        record_import(package_dir, module, metadata)
        return module


def _forget(name: str) -> None:
    """Remove a failed import's package and every module under it from ``sys.modules``."""
    for key in [k for k in list(sys.modules) if k == name or k.startswith(name + ".")]:
        sys.modules.pop(key, None)
