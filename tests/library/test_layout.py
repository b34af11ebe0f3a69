"""Our kernel repositories as kernel-builder lays them out: source in ``torch-ext/<package>/`` beside
``build.toml``, the launch helper once in ``library/_shared/``, and ``build/<variant>/`` produced
from both by library/build.py: never committed, built where it is needed (the package, from a
checkout, into a verified cache: tests/library/test_library_builds.py).

These tests keep git free of builds, the build deterministic and made of exactly the source and
the shared files, every digest true, and every variant's ``metadata.json`` loadable by Hugging
Face's client (``tests/interop`` loads them through that client itself)."""

import base64
import hashlib
import importlib.util
import json
import keyword
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from kernels.library import ATTENTION_REPO, KERNELS, library_path
from kernels.repos.info import Metadata
from kernels.repos.layout import locate_package
from kernels.repos.variants import MachineBuild, VariantAccepted, decide_variants
from tests.support.library import LIBRARY


def _load_build_script(path=Path(LIBRARY) / "build.py", name="library_build"):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


build = _load_build_script()
REPOS = build.repositories()
NOARCH = ("torch-cuda", "torch-rocm", "torch-xpu")

# Hugging Face's client (0.17.2) on metadata.json: the keys it requires and their types, the
# backend types it knows, the python-depends it allows (per backend besides the general ones),
# and its kernel-name rule (its kernels/_rust.pyi and python_depends.json).
REQUIRED = {
    "name": str,
    "id": str,
    "version": int,
    "license": str,
    "python-depends": list,
    "backend": dict,
}
BACKEND_TYPES = {"cann", "cpu", "cuda", "metal", "neuron", "rocm", "tpu", "xpu"}
PYTHON_DEPENDS = {"einops", "helion", "tvm-ffi"}
BACKEND_PYTHON_DEPENDS = {"cuda": {"nvidia-cutlass-dsl"}, "xpu": {"onednn"}}
KERNEL_NAME = re.compile(r"[a-z][-a-z0-9]*[a-z0-9]")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _built(repo) -> Path:
    """``repo``'s folder in the library the package loads (built from the source)."""
    return library_path() / repo.name


def _variants(repo):
    return sorted(p for p in (_built(repo) / "build").iterdir() if p.is_dir())


def test_the_repositories_are_the_ones_the_library_maps():
    # attention is served through transformers' attention registry, not the layer mapping.
    assert {repo.name for repo in REPOS} == {kernel.repo for kernel in KERNELS} | {ATTENTION_REPO}
    for repo in REPOS:
        assert repo.variants == ("torch-universal", *NOARCH), repo.name
        assert (repo.folder / "torch-ext" / repo.package / "__init__.py").is_file()


