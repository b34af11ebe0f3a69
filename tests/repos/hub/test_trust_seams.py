"""The trust chain's seams on a real (local) Hub (issue 56): signatures keyed on the fetched
variant whatever its layout, online and offline; the 0.19 signature policy (warn when
sigstore is installed); hostile refs answered with our errors offline."""

from __future__ import annotations

import json
import logging

import pytest

import kernels
from kernels.errors import KernelSignatureError
from kernels.repos import signatures
from kernels.repos.hubclient import repo_cache_folder

pytestmark = pytest.mark.hub

VARIANT = "torch-universal"
METADATA = {
    "name": "k",
    "version": 1,
    "license": "Apache-2.0",
    "python-depends": [],
    "backend": {"type": "cuda"},
}


def _unsigned_release(hub, marker, layout: str):
    """An unsigned build whose layout hides its variant: package files directly in
    build/<variant>/ with no metadata.json ("flat"), or metadata.json inside the package
    folder ("nested")."""
    repo = hub.create_repo()
    package = repo.repo_id.split("/")[1].replace("-", "_")
    init = f"open({str(marker)!r}, 'w').close()\nVERSION = '0.1.0'\n"
    if layout == "flat":
        repo.write(f"build/{VARIANT}/__init__.py", init)
    else:
        repo.write(f"build/{VARIANT}/{package}/__init__.py", init)
        repo.write(f"build/{VARIANT}/{package}/metadata.json", json.dumps(METADATA))
    repo.commit("release 0.1.0")
    repo.tag("v0.1.0")
    return repo


@pytest.mark.parametrize("layout", ["flat", "nested"])
def test_an_unsigned_build_never_runs_whatever_its_layout(
    hub, layout, tmp_path, monkeypatch, python
):
    marker = tmp_path / "ran"
    repo = _unsigned_release(hub, marker, layout)
    monkeypatch.setenv(signatures.ENV_REQUIRE, "1")
    with pytest.raises(KernelSignatureError, match="it has no signature") as caught:
        kernels.get_kernel(repo.repo_id, version="==0.1.0")
    assert repo.repo_id in str(caught.value) and f"variant {VARIANT}" in str(caught.value)
    assert not marker.exists()

    # Offline, from the cache the refused load filled: refused the same way.
    result = python(
        f"""
        import kernels
        try:
            kernels.get_kernel({repo.repo_id!r}, version="==0.1.0")
            print("LOADED")
        except kernels.KernelLoadError as exc:
            print(type(exc).__name__, exc)
        """,
        env={"HF_HUB_OFFLINE": "1", signatures.ENV_REQUIRE: "1"},
    )
    assert result.returncode == 0, result.stderr
    assert "KernelSignatureError" in result.stdout and "it has no signature" in result.stdout
    assert not marker.exists()


def test_an_unsigned_hub_kernel_loads_with_a_warning_when_sigstore_is_installed(
    hub, tmp_path, monkeypatch, caplog
):
    pytest.importorskip("sigstore")
    monkeypatch.delenv(signatures.ENV_REQUIRE, raising=False)
    repo = _unsigned_release(hub, tmp_path / "ran", "flat")
    with caplog.at_level(logging.WARNING, logger="kernels.repos.signatures"):
        assert kernels.get_kernel(repo.repo_id, version="==0.1.0").VERSION == "0.1.0"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert repo.repo_id in warnings[0] and "it has no signature" in warnings[0]
    assert "KERNELS_REQUIRE_SIGNATURES=1" in warnings[0]


def test_a_non_utf8_ref_in_the_cache_is_not_a_raw_error_offline(released, python):
    repo = released("0.1.0")
    assert kernels.get_kernel(repo.repo_id, version="==0.1.0").VERSION == "0.1.0"
    refs = repo_cache_folder(repo.repo_id) / "refs"
    stray = refs / "stray"
    stray.write_bytes(b"\xff\xfe not a ref")
    try:
        result = python(
            f"""
            import kernels
            print(kernels.get_kernel({repo.repo_id!r}, version="==0.1.0").VERSION)
            """,
            env={"HF_HUB_OFFLINE": "1"},
        )
    finally:
        stray.unlink()  # the session's cache is shared; huggingface_hub cannot read it either
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "0.1.0"
    assert "Ignoring" in result.stderr and "stray" in result.stderr
