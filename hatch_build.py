"""The wheel's build hook (hatchling): our kernel library, built, as ``kernels/_library``.

git holds only the library's sources (``library/``); the wheel ships it built, so an installed
package loads it with no build step and no cache (`kernels.library.library_path`). The files
are ``library/build.py``'s ``library_files()``: the sources and each repository's fresh
``build/<variant>/`` (without ``symbols.json``, which is made by importing the package and so
needs torch, which the isolated build environment lacks; `kernels upload` publishes it). They
are byte for byte what a checkout builds into its cache and loads. A ``build/`` that ``make
library`` left in ``library/`` is not shipped: the hook builds afresh.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

#: Where the library goes inside the wheel (`kernels.library.paths.INSTALLED`).
TARGET = "kernels/_library"


class LibraryBuildHook(BuildHookInterface):
    """Writes the built library into a temporary folder and includes it as ``kernels/_library``."""

    PLUGIN_NAME = "kernels-library"

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel":
            return  # the sdist carries library/ as it is in git: the sources and build.py
        script = Path(self.root) / "library" / "build.py"
        spec = importlib.util.spec_from_file_location("_kernels_wheel_library_build", script)
        assert spec is not None and spec.loader is not None
        build = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = build  # dataclasses look their module up there
        self._staging = Path(tempfile.mkdtemp(prefix="kernels-wheel-library-"))
        try:
            spec.loader.exec_module(build)
            build.write_files(build.library_files(symbols=False), self._staging)
        finally:
            del sys.modules[spec.name]
        build_data["force_include"][str(self._staging)] = TARGET

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        staging = getattr(self, "_staging", None)
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
