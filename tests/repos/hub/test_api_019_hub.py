"""Hugging Face kernels 0.19 behaviour against the local Hub server: UNSTABLE_KERNELS_ALL_LATEST,
check_arch and backend for Hub kernels, install_kernel's result, offline cache misses as
FileNotFoundError, and repositories that survive pickling (docs/hub.md#compatibility)."""

from __future__ import annotations

import json
import logging
import pickle
from pathlib import Path

import pytest

import kernels
from kernels import BuildVariantNotFoundError, KernelMappingError, KernelRevisionError
from kernels.repos import archs
from kernels.repos.variants import machine_build

pytestmark = pytest.mark.hub

ALL_LATEST = "UNSTABLE_KERNELS_ALL_LATEST"


def numbered(hub, *branches: str):
    """A repository with one commit per numbered version, each on its branch ``v<N>``."""
    repo = hub.create_repo()
    for branch in branches:
        repo.write_kernel(version=branch)
        repo.commit(f"version {branch}")
        repo.branch(branch)
    return repo


# --- UNSTABLE_KERNELS_ALL_LATEST ---------------------------------------------------------------


def test_all_latest_overrides_versions_and_revisions(hub, monkeypatch, caplog):
    repo = numbered(hub, "v1", "v2", "v3")
    repo.tag("v0.1.0", ref="v1")
    assert kernels.get_kernel(repo.repo_id, version=1).VERSION == "v1"
    monkeypatch.setenv(ALL_LATEST, "yes")
    with caplog.at_level(logging.WARNING, logger="kernels"):
        assert kernels.get_kernel(repo.repo_id, version=2).VERSION == "v3"
    warning = next(r.getMessage() for r in caplog.records if ALL_LATEST in r.getMessage())
    assert "overriding requested version=2" in warning and "with v3" in warning
    assert "Kernel API changes may break your code" in warning
    assert kernels.get_kernel(repo.repo_id, revision="v0.1.0").VERSION == "v3"
    layer = kernels.LayerRepository(repo.repo_id, layer_name="SiluAndMul", version=1)
    assert layer.load_package().VERSION == "v3"
    assert kernels.has_kernel(repo.repo_id, version=1)


@pytest.mark.parametrize("value", ["0", "", "no", "off"])
def test_all_latest_is_off_unless_set_true(hub, monkeypatch, value):
    repo = numbered(hub, "v1", "v2")
    monkeypatch.setenv(ALL_LATEST, value)
    assert kernels.get_kernel(repo.repo_id, version=1).VERSION == "v1"


def test_all_latest_needs_a_numbered_version(released, monkeypatch):
    repo = released("0.1.0")  # tags only, no branch v<N>
    monkeypatch.setenv(ALL_LATEST, "1")
    with pytest.raises(ValueError, match="no numbered version") as caught:
        kernels.get_kernel(repo.repo_id, version=">=0.1")
    assert isinstance(caught.value, KernelRevisionError) and ALL_LATEST in str(caught.value)


def test_all_latest_overrides_a_lock_pin(hub, tmp_path, monkeypatch):
    from kernels.repos.lock import lock_project

    repo = numbered(hub, "v1", "v2")
    (tmp_path / "pyproject.toml").write_text(
        f'[project]\nname = "demo"\nversion = "0.1"\n\n[tool.kernels.dependencies]\n'
        f'"{repo.repo_id}" = 1\n'
    )
    lockfile, _ = lock_project(tmp_path)
    assert kernels.get_locked_kernel(repo.repo_id, lockfile=lockfile).VERSION == "v1"
    monkeypatch.setenv(ALL_LATEST, "true")
    assert kernels.get_locked_kernel(repo.repo_id, lockfile=lockfile).VERSION == "v2"
    # load_kernel asks no Hub: the newest numbered version the cache knows.
    assert kernels.load_kernel(repo.repo_id, lockfile=lockfile).VERSION == "v2"


def test_all_latest_offline_uses_the_newest_cached_version(hub, python):
    repo = numbered(hub, "v1", "v2")
    assert kernels.get_kernel(repo.repo_id, version=1).VERSION == "v1"
    repo.write_kernel(version="v3").commit()
    repo.branch("v3")  # published later: offline cannot know it
    result = python(
        f"""
        import kernels
        print(kernels.get_kernel({repo.repo_id!r}, version=1).VERSION)
        """,
        env={"HF_HUB_OFFLINE": "1", ALL_LATEST: "1"},
    )
    # Only v1 was ever resolved into this cache, so it is the newest one offline.
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "v1"


