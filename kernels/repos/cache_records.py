"""What `kernels` notes in the Hub cache about its downloads, beside huggingface_hub's layout.

In a repository's cache folder, ``.kernels-files/`` holds:

* ``<commit>/<variant>.json``: the files of a build variant at a commit, written before the
  download starts, so an interrupted download is not mistaken offline for a complete one;
* ``<commit>/listing.json``: the variants the commit offers and the repository's variant
  preference. A commit never changes, so with these two a pinned commit whose variant is
  complete in the cache loads with no Hub request at all;
* ``asked/<digest>.json``: resolution records. The process that resolved a request (a
  version, a branch or tag) notes which commit it found and when, so processes of the same
  machine asking the same thing shortly after use that answer instead of asking the Hub
  again (`kernels.repos.load_locks`, docs/hub.md#many-processes).

Anyone who can write the cache can write these files, so each is read as hostile input:
bounded in size, checked field by field, and ignored when anything is off (the next
download writes it again). A record that passes is still trusted no further than naming a
commit whose variant the cache must hold complete; locked loads verify the files as always.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import stat
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .hubclient import COMMIT_PATTERN
from .variants import PREFERENCES, VARIANT_PATTERN

logger = logging.getLogger(__name__)

FOLDER = ".kernels-files"
_LISTING = "listing.json"
_RESOLUTIONS = "asked"
_FORMAT = 1

# Bounds on what is read back: far above any real kernel, far below harm.
_MAX_FILES = 100_000
_MAX_PATH = 4096
_MAX_FILE_LIST_BYTES = 32 << 20
_MAX_LISTING_BYTES = 1 << 20
_MAX_RECORD_BYTES = 64 << 10
_MAX_TEXT = 1000
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def record_files(folder: Path, commit: str, variant: str, files: Iterable[str]) -> None:
    """Note the files of `variant` at `commit` (paths relative to ``build/<variant>/``)."""
    if _names_ok(commit, variant):
        write_json(folder / FOLDER / commit / f"{variant}.json", list(files))


def read_files(folder: Path, commit: str, variant: str) -> tuple[str, ...] | None:
    """The noted files of `variant` at `commit`; None when not noted or malformed."""
    if not _names_ok(commit, variant):
        return None
    path = folder / FOLDER / commit / f"{variant}.json"
    data = read_json(path, _MAX_FILE_LIST_BYTES)
    if (
        not isinstance(data, list)
        or len(data) > _MAX_FILES
        or not all(isinstance(f, str) and 0 < len(f) <= _MAX_PATH for f in data)
    ):
        _ignored(path, data)
        return None
    return tuple(data)


def record_listing(folder: Path, commit: str, offered: Iterable[str], prefer: str) -> None:
    """Note the variants `commit` offers and the repository's preference at that commit."""
    if COMMIT_PATTERN.match(commit):
        write_json(
            folder / FOLDER / commit / _LISTING, {"offered": sorted(offered), "prefer": prefer}
        )


def read_listing(folder: Path, commit: str) -> tuple[list[str], str] | None:
    """The variants `commit` offers and the preference, as noted; None when unknown."""
    if not COMMIT_PATTERN.match(commit):
        return None
    path = folder / FOLDER / commit / _LISTING
    data = read_json(path, _MAX_LISTING_BYTES)
    if not isinstance(data, dict):
        _ignored(path, data)
        return None
    offered, prefer = data.get("offered"), data.get("prefer")
    if (
        not isinstance(offered, list)
        or len(offered) > _MAX_FILES
        or not all(isinstance(v, str) and VARIANT_PATTERN.match(v) for v in offered)
        or prefer not in PREFERENCES
    ):
        _ignored(path, data)
        return None
    return offered, prefer


@dataclass(frozen=True)
class Resolution:
    """A resolution record: what was asked, the commit it resolved to, by whom and when."""

    #: The `LoadKey.text` it answers.
    asked: str
    #: The branch or tag the commit was found under.
    revision: str
    commit: str
    #: How the revision was chosen (`ResolvedRevision.how`).
    how: str
    variant: str
    #: Wall-clock seconds since the epoch (``time.time()``), shared by the machine's processes.
    time: float
    pid: int
    host: str

    @classmethod
    def now(cls, asked: str, revision: str, commit: str, how: str, variant: str) -> Resolution:
        return cls(asked, revision, commit, how, variant, time.time(), os.getpid(), _host())

    def by_this_process(self) -> bool:
        return (self.pid, self.host) == (os.getpid(), _host())


def record_resolution(folder: Path, digest: str, resolution: Resolution) -> None:
    """Write (atomically) the resolution record of the request whose key digest is `digest`."""
    data = {"format": _FORMAT, **resolution.__dict__}
    write_json(folder / FOLDER / _RESOLUTIONS / f"{digest}.json", data)


def read_resolution(folder: Path, digest: str, asked: str) -> Resolution | None:
    """The resolution record of the request `asked` (digest `digest`), if one is well formed."""
    path = folder / FOLDER / _RESOLUTIONS / f"{digest}.json"
    data = read_json(path, _MAX_RECORD_BYTES)
    if not isinstance(data, dict):
        _ignored(path, data)
        return None
    try:
        resolution = Resolution(**{k: v for k, v in data.items() if k != "format"})
    except (TypeError, AttributeError):
        _ignored(path, data)
        return None
    fine = (
        data.get("format") == _FORMAT
        and resolution.asked == asked
        and _short_text(resolution.revision)
        and isinstance(resolution.commit, str)
        and COMMIT_PATTERN.match(resolution.commit) is not None
        and _short_text(resolution.how)
        and isinstance(resolution.variant, str)
        and VARIANT_PATTERN.match(resolution.variant) is not None
        and isinstance(resolution.time, (int, float))
        and not isinstance(resolution.time, bool)
        and math.isfinite(resolution.time)
        and isinstance(resolution.pid, int)
        and _short_text(resolution.host)
    )
    if not fine:
        _ignored(path, data)
        return None
    return resolution


def _names_ok(commit: str, variant: str) -> bool:
    # Both become path components: nothing else may reach the file system.
    return bool(COMMIT_PATTERN.match(commit)) and bool(VARIANT_PATTERN.match(variant))


def _short_text(value: object) -> bool:
    return isinstance(value, str) and len(value) <= _MAX_TEXT and value.isprintable()


def write_json(path: Path, data: object) -> None:
    """Write `data` to `path` whole or not at all: readers see the old file or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data))
        tmp.replace(path)
    except OSError as exc:  # a read-only cache still works; it only remembers less
        logger.debug("could not write %s: %s", path, exc)
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def read_json(path: Path, limit: int) -> object | None:
    """The JSON value in `path`, or None when it is missing, too large or not JSON."""
    try:
        # Never through a link, never blocking on a FIFO: kernels writes plain files here.
        fd = os.open(path, _READ_FLAGS)
        with os.fdopen(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                logger.debug("ignoring %s: not a regular file", path)
                return None
            raw = file.read(limit + 1)
    except OSError:
        return None
    if len(raw) > limit:
        logger.debug("ignoring %s: larger than %d bytes", path, limit)
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError, UnicodeDecodeError):
        logger.debug("ignoring %s: not JSON", path)
        return None


def _ignored(path: Path, data: object) -> None:
    if data is not None:
        logger.debug("ignoring %s: not in the format kernels writes", path)


def _host() -> str:
    return socket.gethostname()[:_MAX_TEXT]


__all__ = [
    "FOLDER",
    "Resolution",
    "read_files",
    "read_listing",
    "read_resolution",
    "record_files",
    "record_listing",
    "record_resolution",
]
