"""Commit ids: SHA-1 (40 hex) and SHA-256 (64 hex) are both full commits (kernels 0.19)."""

from __future__ import annotations

import pytest

from kernels.repos import cache_records
from kernels.repos.hubclient import COMMIT_PATTERN


@pytest.mark.parametrize("commit", ["a" * 40, "0123456789abcdef" * 4])
def test_sha1_and_sha256_commits_are_full_commits(commit):
    assert COMMIT_PATTERN.match(commit)


@pytest.mark.parametrize(
    "value", ["a" * 39, "a" * 41, "a" * 63, "a" * 65, "A" * 40, "g" * 64, "a" * 64 + "\n", "main"]
)
def test_anything_else_is_not(value):
    assert not COMMIT_PATTERN.match(value)


def test_cache_records_of_a_sha256_commit_are_kept(tmp_path):
    commit = "0123456789abcdef" * 4
    offered = ["torch-2.10-cuda-12.8-cpython-3.9-abi3-x86_64-linux", "sdk", "torch-cuda"]
    cache_records.record_listing(tmp_path, commit, offered, "compiled")
    assert cache_records.read_listing(tmp_path, commit) == (sorted(offered), "compiled")
    cache_records.record_files(tmp_path, commit, "torch-cuda", ["__init__.py"])
    assert cache_records.read_files(tmp_path, commit, "torch-cuda") == ("__init__.py",)
    # A 63-hex name is no commit: nothing is noted under it.
    cache_records.record_listing(tmp_path, commit[:-1], offered, "compiled")
    assert cache_records.read_listing(tmp_path, commit[:-1]) is None