def test_git_holds_no_build():
    """build/ is generated (library/build.py): git ignores it and tracks none of its files."""
    root = Path(LIBRARY).parent
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(
        ["git", "ls-files", "library"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    assert tracked and not [name for name in tracked if "/build/" in name], "git rm -r --cached"
    probe = "library/norm/build/torch-cuda/__init__.py"
    ignored = subprocess.run(["git", "check-ignore", "-q", probe], cwd=root)
    assert ignored.returncode == 0, f".gitignore must ignore {probe}"


def test_the_loaded_library_is_a_fresh_build_of_the_source():
    """What the package loads from a checkout is byte for byte library/build.py's build of
    torch-ext/ and library/_shared/ (without symbols.json), beside a copy of the sources."""
    assert build.tree(library_path()) == build.library_files(symbols=False)


@pytest.mark.parametrize("repo", REPOS, ids=lambda r: r.name)
def test_each_variant_is_exactly_the_source_and_the_shared_files(repo):
    """A variant holds the package's source files and the shared ones, byte for byte, and
    metadata.json; a CUDA variant also the Triton binaries captured from these sources, as
    ``_binaries/``: nothing else (a build for the Hub adds symbols.json)."""
    package = build._files_under(repo.folder / "torch-ext" / repo.package, repo.pyext)
    shared = build._files_under(build.SHARED, build.DEFAULT_PYEXT)
    assert package and shared and not package.keys() & shared.keys()
    # (binaries captured from other sources are left out: test_binaries.py tests that)
    binaries, _ = build.shipped_binaries(repo, build.source_digest(build.package_files(repo)))
    files = build.build_files(repo, symbols=False)
    for variant in repo.variants:
        folder = f"{repo.package}/" if variant == "torch-universal" else ""
        expected = {folder + name: content for name, content in {**package, **shared}.items()}
        if build._carries_binaries(variant):
            expected.update({f"{folder}_binaries/{n}": c for n, c in binaries.items()})
        expected["metadata.json"] = files[f"{variant}/metadata.json"]
        inside = {
            name.removeprefix(f"{variant}/"): content
            for name, content in files.items()
            if name.startswith(f"{variant}/")
        }
        assert inside == expected, variant


@pytest.mark.parametrize("repo", REPOS, ids=lambda r: r.name)
def test_every_digest_in_metadata_json_is_true(repo):
    """Clients check each variant's files against its metadata.json's digest before import:
    it lists every other file of the variant, with its SHA-256 (base64)."""
    for variant in _variants(repo):
        meta = json.loads((variant / "metadata.json").read_text())
        files = build.tree(variant)
        del files["metadata.json"]
        assert meta["digest"]["algorithm"] == "sha256"
        assert meta["digest"]["files"] == {
            name: base64.b64encode(hashlib.sha256(content).digest()).decode()
            for name, content in files.items()
        }, variant


def test_building_is_deterministic(tmp_path):
    """Two builds of every repository, in other folders, are the same bytes."""
    first = {repo.name: build.tree(build.write_build(repo, tmp_path / "a" / repo.name, symbols=False)) for repo in REPOS}  # fmt: skip
    second = {repo.name: build.tree(build.write_build(repo, tmp_path / "b" / repo.name, symbols=False)) for repo in REPOS}  # fmt: skip
    assert first == second
    assert build.main(["--out", str(tmp_path / "a"), "--no-symbols", "--check"]) == 0


def test_building_twice_changes_nothing_and_drops_what_the_source_no_longer_has(tmp_path):
    repo = next(r for r in REPOS if r.name == "rotary")
    first = build.tree(build.write_build(repo, out=tmp_path / "a", symbols=False))
    target = build.write_build(repo, out=tmp_path / "b", symbols=False)
    (target / "torch-cuda" / "removed_module.py").write_text("x = 1\n")
    (target / "torch-old").mkdir()
    assert build.tree(build.write_build(repo, out=tmp_path / "b", symbols=False)) == first


@pytest.mark.parametrize("repo", REPOS, ids=lambda r: r.name)
def test_every_copy_of_a_shared_file_is_the_source(repo):
    shared = {p.name: _sha256(p.read_bytes()) for p in build.SHARED.glob("*.py")}
    assert "_library.py" in shared
    # The source keeps no copy of its own, which could drift from the shared one.
    source = repo.folder / "torch-ext" / repo.package
    assert not {p.name for p in source.iterdir()} & shared.keys()
    for variant in _variants(repo):
        package = variant / repo.package if variant.name == "torch-universal" else variant
        for name, digest in shared.items():
            assert _sha256((package / name).read_bytes()) == digest, package / name


@pytest.mark.parametrize("repo", REPOS, ids=lambda r: r.name)
def test_each_variant_has_its_layout(repo):
    """torch-universal keeps the legacy layout (the package in build/torch-universal/<package>/),
    which older clients load; the noarch variants the current one (the variant folder is the
    package)."""
    universal = _built(repo) / "build" / "torch-universal"
    assert (universal / repo.package / "__init__.py").is_file()
    assert not (universal / "__init__.py").exists()
    for name in NOARCH:
        variant = _built(repo) / "build" / name
        assert (variant / "__init__.py").is_file() and (variant / "_library.py").is_file()
        assert not (variant / repo.package).exists()


@pytest.mark.parametrize("repo", REPOS, ids=lambda r: r.name)
def test_every_metadata_json_is_what_hugging_faces_client_requires(repo):
    ids = set()
    for variant in _variants(repo):
        path = variant / "metadata.json"
        data = json.loads(path.read_text())
        for key, kind in REQUIRED.items():
            assert isinstance(data.get(key), kind), f"{path}: {key!r} must be a {kind.__name__}"
        assert type(data["version"]) is int and data["version"] == repo.version
        assert KERNEL_NAME.fullmatch(data["name"]) and data["name"] == repo.name
        backend = data["backend"]["type"]
        # A noarch variant declares its own backend; torch-universal one Hugging Face accepts
        # ("universal" is not a backend type there).
        assert backend == ("cuda" if variant.name == "torch-universal" else variant.name[6:])
        assert backend in BACKEND_TYPES
        allowed = PYTHON_DEPENDS | BACKEND_PYTHON_DEPENDS.get(backend, set())
        assert set(data["python-depends"]) <= allowed and data["python-depends"] == []
        assert data["license"] == "Apache-2.0"
        # The id is the module name Hugging Face's client imports the variant under.
        kind = "universal" if variant.name == "torch-universal" else backend
        assert re.fullmatch(rf"_{repo.package}_{kind}_[0-9a-f]{{10}}", data["id"]), data["id"]
        assert data["id"].isidentifier() and not keyword.iskeyword(data["id"])
        ids.add(data["id"])
        # Our own reader takes it too.
        assert Metadata.load_from_variant(variant).name == repo.name
    assert len(ids) == len(_variants(repo))


def test_variant_ids_follow_the_source(tmp_path):
    """Another source gives other ids (another module name in Hugging Face's client, so two
    versions load side by side); the same source the same ids."""
    repo = next(r for r in REPOS if r.name == "rotary")
    copy = tmp_path / "rotary"
    shutil.copytree(repo.folder / "torch-ext", copy / "torch-ext")
    shutil.copy(repo.folder / "build.toml", copy / "build.toml")
    if (repo.folder / build.BINARIES).is_dir():  # captured binaries are part of a CUDA build
        shutil.copytree(repo.folder / build.BINARIES, copy / build.BINARIES)
    changed = build.read_repository(copy)

    def ids(r):
        files = build.build_files(r, symbols=False)
        return {json.loads(v)["id"] for k, v in files.items() if k.endswith("metadata.json")}

    assert ids(changed) == ids(repo)
    init = copy / "torch-ext" / "rotary" / "__init__.py"
    init.write_text(init.read_text() + "\n# changed\n")
    assert ids(changed).isdisjoint(ids(repo))


def _machine(backend, version=None):
    return MachineBuild(
        torch=Version("2.13"),
        cxx_abi="cxx11",
        backend=backend,
        backend_version=None if version is None else Version(version),
        cpu="x86_64",
        os="linux",
    )


@pytest.mark.parametrize(
    "machine,expected",
    [
        (_machine("cpu"), "torch-universal"),
        (_machine("cuda", "12.8"), "torch-cuda"),
        (_machine("rocm", "6.3"), "torch-rocm"),
        (_machine("xpu", "2025.1"), "torch-xpu"),
        (_machine("metal"), "torch-universal"),
    ],
    ids=["cpu", "cuda", "rocm", "xpu", "metal"],
)
def test_our_loader_takes_the_variant_of_the_machines_backend(machine, expected):
    for repo in REPOS:
        names = [p.name for p in _variants(repo)]
        decisions = decide_variants(names, machine=machine)
        first = next(d for d in decisions if isinstance(d, VariantAccepted) and d.rank == 0)
        assert first.variant.variant_str == expected, repo.name


def test_the_package_is_found_in_either_layout():
    repo = library_path() / "norm"
    universal = locate_package(repo, "norm", where="norm", variant="torch-universal")
    assert universal.package_dir == repo / "build" / "torch-universal" / "norm"
    flat = locate_package(repo, "norm", where="norm", variant="torch-cuda")
    assert flat.package_dir == repo / "build" / "torch-cuda"


def _repo_with(tmp_path, toml: str, files: dict[str, str] | None = None) -> Path:
    folder = tmp_path / "demo"
    (folder / "torch-ext" / "demo").mkdir(parents=True)
    (folder / "build.toml").write_text(toml)
    for name, text in {"__init__.py": "", **(files or {})}.items():
        (folder / "torch-ext" / "demo" / name).write_text(text)
    return folder


GOOD = """[general]
name = "demo"
version = 2
license = "Apache-2.0"
backends = ["cuda"]

[torch-noarch]
"""


@pytest.mark.parametrize(
    "toml,message",
    [
        (GOOD.replace('"demo"', '"Demo"'), "lowercase letters, digits and dashes"),
        (GOOD.replace('"demo"', '"other"'), "differs from its folder"),
        (GOOD.replace("version = 2", "version = true"), "version must be a positive integer"),
        (GOOD.replace('["cuda"]', '["cuda", "tpu"]'), "backends must be"),
        (GOOD.replace("[torch-noarch]", ""), "needs a [torch-noarch] table"),
        (GOOD + "\n[torch]\nsrc = []\n", "pure-Python (noarch) repositories only"),
        (GOOD.replace("[general]", "[general]\nupstream = 1"), "unknown keys ['upstream']"),
        ("[general\n", "is not valid TOML"),
    ],
    ids=["name", "folder", "version", "backend", "noarch", "compiled", "unknown", "toml"],
)
def test_a_bad_build_toml_is_named_with_the_fix(tmp_path, toml, message):
    folder = _repo_with(tmp_path, toml)
    with pytest.raises(build.LibraryBuildError, match=re.escape(message)):
        build.read_repository(folder)


def test_a_source_file_named_as_a_shared_one_is_refused(tmp_path):
    folder = _repo_with(tmp_path, GOOD, {"_library.py": "x = 1\n"})
    repo = build.read_repository(folder)
    with pytest.raises(build.LibraryBuildError, match="has the name of a shared file"):
        build.package_files(repo)


def test_a_repository_builds_its_backends_with_metadata(tmp_path):
    folder = _repo_with(tmp_path, GOOD, {"op.py": "y = 2\n", "notes.txt": "not shipped\n"})
    repo = build.read_repository(folder)
    files = build.build_files(repo)
    assert sorted(files) == [
        "torch-cuda/__init__.py",
        "torch-cuda/_binaries.py",
        "torch-cuda/_compile_rule.py",
        "torch-cuda/_library.py",
        "torch-cuda/metadata.json",
        "torch-cuda/op.py",
        "torch-cuda/symbols.json",
        "torch-universal/demo/__init__.py",
        "torch-universal/demo/_binaries.py",
        "torch-universal/demo/_compile_rule.py",
        "torch-universal/demo/_library.py",
        "torch-universal/demo/op.py",
        "torch-universal/metadata.json",
        "torch-universal/symbols.json",
    ]
    meta = json.loads(files["torch-cuda/metadata.json"])
    assert meta["version"] == 2 and meta["backend"] == {"type": "cuda"}
    assert build.main([str(folder), "--check"]) == 1  # nothing built yet
    build.write_build(repo)
    assert build.main([str(folder), "--check"]) == 0


def test_kernels_init_scaffolds_the_same_layout(tmp_path, capsys):
    """`kernels init` writes a repository built as ours are: the source in torch-ext/ beside
    build.toml, our build script as build.py, and build/ made by it, metadata.json included."""
    from kernels.cli import main

    assert main(["init", "my-org/fused-silu", "--dir", str(tmp_path)]) == 0
    folder = tmp_path / "fused-silu"
    assert (folder / "build.py").read_bytes() == (Path(LIBRARY) / "build.py").read_bytes()
    own = _load_build_script(folder / "build.py", "scaffold_build")  # as `python build.py` runs
    repo = own.read_repository(folder)
    assert (repo.name, repo.package, repo.variants) == (
        "fused-silu",
        "fused_silu",
        ("torch-universal", *NOARCH),
    )
    assert own.differences(repo) == []
    # No shared launcher in a repository of its own: its package is its torch-ext/ alone.
    assert sorted(own.package_files(repo)) == ["__init__.py", "layers.py", "silu.py"]
    meta = json.loads((folder / "build" / "torch-cuda" / "metadata.json").read_text())
    assert meta["name"] == "fused-silu" and meta["id"].startswith("_fused_silu_cuda_")
    assert 'repo-id = "my-org/fused-silu"' in (folder / "build.toml").read_text()


@pytest.mark.parametrize("name", ["Fused-SiLU", "fused_silu", "a"])
def test_kernels_init_refuses_names_hugging_faces_client_refuses(tmp_path, capsys, name):
    from kernels.cli import main

    assert main(["init", name, "--dir", str(tmp_path)]) == 1
    assert "lowercase letters, digits and dashes" in capsys.readouterr().err