# --- check_arch and backend ---------------------------------------------------------------------


@pytest.fixture
def sm80(monkeypatch):
    """Pretend the current device is a CUDA GPU of capability 8.0 (this machine has none)."""
    monkeypatch.setattr(archs, "device_arch", lambda backend: (8, 0) if backend else None)


def _hopper_only(hub):
    repo = hub.create_repo()
    repo.write_kernel(version="0.1.0")
    meta = {"name": "hopper", "backend": {"type": "cuda", "archs": ["9.0a"]}}
    repo.write("build/torch-universal/metadata.json", json.dumps(meta))
    repo.commit()
    repo.tag("v0.1.0")
    return repo


def test_check_arch_for_hub_kernels(hub, sm80):
    repo = _hopper_only(hub)
    assert kernels.has_kernel(repo.repo_id, version=">=0.1") is False
    assert kernels.has_kernel(repo.repo_id, version=">=0.1", check_arch=False) is True
    with pytest.raises(BuildVariantNotFoundError, match="CUDA capability 8.0.*check_arch=False"):
        kernels.get_kernel(repo.repo_id, version=">=0.1")
    module = kernels.get_kernel(repo.repo_id, version=">=0.1", check_arch=False)
    assert module.VERSION == "0.1.0"
    layer = kernels.LayerRepository(
        repo.repo_id, layer_name="SiluAndMul", version=">=0.1", check_arch=False
    )
    assert layer.load() is module.layers.SiluAndMul


def test_has_kernel_downloads_only_the_metadata(hub, sm80):
    repo = _hopper_only(hub)
    hub.proxy.clear()
    kernels.has_kernel(repo.repo_id, version=">=0.1")
    downloads = hub.proxy.requested("GET", r"/kernels/.*/resolve/.*")
    assert downloads and all(path.endswith("metadata.json") for path in downloads)


def test_backend_chooses_the_variant(hub):
    repo = hub.create_repo()
    repo.release("0.1.0", variants=("torch-universal", f"torch-{machine_build().backend}"))
    module = kernels.get_kernel(repo.repo_id, version=">=0.1", backend="cpu")
    assert module.VARIANT == "torch-cpu"
    decisions = kernels.get_kernel_variants(repo.repo_id, version=">=0.1", backend="cpu")
    assert decisions[0].variant.variant_str == "torch-cpu"
    with pytest.raises(KernelMappingError, match="backend must be None, 'cpu'"):
        kernels.get_kernel(repo.repo_id, version=">=0.1", backend="metal")


# --- install_kernel, offline, pickling ----------------------------------------------------------


def test_install_kernel_returns_the_variant_folder_by_version(hub):
    repo = numbered(hub, "v1", "v2")
    path = kernels.install_kernel(repo.repo_id, version=1)
    assert isinstance(path, Path) and path.name == "torch-universal"
    assert path.parent.name == "build" and path.parents[2].name == "snapshots"
    assert kernels.install_kernel(repo.repo_id, version=1, local_files_only=True) == path


def test_an_offline_cache_miss_is_a_file_not_found_error(released, python):
    repo = released("0.1.0")
    result = python(
        f"""
        import kernels
        try:
            kernels.get_kernel({repo.repo_id!r}, version=1)
        except FileNotFoundError as exc:
            print(type(exc).__name__, "|", exc)
        """,
        env={"HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr
    name, _, message = result.stdout.strip().splitlines()[-1].partition(" | ")
    assert name == "KernelOfflineError" and "HF_HUB_OFFLINE" in message


def test_a_loaded_repository_pickles_as_what_was_asked(released):
    repo = released("0.1.0")
    layer = kernels.LayerRepository(repo.repo_id, layer_name="SiluAndMul", version=">=0.1")
    loaded = layer.load()
    copy = pickle.loads(pickle.dumps(layer))
    assert copy == layer and copy.commit is None  # nothing of the load travels
    assert copy.load() is loaded
    func = kernels.FuncRepository(repo.repo_id, func_name="silu", version=">=0.1")
    assert pickle.loads(pickle.dumps(func)) == func
