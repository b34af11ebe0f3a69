"""The library built for a checkout: sources and ``build/`` folders, in a verified cache.

git holds only the sources of our kernel repositories (``library/<repo>/build.toml``,
``torch-ext/``, ``library/_shared/``), never a generated ``build/``. An installed wheel carries
the library built (its build hook, ``hatch_build.py``, wrote it); a checkout builds it here,
the first time a process needs it, with ``library/build.py``'s own function
(``library_files``), so what is loaded is byte for byte what the Hub gets (less
``symbols.json``, which only ``kernels describe-api`` reads and which takes a child Python a
package to make) and what the wheel ships.

The library (every source file, and each repository's ``build/``) is made in memory, in
milliseconds, and found or written at::

    <cache>/<digest>/                 build.py, _shared/, <repo>/build.toml, torch-ext/, ...
    <cache>/<digest>/<repo>/build/<variant>/...

where ``<digest>`` is a digest of every file and ``<cache>`` is ``$KERNELS_LIBRARY_CACHE``,
else ``$XDG_CACHE_HOME/kernels/library``, else ``~/.cache/kernels/library``. A folder already
there is used only when its files are exactly these: the same names and bytes, no link,
nothing else but Python's ``__pycache__`` (never read: kernel packages are imported from source
only). Anything else, whoever wrote it, is replaced: a fresh copy is written under a temporary
name and renamed into place, so no process sees a half-written folder and two processes that
build at once agree. Where the cache cannot be written, the library goes to a temporary folder
of this process (with a WARNING that says how to keep it).

Each change of the sources is a new digest, so a new folder; older ones are never read again,
and deleting the cache folder at any time is safe.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib.util
import logging
import os
import shutil
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType

logger = logging.getLogger(__name__)

#: How files are written into a folder: ``library/build.py``'s ``write_files``.
Writer = Callable[[Mapping[str, bytes], Path], None]

#: Overrides the folder that holds the library's builds (default ``$XDG_CACHE_HOME/kernels/library``).
ENV_CACHE = "KERNELS_LIBRARY_CACHE"
#: Hex digits of the build digest that name its folder.
DIGEST_LENGTH = 20

_lock = threading.Lock()
# Built folders, by (source folder, cache folder): one build a process.
_built: dict[tuple[Path, Path], Path] = {}


def _reset_lock_after_fork() -> None:
    # A thread of the parent may have held it at the fork; it does not exist in the child.
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_reset_lock_after_fork)


def cache_dir() -> Path:
    """The folder that holds the library's builds, one sub-folder a digest."""
    explicit = os.environ.get(ENV_CACHE)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kernels" / "library"


def build_script(source: Path) -> ModuleType:
    """``source``'s ``build.py`` (our ``library/build.py``), imported once per process."""
    path = (source / "build.py").resolve()
    name = f"_kernels_library_build_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"{path} cannot be imported")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return module


def library_files(source: Path) -> dict[str, bytes]:
    """Every file of the library built from ``source`` (our ``library/``), by path relative to
    it: ``library/build.py``'s ``library_files()``, without ``symbols.json``."""
    return build_script(source).library_files(symbols=False)


def digest(source: Path, files: Mapping[str, bytes]) -> str:
    """The digest (hex) of files, their names and contents, as the build script of ``source``
    digests a package's (one definition: ``library/build.py``'s ``source_digest``)."""
    return build_script(source).source_digest(files)


def built_library(source: Path, cache: Path | None = None) -> Path:
    """The folder of the library built from ``source``: its files and each repository's
    ``<repo>/build/<variant>/``, found in ``cache`` (default `cache_dir`) when it holds exactly
    them, else written there. Built once per process.

    Raises:
        LibraryBuildError (of ``library/build.py``): a repository's source cannot be built.
    """
    cache = cache_dir() if cache is None else cache
    key = (source.resolve(), cache)
    with _lock:
        folder = _built.get(key)
        if folder is None:
            files = library_files(source)
            write = build_script(source).write_files
            folder = _built[key] = _find_or_write(files, cache, digest(source, files), write)
        return folder


def _find_or_write(files: Mapping[str, bytes], cache: Path, name: str, write: Writer) -> Path:
    target = cache / name[:DIGEST_LENGTH]
    try:
        if matches(target, files):
            return target
        _publish(files, cache, target, write)
        return target
    except OSError as exc:
        private = Path(tempfile.mkdtemp(prefix="kernels-library-"))
        atexit.register(shutil.rmtree, private, ignore_errors=True)
        logger.warning(
            "Cannot write the kernel library's build to %s (%s); building it in %s for this "
            "process instead. Set %s to a folder you can write to keep it between runs.",
            cache,
            exc.strerror or exc,
            private,
            ENV_CACHE,
        )
        write(files, private)
        return private


def matches(folder: Path, files: Mapping[str, bytes]) -> bool:
    """Whether ``folder`` holds exactly ``files``: no file missing, changed or added, no link
    and nothing but folders and plain files; ``__pycache__`` folders are passed over."""
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return False
    except FileNotFoundError:
        return False
    seen = set()
    for root, dirs, names in os.walk(folder):
        here = Path(root)
        for name in list(dirs):
            if name == "__pycache__":
                dirs.remove(name)
            elif not stat.S_ISDIR(os.lstat(here / name).st_mode):  # a link to a folder
                return False
        for name in names:
            path = here / name
            relative = path.relative_to(folder).as_posix()
            if relative not in files or not stat.S_ISREG(os.lstat(path).st_mode):
                return False
            with open(path, "rb") as f:
                if f.read(len(files[relative]) + 1) != files[relative]:
                    return False
            seen.add(relative)
    return len(seen) == len(files)


def _publish(files: Mapping[str, bytes], cache: Path, target: Path, write: Writer) -> None:
    """Write ``files`` at ``target`` atomically, replacing whatever is there."""
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=cache))  # mode 0700
    try:
        write(files, staging)
        for _ in range(3):
            try:
                os.rename(staging, target)
                return
            except OSError:
                # Another process renamed its build into place first (then it is this one),
                # or a folder with other content is there: move it aside and try again.
                if matches(target, files):
                    return
                _discard(target, cache)
        os.rename(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _discard(path: Path, cache: Path) -> None:
    """Move ``path`` (a folder, a file or a link) out of the way, then delete it."""
    aside = Path(tempfile.mkdtemp(prefix=".stale-", dir=cache))
    try:
        os.rename(path, aside / "old")
    except FileNotFoundError:
        pass
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(aside)
