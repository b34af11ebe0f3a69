"""The wheel ships our kernel library built (hatch_build.py, the wheel's build hook): git holds
only the sources, so the hook writes library/build.py's ``library_files()`` as
``kernels/_library``, which an installed package loads with no build step.

The hook runs here against a stand-in for hatchling's hook interface (hatchling is the build
backend, installed only in pip's isolated build environment): what it hands hatchling is what
the wheel gets (``pip wheel . --no-deps`` gives the same tree)."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import tomllib

from kernels.library import builds
from tests.support.paths import LIBRARY, REPO_ROOT


class _HookInterface:
    """What hatchling's BuildHookInterface gives a hook that ours uses."""

    def __init__(self, root: str, target_name: str) -> None:
        self.root = root
        self.target_name = target_name


@pytest.fixture
def hook_module(monkeypatch):
    names = ["hatchling", "hatchling.builders", "hatchling.builders.hooks"]
    names += ["hatchling.builders.hooks.plugin", "hatchling.builders.hooks.plugin.interface"]
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules[names[-1]].BuildHookInterface = _HookInterface
    spec = importlib.util.spec_from_file_location("_test_hatch_build", REPO_ROOT / "hatch_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tree(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def test_the_wheel_gets_the_library_built_as_kernels_library(hook_module):
    hook = hook_module.LibraryBuildHook(str(REPO_ROOT), "wheel")
    build_data: dict = {"force_include": {}}
    hook.initialize("standard", build_data)
    [(staging, target)] = build_data["force_include"].items()
    assert target == "kernels/_library"
    shipped = _tree(Path(staging))
    # What a checkout builds into its cache and loads, byte for byte.
    assert shipped == builds.library_files(LIBRARY)
    assert "norm/build/torch-cuda/metadata.json" in shipped and "build.py" in shipped
    hook.finalize("standard", build_data, "kernels.whl")
    assert not Path(staging).exists()


def test_the_sdist_keeps_the_sources_and_the_hook(hook_module):
    build_data: dict = {"force_include": {}}
    hook_module.LibraryBuildHook(str(REPO_ROOT), "sdist").initialize("standard", build_data)
    assert build_data["force_include"] == {}
    targets = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]
    assert targets["targets"]["wheel"]["hooks"]["custom"]["path"] == "hatch_build.py"
    assert {"library", "hatch_build.py"} <= set(targets["targets"]["sdist"]["include"])
    assert "force-include" not in targets["targets"]["wheel"]  # a stale build/ is not shipped
