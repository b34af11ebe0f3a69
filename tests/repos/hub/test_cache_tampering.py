"""A cached Hub kernel changed after it was downloaded: nothing planted in the cache runs.

Anyone who can write to a shared cache (``HF_HUB_CACHE=/shared/...``) can add files to a
snapshot, swap a folder for a link or plant bytecode. Lock-verified loads refuse every
change the lock cannot vouch for, naming the path; bytecode is never read (kernel packages
import from source only), so a planted ``__pycache__`` is ignored rather than trusted.
"""

from __future__ import annotations

import importlib.util
import json
import os
import py_compile
import shutil
import sys
from pathlib import Path

import pytest

import kernels
from kernels import KernelHashMismatchError, KernelLoadError
from kernels.cli import main
from kernels.repos.hubclient import repo_cache_folder
from kernels.repos.lock import lock_project

pytestmark = pytest.mark.hub

VARIANT = "torch-universal"


@pytest.fixture(autouse=True)
def bytecode_on(monkeypatch):
    """Python as users run it, free to read and write bytecode (the test environment sets
    PYTHONDONTWRITEBYTECODE)."""
    monkeypatch.setattr(sys, "dont_write_bytecode", False)


class Downloaded:
    """A released kernel, locked and fetched with `kernels download` (verified)."""

    def __init__(self, released, tmp_path: Path, capsys):
        self.repo = released("0.1.0")
        self.package = self.repo.repo_id.split("/")[1].replace("-", "_")
        self.lockfile = write_lock(self.repo, tmp_path)
        assert main(["download", str(self.lockfile.parent)]) == 0, capsys.readouterr().err
        sha = json.loads(self.lockfile.read_text())[0]["sha"]
        self.repo_folder = repo_cache_folder(self.repo.repo_id)
        self.variant_dir = self.repo_folder / "snapshots" / sha / "build" / VARIANT
        self.package_dir = self.variant_dir / self.package

    def load(self):
        return kernels.load_kernel(self.repo.repo_id, lockfile=self.lockfile)

    def nothing_imported(self) -> bool:
        prefix = f"_kernels_{self.package}_"
        return not [name for name in sys.modules if name.startswith(prefix)]


def write_lock(repo, folder: Path, *, hugging_face_format: bool = False) -> Path:
    """`kernels lock` of a project that depends on `repo`; with `hugging_face_format`, the
    lock as Hugging Face's kernels writes it (no per-file digests, no trust record)."""
    project = folder / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[project]\nname = "demo"\nversion = "0.1"\n\n[tool.kernels.dependencies]\n'
        f'"{repo.repo_id}" = ">=0.1"\n'
    )
    path, _ = lock_project(project)
    if hugging_face_format:
        entry = json.loads(path.read_text())[0]
        path.write_text(json.dumps([{k: entry[k] for k in ("repo_id", "sha", "variants")}]))
    return path


@pytest.fixture
def downloaded(released, tmp_path, capsys) -> Downloaded:
    return Downloaded(released, tmp_path, capsys)


def planted(marker: Path, rest: str = "") -> str:
    return f"open({str(marker)!r}, 'w').write('planted code ran')\n{rest}"


def plant_pyc(source_file: Path, source: str, scratch: Path) -> Path:
    """An unchecked-hash .pyc of other source where Python looks for `source_file`'s."""
    target = Path(importlib.util.cache_from_source(str(source_file)))
    scratch.write_text(source)
    py_compile.compile(
        str(scratch),
        cfile=str(target),
        doraise=True,
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )
    return target


def evil_copy(folder: Path, to: Path, marker: Path) -> Path:
    """A copy of `folder` whose __init__.py also runs planted code."""
    shutil.copytree(folder, to)
    init = to / "__init__.py"
    init.write_text(planted(marker, init.read_text()))
    return to


@pytest.mark.parametrize("module", ["__init__", "layers"])
def test_planted_bytecode_never_runs(downloaded, tmp_path, module):
    marker = tmp_path / "planted-ran"
    source = planted(marker, "VERSION = 'planted'\nclass SiluAndMul: pass\n")
    pyc = plant_pyc(downloaded.package_dir / f"{module}.py", source, tmp_path / "evil.py")
    planted_bytes = pyc.read_bytes()
    loaded = downloaded.load()
    assert loaded.VERSION == "0.1.0" and loaded.layers.SiluAndMul.can_torch_compile is True
    assert not marker.exists()
    assert pyc.read_bytes() == planted_bytes  # ignored, not rewritten
    written = [p for p in downloaded.variant_dir.rglob("*.pyc") if p != pyc]
    assert written == []


def test_a_package_folder_swapped_for_a_link_is_refused(downloaded, tmp_path):
    marker = tmp_path / "planted-ran"
    copy = evil_copy(downloaded.package_dir, tmp_path / "copy", marker)
    shutil.rmtree(downloaded.package_dir)
    downloaded.package_dir.symlink_to(copy, target_is_directory=True)
    with pytest.raises(KernelHashMismatchError) as caught:
        downloaded.load()
    message = str(caught.value)
    assert f"{downloaded.package_dir} is a link to the folder {copy}" in message
    assert "Nothing was imported" in message and "delete" in message
    assert downloaded.nothing_imported() and not marker.exists()


