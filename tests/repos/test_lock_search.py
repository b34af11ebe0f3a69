"""The search for a project's ``kernels.lock`` (a locked load called without ``lockfile=``)
stays in the user's own folders (issue 56, point 5): a lock planted in a world-writable
ancestor (``/tmp``) or in another user's folder is never read."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import types
from pathlib import Path

import pytest

from kernels.errors import KernelLockError
from kernels.repos import project
from kernels.repos.lock import lock_source
from tests.support.other_user import OTHER_UID, as_other_user, shared_folder

CALLER = "kernels_test_lock_search_caller"
# A lock that would pin a commit and trust an organisation of the attacker's choice.
PLANTED = [
    {
        "repo_id": "evil-org/activation",
        "sha": "0123456789abcdef0123456789abcdef01234567",
        "variants": {"torch-universal": {"hash": "sha256-" + "ab" * 32}},
    }
]


@pytest.fixture
def shared():
    folder = shared_folder()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _caller_in(folder: Path, monkeypatch) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "caller.py"
    source.write_text("")
    module = types.ModuleType(CALLER)
    module.__file__ = str(source)
    monkeypatch.setitem(sys.modules, CALLER, module)


def _plant(path: str) -> None:
    Path(path).write_text(json.dumps(PLANTED))


def test_a_lock_planted_in_a_world_writable_ancestor_is_never_read(shared, monkeypatch):
    as_other_user(_plant, str(shared / "kernels.lock"))
    _caller_in(shared / "code", monkeypatch)
    with pytest.raises(KernelLockError, match="No kernels.lock found") as caught:
        lock_source(None, caller=CALLER)
    assert f"the search stopped at {shared}: other users can write it" in str(caught.value)


def _own_folder_with_lock(path: str) -> None:
    folder = Path(path)
    folder.mkdir(mode=0o755)
    (folder / "kernels.lock").write_text(json.dumps(PLANTED))


def test_a_lock_in_another_user_s_folder_is_never_read(shared, monkeypatch):
    as_other_user(_own_folder_with_lock, str(shared / "theirs"))
    assert (shared / "theirs").stat().st_uid == OTHER_UID
    _caller_in(shared / "theirs" / "code", monkeypatch)  # root may write there; nobody else
    os.chmod(shared / "theirs" / "code", 0o755)
    with pytest.raises(KernelLockError) as caught:
        lock_source(None, caller=CALLER)
    assert f"the search stopped at {shared / 'theirs'}: it belongs to another user" in str(
        caught.value
    )


def test_the_user_s_own_lock_is_used_and_named(tmp_path, monkeypatch, caplog):
    project = tmp_path / "project"
    _caller_in(project / "src", monkeypatch)
    (project / "kernels.lock").write_text("[]")
    with caplog.at_level(logging.INFO, logger="kernels.repos.lock"):
        source = lock_source(None, caller=CALLER)
    assert source.description == f"lock file {project / 'kernels.lock'}"
    assert f"come from {project / 'kernels.lock'}" in caplog.text


def test_untrusted_folder(tmp_path):
    assert project.untrusted_folder(tmp_path) is None
    tmp_path.chmod(0o775)
    assert "other users can write it" in project.untrusted_folder(tmp_path)
    tmp_path.chmod(0o700)
    assert "cannot be inspected" in project.untrusted_folder(tmp_path / "missing")
