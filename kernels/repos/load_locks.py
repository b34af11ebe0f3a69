"""The locks of kernel loading: one resolution and download at a time per request, no deadlock.

Loading a Hub kernel has two phases, and they are locked apart:

1. **Resolve and download**, under the lock of a `LoadKey` (repository type, repository id
   and what was asked: a revision, a version specifier or a commit). `hold` takes a
   re-entrant lock per key inside the process and, where the cache can be written, a file
   lock per key beside it (``<HF_HUB_CACHE>/.locks/kernels/<repo folder>/<digest>.lock``),
   so the threads and the processes of one machine (torchrun ranks, dataloader workers)
   that ask for the same thing at once make one set of Hub requests and one download: the
   first resolves and downloads while the others wait, then they use what it found
   (`Turn.in_flight` in the process, a resolution record in the cache across processes).
2. **Import**, under no lock of this module. `kernels.repos.loader` imports one kernel
   package at a time per process (one re-entrant lock) and once per folder; `importing`
   refuses a cycle (a kernel whose import loads, directly or through other kernels,
   itself) with a `KernelLoadError` instead of recursing.

Why this cannot deadlock. A deadlock needs a cycle of threads, each holding a lock the next
one waits for. Here:

* a key lock is held only while resolving and downloading, when no kernel code runs; the
  only locks taken while holding one are the lock of the commit it resolved to (the
  download of that commit) and huggingface_hub's own per-file locks, whose holders take no
  key (commit keys and huggingface_hub's locks are leaves). Key locks are thus always
  taken in the order *request, then commit*, never the other way round; the file locks
  follow the same order, each taken just after its key's thread lock;
* the import lock (the loader's) is never taken while a key lock is held, so a thread that
  imports a kernel and, from that kernel's code, waits for a key lock waits for a holder
  that never waits for the import lock; it finishes its download and lets go;
* kernel code runs only under the import lock, which is one re-entrant lock: a kernel that
  loads another kernel at import imports it in the same thread, and two threads can never
  each hold a kernel import the other one waits for. The only cycle left is within one
  thread (X's import loads Y, whose import loads X), and `importing` detects it. (A lock
  per package folder beside the loader's would bring a cycle back: thread 1 holds Y's
  folder and waits for the loader's lock, which thread 2 holds while X's import waits for
  Y's folder. So the loader's one lock stays the only import lock.)

A child forked while a thread of its parent held a key (a dataloader worker) forgets the
parent's holds, whose threads do not exist in it, and waits for the parent's file locks
like any other process.

A lock is the place where ``kernels`` waits for another process: after 10 s the waiter
logs, once, what it waits for and where the lock file is (the lock frees itself when its
holder exits, however it exits). A lock file that cannot be created (a read-only cache)
leaves loading uncoordinated, as it was before, with one DEBUG log.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import KernelLoadError

if TYPE_CHECKING:
    from filelock import FileLock

logger = logging.getLogger(__name__)

#: Seconds a process waits for another one's lock before it says so in the log.
_PATIENCE_SECONDS = 10.0


@dataclass(frozen=True)
class LoadKey:
    """What one resolution and download is for: a repository and what was asked of it.

    `asked` is ``"commit=<hash>"`` for a full commit hash, ``"revision='<name>'"`` for a
    branch or tag, ``"version=<specifier>"`` or ``"version=<N>"`` for a version.
    """

    repo_type: str
    repo_id: str
    asked: str

    @property
    def text(self) -> str:
        """The key as one line, as resolution records store it."""
        return f"{self.repo_type}:{self.repo_id}:{self.asked}"

    @property
    def digest(self) -> str:
        """A file name for the key: what was asked may hold any character."""
        return hashlib.sha256(self.text.encode("utf-8", "surrogatepass")).hexdigest()[:32]

    def describe(self) -> str:
        return f"{self.repo_id} ({self.asked})"


@dataclass
class _Entry:
    """The process's state for one key while some thread holds or waits for it."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    users: int = 0
    #: How deep the holding thread has entered (re-entrant holds share one file lock).
    depth: int = 0
    file_lock: FileLock | None = None
    #: The last result a holder published, with the monotonic time it was published.
    result: tuple[float, object] | None = None


_entries: dict[LoadKey, _Entry] = {}
_entries_lock = threading.Lock()


def _forget_after_fork() -> None:
    """In a forked child (a dataloader worker), forget the parent's holds.

    A thread of the parent may have held a key at the fork: in the child that thread does
    not exist, and its locks would stay taken for ever. The child starts afresh; the
    parent's file locks are left alone (releasing them here would release the parent's),
    and the child waits for them like any other process.
    """
    global _entries, _entries_lock
    _entries = {}
    _entries_lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_after_fork)


