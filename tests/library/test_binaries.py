"""Shipped Triton binaries (library/_shared/_binaries.py, library/binaries.py, library/build.py):
captured from a Triton cache written as Triton writes it, shipped by the build only when they
were compiled from the sources shipped, and seeded into another cache only where the Triton
version, GPU target and platform match and every digest is true. No GPU: the cache groups are
made with Triton's own ``FileCacheManager``, holding bytes of our making where the cubin would be.
"""

import base64
import hashlib
import importlib.util
import json
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tests.support.library import LIBRARY

TRITON = "3.6.0"
TARGET = "cuda:90"
KERNEL = "_fake_fwd"


def _load(name, path):
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return module


tool = _load("library_binaries_tool", Path(LIBRARY) / "binaries.py")
build = tool.build
shared = tool.shared
PLATFORM = shared.platform_tag()
LAUNCHER = f"__triton_launcher.{PLATFORM}.so"


def _repository(tmp_path, name="fakek", kernel=KERNEL):
    folder = tmp_path / name
    source = folder / "torch-ext" / name
    source.mkdir(parents=True)
    (folder / "build.toml").write_text(
        f'[general]\nname = "{name}"\nversion = 1\nlicense = "Apache-2.0"\n'
        'backends = ["cuda", "rocm"]\n\n[torch-noarch]\n'
    )
    (source / "__init__.py").write_text(
        "import triton\nimport triton.language as tl\n\n\n"
        f"@triton.jit\ndef {kernel}(x, N: tl.constexpr):\n    pass\n\n\n"
        "@triton.autotune(configs=[], key=[])\n@triton.jit\ndef _tuned(x):\n    pass\n"
    )
    return build.read_repository(folder)


def _key(text: str) -> str:
    return base64.b32encode(hashlib.sha256(text.encode()).digest()).decode().rstrip("=")


def _fill_cache(cache: Path, monkeypatch) -> dict:
    """A Triton cache as a GPU run leaves it, written by Triton's FileCacheManager: our kernel
    (metadata, cubin and the IR files), a kernel of someone else's, and a C launcher."""
    from triton.runtime.cache import FileCacheManager

    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    written = {}
    for name, key in ((KERNEL, _key("ours")), ("_not_ours", _key("theirs"))):
        manager = FileCacheManager(key)
        metadata = {
            "hash": key,
            "target": {"backend": "cuda", "arch": 90, "warp_size": 32},
            "num_warps": 4,
            "name": name,
            "triton_version": TRITON,
        }
        group = {}
        for filename, data in (
            (f"{name}.ttir", "module {}"),
            (f"{name}.ptx", "// ptx"),
            (f"{name}.cubin", bytes(range(256)) * 40),  # a 10 kB stand-in
            (f"{name}.json", json.dumps(metadata)),
        ):
            group[filename] = manager.put(data, filename)
        manager.put_group(f"{name}.json", group)
        written[name] = key
    launcher = FileCacheManager(_key("launcher"))
    launcher.put(b"\x7fELF launcher" * 1000, LAUNCHER)
    written["launcher"] = _key("launcher")
    return written


@pytest.fixture
def captured(tmp_path, monkeypatch):
    """A repository with binaries captured from a filled cache, built into build/."""
    repo = _repository(tmp_path)
    keys = _fill_cache(tmp_path / "capture-cache", monkeypatch)
    manifest = tool.capture(repo, tmp_path / "capture-cache")
    build.write_build(repo, symbols=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "user-cache"))
    return repo, manifest, keys


def _package(repo, variant="torch-cuda") -> Path:
    folder = repo.folder / "build" / variant
    return folder / repo.package if variant == "torch-universal" else folder


def _seed(package: Path, cache: Path, **overrides):
    options = dict(target=TARGET, triton_version=TRITON, platform=PLATFORM, cache_dir=str(cache))
    return shared.seed(str(package), **{**options, **overrides})


def _stored(manifest, name: str) -> str:
    """Where the content of the file ``name`` (of the manifest's one group holding it) is."""
    (file,) = [f for g in manifest.groups for f in g.files if f.name == name]
    return shared.stored(file)


def _files(folder: Path) -> dict:
    if not folder.is_dir():
        return {}
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


# ---- capture -------------------------------------------------------------------------------


