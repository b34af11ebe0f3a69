"""Signatures of Hub kernels: KERNELS_REQUIRE_SIGNATURES=1 at load, and `kernels verify-signature`.

Only real bundles are used (tests/data/sigstore/README.md). No signed kernel metadata exists
offline, so a kernel that passes the signature stage is one whose metadata.json is the
wheel sigstore-python's bundle signs: it is then refused as metadata. The warm-load test
replaces the signature stage with a counter to see that it is not run again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import kernels
from kernels.cli import main
from kernels.errors import KernelSignatureError
from kernels.repos import signatures
from kernels.repos.hubclient import repo_cache_folder
from tests.support.digests import sha256_digests

pytestmark = pytest.mark.hub
pytest.importorskip(
    "sigstore", reason="needs the signatures extra: pip install 'kernels[signatures]'"
)

DATA = Path(__file__).resolve().parents[2] / "data" / "sigstore"
ARTIFACT = (DATA / "bundle_v3_github.whl").read_bytes()
BUNDLE = (DATA / "bundle_v3_github.whl.sigstore").read_bytes()
RFC8785_WORKFLOW = (
    "https://github.com/trailofbits/rfc8785.py/.github/workflows/release.yml@refs/tags/v0.1.2"
)
VARIANT = "torch-universal"


@pytest.fixture
def require(monkeypatch):
    monkeypatch.setenv(signatures.ENV_REQUIRE, "1")
    monkeypatch.delenv(signatures.ENV_SIGNERS, raising=False)


def _package(repo) -> str:
    return repo.repo_id.split("/")[1].replace("-", "_")


def _release_with_bundle(hub, metadata: bytes, *, variants=(VARIANT,)):
    repo = hub.create_repo()
    repo.write_kernel(version="1.0.0", variants=variants)
    for variant in variants:
        repo.write(f"build/{variant}/metadata.json", metadata)
        repo.write(f"build/{variant}/metadata.json.sigstore", BUNDLE)
    sha = repo.commit("release 1.0.0")
    repo.tag("v1.0.0").branch("v1")
    return repo, sha


def test_an_unsigned_kernel_is_refused_before_import(hub, require, monkeypatch, tmp_path):
    marker = tmp_path / "imported"
    repo = hub.create_repo()
    repo.write_kernel(version="0.1.0")
    repo.write(
        f"build/{VARIANT}/{_package(repo)}/__init__.py",
        f"open({str(marker)!r}, 'w').close()\nVERSION = '0.1.0'\n",
    )
    repo.commit("release 0.1.0")
    repo.tag("v0.1.0")

    with pytest.raises(KernelSignatureError, match="it has no signature") as caught:
        kernels.get_kernel(repo.repo_id, version="==0.1.0")
    message = str(caught.value)
    assert repo.repo_id in message and "Nothing was imported" in message
    assert "unset KERNELS_REQUIRE_SIGNATURES" in message
    assert not marker.exists()
    assert not [name for name in sys.modules if _package(repo) in name]

    monkeypatch.delenv(signatures.ENV_REQUIRE)  # the same kernel, not required: it imports
    assert kernels.get_kernel(repo.repo_id, version="==0.1.0").VERSION == "0.1.0"
    assert marker.exists()


def test_a_real_bundle_of_another_publisher_is_refused(hub, require, monkeypatch):
    repo, _ = _release_with_bundle(hub, ARTIFACT)
    with pytest.raises(KernelSignatureError, match="does not verify") as caught:
        kernels.get_kernel(repo.repo_id, version=1)
    assert f"signed by {RFC8785_WORKFLOW}" in str(caught.value)
    assert "KERNELS_SIGNERS" in str(caught.value)

    # Accepting that publisher: the signature verifies, and the signed bytes (a wheel) are
    # then refused as metadata, before anything parses the file as the kernel's.
    monkeypatch.setenv(signatures.ENV_SIGNERS, RFC8785_WORKFLOW)
    with pytest.raises(KernelSignatureError, match="not valid kernel metadata.*UTF-8"):
        kernels.get_kernel(repo.repo_id, version=1)


def test_a_verified_kernel_is_not_verified_again(hub, require, monkeypatch):
    repo = hub.create_repo()
    repo.write_kernel(version="1.0.0")
    meta = {
        "name": "activation",
        "id": "_activation_universal_abc",
        "version": 1,
        "license": "Apache-2.0",
        "python-depends": [],
        "backend": {"type": "cuda"},
        "digest": {"algorithm": "sha256", "files": sha256_digests(repo.path / "build" / VARIANT)},
    }
    repo.write(f"build/{VARIANT}/metadata.json", json.dumps(meta))
    repo.write(f"build/{VARIANT}/metadata.json.sigstore", BUNDLE)
    sha = repo.commit("release 1.0.0")
    repo.tag("v1.0.0")
    verified: list[bytes] = []
    monkeypatch.setattr(signatures, "_verify_bundle", lambda signed, *_: verified.append(signed))

    assert kernels.get_kernel(repo.repo_id, version="==1.0.0").VERSION == "1.0.0"
    assert len(verified) == 1  # once, though both the loader and kernel-depends ask
    folder = repo_cache_folder(repo.repo_id)
    receipt = folder / ".kernels-files" / sha / "signed" / f"{VARIANT}.json"
    assert json.loads(receipt.read_text())["format"] == 2

    variant = folder / "snapshots" / sha / "build" / VARIANT
    signatures.check_signature(variant)  # what the next process's load does
    assert len(verified) == 1

    receipt.write_text('{"format": 2, "seal": "forged"}')
    signatures.check_signature(variant)  # a receipt that does not match: verified again
    assert len(verified) == 2

    # A file changed after the receipt: the signature still stands, the digests do not.
    (variant / _package(repo) / "layers.py").resolve().write_text("import os\n")
    with pytest.raises(KernelSignatureError, match="integrity check failed.*layers.py"):
        signatures.check_signature(variant)
    assert len(verified) == 2


def test_cli_unsigned(hub, capsys):
    repo = hub.create_repo()
    repo.write_kernel(version="1.0.0")
    repo.commit("release")
    repo.branch("v1")
    assert main(["verify-signature", repo.repo_id, "1"]) == 1
    out = capsys.readouterr().out
    assert f"FAILED   {VARIANT}: cannot verify kernel integrity: it has no signature" in out
    assert main(["verify-signature", repo.repo_id, "1", "--filter-unsigned"]) == 0
    assert f"skipped  {VARIANT}:" in capsys.readouterr().out


def test_cli_with_a_real_bundle(hub, capsys):
    variants = (VARIANT, "torch28-cxx11-cu128-x86_64-linux")
    repo, sha = _release_with_bundle(hub, ARTIFACT, variants=variants)
    assert main(["verify-signature", repo.repo_id, "1", "--all-variants"]) == 1
    out = capsys.readouterr().out
    assert sha in out
    for variant in variants:
        assert f"FAILED   {variant}: the signature of metadata.json does not verify" in out
    argv = ["verify-signature", repo.repo_id, "==1.0.0", "--signer", RFC8785_WORKFLOW]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "not valid kernel metadata" in out and "does not verify" not in out
    assert main(["verify-signature", repo.repo_id, "1", "--signer", "me/relu"]) == 1
    assert "--signer: 'me/relu' is not a GitHub workflow URI" in capsys.readouterr().err
