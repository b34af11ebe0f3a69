"""The library a checkout loads: built from library/ into a cache folder named by its digest,
used only when its files are exactly the build's (kernels/library/builds.py).

The cache is hostile input: a changed, missing, added or linked file makes a fresh copy, never a
load of what is there."""

import logging
import os
from pathlib import Path

import pytest

from kernels.library import builds, library_path, library_source, load_library_package
from kernels.library.paths import built_repository
from tests.support.library import LIBRARY

SOURCE = Path(LIBRARY)


@pytest.fixture(scope="module")
def files():
    return builds.library_files(SOURCE)


def _build(cache: Path) -> Path:
    builds._built.pop((SOURCE.resolve(), cache), None)  # as a new process would
    return builds.built_library(SOURCE, cache)


def _tree(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_a_fresh_cache_gets_the_build_under_its_digest(tmp_path, files):
    folder = _build(tmp_path)
    assert folder == tmp_path / builds.digest(SOURCE, files)[: builds.DIGEST_LENGTH]
    assert _tree(folder) == files
    assert "norm/build/torch-cuda/metadata.json" in files
    assert "norm/torch-ext/norm/__init__.py" in files and "build.py" in files
    assert not any(name.endswith("symbols.json") for name in files)
    # Nothing else is left in the cache: the staging folder was renamed into place.
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]
    assert oct(folder.stat().st_mode & 0o777) == oct(0o700)


def test_a_good_cache_is_used_as_it_is(tmp_path):
    folder = _build(tmp_path)
    (folder / "norm" / "build" / "torch-cuda" / "__pycache__").mkdir()  # passed over
    inode = os.stat(folder / "norm" / "build" / "torch-cuda" / "__init__.py").st_ino
    assert _build(tmp_path) == folder
    assert os.stat(folder / "norm" / "build" / "torch-cuda" / "__init__.py").st_ino == inode


@pytest.mark.parametrize("tamper", ["changed", "appended", "missing", "added", "link", "file"])
def test_a_cache_that_differs_is_replaced_not_loaded(tmp_path, files, tamper):
    folder = _build(tmp_path)
    init = folder / "norm" / "build" / "torch-cuda" / "__init__.py"
    if tamper == "changed":
        init.write_bytes(b"raise SystemExit('planted')\n")
    elif tamper == "appended":
        init.write_bytes(init.read_bytes() + b"\nimport os\n")
    elif tamper == "missing":
        init.unlink()
    elif tamper == "added":
        (init.parent / "planted.py").write_text("x = 1\n")
    elif tamper == "link":
        init.unlink()
        init.symlink_to(tmp_path / "elsewhere.py")
        (tmp_path / "elsewhere.py").write_bytes(files["norm/build/torch-cuda/__init__.py"])
    elif tamper == "file":  # not even a folder
        import shutil

        shutil.rmtree(folder)
        folder.write_text("planted")
    assert not builds.matches(folder, files)
    assert _build(tmp_path) == folder
    assert _tree(folder) == files
    assert not init.is_symlink()


def test_a_build_renamed_into_place_by_another_process_is_kept(tmp_path, files, monkeypatch):
    """Two processes that build at once: the second finds the first's folder where it renames
    its own, checks it, and uses it."""
    target = tmp_path / builds.digest(SOURCE, files)[: builds.DIGEST_LENGTH]
    script = builds.build_script(SOURCE)
    real_write = script.write_files

    def write_then_lose_the_race(content, folder):
        real_write(content, folder)
        if not target.exists():
            real_write(content, target)  # the other process wins meanwhile

    monkeypatch.setattr(script, "write_files", write_then_lose_the_race)
    assert _build(tmp_path) == target
    assert _tree(target) == files
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # our copy went


def test_an_unwritable_cache_builds_for_this_process_and_says_how_to_keep_it(
    tmp_path, files, caplog
):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with caplog.at_level(logging.WARNING, logger="kernels.library.builds"):
        folder = _build(blocked / "cache")
    assert _tree(folder) == files
    assert not folder.is_relative_to(tmp_path)
    message = caplog.records[-1].getMessage()
    assert f"Cannot write the kernel library's build to {blocked / 'cache'}" in message
    assert "KERNELS_LIBRARY_CACHE" in message


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNELS_LIBRARY_CACHE", str(tmp_path / "explicit"))
    assert builds.cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("KERNELS_LIBRARY_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert builds.cache_dir() == tmp_path / "xdg" / "kernels" / "library"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert builds.cache_dir() == tmp_path / "home" / ".cache" / "kernels" / "library"


def test_a_change_of_the_source_is_a_new_folder(tmp_path, files):
    """Another source gives another digest: a process never loads a build of older sources."""
    import shutil

    copy = tmp_path / "library"
    shutil.copytree(SOURCE, copy, ignore=shutil.ignore_patterns("build", "__pycache__"))
    first = builds.built_library(copy, tmp_path / "cache")
    init = copy / "norm" / "torch-ext" / "norm" / "__init__.py"
    init.write_text(init.read_text() + "\n# changed\n")
    builds._built.pop((copy.resolve(), tmp_path / "cache"))
    second = builds.built_library(copy, tmp_path / "cache")
    assert second != first and second.parent == first.parent
    assert (
        (second / "norm" / "build" / "torch-cuda" / "__init__.py")
        .read_text()
        .endswith("# changed\n")
    )


def test_a_checkout_loads_its_library_from_the_build():
    assert library_source() == SOURCE
    built = library_path()
    assert built.parent == builds.cache_dir()
    norm = load_library_package("norm")
    assert Path(norm.__file__).is_relative_to(built / "norm" / "build")


def test_a_library_source_folder_names_its_build(tmp_path):
    """`kernels check library/norm` and the other commands that take a folder read the build
    of a library source folder; any other folder is itself."""
    assert built_repository(SOURCE / "norm") == library_path() / "norm"
    assert built_repository(tmp_path) == tmp_path
    assert built_repository(library_path() / "norm") == library_path() / "norm"
