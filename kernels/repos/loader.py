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
import re
import sys
import threading
from pathlib import Path
from types import ModuleType

from ..errors import KernelLoadError
from .loaded import record_import

logger = logging.getLogger(__name__)

_lock = threading.RLock()
_loaded: dict[Path, ModuleType] = {}


def unique_module_name(package_name: str, package_dir: Path) -> str:
    """The ``sys.modules`` name a package folder is imported under."""
    digest = hashlib.sha256(str(package_dir).encode()).hexdigest()[:16]
    safe = re.sub(r"\W", "_", package_name) or "kernel"
    return f"_kernels_{safe}_{digest}"


def import_package(package_dir: Path, package_name: str) -> ModuleType:
    """Import the package in `package_dir` (a folder with ``__init__.py``), once per folder.

    Raises:
        KernelLoadError: the folder is no package, or importing it raised; nothing of a
            failed import is left in ``sys.modules``.
    """
    package_dir = Path(package_dir).resolve()
    with _lock:
        module = _loaded.get(package_dir)
        if module is not None:
            return module
        init = package_dir / "__init__.py"
        if not init.is_file():
            raise KernelLoadError(f"{package_dir} is not a Python package: it has no __init__.py.")
        name = unique_module_name(package_name, package_dir)
        spec = importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[str(package_dir)]
        )
        if spec is None or spec.loader is None:
            raise KernelLoadError(f"Python cannot import the package at {package_dir}.")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
                del sys.modules[key]
            raise KernelLoadError(
                f"Importing kernel package '{package_name}' from {package_dir} failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        logger.debug("imported kernel package %s from %s as %s", package_name, package_dir, name)
        _loaded[package_dir] = module
        record_import(package_dir, module)
        return module