@dataclass
class Turn:
    """A thread's hold of a key (see `hold`)."""

    key: LoadKey
    #: Whether other processes are kept out too (False: the lock file could not be made).
    across_processes: bool
    _entry: _Entry
    _started: float

    def in_flight(self) -> object | None:
        """What another thread of this process published for the key while this one waited.

        Only a result published after this thread asked is returned: it is as fresh as an
        answer this thread would have got itself, so sharing it never serves an old one.
        """
        result = self._entry.result
        if result is None or result[0] < self._started:
            return None
        return result[1]

    def publish(self, result: object) -> None:
        """Offer `result` to the threads waiting for this key."""
        self._entry.result = (time.monotonic(), result)


@contextlib.contextmanager
def hold(key: LoadKey, lock_dir: Path | None) -> Iterator[Turn]:
    """Hold `key`: the only thread of this process, and where `lock_dir` can be written the
    only process of this machine, that resolves and downloads it.

    Re-entrant within a thread. Never run kernel code while holding a key (see the module
    docstring); the holder may take the key of the commit it resolved to, nothing else.

    Args:
        key: what is resolved and downloaded.
        lock_dir: the folder of the key's lock file, or None for no file lock.
    """
    started = time.monotonic()
    with _entries_lock:
        entry = _entries.setdefault(key, _Entry())
        entry.users += 1
    try:
        with entry.lock:
            if entry.depth == 0:
                entry.file_lock = _lock_file(key, lock_dir)
            entry.depth += 1
            try:
                yield Turn(key, entry.file_lock is not None, entry, started)
            finally:
                entry.depth -= 1
                if entry.depth == 0 and entry.file_lock is not None:
                    file_lock, entry.file_lock = entry.file_lock, None
                    with contextlib.suppress(OSError):
                        file_lock.release()
    finally:
        with _entries_lock:
            entry.users -= 1
            if entry.users == 0:
                # Nobody waits: a published result could only serve later callers, which
                # must ask for themselves.
                del _entries[key]


def _lock_file(key: LoadKey, lock_dir: Path | None) -> FileLock | None:
    """Take the key's file lock (blocking), or None where it cannot be made."""
    if lock_dir is None:
        return None
    from filelock import FileLock, Timeout

    path = lock_dir / f"{key.digest}.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path))
        try:
            lock.acquire(timeout=_PATIENCE_SECONDS)
        except Timeout:
            logger.info(
                "Waiting for another process that resolves or downloads %s (lock file %s); "
                "if no such process runs, the lock frees itself when it exits.",
                key.describe(),
                path,
            )
            lock.acquire()
    except OSError as exc:
        logger.debug(
            "cannot lock %s (%s: %s); loading %s without coordinating with other processes",
            path,
            type(exc).__name__,
            exc,
            key.describe(),
        )
        return None
    return lock


_importing = threading.local()


@contextlib.contextmanager
def importing(package_dir: Path, what: str) -> Iterator[None]:
    """Mark `package_dir` as being imported by this thread for the duration of the block.

    Raises:
        KernelLoadError: this thread is already importing `package_dir`: its import loads,
            directly or through other kernels, the same kernel again, which can never
            finish (Python would hand out a half-initialised module).
    """
    package_dir = Path(package_dir).resolve()
    stack: list[tuple[Path, str]] = _importing.__dict__.setdefault("stack", [])
    for i, (folder, _) in enumerate(stack):
        if folder == package_dir:
            chain = " -> ".join([name for _, name in stack[i:]] + [what])
            raise KernelLoadError(
                f"Cyclic kernel import: {chain}. A kernel cannot load itself, or a kernel "
                "that loads it, while it is being imported. Load the other kernel lazily "
                "(inside the function that needs it), or break the cycle."
            )
    stack.append((package_dir, what))
    try:
        yield
    finally:
        stack.pop()


def lock_folder(cache_dir: Path, repo_folder_name: str) -> Path:
    """Where the lock files of one repository's loads live in the Hub cache.

    Beside huggingface_hub's own ``.locks``, which its cache scans and deletes skip; a lock
    file in the repository's folder would make a repository that was never downloaded
    (a mistyped id) show up as a corrupted cache entry.
    """
    return cache_dir / ".locks" / "kernels" / repo_folder_name


__all__ = ["LoadKey", "Turn", "hold", "importing", "lock_folder"]
