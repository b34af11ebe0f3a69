"""Repository types: kernels live in the Hub's `kernel` repositories; older kernels published
as model repositories load only when asked for with ``repo_type="model"``; old lock files
(no repo type) still load, verified against their hashes; a huggingface_hub that predates the
kernel type gets one clear error while everything local keeps working."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kernels
from kernels import (
    KernelHubUnsupportedError,
    KernelMappingError,
    KernelRepositoryNotFoundError,
    LayerRepository,
    LockedLayerRepository,
)
from kernels.cli import main
from kernels.repos.hubclient import repo_cache_folder, supports_kernel_repo_type

pytestmark = pytest.mark.hub

needs_kernel_type = pytest.mark.skipif(
    not supports_kernel_repo_type(), reason="needs a huggingface_hub that knows the kernel type"
)


def test_kernel_repositories_are_asked_for_as_the_kernel_type(released, hub):
    repo = released("0.1.0")
    module = kernels.get_kernel(repo.repo_id, version=">=0.1")
    assert module.VERSION == "0.1.0"
    # huggingface_hub's cache layout for the type, and its API paths on the wire.
    assert Path(module.__file__).is_relative_to(repo_cache_folder(repo.repo_id, "kernel"))
    assert repo_cache_folder(repo.repo_id, "kernel").name.startswith("kernels--")
    assert f"/api/kernels/{repo.repo_id}/refs".encode() in hub.proxy.sent
    assert b"/api/models/" not in hub.proxy.sent


@pytest.mark.any_hub_client
def test_a_model_repository_loads_when_asked_for_as_one(released, hub):
    repo = released("0.1.0", "0.2.0", repo_type="model")
    module = kernels.get_kernel(repo.repo_id, version="<0.2", repo_type="model")
    assert module.VERSION == "0.1.0"
    assert Path(module.__file__).is_relative_to(repo_cache_folder(repo.repo_id, "model"))
    assert kernels.has_kernel(repo.repo_id, version=">=0.2", repo_type="model")
    layer = LayerRepository(
        repo.repo_id, layer_name="SiluAndMul", version=">=0.2", repo_type="model"
    )
    assert layer.load_package().VERSION == "0.2.0"
    assert str(layer).startswith(f"model repository {repo.repo_id} (version >=0.2")


@needs_kernel_type
def test_a_model_repository_is_never_found_silently_but_named_in_the_error(released):
    repo = released("0.1.0", repo_type="model")
    with pytest.raises(KernelRepositoryNotFoundError) as info:
        kernels.get_kernel(repo.repo_id, version=">=0.1")
    message = str(info.value)
    assert f"Kernel repository {repo.repo_id} was not found" in message
    assert f"A model repository named {repo.repo_id} exists" in message
    assert "repo_type='model'" in message


@needs_kernel_type
def test_offline_a_cached_model_snapshot_is_named_not_used(released, python):
    repo = released("0.1.0", repo_type="model")
    assert kernels.get_kernel(repo.repo_id, version=">=0.1", repo_type="model").VERSION == "0.1.0"
    result = python(
        f"""
        import kernels
        try:
            kernels.get_kernel({repo.repo_id!r}, version=">=0.1")
        except kernels.KernelOfflineError as exc:
            print("ERROR", exc)
        print("MODEL", kernels.get_kernel({repo.repo_id!r}, version=">=0.1", repo_type="model").VERSION)
        """,
        env={"HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert "The cache does hold" in result.stdout and "repo_type='model'" in result.stdout
    assert "MODEL 0.1.0" in result.stdout


def test_bad_repo_types_are_refused_when_the_mapping_is_written():
    with pytest.raises(KernelMappingError, match="repo_type must be 'kernel' .* got 'dataset'"):
        LayerRepository("org/name", layer_name="X", repo_type="dataset")
    with pytest.raises(KernelMappingError, match="repo_type"):
        kernels.get_kernel("org/name", version=">=0.1", repo_type="models")


def write_project(folder: Path, entry: str, repo_id: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(
        f'[project]\nname = "demo"\nversion = "0.1"\n\n'
        f'[tool.kernels.dependencies]\n"{repo_id}" = {entry}\n'
    )
    return folder


@needs_kernel_type
def test_locks_record_the_repository_type(released, tmp_path, capsys):
    kernel = released("0.1.0")
    model = released("0.1.0", repo_type="model")
    for repo, entry, expected in (
        (kernel, '">=0.1"', "kernel"),
        (model, '{ version = ">=0.1", repo-type = "model" }', "model"),
    ):
        project = write_project(tmp_path / expected, entry, repo.repo_id)
        assert main(["lock", str(project)]) == 0, capsys.readouterr().err
        (locked,) = json.loads((project / "kernels.lock").read_text())
        assert locked["repo_type"] == expected
        loaded = LockedLayerRepository(
            repo.repo_id, layer_name="SiluAndMul", lockfile=project / "kernels.lock"
        ).load_package()
        assert Path(loaded.__file__).is_relative_to(repo_cache_folder(repo.repo_id, expected))


def _old_lock(project: Path) -> Path:
    """The project's lock as a release before repository types wrote it: no repo_type."""
    path = project / "kernels.lock"
    entries = json.loads(path.read_text())
    for entry in entries:
        entry.pop("repo_type")
    path.write_text(json.dumps(entries, indent=2))
    return path


