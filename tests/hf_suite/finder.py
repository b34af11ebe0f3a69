"""Serves Hugging Face's private module names (``kernels._internals.*``, ``kernels._rust``)
from the adapter modules in tests/hf_suite/adapter/, while ``kernels`` itself is ours.

Only the test run installs it (tests/hf_suite/plugin.py); our package never has these names.
A private module without an adapter file is served as an empty module whose every name is a
`Gap`, so its tests fail one by one, naming what is missing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path

from tests.hf_suite.gaps import gaps_for

ADAPTER_ROOT = Path(__file__).resolve().parent / "adapter"
#: Their private names, each the root of what the adapters serve.
SERVED = ("kernels._internals", "kernels._rust")


def is_served(fullname: str) -> bool:
    return any(fullname == root or fullname.startswith(root + ".") for root in SERVED)


def adapter_path(fullname: str) -> tuple[Path, bool] | None:
    """The adapter file for `fullname` and whether it is a package, or None if none exists."""
    relative = Path(*fullname.split(".")[1:])
    package = ADAPTER_ROOT / relative / "__init__.py"
    if package.is_file():
        return package, True
    module = (ADAPTER_ROOT / relative).with_suffix(".py")
    if module.is_file():
        return module, False
    return None


class _GapLoader(importlib.abc.Loader):
    """A module with no adapter: a package (their submodules may be imported below it) whose
    every attribute is a Gap."""

    def create_module(self, spec):
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        module.__getattr__ = gaps_for(module.__name__)  # type: ignore[method-assign]


class AdapterFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if not is_served(fullname):
            return None
        found = adapter_path(fullname)
        if found is None:
            return importlib.machinery.ModuleSpec(fullname, _GapLoader(), is_package=True)
        file, is_package = found
        return importlib.util.spec_from_file_location(
            fullname,
            file,
            submodule_search_locations=[str(file.parent)] if is_package else None,
        )


_FINDER = AdapterFinder()


def install() -> None:
    """Put the finder first on sys.meta_path (once)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