def test_capture_takes_the_package_kernels_metadata_and_binary_and_the_c_modules(captured):
    repo, manifest, keys = captured
    assert tool.jit_names(repo) == {KERNEL, "_tuned"}
    kernels = [g for g in manifest.groups if g.kernel is not None]
    modules = [g for g in manifest.groups if g.module is not None]
    assert [(g.kernel, g.target, g.triton, g.key) for g in kernels] == [
        (KERNEL, TARGET, TRITON, keys[KERNEL])
    ]
    # Compiled under the key of the Python whose C modules the cache holds.
    assert kernels[0].platform == PLATFORM
    # What a cache hit reads; the IR files are left out.
    assert {f.name for f in kernels[0].files} == {f"{KERNEL}.json", f"{KERNEL}.cubin"}
    assert [(g.module, g.platform, g.triton) for g in modules] == [
        ("__triton_launcher", PLATFORM, TRITON)
    ]
    # Each content stored once, named by its digest and its name's extension.
    on_disk = _files(repo.folder / "binaries")
    listed = {f.name: f for g in manifest.groups for f in g.files}
    assert set(listed) == {f"{KERNEL}.json", f"{KERNEL}.cubin", LAUNCHER}
    assert set(on_disk) == {
        "manifest.json",
        f"files/{listed[f'{KERNEL}.json'].sha256}.json",
        f"files/{listed[f'{KERNEL}.cubin'].sha256}.cubin",
        f"files/{listed[LAUNCHER].sha256}.so",
    }
    assert all(hashlib.sha256(on_disk[shared.stored(f)]).hexdigest() == f.sha256 for f in listed.values())  # fmt: skip
    assert shared.verify_files(str(repo.folder / "binaries"), manifest) == []


def test_a_cache_without_the_package_kernels_leaves_the_folder_as_it_was(tmp_path, monkeypatch):
    repo = _repository(tmp_path, "otherk", kernel="_other_fwd")
    _fill_cache(tmp_path / "cache", monkeypatch)
    assert tool.capture(repo, tmp_path / "cache") is None
    assert not (repo.folder / "binaries").exists()


# ---- build ---------------------------------------------------------------------------------


def test_the_cuda_variants_carry_the_binaries_covered_by_their_digests(captured):
    repo, manifest, _ = captured
    binaries = _files(repo.folder / "binaries")
    for variant in ("torch-cuda", "torch-universal"):
        package = _package(repo, variant)
        assert _files(package / "_binaries") == binaries, variant
        variant_dir = repo.folder / "build" / variant
        digests = json.loads((variant_dir / "metadata.json").read_text())["digest"]["files"]
        prefix = "fakek/" if variant == "torch-universal" else ""
        for name, content in binaries.items():
            expected = base64.b64encode(hashlib.sha256(content).digest()).decode()
            assert digests[f"{prefix}_binaries/{name}"] == expected
        # The digest kernels check compares is the build's own.
        assert shared.shipped_source_digest(str(package)) == manifest.source_digest
    assert not (repo.folder / "build" / "torch-rocm" / "_binaries").exists()
    # A variant's id names its content: with binaries it is another build than without them
    # (Hugging Face's client refuses two builds of one id in a process: tests/interop).
    for variant in ("torch-cuda", "torch-universal", "torch-rocm"):
        meta = json.loads((repo.folder / "build" / variant / "metadata.json").read_text())
        plain = build.metadata(repo, variant, manifest.source_digest)["id"]
        assert (meta["id"] == plain) == (variant == "torch-rocm"), variant


def test_stale_binaries_are_not_shipped_and_the_build_says_so(captured, capsys):
    repo, _, _ = captured
    init = repo.folder / "torch-ext" / repo.package / "__init__.py"
    init.write_text(init.read_text() + "\n# changed\n")
    files = build.build_files(repo, symbols=False)
    assert not any("_binaries/" in name for name in files)
    _, note = build.shipped_binaries(repo, build.source_digest(build.package_files(repo)))
    assert "left out: captured from other sources" in note
    assert build.main([str(repo.folder), "--no-symbols"]) == 0
    assert "note: fakek: binaries/ left out" in capsys.readouterr().out