@pytest.mark.parametrize("hugging_face_format", [False, True])
def test_a_linked_folder_that_shadows_a_module_is_refused(released, tmp_path, hugging_face_format):
    """``pkg/layers/`` wins over ``pkg/layers.py`` at import; as a link, a file walk that
    does not follow links would never see its files."""
    repo = released("0.1.0")
    package = repo.repo_id.split("/")[1].replace("-", "_")
    lockfile = write_lock(repo, tmp_path, hugging_face_format=hugging_face_format)
    variant_dir = kernels.install_kernel(repo.repo_id, revision="v0.1.0")  # not verified yet
    marker = tmp_path / "planted-ran"
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "__init__.py").write_text(planted(marker, "class SiluAndMul: pass\n"))
    (variant_dir / package / "layers").symlink_to(shadow, target_is_directory=True)
    with pytest.raises(KernelHashMismatchError, match=rf"{package}/layers is a link to the folder"):
        kernels.load_kernel(repo.repo_id, lockfile=lockfile)
    assert not marker.exists()


def test_a_variant_folder_swapped_for_a_link_is_refused(downloaded, tmp_path):
    marker = tmp_path / "planted-ran"
    copy = tmp_path / "variant-copy"
    shutil.copytree(downloaded.variant_dir, copy, symlinks=False)
    evil_init = copy / downloaded.package / "__init__.py"
    evil_init.write_text(planted(marker, evil_init.read_text()))
    shutil.rmtree(downloaded.variant_dir)
    downloaded.variant_dir.symlink_to(copy, target_is_directory=True)
    with pytest.raises(KernelHashMismatchError, match="is a link to a folder"):
        downloaded.load()
    assert downloaded.nothing_imported() and not marker.exists()


def test_a_file_link_leaving_the_repository_folder_is_refused(downloaded, tmp_path):
    """Even with the locked contents: what lies outside the repository's cache folder can
    change after it was checked."""
    layers = downloaded.package_dir / "layers.py"
    outside = tmp_path / "layers.py"
    outside.write_bytes(layers.read_bytes())
    layers.unlink()
    layers.symlink_to(outside)
    with pytest.raises(KernelHashMismatchError) as caught:
        downloaded.load()
    message = str(caught.value)
    assert f"{layers} is a link to {outside}, outside the repository's cache folder" in message
    assert str(downloaded.repo_folder) in message
    assert downloaded.nothing_imported()


def test_a_link_to_another_file_of_the_repository_is_verified_by_its_contents(downloaded):
    """huggingface_hub links every snapshot file into the repository's blobs/; a link
    elsewhere inside the repository folder is checked like any file: by what it holds."""
    layers = downloaded.package_dir / "layers.py"
    init_blob = os.path.realpath(downloaded.package_dir / "__init__.py")
    layers.unlink()
    layers.symlink_to(init_blob)
    with pytest.raises(KernelHashMismatchError, match=r"layers.py has git-sha1:"):
        downloaded.load()


def test_special_files_are_refused(downloaded):
    fifo = downloaded.package_dir / "ops.py"
    os.mkfifo(fifo)
    with pytest.raises(KernelHashMismatchError, match=rf"{fifo} is neither a file nor a folder"):
        downloaded.load()
    assert downloaded.nothing_imported()


@pytest.mark.parametrize("name", ["__init__.py", "notes.txt", "deeper/x.pyc"])
def test_a_pycache_folder_holds_bytecode_only(downloaded, name):
    """A __pycache__ is ignored because it is never read; anything but bytecode in one
    (a package Python could import from it) is refused."""
    planted_file = downloaded.package_dir / "__pycache__" / name
    planted_file.parent.mkdir(parents=True)
    planted_file.write_text("print('planted')\n")
    with pytest.raises(KernelHashMismatchError, match="__pycache__"):
        downloaded.load()
    assert downloaded.nothing_imported()


def test_a_file_changed_after_a_verified_load_is_caught_on_the_next(downloaded, tmp_path):
    """The record of verified folders is no pass: each load lists the files again, and a
    file rewritten in place with its size and modification time kept is hashed anew."""
    loaded = downloaded.load()
    layers = downloaded.package_dir / "layers.py"
    data = layers.read_bytes()
    st = layers.stat()
    tampered = data.replace(b"can_torch_compile = True", b"can_torch_compile = 1234")
    assert len(tampered) == len(data) and tampered != data
    layers.unlink()
    layers.write_bytes(tampered)
    os.utime(layers, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(KernelHashMismatchError, match=r"layers.py has git-sha1:"):
        downloaded.load()
    layers.unlink()
    layers.write_bytes(data)
    assert downloaded.load() is loaded  # the locked contents again: verified, same module


def test_a_kernel_that_exits_at_import_is_a_load_error(hub):
    repo = hub.create_repo()
    package = repo.repo_id.split("/")[1].replace("-", "_")
    repo.write_kernel(version="0.1.0")
    repo.write(
        f"build/{VARIANT}/{package}/__init__.py", "from . import layers\nraise SystemExit(2)\n"
    )
    repo.commit()
    repo.tag("v0.1.0")
    for _ in range(2):
        with pytest.raises(KernelLoadError, match="SystemExit: 2"):
            kernels.get_kernel(repo.repo_id, version=">=0.1")
        assert not [m for m in sys.modules if m.startswith(f"_kernels_{package}_")]


def test_malformed_metadata_refuses_every_load(hub, tmp_path):
    repo = hub.create_repo()
    package = repo.repo_id.split("/")[1].replace("-", "_")
    marker = tmp_path / "kernel-ran"
    repo.write_kernel(version="0.1.0")
    repo.write(f"build/{VARIANT}/{package}/__init__.py", planted(marker, "from . import layers\n"))
    repo.write(f"build/{VARIANT}/metadata.json", '{"version": "one"}')
    repo.commit()
    repo.tag("v0.1.0")
    for _ in range(2):  # the first refusal registers nothing the second could return
        with pytest.raises(KernelLoadError, match=r"metadata.json is malformed"):
            kernels.get_kernel(repo.repo_id, version=">=0.1")
        assert not marker.exists()
        assert not [m for m in sys.modules if m.startswith(f"_kernels_{package}_")]
