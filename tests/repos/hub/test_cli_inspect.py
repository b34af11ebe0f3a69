"""The inspection commands of kernels 0.19 against the test server: `variants`, `describe-api`,
`info`, `cache ls`, and the deprecated `versions`."""

from __future__ import annotations

import json

import pytest

from kernels.cli import main

pytestmark = pytest.mark.hub

RUNS_NOWHERE = "torch27-cxx11-cu126-aarch64-linux"  # no test machine is an aarch64 CUDA 12.6 box


def _symbols(module: str, function: str = "silu_and_mul") -> str:
    return json.dumps(
        {
            "schema_version": 1,
            "module": module,
            "functions": [
                {
                    "name": function,
                    "qualname": function,
                    "module": module,
                    "kind": "function",
                    "doc": "SiLU of the first half times the second.\n\nMore.",
                    "signature": {
                        "parameters": [
                            {
                                "name": "x",
                                "kind": "POSITIONAL_OR_KEYWORD",
                                "default": None,
                                "annotation": "torch.Tensor",
                            }  # fmt: skip
                        ],
                        "return_annotation": "torch.Tensor",
                    },
                }
            ],
            "layers": [
                {
                    "name": "SiluAndMul",
                    "kind": "class",
                    "attributes": {"has_backward": True, "can_torch_compile": None},
                }
            ],
        }
    )


def _metadata(name: str, version: int, **extra) -> str:
    return json.dumps(
        {
            "name": name,
            "id": f"_{name}_{version}",
            "version": version,
            "license": "Apache-2.0",
            "python-depends": [],
            "backend": {"type": "cuda"},
            **extra,
        }
    )


@pytest.fixture
def versioned(hub):
    """A kernel with branches v1 (torch-universal) and v2 (torch-universal and a variant that
    runs nowhere), each variant with metadata.json and symbols.json."""
    repo = hub.create_repo()
    for version, variants in ((1, ("torch-universal",)), (2, ("torch-universal", RUNS_NOWHERE))):
        repo.write_kernel(version=f"{version}.0.0", variants=variants)
        for variant in variants:
            repo.write(f"build/{variant}/metadata.json", _metadata("demo", version))
            repo.write(f"build/{variant}/symbols.json", _symbols(f"_demo_{version}"))
        repo.commit(f"version {version}")
        repo.branch(f"v{version}")
    return repo


