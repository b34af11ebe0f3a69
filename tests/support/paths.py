"""Where things are in this checkout, and the environment a child interpreter needs to import
this checkout's `kernels` and the ``tests`` package."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
#: Our kernel repositories' sources (library/<repo>/build.toml, torch-ext/): no build/ in git.
#: The built library is `kernels.library.library_path()`, made from it in the session's cache.
LIBRARY = REPO_ROOT / "library"


def subprocess_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child interpreter: the repository root first on its
    path, then whatever PYTHONPATH already holds (e.g. another huggingface_hub under test)."""
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}