@needs_kernel_type
@pytest.mark.parametrize("published_as", ["kernel", "model"])
def test_a_lock_written_before_repository_types_still_loads(
    released, tmp_path, capsys, published_as
):
    repo = released("0.1.0", repo_type=published_as)
    entry = '">=0.1"' if published_as == "kernel" else '{ version = ">=0.1", repo-type = "model" }'
    project = write_project(tmp_path / "project", entry, repo.repo_id)
    assert main(["lock", str(project)]) == 0, capsys.readouterr().err
    lockfile = _old_lock(project)
    module = kernels.get_locked_kernel(repo.repo_id, lockfile=lockfile)
    assert module.VERSION == "0.1.0"
    assert Path(module.__file__).is_relative_to(repo_cache_folder(repo.repo_id, published_as))
    assert kernels.load_kernel(repo.repo_id, lockfile=lockfile).VERSION == "0.1.0"


@needs_kernel_type
def test_an_old_lock_never_loads_other_code_from_the_other_type(released, hub, tmp_path, capsys):
    """Same name, both types, different code: the old lock's hashes decide, and they pin the
    kernel repository's code, so a tampered model repository cannot stand in for it."""
    repo = released("0.1.0")
    project = write_project(tmp_path / "project", '">=0.1"', repo.repo_id)
    assert main(["lock", str(project)]) == 0, capsys.readouterr().err
    lockfile = _old_lock(project)
    impostor = hub.create_repo(repo.repo_id, repo_type="model")
    impostor.release("0.1.0", offset=666.0)
    assert kernels.get_locked_kernel(repo.repo_id, lockfile=lockfile).VERSION == "0.1.0"
    import torch

    layer = kernels.get_locked_kernel(repo.repo_id, lockfile=lockfile).layers.SiluAndMul()
    assert layer(torch.zeros(1, 2)).item() == pytest.approx(1.0)  # offset 1.0, not 666


@pytest.mark.any_hub_client
@pytest.mark.skipif(supports_kernel_repo_type(), reason="needs a huggingface_hub < 1.10")
def test_a_huggingface_hub_without_the_kernel_type_gets_one_clear_error(released, tmp_path):
    import huggingface_hub

    repo = released("0.1.0", repo_type="model")
    for call in (
        lambda: kernels.get_kernel(repo.repo_id, version=">=0.1"),
        lambda: kernels.has_kernel(repo.repo_id, version=">=0.1"),
        lambda: LayerRepository(repo.repo_id, layer_name="SiluAndMul", version=">=0.1").load(),
    ):
        with pytest.raises(KernelHubUnsupportedError) as info:
            call()
        message = str(info.value)
        assert f"huggingface_hub {huggingface_hub.__version__} does not know" in message
        assert "huggingface_hub>=1.10" in message
        assert "library_mapping()" in message and "repo_type='model'" in message
    # The model-type path and everything local keep working.
    assert kernels.get_kernel(repo.repo_id, version=">=0.1", repo_type="model").VERSION == "0.1.0"
    assert kernels.library_mapping()


@needs_kernel_type
def test_upload_creates_a_kernel_repository(hub, kernel_repo, cli):
    """olah refuses repository creation (it is a read-only mirror); what reaches it is a
    request to create a repository of the kernel type."""
    repo = kernel_repo("to-upload")
    result = cli("upload", str(repo), "--repo-id", "my-org/to-upload")
    assert result.returncode == 1
    assert result.stdout.startswith("2 file(s)") or "file(s)" in result.stdout
    assert "kernel repository my-org/to-upload" in result.stdout
    assert "405" in result.stderr and "Traceback" not in result.stderr
    sent = bytes(hub.proxy.sent)
    assert b"POST /api/repos/create" in sent
    assert b'"type":"kernel"' in sent.replace(b" ", b"")


@needs_kernel_type
def test_versions_and_check_take_the_repository_type(released, capsys):
    model = released("0.1.0", repo_type="model")
    assert main(["versions", model.repo_id, "--repo-type", "model", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["repo_type"] == "model" and listed["refs"][0]["name"] == "v0.1.0"
    assert main(["versions", model.repo_id]) == 1
    assert "repo_type='model'" in capsys.readouterr().err
    assert main(["check", model.repo_id, "--version", ">=0.1", "--repo-type", "model"]) == 0
