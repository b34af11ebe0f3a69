"""A Hub kernel in the ZIP build layout: downloaded, verified and imported from its archive in
the cache, in place; an archive swapped in the cache after the download never runs."""

from __future__ import annotations

import importlib.resources
import json
import zipfile

import pytest

import kernels
from kernels import KernelHashMismatchError, get_loaded_kernels
from kernels.cli import main
from kernels.repos.download import install_kernel
from kernels.repos.hubclient import repo_cache_folder
from tests.repos.hub.test_cache_tampering import write_lock
from tests.support.zip_layout import KERNEL_ID, write_zip_variant

pytestmark = pytest.mark.hub

VARIANT = "torch-universal"


def _publish(hub):
    repo = hub.create_repo()
    write_zip_variant(repo.path / "build" / VARIANT)
    sha = repo.commit("release 0.1.0")
    repo.tag("v0.1.0")
    return repo, sha


def test_a_zip_layout_kernel_loads_from_the_hub_in_place(hub):
    repo, sha = _publish(hub)
    module = kernels.get_kernel(repo.repo_id, version="==0.1.0")
    assert (module.OPS, module.LAYER, module._native.VALUE) == ("ops", "layer", "native")
    configs = importlib.resources.files(module.__name__) / "configs"
    assert json.loads((configs / "device.json").read_text()) == {"block_size": 1024}
    variant = repo_cache_folder(repo.repo_id) / "snapshots" / sha / "build" / VARIANT
    assert module.__file__ == f"{variant / KERNEL_ID}.zip/__init__.py"
    # Nothing extracted or compiled beside the archive in the cache.
    assert sorted(p.name for p in variant.iterdir()) == sorted(
        [f"{KERNEL_ID}.zip", "_native.py", "metadata.json"]
    )
    (loaded,) = [k for k in get_loaded_kernels() if k.module is module]
    assert loaded.repo_info is not None and loaded.repo_info.revision == sha
    layer = kernels.LayerRepository(
        repo_id=repo.repo_id, layer_name="SiluAndMul", version="==0.1.0"
    ).load()
    assert layer is module.layers.SiluAndMul


def test_an_archive_swapped_in_the_cache_never_runs(hub, tmp_path):
    repo, sha = _publish(hub)
    variant = install_kernel(repo.repo_id, revision=sha)  # 0.19: the variant folder
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("__init__.py", f"open({str(marker)!r}, 'w').close()\n")
    # The snapshot's file links to the blob that holds the archive: overwrite what it reads.
    (variant / f"{KERNEL_ID}.zip").resolve().write_bytes(evil.read_bytes())
    with pytest.raises(KernelHashMismatchError, match=rf"{KERNEL_ID}\.zip has sha256"):
        kernels.get_kernel(repo.repo_id, revision=sha)
    assert not marker.exists()


def test_a_locked_zip_layout_kernel_loads(hub, tmp_path, capsys):
    repo, _ = _publish(hub)
    lockfile = write_lock(repo, tmp_path)
    assert main(["download", str(lockfile.parent)]) == 0, capsys.readouterr().err
    module = kernels.load_kernel(repo.repo_id, lockfile=lockfile)
    assert (module.OPS, module._native.VALUE) == ("ops", "native")


def test_the_lock_covers_the_archive(hub, tmp_path, capsys):
    repo, sha = _publish(hub)
    lockfile = write_lock(repo, tmp_path)
    assert main(["download", str(lockfile.parent)]) == 0, capsys.readouterr().err
    variant = repo_cache_folder(repo.repo_id) / "snapshots" / sha / "build" / VARIANT
    archive = (variant / f"{KERNEL_ID}.zip").resolve()
    data = bytearray(archive.read_bytes())
    data[-30] ^= 1
    archive.write_bytes(bytes(data))
    with pytest.raises(KernelHashMismatchError, match=rf"{KERNEL_ID}\.zip"):
        kernels.load_kernel(repo.repo_id, lockfile=lockfile)