def test_variants_of_the_newest_version(versioned, capsys):
    assert main(["variants", versioned.repo_id]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Version 2 (v2):\n")
    assert "torch-universal" in out and "compatible, preferred" in out
    assert f"{RUNS_NOWHERE}  incompatible: " in out
    assert "Version 1" not in out


def test_variants_of_every_version_as_json(versioned, capsys):
    assert main(["variants", versioned.repo_id, "--all-versions", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["repo_id"] == versioned.repo_id
    assert [(r["version"], r["revision"]) for r in data["revisions"]] == [(1, "v1"), (2, "v2")]
    v2 = {v["variant"]: v for v in data["revisions"][1]["variants"]}
    assert v2["torch-universal"] == {
        "variant": "torch-universal",
        "compatible": True,
        "preferred": True,
        "reason": None,
    }
    assert v2[RUNS_NOWHERE]["compatible"] is False and "aarch64" in v2[RUNS_NOWHERE]["reason"]


def test_variants_only_compatible_and_one_version(versioned, capsys):
    assert main(["variants", versioned.repo_id, "--version", "2", "--only-compatible"]) == 0
    out = capsys.readouterr().out
    assert "torch-universal" in out and RUNS_NOWHERE not in out
    assert main(["variants", versioned.repo_id, "--revision", "main", "--json"]) == 0
    (revision,) = json.loads(capsys.readouterr().out)["revisions"]
    assert revision["version"] is None and revision["revision"] == "main"


def test_variants_errors(versioned, hub, capsys, cli):
    assert main(["variants", versioned.repo_id, "--version", "3"]) == 1
    err = capsys.readouterr().err
    assert "Version 3 not found in" in err and "available versions: 1, 2." in err
    unversioned = hub.create_repo()
    unversioned.write_kernel().commit()
    assert main(["variants", unversioned.repo_id]) == 1
    err = capsys.readouterr().err
    assert "No numbered versions found" in err and "--revision" in err
    result = cli("variants", "kernels-community/no-such-kernel")
    assert result.returncode == 1
    assert result.stderr.startswith("error: Kernel repository kernels-community/no-such-kernel")
    assert "Traceback" not in result.stderr


def test_variants_by_version_tags_where_there_are_no_version_branches(released, capsys):
    repo = released("0.1.0", "0.2.0")
    assert main(["variants", repo.repo_id, "--all-versions", "--json"]) == 0
    revisions = json.loads(capsys.readouterr().out)["revisions"]
    assert [(r["version"], r["revision"]) for r in revisions] == [
        ("0.1.0", "v0.1.0"),
        ("0.2.0", "v0.2.0"),
    ]


def test_versions_is_deprecated_but_still_works(versioned, cli):
    result = cli("versions", versioned.repo_id)
    assert result.returncode == 0
    assert result.stderr.startswith(
        "WARNING: `kernels versions` is deprecated and will be removed in kernels 0.20. "
        "Use `kernels variants --all-versions` instead."
    )
    assert versioned.repo_id in result.stdout and "v2" in result.stdout


def test_describe_api_of_a_hub_kernel(versioned, capsys):
    assert main(["describe-api", versioned.repo_id]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        f"Repository: {versioned.repo_id}\nRevision: v2\nVariant: torch-universal\n"
    )
    assert "  silu_and_mul(x: torch.Tensor) -> torch.Tensor\n" in out
    assert "      SiLU of the first half times the second.\n" in out
    assert "  SiluAndMul  has_backward=True  can_torch_compile=unknown\n" in out
    assert main(["describe-api", versioned.repo_id, "--version", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["repo_id"], data["revision"], data["variant"]) == (
        versioned.repo_id,
        "v1",
        "torch-universal",
    )
    assert data["module"] == "_demo_1" and data["functions"][0]["name"] == "silu_and_mul"


def test_describe_api_without_symbols_json(hub, capsys):
    repo = hub.create_repo()
    repo.write_kernel().commit()
    repo.branch("v1")
    assert main(["describe-api", repo.repo_id]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        f"error: No symbols.json found in {repo.repo_id} (version: 1, revision: v1) "
        "(variant: torch-universal)."
    )


def test_describe_api_reads_the_cache_offline(versioned, capsys, cli):
    """HF_HUB_OFFLINE is read when huggingface_hub is imported: offline runs are children."""
    assert main(["describe-api", versioned.repo_id, "--version", "1", "--json"]) == 0
    online = json.loads(capsys.readouterr().out)
    offline = cli(
        "describe-api", versioned.repo_id, "--version", "1", "--json", env={"HF_HUB_OFFLINE": "1"}
    )
    assert offline.returncode == 0, offline.stderr
    assert json.loads(offline.stdout) == online


def test_info_follows_kernel_depends(hub, capsys):
    base = hub.create_repo()
    base.write_kernel()
    base.write("build/torch-universal/metadata.json", _metadata("base", 1, **{"python-depends": ["einops"]}))  # fmt: skip
    base.commit()
    base.branch("v1")
    top = hub.create_repo()
    top.write_kernel(variants=("torch-universal", RUNS_NOWHERE))
    depends = {"kernel-depends": [{"repo-id": base.repo_id, "version": 1}]}
    top.write("build/torch-universal/metadata.json", _metadata("top", 3, **depends))
    top.commit()
    top.branch("v3")
    assert main(["info", top.repo_id, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["repo_id"], info["revision"], info["variant"]) == (
        top.repo_id,
        "v3",
        "torch-universal",
    )
    assert (info["name"], info["version"], info["license"]) == ("top", 3, "Apache-2.0")
    assert info["kernel_depends"] == [base.repo_id]
    assert info["python_depends"] == ["einops"]  # the dependency's, too
    assert info["backends"] == ["cuda", "universal"]
    assert "dependency_tree" not in info
    assert main(["info", top.repo_id, "--dep-tree"]) == 0
    out = capsys.readouterr().out
    assert f"Kernel dependencies:\n  {top.repo_id}\n  `-- {base.repo_id}\n" in out
    assert main(["info", top.repo_id, "--dep-tree", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dependency_tree"] == {base.repo_id: {}}


def test_info_of_a_missing_dependency_is_an_error(hub, capsys):
    top = hub.create_repo()
    top.write_kernel()
    missing = {"kernel-depends": [{"repo-id": "kernels-community/no-such-dep", "version": 1}]}
    top.write("build/torch-universal/metadata.json", _metadata("top", 1, **missing))
    top.commit()
    top.branch("v1")
    assert main(["info", top.repo_id]) == 1
    assert "kernels-community/no-such-dep was not found" in capsys.readouterr().err


def test_cache_ls_lists_what_was_downloaded(versioned, capsys):
    assert main(["describe-api", versioned.repo_id, "--version", "1"]) == 0
    assert main(["describe-api", versioned.repo_id, "--version", "2"]) == 0
    capsys.readouterr()
    assert main(["cache", "ls", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (repo,) = [r for r in data["repos"] if r["repo_id"] == versioned.repo_id]
    assert set(repo) == {"repo_id", "size_on_disk", "last_accessed", "last_modified", "versions"}
    assert [(v["version"], v["variants"]) for v in repo["versions"]] == [
        ("v1", ["torch-universal"]),
        ("v2", ["torch-universal"]),
    ]
    assert set(repo["versions"][0]) == {
        "version",
        "size_on_disk",
        "last_accessed",
        "last_modified",
        "variants",
    }
    # Full values: the table is cut to the terminal's width otherwise (80 columns without one).
    assert main(["cache", "ls", "--no-truncate"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ID", "SIZE", "LAST_ACCESSED", "LAST_MODIFIED", "VERSION", "VARIANTS"]  # fmt: skip
    mine = [line for line in lines if f"kernel/{versioned.repo_id}" in line]
    assert len(mine) == 2 and mine[0].split()[-2:] == ["v1", "torch-universal"]


def test_describe_api_offline_of_a_kernel_never_downloaded(versioned, cli):
    offline = {"HF_HUB_OFFLINE": "1"}
    result = cli("describe-api", versioned.repo_id, env=offline)
    assert result.returncode == 1
    assert result.stderr.startswith(f"error: No numbered versions found for {versioned.repo_id}")
    result = cli("describe-api", versioned.repo_id, "--revision", "v1", env=offline)
    assert result.returncode == 1
    assert result.stderr.startswith("error: ") and "HF_HUB_OFFLINE" in result.stderr
    assert "Traceback" not in result.stderr
