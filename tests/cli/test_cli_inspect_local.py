"""`describe-api`, `info` and `cache ls` on local folders and caches (no Hub).

Their Hub cases run against the test server in tests/repos/hub/test_cli_inspect.py."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from kernels.cli import main
from kernels.repos.hubclient import supports_kernel_repo_type
from tests.support.library import LIBRARY

NORM = os.path.join(LIBRARY, "norm")  # the source: the commands read its build
SYMBOLS = {
    "schema_version": 1,
    "module": "_demo",
    "functions": [
        {
            "name": "relu",
            "signature": {
                "parameters": [
                    {
                        "name": "x",
                        "kind": "POSITIONAL_ONLY",
                        "default": None,
                        "annotation": "torch.Tensor",
                    },  # fmt: skip
                    {
                        "name": "inplace",
                        "kind": "KEYWORD_ONLY",
                        "default": "False",
                        "annotation": None,
                    },  # fmt: skip
                ],
                "return_annotation": "torch.Tensor",
            },
        }
    ],
    "layers": [{"name": "ReLU", "attributes": {"has_backward": False, "can_torch_compile": True}}],
}


def _variant(root, name="torch-universal", symbols=SYMBOLS, **metadata):
    folder = root / "build" / name
    folder.mkdir(parents=True)
    meta = {"name": "demo", "id": "_demo", "version": 1, "license": "MIT", "python-depends": []}
    (folder / "metadata.json").write_text(json.dumps({**meta, **metadata}))
    if symbols is not None:
        text = symbols if isinstance(symbols, str) else json.dumps(symbols)
        (folder / "symbols.json").write_text(text)
    (folder / "__init__.py").write_text("raise AssertionError('describing must not import')\n")
    return folder


def test_describe_api_of_our_norm_repository(capsys, published_library):
    """As published (symbols.json is made for the Hub, not for the package's own loading)."""
    norm = str(published_library("norm"))
    assert main(["describe-api", norm]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Path: {norm}\nVariant: ")
    assert "\n  rms_norm(x: torch.Tensor, weight: torch.Tensor" in out
    assert "\n  RMSNorm  has_backward=True  can_torch_compile=True\n" in out
    assert main(["describe-api", os.path.join(norm, "build", "torch-cuda"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["variant"] == "torch-cuda" and data["module"].startswith("_norm_cuda_")
    assert data["path"] == os.path.join(norm, "build", "torch-cuda")


def test_describe_api_of_a_library_source_folder_describes_its_sources(capsys):
    """A checkout's library/norm loads a build without symbols.json (made by importing the
    package, which loading need not pay): describe-api makes it from the sources, for the
    variant this machine loads."""
    assert main(["describe-api", NORM]) == 0
    out = capsys.readouterr().out
    assert "\n  rms_norm(x: torch.Tensor, weight: torch.Tensor" in out
    assert "\n  RMSNorm  has_backward=True  can_torch_compile=True\n" in out


@pytest.mark.parametrize("where", ["", "build", "build/torch-universal"])
def test_describe_api_of_each_local_form(tmp_path, capsys, where):
    _variant(tmp_path)
    path = tmp_path / where
    assert main(["describe-api", str(path)]) == 0
    assert capsys.readouterr().out == (
        f"Path: {path}\nVariant: torch-universal\n\n"
        "Functions:\n  relu(x: torch.Tensor, /, *, inplace=False) -> torch.Tensor\n\n"
        "Layers:\n  ReLU  has_backward=False  can_torch_compile=True\n"
    )
    assert main(["describe-api", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        **SYMBOLS,
        "path": str(path),
        "variant": "torch-universal",
    }


def test_describe_api_uses_the_variant_this_machine_loads_and_no_other(tmp_path, capsys):
    _variant(tmp_path, "torch-universal", symbols=None)
    _variant(tmp_path, "torch27-cxx11-cu126-aarch64-linux")  # runs on no test machine
    assert main(["describe-api", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: No symbols.json found in {tmp_path} (variant: torch-universal).")
    assert "rebuild the kernel" in err


@pytest.mark.parametrize(
    "content,message",
    [
        ("{invalid", "Invalid symbols.json"),
        ("[]", "Unsupported symbols.json schema"),
        ('{"schema_version": 2}', "Unsupported symbols.json schema"),
        ('{"schema_version": 1, "functions": null, "layers": []}', "functions must be a list"),
        ('{"schema_version": 1, "functions": [{}], "layers": []}', "functions must be a list"),
        (
            '{"schema_version": 1, "functions": [], "layers": [{"name": "L", "attributes": []}]}',
            "layer attributes must be booleans or null",
        ),
    ],
)
def test_describe_api_rejects_a_malformed_symbols_json(tmp_path, capsys, content, message):
    _variant(tmp_path, symbols=content)
    assert main(["describe-api", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and message in captured.err


def test_describe_api_and_info_argument_errors(tmp_path, capsys):
    _variant(tmp_path)
    for command in ("describe-api", "info"):
        assert main([command, str(tmp_path), "--revision", "main"]) == 1
        assert "cannot be used with a local path" in capsys.readouterr().err
        assert main([command, str(tmp_path / "missing")]) == 1
        assert "Not a local kernel directory" in capsys.readouterr().err
        (tmp_path / "empty").mkdir(exist_ok=True)
        assert main([command, str(tmp_path / "empty")]) == 1
        assert "is not a kernel folder" in capsys.readouterr().err
        assert main([command, "org/name", "--revision", "a", "--version", "1"]) == 2
        assert "not allowed with argument" in capsys.readouterr().err


def test_info_of_a_local_repository(tmp_path, capsys):
    _variant(tmp_path, upstream="https://example.com/demo", backend={"type": "cuda"})
    _variant(tmp_path, "torch-cuda")
    assert main(["info", str(tmp_path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["path"] == str(tmp_path)
    assert (info["name"], info["version"], info["license"]) == ("demo", 1, "MIT")
    assert info["upstream"] == "https://example.com/demo" and info["source"] is None
    assert info["backends"] == ["cuda", "universal"]
    assert info["kernel_depends"] == [] and info["python_depends"] == []
    assert main(["info", NORM]) == 0
    out = capsys.readouterr().out
    assert "Name: norm\nVersion: 1\n" in out and "Kernel dependencies: -\n" in out
    assert "Backends: cuda, rocm, universal, xpu\n" in out


def _cached(cache, repo_id, commit, refs, files):
    """A repository in huggingface_hub's cache layout: blobs, snapshot links, refs."""
    repo = cache / f"kernels--{repo_id.replace('/', '--')}"
    for name, content in files.items():
        blob = repo / "blobs" / hashlib.sha256(content).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(content)
        link = repo / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)


@pytest.mark.skipif(not supports_kernel_repo_type(), reason="needs huggingface_hub >= 1.10")
def test_cache_ls_lists_versions_and_their_cached_variants(tmp_path, capsys):
    cache = tmp_path / "hub"
    cuda = "build/torch-cuda/__init__.py"
    universal = "build/torch-universal/demo/__init__.py"
    _cached(cache, "org/demo", "a" * 40, ["v2", "main"], {cuda: b"x = 1\n", universal: b"y\n"})
    _cached(cache, "org/demo", "b" * 40, ["v10"], {cuda: b"x = 2\n"})
    _cached(cache, "org/demo", "c" * 40, [], {cuda: b"detached\n"})  # no version names it
    _cached(cache, "org/tagged", "d" * 40, ["v0.1.0", "nightly"], {"README.md": b"no build\n"})
    assert main(["cache", "ls", "--cache-dir", str(cache), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cache_dir"] == str(cache.resolve())
    assert [r["repo_id"] for r in data["repos"]] == ["org/demo", "org/tagged"]
    demo, tagged = data["repos"]
    assert [(v["version"], v["variants"]) for v in demo["versions"]] == [
        ("v2", ["torch-cuda", "torch-universal"]),
        ("v10", ["torch-cuda"]),
    ]
    assert demo["versions"][0]["size_on_disk"] == len(b"x = 1\n") + len(b"y\n")
    assert [(v["version"], v["variants"]) for v in tagged["versions"]] == [("v0.1.0", [])]
    assert main(["cache", "ls", "--cache-dir", str(cache)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ID", "SIZE", "LAST_ACCESSED", "LAST_MODIFIED", "VERSION", "VARIANTS"]  # fmt: skip
    start = lines[0].index("VARIANTS")
    assert [line[start:] for line in lines[2:]] == ["torch-cuda", "torch-universal", "torch-cuda", "-"]  # fmt: skip
    assert lines[3][:start].strip() == ""  # a variant's own line leaves the other columns empty


@pytest.mark.skipif(not supports_kernel_repo_type(), reason="needs huggingface_hub >= 1.10")
def test_cache_ls_fits_the_terminal_unless_told_not_to(tmp_path, capsys, monkeypatch):
    cache = tmp_path / "hub"
    repo_id = "org/a-kernel-with-a-rather-long-name-for-a-narrow-terminal"
    variant = "build/torch210-cxx11-cu128-x86_64-linux/__init__.py"
    _cached(cache, repo_id, "a" * 40, ["v1"], {variant: b"x = 1\n"})
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["cache", "ls", "--cache-dir", str(cache)]) == 0
    out, err = capsys.readouterr()
    assert all(len(line) <= 80 for line in out.splitlines())
    assert repo_id not in out and "..." in out
    assert "--no-truncate" in err and "--json" in err
    header, rule = out.splitlines()[:2]
    # The header keeps its names, each column as wide as its rule.
    assert header.split() == ["ID", "SIZE", "LAST_ACCESSED", "LAST_MODIFIED", "VERSION", "VARIANTS"]  # fmt: skip
    assert [len(dashes) for dashes in rule.split()][-1] >= len("VARIANTS")
    assert main(["cache", "ls", "--cache-dir", str(cache), "--no-truncate"]) == 0
    out, err = capsys.readouterr()
    assert f"kernel/{repo_id}" in out and "torch210-cxx11-cu128-x86_64-linux" in out
    assert err == ""


@pytest.mark.skipif(not supports_kernel_repo_type(), reason="needs huggingface_hub >= 1.10")
def test_cache_ls_of_an_empty_or_broken_cache(tmp_path, capsys):
    assert main(["cache", "ls", "--cache-dir", str(tmp_path / "none")]) == 0
    assert "No cached kernel versions found" in capsys.readouterr().out
    (tmp_path / "file").write_text("not a folder")
    assert main(["cache", "ls", "--cache-dir", str(tmp_path / "file")]) == 1
    assert "Cannot scan kernel cache" in capsys.readouterr().err


@pytest.mark.skipif(supports_kernel_repo_type(), reason="huggingface_hub 0.x only")
def test_cache_ls_explains_that_huggingface_hub_0_x_cannot_see_kernels(tmp_path, capsys):
    assert main(["cache", "ls", "--cache-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "needs huggingface_hub >= 1.10" in err and "`kernel` repository type" in err


def test_cache_needs_an_action(capsys):
    assert main(["cache"]) == 2
    assert "required" in capsys.readouterr().err
