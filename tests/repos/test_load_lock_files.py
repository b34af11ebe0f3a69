"""The lock files of kernel loading (issue 56, points 3 and 4): no other user can hold one, a
wait for one is bounded and names who holds it, and a link is never followed."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from kernels.errors import KernelLoadError
from kernels.repos import load_locks
from kernels.repos.load_locks import LoadKey, hold
from tests.support.other_user import as_other_user, shared_folder

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

KEY = LoadKey("kernel", "org/k", "version=>=1")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def shared():
    folder = shared_folder()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _lock_path(lock_dir: Path) -> Path:
    return lock_dir / f"{KEY.digest}.lock"


def _try_to_hold(path: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY)
    except PermissionError:
        return "cannot open"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return "held"
    except OSError:
        return "busy"
    finally:
        os.close(fd)


def test_another_user_cannot_hold_a_lock_file(shared):
    lock_dir = shared / ".locks" / "kernels" / "kernels--org--k"
    with hold(KEY, lock_dir) as turn:
        assert turn.across_processes
    path = _lock_path(lock_dir)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert as_other_user(_try_to_hold, str(path)) == "cannot open"


def test_an_older_wider_lock_file_of_ours_is_narrowed(tmp_path):
    path = _lock_path(tmp_path)
    path.touch(mode=0o644)
    path.chmod(0o644)
    with hold(KEY, tmp_path):
        pass
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_group_shared_cache_gets_group_lock_files(tmp_path):
    lock_dir = tmp_path / "team"
    lock_dir.mkdir()
    lock_dir.chmod(0o2770)  # set-group-ID, group-writable: a team's shared cache
    with hold(KEY, lock_dir) as turn:
        assert turn.across_processes
    assert stat.S_IMODE(_lock_path(lock_dir).stat().st_mode) == 0o660


HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(600)
"""


def test_the_wait_for_a_held_lock_is_bounded_and_names_the_holder(tmp_path, monkeypatch, caplog):
    path = _lock_path(tmp_path)
    with hold(KEY, tmp_path):
        pass  # creates the file
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setenv(load_locks.ENV_LOCK_TIMEOUT, "1")
        outcome: list[bool] = []

        def load() -> None:
            with hold(KEY, tmp_path) as turn:
                outcome.append(turn.across_processes)

        with caplog.at_level(logging.INFO, logger="kernels.repos.load_locks"):
            waiter = threading.Thread(target=load, daemon=True)
            waiter.start()
            waiter.join(30)
        assert not waiter.is_alive(), "the load waited for the lock without bound"
        assert outcome == [False]  # it went on, uncoordinated
        warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warning) == 1
        assert str(path) in warning[0] and f"held by process {holder.pid}" in warning[0]
        assert "KERNELS_LOCK_TIMEOUT" in warning[0]
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("value", ["-1", "soon", "nan", "inf"])
def test_a_malformed_lock_timeout_is_an_error(tmp_path, monkeypatch, value):
    monkeypatch.setenv(load_locks.ENV_LOCK_TIMEOUT, value)
    with pytest.raises(KernelLoadError, match="KERNELS_LOCK_TIMEOUT"):
        with hold(KEY, tmp_path):
            pass


class _FilelockBefore3201:
    """What filelock before 3.20.1 did on Unix (CVE-2025-68146): open the lock path with
    O_TRUNC, following a link, and change the mode of whatever it reaches."""

    def __init__(self, path: str, *args, **kwargs):
        self.path = path
        self.fd: int | None = None

    def acquire(self, timeout: float = -1, **kwargs):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.fchmod(self.fd, 0o666)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def release(self, **kwargs):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _plant_link(lock_path: str, target: str) -> None:
    os.symlink(target, lock_path)


def test_a_link_planted_as_a_lock_file_is_never_followed(shared, tmp_path, monkeypatch, caplog):
    import filelock

    monkeypatch.setattr(filelock, "FileLock", _FilelockBefore3201)
    victim = tmp_path / "precious.txt"
    victim.write_text("the user's data\n")
    victim.chmod(0o600)
    lock_dir = shared / "locks"
    lock_dir.mkdir(mode=0o777)
    lock_dir.chmod(0o777)  # a cache every user can write
    as_other_user(_plant_link, str(_lock_path(lock_dir)), str(victim))

    with caplog.at_level(logging.WARNING, logger="kernels.repos.load_locks"):
        with hold(KEY, lock_dir) as turn:
            assert not turn.across_processes
    assert victim.read_text() == "the user's data\n"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert "symbolic link" in caplog.text and str(_lock_path(lock_dir)) in caplog.text


def test_filelock_is_at_least_the_fixed_release():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (spec,) = [
        Requirement(r).specifier
        for r in project["project"]["dependencies"]
        if Requirement(r).name == "filelock"
    ]
    assert "3.20.1" in spec and "3.20.0" not in spec and "3.19.1" not in spec


def test_o_nofollow_refuses_a_link(tmp_path):
    # The primitive the lock files rely on, on this platform.
    (tmp_path / "target").touch()
    (tmp_path / "link").symlink_to(tmp_path / "target")
    with pytest.raises(OSError) as caught:
        os.open(tmp_path / "link", os.O_RDWR | os.O_NOFOLLOW)
    assert caught.value.errno == errno.ELOOP
