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
logs, once, what it waits for, the lock file and who holds it (the process and its user,
from ``/proc/locks``, else the file's owner); the lock frees itself when its holder exits,
however it exits. The wait is bounded: after ``KERNELS_LOCK_TIMEOUT`` seconds (default 300;
0 waits not at all) the load goes on without coordinating with that process, with a WARNING
naming the lock and its holder. Going on is safe (the lock saves duplicate Hub requests and
downloads; huggingface_hub's own file locks keep each file whole), and it means that nobody
who can open a lock file can stall a load for ever.

Lock files are never held by other users: they are created 0600, or 0660 where the cache
folder is group-shared (its ``.locks/kernels`` folder has the set-group-ID bit and is group
writable, as a team's shared cache is set up; the group can then write the whole cache
anyway); an older lock file of ours with a wider mode is narrowed. They are opened with
``O_NOFOLLOW``, whatever the installed filelock does: a link planted where a lock file
belongs (CVE-2025-68146) is never followed, and the load goes on uncoordinated with a
WARNING. A lock file that cannot be created (a read-only cache) or that another user owns
leaves loading uncoordinated, as it was before, with one DEBUG log.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import stat
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
#: Seconds a process waits for another one's lock at most (then it goes on uncoordinated).
ENV_LOCK_TIMEOUT = "KERNELS_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT = 300.0


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
    file_lock: _FileLock | FileLock | None = None
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
    for entry in _entries.values():
        # Our copy of the parent's lock file descriptor: closing it leaves the parent's lock
        # held (a flock belongs to the open file, which the parent still has), and the
        # parent's release then frees it even while this child lives on.
        if isinstance(entry.file_lock, _FileLock):
            entry.file_lock.forget()
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


def lock_timeout() -> float:
    """The longest wait for another process's lock, in seconds (`ENV_LOCK_TIMEOUT`).

    Raises:
        KernelLoadError: the variable is not a number >= 0.
    """
    raw = os.environ.get(ENV_LOCK_TIMEOUT, "").strip()
    if not raw:
        return DEFAULT_LOCK_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise KernelLoadError(
            f"{ENV_LOCK_TIMEOUT}={raw!r} is not a number of seconds >= 0; it bounds how long a "
            f"kernel load waits for another process's lock (default {DEFAULT_LOCK_TIMEOUT:g})."
        )
    return value


class _FileLock:
    """A held ``flock`` on a lock file we opened ourselves (never through a link)."""

    def __init__(self, fd: int):
        self._fd: int | None = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor releases the flock

    def forget(self) -> None:
        """In a forked child: drop the inherited descriptor (the lock stays the parent's)."""
        with contextlib.suppress(OSError):
            self.release()


def _lock_file(key: LoadKey, lock_dir: Path | None) -> _FileLock | FileLock | None:
    """Take the key's file lock (waiting at most `lock_timeout`), or None where it cannot be
    made, is another user's, is a link, or stays held by another process past the bound."""
    if lock_dir is None:
        return None
    timeout = lock_timeout()
    path = lock_dir / f"{key.digest}.lock"
    try:
        lock_dir.mkdir(parents=True, exist_ok=True)
        if not _HAS_FLOCK:  # pragma: no cover - Windows
            return _filelock(path, timeout)
        fd = _open_lock_file(path)
    except OSError as exc:
        log = logger.warning if exc.errno == errno.ELOOP else logger.debug
        log(
            "cannot lock %s (%s); loading %s without coordinating with other processes",
            path,
            "it is a symbolic link, which kernels never follows: remove it"
            if exc.errno == errno.ELOOP
            else f"{type(exc).__name__}: {exc}",
            key.describe(),
        )
        return None
    import fcntl

    started = time.monotonic()
    told = False
    pause = 0.01
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return _FileLock(fd)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                os.close(fd)
                logger.debug("cannot lock %s (%s); loading uncoordinated", path, exc)
                return None
        waited = time.monotonic() - started
        if waited >= timeout:
            logger.warning(
                "Gave up waiting after %.0f s (%s) for the lock of %s: lock file %s, %s. "
                "Loading it without coordinating with that process (it may make the same Hub "
                "requests and download the same files). If that process is stuck, stop it.",
                waited,
                ENV_LOCK_TIMEOUT,
                key.describe(),
                path,
                _holder(fd, path),
            )
            os.close(fd)
            return None
        if not told and waited >= min(_PATIENCE_SECONDS, timeout):
            told = True
            logger.info(
                "Waiting for another process that resolves or downloads %s (lock file %s, %s); "
                "the lock frees itself when that process exits, and this load goes on "
                "uncoordinated after %g s (%s).",
                key.describe(),
                path,
                _holder(fd, path),
                timeout,
                ENV_LOCK_TIMEOUT,
            )
        time.sleep(min(pause, max(timeout - waited, 0.0)))
        pause = min(pause * 2, 0.25)


_HAS_FLOCK = hasattr(os, "O_NOFOLLOW") and os.name == "posix"


def _open_lock_file(path: Path) -> int:
    """Open (creating) a lock file without following a link, with a mode only this user (or,
    in a group-shared cache, its group) can open; refuse another user's file."""
    shared = _group_shared(path.parent)
    mode = 0o660 if shared else 0o600
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if info.st_uid == os.getuid():
            if stat.S_IMODE(info.st_mode) != mode:
                # An older, wider lock file; or a new one the umask narrowed below the group's.
                os.fchmod(fd, mode)
        elif not shared:
            raise OSError(errno.EPERM, f"the lock file belongs to {_user(info.st_uid)}", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _group_shared(folder: Path) -> bool:
    try:
        info = os.stat(folder)
    except OSError:
        return False
    return bool(info.st_mode & stat.S_ISGID and info.st_mode & stat.S_IWGRP)


def _holder(fd: int, path: Path) -> str:
    """Who holds the lock on `fd`'s file, for messages: the process and its user when
    ``/proc/locks`` says, else the file's owner."""
    try:
        info = os.fstat(fd)
    except OSError:
        return "held by another process"
    wanted = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        with open("/proc/locks") as locks:
            for line in locks:
                fields = line.split()
                # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; "->" marks a waiter.
                if "->" in fields or len(fields) < 6 or fields[5] != wanted:
                    continue
                pid = int(fields[4])
                if pid == os.getpid():
                    continue
                uid = os.stat(f"/proc/{pid}").st_uid
                return f"held by process {pid} of {_user(uid)}"
    except (OSError, ValueError):
        pass
    return f"held by another process; the file belongs to {_user(info.st_uid)}"


def _user(uid: int) -> str:
    try:
        import pwd

        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _filelock(path: Path, timeout: float):  # pragma: no cover - Windows
    from filelock import FileLock, Timeout

    if path.is_symlink():
        raise OSError(errno.ELOOP, "a symbolic link", str(path))
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=timeout)
    except Timeout:
        logger.warning("Gave up waiting for %s; loading uncoordinated", path)
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
