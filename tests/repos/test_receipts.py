"""Verification receipts only this user can make (issue 56, point 2).

A receipt in the cache lets a warm load skip hashing files or verifying a signature. It is
sealed with a key only the user can read (kernels.repos.receipt_key): a second local user who
can write the cache swaps a file and writes the best receipt it can (the public algorithm, a
key of its own); the victim's next load ignores it, checks again, and refuses the file.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
from pathlib import Path

import pytest

from kernels.errors import KernelHashMismatchError, KernelSignatureError
from kernels.repos import digests, receipt_key, signatures
from kernels.repos.hashing import list_variant_files
from kernels.repos.info import Metadata
from tests.support.digests import sha256_digests
from tests.support.other_user import OTHER_UID, as_other_user, open_to_all, shared_folder

COMMIT = "0123456789abcdef0123456789abcdef01234567"
VARIANT = "torch-universal"


@pytest.fixture
def state(tmp_path, monkeypatch):
    """A fresh receipt key folder for the victim (this process)."""
    folder = tmp_path / "state" / "kernels"
    monkeypatch.setenv(receipt_key.ENV_STATE_DIR, str(folder))
    monkeypatch.setattr(receipt_key, "_keys", {})
    receipt_key._warn_once.cache_clear()
    return folder


@pytest.fixture
def shared():
    folder = shared_folder()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _snapshot(root: Path, *, bundle: bytes | None = None) -> tuple[Path, Metadata, dict]:
    """A kernel variant in huggingface_hub's cache layout under `root`, with file digests."""
    variant = root / "kernels--org--k" / "snapshots" / COMMIT / "build" / VARIANT
    (variant / "k").mkdir(parents=True)
    (variant / "k" / "__init__.py").write_text("VERSION = '1'\n")
    (variant / "k" / "layers.py").write_text("GOOD = True\n")
    files = sha256_digests(variant)
    meta = {"name": "k", "version": 1, "digest": {"algorithm": "sha256", "files": files}}
    (variant / "metadata.json").write_text(json.dumps(meta))
    if bundle is not None:
        (variant / "metadata.json.sigstore").write_bytes(bundle)
    return variant, Metadata.load_from_variant(variant), files


def _swap_and_forge_digest_receipt(variant: str, files: dict, state: str) -> None:
    """The attacker: another local user who can write the cache but not read the victim's key."""
    os.environ[receipt_key.ENV_STATE_DIR] = state
    variant_dir = Path(variant)
    (variant_dir / "k" / "layers.py").write_text("GOOD = False  # swapped\n")

    def refuse(path, why):
        raise RuntimeError(f"{path} {why}")

    listing = tuple(
        e
        for e in list_variant_files(variant_dir, refuse)
        if not e[0].startswith("metadata.json") and not e[0].endswith(".pyc")
    )
    receipt = digests.receipt_path(variant_dir)
    data = json.loads(receipt.read_text())
    if "listing" in data:  # an unsealed receipt: public inputs are all it takes
        data["listing"] = [list(e) for e in listing]
    else:  # a sealed one: the best a forger can do is a seal of its own key
        stamp = digests._stamp("sha256", files)
        data["seal"] = receipt_key.seal("digests", digests._sealed(variant_dir, stamp, listing))
    receipt.write_text(json.dumps(data))


def test_a_digest_receipt_forged_by_another_cache_writer_is_ignored(state, shared):
    variant, meta, files = _snapshot(shared / "hub")
    digests.check_digests(meta, variant)  # the victim's load: hashed, receipt written
    assert digests.receipt_path(variant).is_file()
    open_to_all(shared / "hub")  # a cache other users can write

    as_other_user(_swap_and_forge_digest_receipt, str(variant), files, str(shared / "attacker"))

    with pytest.raises(KernelHashMismatchError, match=r"k/layers.py has sha256"):
        digests.check_digests(meta, variant)


def _forge_signature_receipt(variant: str, state: str) -> None:
    os.environ[receipt_key.ENV_STATE_DIR] = state
    variant_dir = Path(variant)
    stamp = signatures._stamp(variant_dir, signatures.policies_from_env())
    receipt = digests.receipt_path(variant_dir, "signed")
    receipt.parent.mkdir(parents=True, exist_ok=True)
    if hasattr(signatures, "_sealed"):
        code = receipt_key.seal("signature", signatures._sealed(variant_dir, stamp))
        data = {"format": 2, "seal": code}
    else:  # an unsealed receipt: public inputs are all it takes
        data = {"format": 1, "stamp": stamp}
    receipt.write_text(json.dumps(data))


