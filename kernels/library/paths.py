"""Where our kernel repositories live: their sources, and their builds.

Installed from a wheel, the package carries both as package data (``kernels/_library``: the
wheel's build hook wrote every ``<repo>/build/`` there). A checkout (or an editable install)
has the sources only, in the top-level ``library/`` folder, and builds them into a verified
cache the first time a process asks (`kernels.library.builds`).
"""

from __future__ import annotations

from pathlib import Path

#: The folder of our repositories inside an installed package.
INSTALLED = "_library"


def library_source() -> Path:
    """The folder of our kernel repositories' sources: ``library/`` in a checkout,
    ``kernels/_library`` in an installed package. It holds ``build.py``, ``_shared/`` and each
    ``<repo>/build.toml`` and ``<repo>/torch-ext/``, but in a checkout no ``build/``."""
    package_dir = Path(__file__).resolve().parent.parent
    for candidate in (package_dir / INSTALLED, package_dir.parent / "library"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"The kernel library is missing: neither {package_dir / INSTALLED} nor "
        f"{package_dir.parent / 'library'} exists. Reinstall the kernels package."
    )


def library_path() -> Path:
    """The folder holding our kernel repositories built, each ``<repo>/build/<variant>/``, as
    `kernels.get_local_kernel` and `kernels.LocalLayerRepository` take them.

    An installed package's ``kernels/_library``; in a checkout, the library built from
    ``library/`` into the cache (`kernels.library.builds.built_library`: the first call of a
    process builds, in milliseconds, or finds the build there).

    Raises:
        LibraryBuildError (of ``library/build.py``): in a checkout, a repository's source
            cannot be built (the message names the file and the fix).
    """
    source = library_source()
    if source.name == INSTALLED:
        return source
    from .builds import built_library

    return built_library(source)


def built_repository(path: Path) -> Path:
    """The folder to load for the local repository folder ``path``: ``path`` itself, unless it
    is one of our library's source folders in a checkout (``library/norm``), whose build is
    ``library_path() / <repo>``, made from its sources: a ``build/`` that ``make library`` left
    there may be older than them. So ``kernels benchmark library/activation`` and the other
    commands that take a folder work on a fresh clone, and never on a stale build."""
    source = library_source()
    if (
        source.name != INSTALLED
        and (path / "build.toml").is_file()
        and path.resolve().parent == source.resolve()
    ):
        return library_path() / path.resolve().name
    return path
