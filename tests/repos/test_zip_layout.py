"""Kernels in the ZIP build layout: imported from ``build/<variant>/<id>.zip`` in memory, with the
archive covered by the variant's digests, and hostile archives refused."""

from __future__ import annotations

import importlib
import importlib.resources
import inspect
import json
import os
import pkgutil
import stat
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest

from kernels import (
    KernelHashMismatchError,
    KernelLoadError,
    KernelMetadataError,
    LocalLayerRepository,
    get_loaded_kernels,
    get_local_kernel,
)
from kernels.errors import KernelArchiveError
from kernels.repos import archive, loader
from tests.support.paths import REPO_ROOT
from tests.support.zip_layout import KERNEL_ID, MEMBERS, write_metadata, write_zip_variant

VARIANT = "torch-universal"


@pytest.fixture
def zip_repo(tmp_path):
    """A factory: zip_repo(**write_zip_variant options) -> repository folder."""
    count = 0

    def make(**options) -> Path:
        nonlocal count
        count += 1
        root = tmp_path / f"repo{count}"
        write_zip_variant(root / "build" / VARIANT, **options)
        return root

    return make


def _variant(root: Path) -> Path:
    return root / "build" / VARIANT


def test_package_is_imported_from_the_archive_and_beside_it(zip_repo):
    root = zip_repo()
    variant = _variant(root)
    module = get_local_kernel(root)
    # _native sits beside the archive, _ops and layers are in it.
    assert (module.OPS, module.LAYER, module._native.VALUE) == ("ops", "layer", "native")
    zip_path = variant / f"{KERNEL_ID}.zip"
    assert module.__file__ == f"{zip_path.resolve()}/__init__.py"
    assert module.__path__ == [str(variant.resolve()), str(zip_path.resolve())]
    assert module.layers.__file__ == f"{zip_path.resolve()}/layers/__init__.py"
    assert module._native.__file__ == str(variant.resolve() / "_native.py")
    assert sys.modules[module.__name__] is module
    # Imported in place: nothing extracted, no bytecode written beside the archive.
    assert sorted(p.name for p in variant.iterdir()) == sorted(
        [f"{KERNEL_ID}.zip", "_native.py", "metadata.json"]
    )
    # Every form of a local folder, and the layer API, reach the same module.
    assert get_local_kernel(root / "build") is module
    assert get_local_kernel(variant) is not None
    layer = LocalLayerRepository(root, layer_name="SiluAndMul").load()
    assert layer is module.layers.SiluAndMul
    loaded = [k for k in get_loaded_kernels() if k.module is module]
    assert loaded and loaded[0].metadata.extra["build-layout"] == "zip"


def test_source_resources_and_submodule_imports_work_in_the_archive(zip_repo):
    module = get_local_kernel(zip_repo())
    # inspect.getsource (Triton's @jit needs it) reads the member's source.
    assert inspect.getsource(module.layers.SiluAndMul).startswith("class SiluAndMul(")
    files = importlib.resources.files(module.__name__)
    configs = files / "configs"
    assert configs.is_dir() and not configs.is_file()
    assert [p.name for p in configs.iterdir()] == ["device.json"]
    assert json.loads((configs / "device.json").read_text()) == {"block_size": 1024}
    assert not (configs / "missing.json").is_file()
    with pytest.raises(FileNotFoundError):
        (configs / "missing.json").read_bytes()
    assert pkgutil.get_data(module.__name__, "configs/device.json") == b'{"block_size": 1024}'
    with importlib.resources.as_file(configs / "device.json") as path:
        assert path.read_text() == '{"block_size": 1024}'
    # Imports by name and reloads go through the archive too.
    assert importlib.import_module(f"{module.__name__}._ops").OPS == "ops"
    assert importlib.reload(module) is module


def test_a_module_only_as_bytecode_in_the_archive_is_refused(zip_repo):
    members = {**MEMBERS, "__init__.py": "from . import hidden\n", "hidden.pyc": b"\0" * 32}
    with pytest.raises(KernelLoadError, match=r"hidden\.pyc is bytecode without its source"):
        get_local_kernel(zip_repo(members=members))


def test_failed_import_leaves_nothing_behind(zip_repo):
    root = zip_repo(beside={})  # __init__ imports _native, which is not there
    before = set(sys.modules)
    with pytest.raises(KernelLoadError, match="_native"):
        get_local_kernel(root)
    assert set(sys.modules) - before == set()


# --- the trust chain --------------------------------------------------------------------


