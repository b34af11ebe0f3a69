"""Every read of the Hub cache is guarded (issue 56, point 6): whatever a cache writer leaves
in ``refs/``, ``snapshots/`` or kernels' records, a load gets our own errors or ignores the
file, never a raw UnicodeDecodeError, PermissionError or a hang. Property-based over the
cache layout, beside the parsers' own (tests/repos/test_parsers.py)."""

from __future__ import annotations

import os
import shutil
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernels.errors import KernelLoadError, KernelsError
from kernels.repos import cache_records, hubclient
from kernels.repos.loaded import read_metadata
from tests.support.other_user import as_other_user, shared_folder

REPO = "org/k"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
VARIANT = "torch-universal"

names = st.text(string.ascii_letters + string.digits + "-_.", min_size=1, max_size=12).filter(
    lambda n: n not in (".", "..")
)
contents = st.one_of(
    st.binary(max_size=300),
    st.just(COMMIT.encode()),
    st.just(b"\xff\xfe" + COMMIT.encode()),
    st.just((COMMIT + "\n").encode()),
    st.builds(lambda n: b"x" * n, st.integers(0, 5000)),
)
# What a cache writer can put where a file belongs: bytes, a folder, a link, a FIFO.
entries = st.one_of(
    st.tuples(st.just("file"), contents),
    st.tuples(st.just("folder"), st.just(b"")),
    st.tuples(st.just("link"), st.sampled_from([b"/etc/hostname", b"nowhere", b"."])),
    st.tuples(st.just("fifo"), st.just(b"")),
)


def _plant(path: Path, kind: str, content: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        return
    if kind == "file":
        path.write_bytes(content)
    elif kind == "folder":
        path.mkdir()
    elif kind == "link":
        path.symlink_to(content.decode())
    else:
        os.mkfifo(path)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "hub"
    root.mkdir()
    monkeypatch.setattr(hubclient, "cache_dir", lambda: root)
    return root


_SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_SETTINGS
@given(st.dictionaries(st.lists(names, min_size=1, max_size=3).map(tuple), entries, max_size=6))
def test_refs_give_commits_or_are_ignored(cache, planted):
    folder = hubclient.repo_cache_folder(REPO)
    shutil.rmtree(folder, ignore_errors=True)
    for parts, (kind, content) in planted.items():
        _plant(folder / "refs" / Path(*parts), kind, content)
    refs = hubclient.cached_refs(REPO)
    for name, commit in refs.items():
        assert hubclient.COMMIT_PATTERN.match(commit), (name, commit)
        path = folder / "refs" / name
        assert path.is_file() and not path.is_symlink()
    assert hubclient.cached_commits(REPO) == []


@_SETTINGS
@given(st.dictionaries(names, entries, max_size=6))
def test_snapshots_list_commit_folders_only(cache, planted):
    folder = hubclient.repo_cache_folder(REPO)
    shutil.rmtree(folder, ignore_errors=True)
    for name, (kind, content) in planted.items():
        _plant(folder / "snapshots" / name, kind, content)
    _plant(folder / "snapshots" / COMMIT, "folder", b"")
    assert COMMIT in hubclient.cached_commits(REPO)
    assert all(hubclient.COMMIT_PATTERN.match(c) for c in hubclient.cached_commits(REPO))


@_SETTINGS
@given(entries, entries, entries)
def test_records_are_read_or_ignored(cache, files, listing, resolution):
    folder = hubclient.repo_cache_folder(REPO)
    shutil.rmtree(folder, ignore_errors=True)
    records = folder / cache_records.FOLDER
    _plant(records / COMMIT / f"{VARIANT}.json", *files)
    _plant(records / COMMIT / "listing.json", *listing)
    _plant(records / "asked" / f"{'0' * 32}.json", *resolution)
    noted = cache_records.read_files(folder, COMMIT, VARIANT)
    assert noted is None or all(isinstance(f, str) for f in noted)
    assert cache_records.read_listing(folder, COMMIT) in (None,) or isinstance(
        cache_records.read_listing(folder, COMMIT), tuple
    )
    assert cache_records.read_resolution(folder, "0" * 32, "kernel:org/k:x") is None


@_SETTINGS
@given(entries)
def test_a_snapshot_s_metadata_is_read_or_refused_with_our_error(cache, metadata):
    variant = hubclient.repo_cache_folder(REPO) / "snapshots" / COMMIT / "build" / VARIANT
    shutil.rmtree(hubclient.repo_cache_folder(REPO), ignore_errors=True)
    (variant / "k").mkdir(parents=True)
    (variant / "k" / "__init__.py").write_text("")
    _plant(variant / "metadata.json", *metadata)
    try:
        read_metadata(variant / "k")
    except KernelsError as exc:  # ours, naming the file; anything else fails the test
        assert str(variant / "metadata.json") in str(exc)


def _refs_as_this_user(cache_root: str) -> object:
    hubclient.cache_dir = lambda: Path(cache_root)  # in the child only
    try:
        return hubclient.cached_refs(REPO)
    except KernelLoadError as exc:
        return f"KernelLoadError: {exc}"


def test_unreadable_refs_are_our_errors_for_another_user(caplog):
    shared = shared_folder()
    try:
        refs = shared / "hub" / "kernels--org--k" / "refs"
        refs.mkdir(parents=True)
        for folder in (shared / "hub", refs.parent, refs):
            folder.chmod(0o755)
        (refs / "v1").write_text(COMMIT)
        (refs / "v2").write_text(COMMIT)
        (refs / "v2").chmod(0o600)  # another user's stray file: unreadable to this one
        assert as_other_user(_refs_as_this_user, str(shared / "hub")) == {"v1": COMMIT}

        (refs / "private").mkdir(mode=0o700)  # a folder it cannot list
        answer = as_other_user(_refs_as_this_user, str(shared / "hub"))
        assert isinstance(answer, str) and answer.startswith("KernelLoadError: Cannot list")
        assert str(refs / "private") in answer and "Fix its permissions" in answer
    finally:
        shutil.rmtree(shared, ignore_errors=True)