def test_a_binary_that_differs_from_its_manifest_fails_the_build(captured):
    repo, manifest, keys = captured
    cubin = repo.folder / "binaries" / _stored(manifest, f"{KERNEL}.cubin")
    cubin.write_bytes(b"\1" + cubin.read_bytes()[1:])
    with pytest.raises(build.LibraryBuildError, match="SHA-256 differs"):
        build.build_files(repo, symbols=False)


# ---- seeding -------------------------------------------------------------------------------


def test_seeding_writes_the_files_byte_identical_and_a_group_triton_reads(captured, tmp_path):
    from triton.runtime.cache import FileCacheManager

    repo, manifest, keys = captured
    cache = tmp_path / "user-cache"
    report = _seed(_package(repo), cache)
    assert (report.written, report.refused, report.skipped) == (3, 0, None)
    ours = _files(_package(repo) / "_binaries")
    kernel = f"{keys[KERNEL]}/{KERNEL}"
    for name in (f"{kernel}.json", f"{kernel}.cubin"):
        assert (cache / name).read_bytes() == ours[_stored(manifest, name.split("/")[1])]
    launcher = f"{keys['launcher']}/{LAUNCHER}"
    assert (cache / launcher).read_bytes() == ours[_stored(manifest, LAUNCHER)]
    # Triton's own reader finds the group, pointing at this cache's files: a cache hit.
    group = FileCacheManager(keys[KERNEL]).get_group(f"{KERNEL}.json")
    assert group == {
        f"{KERNEL}.json": str(cache / f"{kernel}.json"),
        f"{KERNEL}.cubin": str(cache / f"{kernel}.cubin"),
    }
    assert not [p for p in cache.rglob("*tmp*")]  # no temporary file left


def test_the_legacy_variant_seeds_the_same(captured, tmp_path):
    repo, _, _ = captured
    assert _seed(_package(repo, "torch-universal"), tmp_path / "c").written == 3


def test_files_already_in_the_cache_are_kept(captured, tmp_path):
    repo, _, keys = captured
    cache = tmp_path / "user-cache"
    (cache / keys["launcher"]).mkdir(parents=True)
    (cache / keys["launcher"] / LAUNCHER).write_bytes(b"the user's own")
    report = _seed(_package(repo), cache)
    assert (report.written, report.present) == (2, 1)
    assert (cache / keys["launcher"] / LAUNCHER).read_bytes() == b"the user's own"


def test_a_tampered_binary_is_never_copied_and_warns(captured, tmp_path, caplog):
    repo, manifest, keys = captured
    cubin = _package(repo) / "_binaries" / _stored(manifest, f"{KERNEL}.cubin")
    data = bytearray(cubin.read_bytes())
    data[100] ^= 1  # one bit of one byte
    cubin.write_bytes(bytes(data))
    cache = tmp_path / "user-cache"
    with caplog.at_level(logging.WARNING, logger="kernels.binaries"):
        report = _seed(_package(repo), cache)
    assert report.refused == 1
    # Neither the cubin nor its group (so Triton compiles the kernel itself), nor the marker
    # (so the next process checks again); the launcher, whose digest is true, is there.
    assert not (cache / keys[KERNEL]).exists()
    assert (cache / keys["launcher"] / LAUNCHER).is_file()
    assert not list(cache.glob(f"{shared.MARKER_PREFIX}*"))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert f"{KERNEL}.cubin" in warnings[0].getMessage()
    assert "build" in warnings[0].getMessage() or "torch-cuda" in warnings[0].getMessage()


@pytest.mark.parametrize(
    "overrides",
    [
        {"triton_version": "3.5.1"},
        {"target": "cuda:80"},
        {"target": "hip:gfx942"},
    ],
    ids=["another-triton", "another-arch", "rocm"],
)
def test_another_triton_or_gpu_copies_no_kernel(captured, tmp_path, overrides):
    repo, _, keys = captured
    cache = tmp_path / "user-cache"
    report = _seed(_package(repo), cache, **overrides)
    assert not (cache / keys[KERNEL]).exists()
    if "triton_version" in overrides:
        assert report.skipped == "no matching binaries" and not cache.exists()


def test_another_python_copies_neither_kernel_nor_c_module(captured, tmp_path):
    """A kernel's cache key hashes Triton's build for one Python: under another its key is
    another, so the capture's kernels are not copied for it (nor its C modules)."""
    repo, _, keys = captured
    cache = tmp_path / "user-cache"
    report = _seed(_package(repo), cache, platform="cpython-312-aarch64-linux-gnu")
    assert report.written == 0 and report.skipped == "no matching binaries"
    assert not (cache / keys[KERNEL]).exists() and not (cache / keys["launcher"]).exists()