def test_the_digest_covers_the_archive_byte_for_byte(zip_repo):
    root = zip_repo()
    zip_path = _variant(root) / f"{KERNEL_ID}.zip"
    data = bytearray(zip_path.read_bytes())
    data[-30] ^= 1  # one bit of the central directory
    zip_path.write_bytes(bytes(data))
    with pytest.raises(KernelHashMismatchError, match=rf"{KERNEL_ID}\.zip has sha256"):
        get_local_kernel(root)


def test_an_archive_swapped_after_the_check_never_runs(zip_repo, monkeypatch, tmp_path):
    root = zip_repo()
    zip_path = _variant(root) / f"{KERNEL_ID}.zip"
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("__init__.py", f"open({str(marker)!r}, 'w').close()\n")
    real = loader.check_digests

    def check_then_swap(metadata, variant_dir, **kw):
        real(metadata, variant_dir, **kw)
        zip_path.write_bytes(evil.read_bytes())  # between the check and the import

    monkeypatch.setattr(loader, "check_digests", check_then_swap)
    with pytest.raises(KernelHashMismatchError, match="the bytes read differ from its sha256"):
        get_local_kernel(root)
    assert not marker.exists()


def test_an_archive_the_digests_do_not_list_is_refused(zip_repo):
    root = zip_repo()
    variant = _variant(root)
    meta = json.loads((variant / "metadata.json").read_text())
    del meta["digest"]["files"][f"{KERNEL_ID}.zip"]
    (variant / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(KernelHashMismatchError, match="is not listed in the digests"):
        get_local_kernel(root)


# --- metadata -----------------------------------------------------------------------------


@pytest.mark.parametrize("bad_id", ["../evil", "a/b", "sub\\mod", "1abc", "", "a.b", None])
def test_an_id_that_is_no_identifier_is_refused(zip_repo, bad_id):
    root = zip_repo()
    write_metadata(_variant(root), kernel_id=bad_id)  # type: ignore[arg-type]
    with pytest.raises(KernelMetadataError, match="needs an id that is a Python identifier"):
        get_local_kernel(root)


def test_a_missing_archive_is_named(zip_repo):
    root = zip_repo()
    variant = _variant(root)
    (variant / f"{KERNEL_ID}.zip").unlink()
    write_metadata(variant)
    with pytest.raises(KernelArchiveError, match=rf"its archive {KERNEL_ID}\.zip is missing"):
        get_local_kernel(root)


def test_an_unknown_build_layout_is_refused(zip_repo):
    root = zip_repo()
    write_metadata(_variant(root), **{"build-layout": "tar"})
    with pytest.raises(KernelMetadataError, match="'build-layout' is 'tar'; it must be"):
        get_local_kernel(root)


def test_files_layout_without_init_says_what_is_missing(zip_repo):
    root = zip_repo()
    write_metadata(_variant(root), **{"build-layout": "files"})
    with pytest.raises(KernelLoadError, match="has no __init__.py, and its metadata.json"):
        get_local_kernel(root)


# --- hostile archives ---------------------------------------------------------------------


def _symlink(z: zipfile.ZipFile) -> None:
    info = zipfile.ZipInfo("layers.py")
    info.create_system = 3
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    z.writestr(info, "/etc/passwd")


def _central_entry(data: bytes, name: bytes) -> int:
    """Where the central directory entry of member `name` starts: its name's last occurrence
    follows that entry's 46-byte fixed header."""
    entry = data.rindex(name) - 46
    assert data[entry : entry + 4] == b"PK\x01\x02"
    return entry


def _encrypted(z: zipfile.ZipFile) -> None:
    z.writestr("secret.py", "x = 1\n")  # zipfile writes no encryption: the flag is set after


def _duplicate(z: zipfile.ZipFile) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate it writes
        z.writestr("__init__.py", "print('second')\n")


@pytest.mark.parametrize(
    "add, message",
    [
        (lambda z: z.writestr("/abs.py", ""), "absolute or non-portable path '/abs.py'"),
        (lambda z: z.writestr("../up.py", ""), r"'\.\./up\.py' is not a plain relative path"),
        (lambda z: z.writestr("a/../../up.py", ""), "is not a plain relative path"),
        (lambda z: z.writestr("C:/x.py", ""), "absolute or non-portable path"),
        (_symlink, "holds a symbolic link 'layers.py'"),
        (_duplicate, "holds the member '__init__.py' twice"),
        (lambda z: z.writestr("_ops.abi3.so", b"\x7fELF"), "compiled module '_ops.abi3.so'"),
        (lambda z: z.writestr("sub/_x.pyd", b"MZ"), "compiled module 'sub/_x.pyd'"),
        (lambda z: z.writestr("lib.dylib", b""), "compiled module 'lib.dylib'"),
        (_encrypted, "encrypted member 'secret.py'"),
    ],
)
def test_hostile_members_are_refused(zip_repo, add, message):
    root = zip_repo()
    variant = _variant(root)
    zip_path = variant / f"{KERNEL_ID}.zip"
    with zipfile.ZipFile(zip_path, "a") as z:
        add(z)
    if add is _encrypted:
        data = bytearray(zip_path.read_bytes())
        data[_central_entry(data, b"secret.py") + 8] |= 0x1  # general purpose flags: encrypted
        zip_path.write_bytes(bytes(data))
    write_metadata(variant)  # digests that vouch for the hostile archive: it is still refused
    with pytest.raises(KernelArchiveError, match=message) as caught:
        get_local_kernel(root)
    assert "Nothing was imported" in str(caught.value)


def test_an_archive_whose_top_level_is_not_the_package_is_refused(zip_repo):
    nested = {f"zipped/{name}": content for name, content in MEMBERS.items()}
    with pytest.raises(KernelArchiveError, match=r"has no __init__.py at its top level.*zipped"):
        get_local_kernel(zip_repo(members=nested))


def test_a_file_that_is_no_zip_archive_is_refused(zip_repo):
    root = zip_repo()
    variant = _variant(root)
    (variant / f"{KERNEL_ID}.zip").write_bytes(b"print('not a zip')\n")
    write_metadata(variant)
    with pytest.raises(KernelArchiveError, match="is not a readable zip archive"):
        get_local_kernel(root)


def test_too_many_members_are_refused(zip_repo, monkeypatch):
    monkeypatch.setattr(archive, "MAX_MEMBERS", 3)
    with pytest.raises(KernelArchiveError, match="has 4 members, more than the 3 allowed"):
        get_local_kernel(zip_repo())


def test_a_zip_bomb_is_refused_before_it_is_inflated(zip_repo, monkeypatch):
    monkeypatch.setattr(archive, "MAX_UNPACKED_SIZE", 1 << 20)
    bomb = {**MEMBERS, "zeros.bin": b"\0" * (4 << 20)}  # 4 MiB that deflate to a few KiB
    root = zip_repo(members=bomb)
    assert (_variant(root) / f"{KERNEL_ID}.zip").stat().st_size < 64 << 10
    with pytest.raises(KernelArchiveError, match="unpacks to more than 1048576 bytes"):
        get_local_kernel(root)


def test_a_member_larger_than_declared_is_refused(zip_repo):
    root = zip_repo(members={**MEMBERS, "data.bin": b"x" * 1000})
    variant = _variant(root)
    path = variant / f"{KERNEL_ID}.zip"
    data = bytearray(path.read_bytes())
    # Lower data.bin's declared uncompressed size in the central directory from 1000 to 10.
    entry = _central_entry(data, b"data.bin")
    size_at = entry + 24
    assert int.from_bytes(data[size_at : size_at + 4], "little") == 1000
    data[size_at : size_at + 4] = (10).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    write_metadata(variant)
    with pytest.raises(KernelArchiveError, match="data.bin"):
        get_local_kernel(root)


# --- the same repository in Hugging Face's client -------------------------------------------

HF_PYTHON = REPO_ROOT / ".venv-hf" / "bin" / "python"


@pytest.mark.skipif(
    not HF_PYTHON.exists(), reason="Hugging Face's kernels client (.venv-hf) is not installed"
)
def test_hugging_face_client_loads_the_same_repository(zip_repo):
    """Our test repository is a ZIP-layout build as theirs reads it: they import it from the
    archive, with its digests (which they check) and its module beside the archive."""
    root = zip_repo()
    code = (
        "import json, sys, importlib.resources\n"
        "from pathlib import Path\n"
        "from kernels import get_local_kernel, get_loaded_kernels\n"
        "m = get_local_kernel(Path(sys.argv[1]))\n"
        "data = (importlib.resources.files(m.__name__) / 'configs' / 'device.json').read_text()\n"
        "layout = str(get_loaded_kernels()[-1].metadata.build_layout)\n"
        "print(json.dumps([m.OPS, m.LAYER, m._native.VALUE, json.loads(data), layout]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    result = subprocess.run(
        [str(HF_PYTHON), "-I", "-c", code, str(root)],
        capture_output=True,
        text=True,
        env={**env, "HF_HUB_OFFLINE": "1"},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == [
        "ops",
        "layer",
        "native",
        {"block_size": 1024},
        "zip",
    ]
