"""Signature checks of build variants, against REAL sigstore bundles only.

No signed kernel metadata can be had offline, so the signature stage is tested on
sigstore-python's production test bundle (tests/data/sigstore/README.md): its signed
artifact, a wheel, stands in for a variant's metadata.json. It passes the signature stage
under a policy for its real signer and then fails, as it must, as metadata. The digest
stage is tested on real metadata with digests, with the signature stage replaced (that
stage is covered by the bundle tests above it).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from kernels.errors import KernelSignatureError
from kernels.repos import signatures
from kernels.repos.signatures import (
    DEFAULT_POLICIES,
    GitHubWorkflowPolicy,
    Status,
    check_signature,
    policies_from_env,
    verify_variant,
)
from tests.support.children import run_python
from tests.support.digests import sha256_digests
from tests.support.paths import subprocess_env

pytest.importorskip(
    "sigstore", reason="needs the signatures extra: pip install 'kernels[signatures]'"
)

DATA = Path(__file__).resolve().parents[1] / "data" / "sigstore"
ARTIFACT = (DATA / "bundle_v3_github.whl").read_bytes()
BUNDLE = (DATA / "bundle_v3_github.whl.sigstore").read_bytes()
OTHER_ARTIFACT = (DATA / "bundle_v3.txt").read_bytes()

#: The identity that really signed the test bundle.
RFC8785 = GitHubWorkflowPolicy(
    "trailofbits/rfc8785.py",
    ("https://github.com/trailofbits/rfc8785.py/.github/workflows/release.yml@refs/tags/v0.1.2",),
)


def _variant(tmp_path: Path, metadata: bytes | None, bundle: bytes | None) -> Path:
    variant = tmp_path / "build" / "torch-cpu"
    variant.mkdir(parents=True)
    if metadata is not None:
        (variant / "metadata.json").write_bytes(metadata)
    if bundle is not None:
        (variant / "metadata.json.sigstore").write_bytes(bundle)
    return variant


def test_the_real_signer_passes_the_signature_stage_then_the_wheel_is_no_metadata(tmp_path):
    result = verify_variant(_variant(tmp_path, ARTIFACT, BUNDLE), [RFC8785])
    # The signature verified (else SIGNATURE_INVALID); the signed bytes are a wheel, so the
    # next stage refuses them as metadata. This is as far as a real bundle gets offline.
    assert result.status is Status.METADATA_INVALID, result
    assert "UTF-8" in result.reason
    assert result.summary().startswith("torch-cpu: cannot verify kernel integrity")


def test_the_offline_trust_root_is_not_reported_as_a_warning(tmp_path, caplog):
    # Offline is this module's documented default; sigstore's notice of it would read as a fault.
    with caplog.at_level(logging.DEBUG):
        verify_variant(_variant(tmp_path, ARTIFACT, BUNDLE), [RFC8785])
    assert not [r for r in caplog.records if "offline mode" in r.getMessage()]


def test_one_changed_byte_fails_the_signature(tmp_path):
    tampered = bytearray(ARTIFACT)
    tampered[len(tampered) // 2] ^= 1
    result = verify_variant(_variant(tmp_path, bytes(tampered), BUNDLE), [RFC8785])
    assert result.status is Status.SIGNATURE_INVALID
    assert "digest mismatch" in result.reason


def test_the_default_policy_refuses_another_publisher(tmp_path):
    variant = _variant(tmp_path, ARTIFACT, BUNDLE)
    result = verify_variant(variant)
    assert result.status is Status.SIGNATURE_INVALID
    assert "signed by https://github.com/trailofbits/rfc8785.py/" in result.reason, result.reason
    assert "accepted signers are huggingface/kernels-community" in result.reason
    # Any one policy that matches suffices.
    assert verify_variant(variant, [*DEFAULT_POLICIES, RFC8785]).status is Status.METADATA_INVALID


def test_a_wrong_workflow_of_the_right_repository_is_refused(tmp_path):
    release_v2 = GitHubWorkflowPolicy(
        "trailofbits/rfc8785.py",
        (
            "https://github.com/trailofbits/rfc8785.py/.github/workflows/release.yml@refs/tags/v0.2.0",
        ),
    )
    result = verify_variant(_variant(tmp_path, ARTIFACT, BUNDLE), [release_v2])
    assert result.status is Status.SIGNATURE_INVALID


def test_a_bundle_for_another_artifact_fails_the_signature(tmp_path):
    result = verify_variant(_variant(tmp_path, OTHER_ARTIFACT, BUNDLE), [RFC8785])
    assert result.status is Status.SIGNATURE_INVALID


def test_missing_files(tmp_path):
    assert verify_variant(_variant(tmp_path / "a", ARTIFACT, None)).status is Status.BUNDLE_MISSING
    result = verify_variant(_variant(tmp_path / "b", None, BUNDLE), [RFC8785])
    assert result.status is Status.METADATA_MISSING


@pytest.mark.parametrize(
    "bundle",
    [
        BUNDLE[: len(BUNDLE) // 2],  # truncated
        b"[" * 100_000,  # nested past any parser's comfort
        b"\xff\xfe",  # not UTF-8
        b'{"mediaType": 3}',  # JSON, not a bundle
        BUNDLE.replace(b'"mediaType"', b'"mediaType": 1, "mediaType"', 1),  # duplicate key
        b"",
    ],
    ids=["truncated", "deep", "not-utf8", "wrong-shape", "duplicate-key", "empty"],
)
def test_a_malformed_bundle_is_invalid(tmp_path, bundle):
    result = verify_variant(_variant(tmp_path, ARTIFACT, bundle), [RFC8785])
    assert result.status is Status.BUNDLE_INVALID, result
    assert result.reason


def test_a_huge_bundle_is_refused_unread(tmp_path):
    result = verify_variant(_variant(tmp_path, ARTIFACT, b" " * (2 << 20)), [RFC8785])
    assert result.status is Status.BUNDLE_INVALID
    assert "refused unread" in result.reason


# The digest stage: real metadata with digests, the signature stage replaced.


def _digested_variant(tmp_path: Path, *, with_digest: bool = True) -> Path:
    variant = _variant(tmp_path, None, BUNDLE)
    package = variant / "relu"
    package.mkdir()
    (package / "__init__.py").write_text("def relu(x):\n    return x\n")
    (package / "_ops.py").write_text("OPS = 1\n")
    files = sha256_digests(variant)
    meta = {
        "name": "relu",
        "id": "_relu_cpu_abc",
        "version": 1,
        "license": "Apache-2.0",
        "python-depends": [],
        "backend": {"type": "cpu"},
    }
    if with_digest:
        meta["digest"] = {"algorithm": "sha256", "files": files}
    (variant / "metadata.json").write_text(json.dumps(meta))
    return variant


@pytest.fixture
def signature_passes(monkeypatch):
    verified: list[bytes] = []
    monkeypatch.setattr(signatures, "_verify_bundle", lambda signed, *_: verified.append(signed))
    return verified


def test_digest_stage(tmp_path, signature_passes):
    variant = _digested_variant(tmp_path)
    result = verify_variant(variant)
    assert result.status is Status.VERIFIED and result.ok
    assert signature_passes == [(variant / "metadata.json").read_bytes()]

    (variant / "relu" / "_ops.py").write_text("OPS = 2\n")
    result = verify_variant(variant)
    assert result.status is Status.DIGEST_MISMATCH
    assert "relu/_ops.py has sha256" in result.reason

    (variant / "relu" / "_ops.py").write_text("OPS = 1\n")
    (variant / "relu" / "extra.py").write_text("")
    assert "is not listed in the digests" in verify_variant(variant).reason


def test_signed_metadata_without_digests(tmp_path, signature_passes):
    result = verify_variant(_digested_variant(tmp_path, with_digest=False))
    assert result.status is Status.DIGEST_MISSING


def test_malformed_digests_are_invalid_metadata(tmp_path, signature_passes):
    variant = _digested_variant(tmp_path)
    meta = json.loads((variant / "metadata.json").read_text())
    meta["digest"]["algorithm"] = "md5"
    (variant / "metadata.json").write_text(json.dumps(meta))
    assert verify_variant(variant).status is Status.METADATA_INVALID


# Policies and settings.


def test_policies_are_validated():
    with pytest.raises(ValueError, match="org/name"):
        GitHubWorkflowPolicy("not a repo", ("x",))
    with pytest.raises(ValueError, match="at least one workflow"):
        GitHubWorkflowPolicy("me/kernels", ())
    with pytest.raises(ValueError, match="not a workflow URI of me/kernels"):
        GitHubWorkflowPolicy(
            "me/kernels",
            ("https://github.com/you/kernels/.github/workflows/b.yaml@refs/heads/main",),
        )
    with pytest.raises(ValueError, match="not a GitHub workflow URI"):
        GitHubWorkflowPolicy.from_workflow("https://example.com/build.yaml")
    assert GitHubWorkflowPolicy.from_workflow(RFC8785.workflows[0]) == RFC8785


def test_signers_from_the_environment(monkeypatch):
    monkeypatch.setenv(signatures.ENV_SIGNERS, f" {RFC8785.workflows[0]} ,")
    assert policies_from_env() == (*DEFAULT_POLICIES, RFC8785)
    monkeypatch.setenv(signatures.ENV_SIGNERS, "trailofbits/rfc8785.py")
    with pytest.raises(KernelSignatureError, match="KERNELS_SIGNERS.*not a GitHub workflow URI"):
        policies_from_env()


def test_require_setting(monkeypatch):
    monkeypatch.setenv(signatures.ENV_REQUIRE, "maybe")
    with pytest.raises(KernelSignatureError, match="neither 1 nor 0"):
        signatures.signatures_required()
    monkeypatch.setenv(signatures.ENV_REQUIRE, "0")
    assert not signatures.signatures_required()


def test_local_folders_are_exempt(tmp_path, monkeypatch):
    monkeypatch.setenv(signatures.ENV_REQUIRE, "1")
    check_signature(_variant(tmp_path, b"{}", None))  # no error


def test_an_unsigned_snapshot_is_refused_when_required(tmp_path, monkeypatch):
    snapshot = tmp_path / "kernels--org--relu" / "snapshots" / ("a" * 40)
    variant = _variant(snapshot, b"{}", None)
    check_signature(variant)  # not required: nothing checked
    monkeypatch.setenv(signatures.ENV_REQUIRE, "1")
    with pytest.raises(
        KernelSignatureError,
        match=r"org/relu at commit a{12}, variant torch-cpu .*: cannot verify kernel integrity: it has no signature",
    ) as caught:
        check_signature(variant)
    assert "Nothing was imported" in str(caught.value)


def test_missing_sigstore_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "sigstore", None)
    for name in [m for m in sys.modules if m.startswith("sigstore.")]:
        monkeypatch.setitem(sys.modules, name, None)
    signatures._sigstore.cache_clear()
    try:
        with pytest.raises(KernelSignatureError, match=r"pip install 'kernels\[signatures\]'"):
            verify_variant(_variant(tmp_path, ARTIFACT, BUNDLE))
    finally:
        signatures._sigstore.cache_clear()


def test_importing_kernels_does_not_import_sigstore():
    code = "import sys, kernels, kernels.repos.signatures; print('sigstore' in sys.modules)"
    out = run_python("-c", code, env=subprocess_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_offline_trust_root_unless_refresh_is_asked(monkeypatch):
    monkeypatch.delenv(signatures.ENV_REFRESH, raising=False)
    assert signatures._offline()
    monkeypatch.setenv(signatures.ENV_REFRESH, "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(signatures.hubclient, "is_offline", lambda: True)
    assert signatures._offline()
    monkeypatch.setattr(signatures.hubclient, "is_offline", lambda: False)
    assert not signatures._offline()


def test_test_data_is_what_the_readme_names():
    readme = (DATA / "README.md").read_text()
    assert "27db13db157ecae5606eb22ec0be299ef348c370" in readme
    for name in ("bundle_v3_github.whl", "bundle_v3_github.whl.sigstore", "bundle_v3.txt"):
        assert name in readme


def test_the_default_signers_are_those_of_their_client_0_19():
    assert [p.repository for p in signatures.DEFAULT_POLICIES] == [
        "huggingface/kernels-community",
        "huggingface/kernels-community-rs",
    ]
    assert signatures.DEFAULT_POLICIES[1].workflows == (
        "https://github.com/huggingface/kernels-community-rs/.github/workflows/build.yaml"
        "@refs/heads/main",
    )