def test_a_kernel_group_of_no_python_is_copied_for_any(captured, tmp_path):
    repo, manifest, keys = captured
    package = _package(repo)
    untagged = shared.Manifest(
        manifest.repository,
        manifest.source_digest,
        tuple(replace(g, platform=None) if g.kernel else g for g in manifest.groups),
    )
    (package / "_binaries" / shared.MANIFEST).write_text(untagged.to_json())
    cache = tmp_path / "user-cache"
    report = _seed(package, cache, platform="cpython-312-aarch64-linux-gnu")
    assert report.written == 2 and (cache / keys[KERNEL] / f"{KERNEL}.cubin").is_file()
    assert not (cache / keys["launcher"]).exists()


def test_a_cache_manager_of_the_users_own_means_no_seeding(captured, tmp_path, monkeypatch):
    repo, _, _ = captured
    monkeypatch.setenv("TRITON_CACHE_MANAGER", "my_cache:MyManager")
    report = shared.seed(str(_package(repo)), target=TARGET, triton_version=TRITON)
    assert "cache manager" in report.skipped
    assert not (tmp_path / "user-cache").exists()


def test_the_switch_turns_seeding_off(captured, tmp_path, monkeypatch):
    repo, _, _ = captured
    monkeypatch.setenv("KERNELS_TRITON_BINARIES", "0")
    assert _seed(_package(repo), tmp_path / "c").skipped == "KERNELS_TRITON_BINARIES=0"
    assert not (tmp_path / "c").exists()


def test_the_default_cache_is_tritons(captured, tmp_path):
    repo, _, keys = captured
    report = shared.seed(str(_package(repo)), target=TARGET, triton_version=TRITON)
    assert report.written == 3  # TRITON_CACHE_DIR, as Triton reads it
    assert (tmp_path / "user-cache" / keys[KERNEL] / f"{KERNEL}.cubin").is_file()


def test_an_unwritable_cache_warns_once_and_raises_nothing(captured, tmp_path, caplog):
    repo, _, _ = captured
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")  # root can write anywhere; a file is in the way for all
    with caplog.at_level(logging.WARNING, logger="kernels.binaries"):
        report = _seed(_package(repo), blocked)
    assert report.skipped == "cache not writable"
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "cannot write its Triton binaries" in caplog.records[0].getMessage()


def test_the_marker_makes_a_later_seeding_hash_nothing_but_the_manifest(
    captured, tmp_path, monkeypatch
):
    repo, _, _ = captured
    cache = tmp_path / "user-cache"
    hashed = []
    original = shared.file_sha256
    monkeypatch.setattr(
        shared, "file_sha256", lambda data: hashed.append(len(data)) or original(data)
    )
    assert _seed(_package(repo), cache).written == 3
    assert len(hashed) == 4  # three files and the manifest
    hashed.clear()
    report = _seed(_package(repo), cache)
    assert report.skipped == "seeded before" and report.written == 0
    manifest_size = (_package(repo) / "_binaries" / "manifest.json").stat().st_size
    assert hashed == [manifest_size + len(f"\0{TRITON}\0{TARGET}\0{PLATFORM}")]
    # Another GPU sharing the cache makes another selection, so has a marker of its own: it
    # checks again (and finds the launcher there, and no kernel of its own).
    report = _seed(_package(repo), cache, target="cuda:80")
    assert (report.skipped, report.present, report.written) == (None, 1, 0)


def test_seeding_for_a_device_happens_once_a_process_and_never_raises(monkeypatch, caplog):
    calls = []
    monkeypatch.setattr(shared, "_seeded", set())
    monkeypatch.setattr(shared, "_targets", {})
    monkeypatch.setattr(shared, "device_target", lambda index: TARGET)
    monkeypatch.setattr(shared, "seed", lambda package_dir, target: calls.append(target))
    shared.seed_for_device(0)
    shared.seed_for_device(0)
    assert calls == [TARGET]

    def broken(index):
        raise RuntimeError("no driver")

    monkeypatch.setattr(shared, "_targets", {})
    monkeypatch.setattr(shared, "device_target", broken)
    with caplog.at_level(logging.WARNING, logger="kernels.binaries"):
        shared.seed_for_device(1)
    assert "Seeding the shipped Triton binaries failed" in caplog.text


