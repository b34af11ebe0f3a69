"""A process forked while another thread imports a kernel can load kernels (issue 56, point
7): every lock of the loader is reset in the child (os.register_at_fork)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from kernels.repos.loader import import_package

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def _exit_status(pid: int, timeout: float) -> int | None:
    """The child's exit code, or None (after killing it) when it is still running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def test_a_child_forked_during_an_import_loads_a_kernel(tmp_path):
    started, go = tmp_path / "started", tmp_path / "go"
    slow = tmp_path / "slow" / "slow_kernel"
    slow.mkdir(parents=True)
    (slow / "__init__.py").write_text(
        "import os, time\n"
        f"open({str(started)!r}, 'w').close()\n"
        f"while not os.path.exists({str(go)!r}):\n"
        "    time.sleep(0.01)\n"
    )
    other = tmp_path / "other" / "other_kernel"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("VALUE = 7\n")

    importer = threading.Thread(target=import_package, args=(slow, "slow_kernel"), daemon=True)
    importer.start()
    try:
        _wait_for(started)  # the thread is inside the kernel's import, holding the loader
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 3
            try:
                code = 0 if import_package(other, "other_kernel").VALUE == 7 else 2
            finally:
                os._exit(code)
        status = _exit_status(pid, timeout=30)
    finally:
        go.touch()
        importer.join(30)
    assert status is not None, "the forked child hung on a lock the parent's thread held"
    assert status == 0
