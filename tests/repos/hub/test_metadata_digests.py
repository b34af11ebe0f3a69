"""A Hub kernel whose metadata.json records file digests: checked once per snapshot, with a
receipt in the cache that a warm load trusts only while the files are as they were."""

from __future__ import annotations

import json

import pytest

import kernels
from kernels import KernelHashMismatchError
from kernels.repos import digests
from kernels.repos.hubclient import repo_cache_folder
from kernels.repos.info import Metadata
from tests.support.digests import sha256_digests

pytestmark = pytest.mark.hub

VARIANT = "torch-universal"


def _publish(hub):
    repo = hub.create_repo()
    repo.write_kernel(version="0.1.0", offset=1.0)
    variant = repo.path / "build" / VARIANT
    files = sha256_digests(variant)
    meta = {
        "name": "activation",
        "id": "_activation_universal_abc",
        "version": 1,
        "license": "Apache-2.0",
        "python-depends": [],
        "backend": {"type": "cuda"},
        "digest": {"algorithm": "sha256", "files": files},
    }
    repo.write(f"build/{VARIANT}/metadata.json", json.dumps(meta))
    sha = repo.commit("release 0.1.0")
    repo.tag("v0.1.0")
    return repo, sha


def test_digests_are_checked_once_per_snapshot(hub, monkeypatch):
    repo, sha = _publish(hub)
    assert kernels.get_kernel(repo.repo_id, version="==0.1.0").VERSION == "0.1.0"
    folder = repo_cache_folder(repo.repo_id)
    receipt = folder / ".kernels-files" / sha / "verified" / f"{VARIANT}.json"
    assert json.loads(receipt.read_text())["format"] == 2
    variant = folder / "snapshots" / sha / "build" / VARIANT
    meta = Metadata.load_from_variant(variant)

    hashed: list[str] = []
    real = digests._file_digest

    def counting(path, algorithm, refuse):
        hashed.append(path.name)
        return real(path, algorithm, refuse)

    monkeypatch.setattr(digests, "_file_digest", counting)
    digests.check_digests(meta, variant)  # warm: the receipt vouches for the same files
    assert hashed == []

    for hostile in (b"\xff", b"[" * 100_000, b'{"format": 1, "stamp": 3, "listing": {}}'):
        receipt.write_bytes(hostile)
        digests.check_digests(meta, variant)  # ignored: hashed again, and written anew
        assert sorted(hashed) == ["__init__.py", "layers.py"]
        hashed.clear()
        assert json.loads(receipt.read_text())["format"] == 2

    # A file altered in the cache after the receipt was written: its listing changed, so it
    # is hashed again and refused, named.
    package = repo.repo_id.split("/")[1].replace("-", "_")
    (variant / package / "layers.py").resolve().write_text("import os\n")
    with pytest.raises(KernelHashMismatchError, match=f"{package}/layers.py has sha256") as caught:
        digests.check_digests(meta, variant)
    assert f"delete {folder / 'snapshots' / sha}" in str(caught.value)