def test_the_launcher_seeds_before_its_first_compile_only_on_cuda():
    """library/_shared/_library.py calls the seeder on the CUDA path's cache miss, before
    Triton's compile, and nowhere else."""
    source = (Path(LIBRARY) / "_shared" / "_library.py").read_text()
    cuda_path = source[source.index("    entry = _compiled.get(key)") :]
    assert cuda_path.index("_seed_binaries(index)") < cuda_path.index("kernel[grid](")
    assert source.count("_seed_binaries(") == 1


# ---- hostile manifests ---------------------------------------------------------------------


def _valid_document(keys=None) -> dict:
    key = _key("ours")
    return {
        "format": 2,
        "repository": "fakek",
        "source_digest": "0" * 64,
        "groups": [
            {
                "triton": TRITON,
                "target": TARGET,
                "kernel": KERNEL,
                "key": key,
                "files": {f"{KERNEL}.json": {"sha256": "a" * 64, "size": 10}},
            }
        ],
    }


def _with(path, value):
    document = _valid_document()
    node = document
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return document


HOSTILE = {
    "dotdot-key": _with(("groups", 0, "key"), ".."),
    "traversing-key": _with(("groups", 0, "key"), "../../etc"),
    "absolute-file": _with(
        ("groups", 0, "files"), {"/etc/passwd": {"sha256": "a" * 64, "size": 1}}
    ),
    "nested-file": _with(
        ("groups", 0, "files"), {f"{KERNEL}.json/../x": {"sha256": "a" * 64, "size": 1}}
    ),
    "group-file": _with(
        ("groups", 0, "files"), {f"__grp__{KERNEL}.json": {"sha256": "a" * 64, "size": 1}}
    ),
    "traversing-version": _with(("groups", 0, "triton"), "../3.6.0"),
    "traversing-target": _with(("groups", 0, "target"), "cuda:../x"),
    "huge-file": _with(("groups", 0, "files", f"{KERNEL}.json", "size"), 2**40),
    "size-as-text": _with(("groups", 0, "files", f"{KERNEL}.json", "size"), "10"),
    "size-as-bool": _with(("groups", 0, "files", f"{KERNEL}.json", "size"), True),
    "digest-short": _with(("groups", 0, "files", f"{KERNEL}.json", "sha256"), "abc"),
    "unknown-key": _with(("groups", 0, "extra"), 1),
    "groups-not-list": _with(("groups",), {}),
    "format-1": _with(("format",), 1),
    "one-content-two-sizes": _with(
        ("groups", 0, "files"),
        {
            f"{KERNEL}.json": {"sha256": "a" * 64, "size": 10},
            f"{KERNEL}.cubin": {"sha256": "a" * 64, "size": 11},
        },
    ),
    "another-kernel-file": _with(
        ("groups", 0, "files"), {"other.cubin": {"sha256": "a" * 64, "size": 1}}
    ),
}


