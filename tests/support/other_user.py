"""Run a function as a second local user (``nobody``), for attacks that need one.

The suite runs as root here; a test that plays another user forks, and the child gives up
root for good (no supplementary groups, real, effective and saved ids of ``nobody``) before
it runs the attacker's function. The parent, the victim, keeps its own user. Without root
(a developer's machine) there is no second user to become, and such tests are skipped.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

#: ``nobody``'s user and group ids.
OTHER_UID = OTHER_GID = 65534


def require_root() -> None:
    if not hasattr(os, "fork") or os.geteuid() != 0:
        pytest.skip("needs root, to play a second local user in a forked child")


def _become_other_user() -> None:
    # Imported first: the interpreter's own files may be out of the other user's reach.
    from kernels.repos import receipt_key

    os.setgroups([])
    os.setresgid(OTHER_GID, OTHER_GID, OTHER_GID)
    os.setresuid(OTHER_UID, OTHER_UID, OTHER_UID)
    # Nothing the victim's process had in memory belongs to the attacker.
    receipt_key._keys.clear()


def _read_all(fd: int, deadline: float) -> bytes:
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError("the other user's process did not answer in time")
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def as_other_user(fn: Callable, *args, timeout: float = 60):
    """``fn(*args)`` run by another local user; its result (pickled back), or AssertionError
    with the exception it raised."""
    require_root()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        status = 0
        try:
            os.close(read)
            _become_other_user()
            result = ("ok", fn(*args))
        except BaseException as exc:
            result = ("error", f"{type(exc).__name__}: {exc}")
        try:
            os.write(write, pickle.dumps(result))
        except BaseException:
            status = 1
        os._exit(status)
    os.close(write)
    try:
        data = _read_all(read, time.monotonic() + timeout)
    except TimeoutError:
        os.kill(pid, signal.SIGKILL)
        raise
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    kind, value = pickle.loads(data)
    if kind == "error":
        raise AssertionError(f"as another user: {value}")
    return value


@contextlib.contextmanager
def held_by_other_user(fn: Callable, *args, timeout: float = 60) -> Iterator[object]:
    """Run ``fn(*args)`` as another user and keep that process alive (holding what `fn`
    opened) until the block ends; yields what `fn` returned."""
    require_root()
    read, write = os.pipe()
    release_read, release_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read)
            os.close(release_write)
            _become_other_user()
            result = ("ok", fn(*args))
        except BaseException as exc:
            result = ("error", f"{type(exc).__name__}: {exc}")
        os.write(write, pickle.dumps(result))
        os.close(write)
        os.read(release_read, 1)  # until the parent lets go (or exits)
        os._exit(0)
    os.close(write)
    os.close(release_read)
    try:
        kind, value = pickle.loads(_read_all(read, time.monotonic() + timeout))
        if kind == "error":
            raise AssertionError(f"as another user: {value}")
        yield value
    finally:
        os.close(release_write)
        os.close(read)
        os.waitpid(pid, 0)


def shared_folder() -> Path:
    """A new folder every local user can write (as a shared cache or /tmp is)."""
    folder = Path(tempfile.mkdtemp(prefix="kernels-shared-"))
    folder.chmod(0o777)
    return folder


def open_to_all(root: Path) -> None:
    """Make everything under `root` writable by every user (a cache everyone can write)."""
    root.chmod(0o777)
    for path in root.rglob("*"):
        if not path.is_symlink():
            path.chmod(0o777 if path.is_dir() else 0o666)
