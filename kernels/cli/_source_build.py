"""A kernel repository's source built for publishing: what `kernels upload` sends when the
folder holds the source its ``build/`` is made from.

Two kinds of folder carry that source (``build.toml`` and ``torch-ext/<package>/``) and a build
script that turns it into ``build/<variant>/`` (``library/build.py``, or a copy of it):

* a repository of our library (``library/<repo>``, whose script is ``library/build.py`` beside
  it, which also copies ``library/_shared/`` in): git holds no ``build/`` there;
* a repository made by ``kernels init``, which carries the script as its own ``build.py``.

Either way the upload is a staged copy of the folder with ``build/`` made afresh, with every
variant's ``symbols.json`` (kernel-builder writes one; it imports the package in a child
Python): what is published is what the source makes, never a stale or hand-edited build.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from . import CommandError

SCRIPT = "build.py"


def build_script(path: Path) -> Path | None:
    """The script that builds the repository folder ``path`` from its source, or None when the
    folder holds no source to build (no ``build.toml`` beside ``torch-ext/``, or no script)."""
    if not ((path / "build.toml").is_file() and (path / "torch-ext").is_dir()):
        return None
    if (path / SCRIPT).is_file():
        return path / SCRIPT
    from ..library.paths import library_source

    # Only our library's script is taken from the folder above: another project's build.py
    # there is no kernel build script, and importing it would run it.
    library = library_source()
    if path.resolve().parent == library.resolve():
        return library / SCRIPT
    return None


def stage(path: Path, staging: Path, ignored: Callable[[str], bool]) -> Path:
    """A copy of the repository folder ``path`` under ``staging`` with ``build/`` built afresh
    by its `build_script`; files for which ``ignored(relative path)`` holds, and the folder's
    own ``build/``, are left out.

    Raises:
        CommandError: the folder has no build script, or its source does not build (the
            message is the script's: it names the file and the fix).
    """
    script = build_script(path)
    if script is None:
        raise CommandError(f"{path} holds no kernel source with a build script to build")
    target = staging / path.resolve().name
    for source in sorted(path.rglob("*")):
        relative = source.relative_to(path)
        if relative.parts[0] == "build" or ignored(relative.as_posix()) or not source.is_file():
            continue
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, destination)
    module = _import(script)
    try:
        repo = module.read_repository(path.resolve())
        module.write_build(repo, target)
    except module.LibraryBuildError as exc:
        raise CommandError(f"building {path}: {exc}") from None
    return target


def _import(script: Path):
    name = "_kernels_upload_build"
    spec = importlib.util.spec_from_file_location(name, script)
    if spec is None or spec.loader is None:
        raise CommandError(f"{script} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise CommandError(f"{script} cannot be imported: {type(exc).__name__}: {exc}") from exc
    finally:
        sys.modules.pop(name, None)
    return module