@pytest.mark.parametrize("document", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_manifests_are_refused(document):
    shared.parse_manifest(json.dumps(_valid_document()).encode())  # the base is fine
    with pytest.raises(shared.ManifestError):
        shared.parse_manifest(json.dumps(document).encode())


def test_an_oversized_or_linked_manifest_is_refused_and_seeding_warns(tmp_path, caplog):
    package = tmp_path / "pkg"
    (package / "_binaries").mkdir(parents=True)
    manifest = package / "_binaries" / "manifest.json"
    manifest.write_bytes(b" " * (shared.MAX_MANIFEST_BYTES + 1))
    with pytest.raises(shared.ManifestError, match="larger than"):
        shared.read_manifest(str(package / "_binaries"))
    manifest.unlink()
    (tmp_path / "elsewhere.json").write_text(json.dumps(_valid_document()))
    manifest.symlink_to(tmp_path / "elsewhere.json")
    with caplog.at_level(logging.WARNING, logger="kernels.binaries"):
        report = _seed(package, tmp_path / "cache")
    assert report.skipped == "manifest refused" and not (tmp_path / "cache").exists()
    assert "manifest" in caplog.text and "compile as usual" in caplog.text


def test_a_package_without_binaries_seeds_nothing(tmp_path):
    assert _seed(tmp_path, tmp_path / "cache").skipped == "no binaries"
    assert not (tmp_path / "cache").exists()


# ---- kernels check -------------------------------------------------------------------------


def test_kernels_check_verifies_the_binaries(captured):
    from kernels.cli.check import Report, _check_binaries

    repo, manifest, keys = captured
    report = Report()
    _check_binaries(report, "torch-cuda", _package(repo))
    assert [s for s, _ in report.lines] == ["ok", "-"]
    assert "--rebuild-binaries" in report.lines[1][1]

    cubin = _package(repo) / "_binaries" / _stored(manifest, f"{KERNEL}.cubin")
    cubin.write_bytes(cubin.read_bytes() + b"\0")
    (_package(repo) / "__init__.py").write_text("# other sources\n")
    report = Report()
    _check_binaries(report, "torch-cuda", _package(repo))
    failures = [text for status, text in report.lines if status == "FAIL"]
    assert len(failures) == 2
    assert f"({KERNEL}.cubin): its SHA-256 differs" in failures[0]
    assert "other sources" in failures[1]


def test_the_real_library_ships_no_stale_binaries():
    """Whatever library/<repo>/binaries/ holds verifies, and is shipped or noted as stale."""
    for repo in build.repositories():
        files, note = build.shipped_binaries(repo, build.source_digest(build.package_files(repo)))
        assert files or note or not (repo.folder / "binaries").exists()


def test_os_helpers_keep_the_users_umask(captured, tmp_path):
    repo, _, keys = captured
    old = os.umask(0o027)
    try:
        _seed(_package(repo), tmp_path / "user-cache")
    finally:
        os.umask(old)
    mode = (tmp_path / "user-cache" / keys[KERNEL] / f"{KERNEL}.cubin").stat().st_mode & 0o777
    assert mode == 0o640


# ---- the ZIP build layout ------------------------------------------------------------------


def test_a_zip_layout_package_loads_with_its_binaries_and_seeds_nothing(captured, tmp_path):
    """kernel-builder's ZIP layout packs the package into ``<id>.zip``; compiled modules may not
    be inside it (kernels/repos/archive.py refuses them), so a ZIP build carries the kernel
    groups only. It loads as before; the seeder reads a folder on disk, which an archive is
    not, so it seeds nothing (and raises nothing)."""
    from kernels import get_local_kernel
    from kernels.errors import KernelArchiveError
    from tests.support.zip_layout import write_zip_variant

    repo, _, _ = captured
    package = _package(repo)
    members = {
        name: content
        for name, content in _files(package).items()
        if name not in ("metadata.json", "__init__.py") and not name.endswith(".so")
    }
    members["__init__.py"] = b"from . import _binaries\n"
    assert any(name.startswith("_binaries/files/") and name.endswith(".cubin") for name in members)
    root = tmp_path / "zipped"
    write_zip_variant(root / "build" / "torch-universal", members=members, beside={})
    module = get_local_kernel(root)
    seeder = module._binaries
    report = _seed(Path(seeder.__file__).parent, tmp_path / "zip-cache")
    assert report.skipped == "no binaries" and not (tmp_path / "zip-cache").exists()

    with_modules = {**members, **{n: c for n, c in _files(package).items() if n.endswith(".so")}}
    refused = tmp_path / "refused"
    write_zip_variant(refused / "build" / "torch-universal", members=with_modules, beside={})
    with pytest.raises(KernelArchiveError, match="compiled module"):
        get_local_kernel(refused)


def test_the_installed_library_carries_each_binary_in_its_variants_only(captured, monkeypatch):
    """The wheel and a checkout's cache (`library_files`) ship the binaries inside the CUDA
    variants, which load them, not the repository's captured ``binaries/`` a second time."""
    repo, _, _ = captured
    monkeypatch.setattr(build, "LIBRARY", repo.folder.parent)
    files = build.library_files()
    assert not [name for name in files if name.startswith(f"{repo.name}/binaries/")]
    for variant in ("torch-cuda", f"torch-universal/{repo.name}"):
        prefix = f"{repo.name}/build/{variant}/_binaries/"
        assert [name for name in files if name.startswith(prefix)], variant