def test_a_signature_receipt_forged_by_another_cache_writer_is_ignored(state, shared, monkeypatch):
    # An unsigned build (the "bundle" is junk) whose files match its metadata's digests.
    variant, meta, _ = _snapshot(shared / "hub", bundle=b'{"not": "a bundle"}')
    digests.check_digests(meta, variant)
    open_to_all(shared / "hub")
    as_other_user(_forge_signature_receipt, str(variant), str(shared / "attacker"))
    monkeypatch.setenv(signatures.ENV_REQUIRE, "1")
    # Verified again: refused as no valid bundle (or for want of sigstore), never loaded.
    with pytest.raises(KernelSignatureError, match="not a valid bundle|needs the sigstore"):
        signatures.check_signature(variant)


def _try_to_read(path: str) -> str:
    try:
        Path(path).read_bytes()
    except PermissionError:
        return "refused"
    return "read"


def test_the_key_is_private_and_made_once(state):
    first = receipt_key.receipt_key()
    key_file = state / receipt_key.KEY_FILE
    assert first is not None and len(first) == 32 and key_file.read_bytes() == first
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    receipt_key._keys.clear()
    assert receipt_key.receipt_key() == first  # read back, not made again
    assert [p.name for p in state.iterdir()] == [receipt_key.KEY_FILE]  # no temporary left
    assert as_other_user(_try_to_read, str(key_file)) == "refused"


@pytest.mark.parametrize("flaw", ["group-readable", "world-readable", "foreign", "link", "short"])
def test_an_untrustworthy_key_is_refused_and_every_load_verifies(state, tmp_path, flaw, caplog):
    receipt_key.receipt_key()
    receipt_key._keys.clear()
    key_file = state / receipt_key.KEY_FILE
    if flaw == "group-readable":
        key_file.chmod(0o640)
    elif flaw == "world-readable":
        key_file.chmod(0o604)
    elif flaw == "foreign":
        if os.geteuid() != 0:
            pytest.skip("needs root to give the key to another user")
        os.chown(key_file, OTHER_UID, -1)
    elif flaw == "link":
        target = tmp_path / "elsewhere.key"
        target.write_bytes(key_file.read_bytes())
        target.chmod(0o600)
        key_file.unlink()
        key_file.symlink_to(target)
    else:
        key_file.write_bytes(b"short")
    with caplog.at_level(logging.WARNING, logger="kernels.repos.receipt_key"):
        assert receipt_key.receipt_key() is None
    assert "Verification receipts are not used" in caplog.text
    assert str(key_file) in caplog.text or flaw == "link"

    # Without a key, a load checks in full and leaves no receipt anyone could take for ours.
    variant, meta, _ = _snapshot(tmp_path / "hub")
    digests.check_digests(meta, variant)
    assert not digests.receipt_path(variant).exists()
    (variant / "k" / "layers.py").write_text("GOOD = False\n")
    with pytest.raises(KernelHashMismatchError):
        digests.check_digests(meta, variant)


def test_a_state_folder_of_another_user_is_refused(tmp_path, monkeypatch, caplog):
    if os.geteuid() != 0:
        pytest.skip("needs root to give the folder to another user")
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, OTHER_UID, OTHER_UID)
    monkeypatch.setenv(receipt_key.ENV_STATE_DIR, str(folder))
    monkeypatch.setattr(receipt_key, "_keys", {})
    receipt_key._warn_once.cache_clear()
    with caplog.at_level(logging.WARNING):
        assert receipt_key.receipt_key() is None
    assert "belongs to user 65534" in caplog.text
    assert not (folder / receipt_key.KEY_FILE).exists()


def test_a_receipt_of_another_variant_does_not_vouch_for_this_one(state, tmp_path):
    variant, meta, _ = _snapshot(tmp_path / "a")
    other, other_meta, _ = _snapshot(tmp_path / "b")
    digests.check_digests(meta, variant)
    digests.check_digests(other_meta, other)
    shutil.copy(digests.receipt_path(variant), digests.receipt_path(other))
    (other / "k" / "layers.py").write_text("GOOD = False\n")
    with pytest.raises(KernelHashMismatchError):
        digests.check_digests(other_meta, other)
