"""Where our kernel repositories live: package data in an install, ``library/`` in a checkout."""

from __future__ import annotations

from pathlib import Path


def library_path() -> Path:
    """The folder holding our kernel repositories.

    An installed package carries them as package data (``kernels/_library``); a checkout
    (or an editable install) has them in the top-level ``library/`` folder.
    """
    package_dir = Path(__file__).resolve().parent.parent
    for candidate in (package_dir / "_library", package_dir.parent / "library"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"The kernel library is missing: neither {package_dir / '_library'} nor "
        f"{package_dir.parent / 'library'} exists. Reinstall the kernels package."
    )
