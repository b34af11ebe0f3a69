"""Locks: `kernels lock`, LockedLayerRepository / load_kernel / get_locked_kernel, hash checks,
and a project that locks, prefetches and then kernelizes offline."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kernels
from kernels import (
    KernelHashMismatchError,
    KernelLockError,
    KernelOfflineError,
    LockedLayerRepository,
    UntrustedKernelError,
)
from kernels.cli import main
from kernels.repos.hubclient import repo_cache_folder
from kernels.repos.lock import combined_hash, read_lockfile
from tests.support.children import run_python

pytestmark = pytest.mark.hub


def write_project(folder: Path, dependencies: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = "\n".join(f'"{repo}" = {spec}' for repo, spec in dependencies.items())
    (folder / "pyproject.toml").write_text(
        f'[project]\nname = "demo"\nversion = "0.1"\n\n[tool.kernels.dependencies]\n{lines}\n'
    )
    return folder


def lock(project: Path, capsys) -> list[dict]:
    assert main(["lock", str(project)]) == 0, capsys.readouterr().err
    return json.loads((project / "kernels.lock").read_text())


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


def test_lock_records_commit_version_trust_and_file_hashes(hub, released, tmp_path, capsys):
    specced = released("0.1.0", "0.1.3", "0.2.0")
    branched = hub.create_repo()
    branched.write_kernel(
        version="1.x", variants=("torch-universal", "torch28-cxx11-cu128-x86_64-linux")
    )
    branch_sha = branched.commit()
    branched.branch("v1")
    stranger = released("0.1.0", org="some-stranger")
    project = write_project(
        tmp_path / "project",
        {
            specced.repo_id: '">=0.1,<0.2"',
            branched.repo_id: "1",
            stranger.repo_id: '{ version = ">=0.1", trust-remote-code = true }',
        },
    )
    entries = lock(project, capsys)
    out = capsys.readouterr().out
    assert f"wrote {project / 'kernels.lock'}" in out
    by_repo = {e["repo_id"]: e for e in entries}

    first = by_repo[specced.repo_id]
    assert first["sha"] == specced.git("rev-parse", "v0.1.3")
    assert (first["version"], first["ref"]) == (">=0.1,<0.2", "v0.1.3")
    assert first["trust"]["trusted"] is True and "kernels-community" in first["trust"]["reason"]
    package = specced.repo_id.split("/")[1].replace("-", "_")
    files = first["files"]["torch-universal"]
    for name in ("__init__.py", "layers.py"):
        data = subprocess.run(
            ["git", "cat-file", "blob", f"v0.1.3:build/torch-universal/{package}/{name}"],
            cwd=specced.path,
            capture_output=True,
            check=True,
        ).stdout
        assert files[f"{package}/{name}"] == f"git-sha1:{git_blob_id(data)}"
    # The variant hash is Hugging Face's format: the same keys, the same combination.
    assert first["variants"]["torch-universal"] == {
        "hash": combined_hash(files),
        "hash_type": "git_lfs_concat",
    }

    second = by_repo[branched.repo_id]
    assert (second["sha"], second["version"], second["ref"]) == (branch_sha, 1, "v1")
    assert sorted(second["variants"]) == ["torch-universal", "torch28-cxx11-cu128-x86_64-linux"]

    third = by_repo[stranger.repo_id]
    assert third["trust"] == {
        "trusted": True,
        "reason": "trusted by the caller (trust_remote_code=True)",
    }


def test_lock_refuses_untrusted_kernels(released, tmp_path, capsys):
    stranger = released("0.1.0", org="some-stranger")
    project = write_project(tmp_path / "p", {stranger.repo_id: '">=0.1"'})
    assert main(["lock", str(project)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: Refusing") and "trust_remote_code" in err
    assert not (project / "kernels.lock").exists()


def test_lock_asks_the_hub_never_the_cache(released, hub, tmp_path, capsys, cli):
    """A lock pins what the Hub serves now: with the Hub down or HF_HUB_OFFLINE set, a version
    the cache remembers is not locked, and the error says how to reach the Hub."""
    repo = released("0.1.0")
    kernels.get_kernel(repo.repo_id, version=">=0.1")  # the cache can resolve >=0.1
    project = write_project(tmp_path / "p", {repo.repo_id: '">=0.1"'})
    hub.proxy.stop()
    assert main(["lock", str(project)]) == 1
    err = capsys.readouterr().err
    assert f"Could not list the branches and tags of {repo.repo_id}" in err
    assert "cannot be reached" in err and "Check the connection" in err
    assert "cache" not in err and "kernels download" not in err
    assert not (project / "kernels.lock").exists()
    hub.proxy.start()
    result = cli("lock", str(project), env={"HF_HUB_OFFLINE": "1"})
    assert result.returncode == 1
    assert "HF_HUB_OFFLINE is set" in result.stderr and "Unset HF_HUB_OFFLINE" in result.stderr
    assert "kernels download" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("pyproject", "message"),
    [
        (None, "pyproject.toml does not exist"),
        ('[project]\nname = "x"\n', "no [tool.kernels.dependencies]"),
        ('[tool.kernels.dependencies]\n"a/b" = "latest"\n', "not a PEP 440 version specifier"),
        ('[tool.kernels.dependencies]\n"a/b" = { versoin = ">=1" }\n', "unknown keys versoin"),
        ("[tool.kernels.dependencies\n", "not valid TOML"),
    ],
)
def test_lock_reports_bad_projects(tmp_path, capsys, pyproject, message, hub):
    if pyproject is not None:
        (tmp_path / "pyproject.toml").write_text(pyproject)
    assert main(["lock", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_locked_repository_loads_the_locked_commit_after_newer_releases(released, tmp_path, capsys):
    repo = released("0.1.0", "0.1.1")
    project = write_project(tmp_path / "p", {repo.repo_id: '"<0.2"'})
    lock(project, capsys)
    repo.release("0.1.2")  # newer, but not locked
    locked = LockedLayerRepository(
        repo.repo_id, layer_name="SiluAndMul", lockfile=project / "kernels.lock"
    )
    assert hash(locked) == hash(
        LockedLayerRepository(
            repo.repo_id, layer_name="SiluAndMul", lockfile=str(project / "kernels.lock")
        )
    )
    assert locked.load_package().VERSION == "0.1.1"
    assert locked.load().__name__ == "SiluAndMul"  # what the lock's package provides
    assert "verified" in str(locked) and "commit" in str(locked)
    assert (
        kernels.get_kernel(repo.repo_id, version="<0.2").VERSION == "0.1.2"
    )  # unlocked resolves anew


def _locked(released, tmp_path, capsys, **kernel):
    repo = released("0.1.0", **kernel)
    project = write_project(tmp_path / "p", {repo.repo_id: '">=0.1"'})
    lock(project, capsys)
    return repo, project / "kernels.lock"


def _nothing_imported(repo) -> bool:
    package = repo.repo_id.split("/")[1].replace("-", "_")
    return not [name for name in sys.modules if name.startswith(f"_kernels_{package}_")]


def test_hash_mismatch_in_the_lock_names_the_file_and_imports_nothing(released, tmp_path, capsys):
    repo, lockfile = _locked(released, tmp_path, capsys)
    package = repo.repo_id.split("/")[1].replace("-", "_")
    data = json.loads(lockfile.read_text())
    data[0]["files"]["torch-universal"][f"{package}/layers.py"] = "git-sha1:" + "0" * 40
    lockfile.write_text(json.dumps(data))
    with pytest.raises(KernelHashMismatchError) as info:
        kernels.get_locked_kernel(repo.repo_id, lockfile=lockfile)
    message = str(info.value)
    assert f"build/torch-universal/{package}/layers.py" in message
    assert "Nothing was imported" in message
    assert _nothing_imported(repo)


def test_tampered_cache_file_is_caught_before_import(released, tmp_path, capsys):
    repo, lockfile = _locked(released, tmp_path, capsys)
    package = repo.repo_id.split("/")[1].replace("-", "_")
    variant_dir = kernels.install_kernel(repo.repo_id, revision=read_lockfile(lockfile)[0].sha)
    init = variant_dir / package / "__init__.py"
    source = init.read_text()
    init.unlink()  # replace the cache's symlink by a file with other contents
    init.write_text(source + "\nraise SystemExit('tampered code ran')\n")
    with pytest.raises(
        KernelHashMismatchError, match=rf"build/torch-universal/{package}/__init__.py has git-sha1:"
    ):
        kernels.load_kernel(repo.repo_id, lockfile=lockfile)
    assert _nothing_imported(repo)


def test_extra_file_in_the_cache_is_caught(released, tmp_path, capsys):
    repo, lockfile = _locked(released, tmp_path, capsys)
    package = repo.repo_id.split("/")[1].replace("-", "_")
    variant_dir = kernels.install_kernel(repo.repo_id, revision=read_lockfile(lockfile)[0].sha)
    (variant_dir / package / "sitecustomize.py").write_text("print('injected')\n")
    with pytest.raises(
        KernelHashMismatchError, match=rf"{package}/sitecustomize.py is not in the lock"
    ):
        kernels.load_kernel(repo.repo_id, lockfile=lockfile)
    assert _nothing_imported(repo)


def test_load_kernel_uses_only_the_cache(released, tmp_path, capsys):
    repo, lockfile = _locked(released, tmp_path, capsys)
    with pytest.raises(KernelOfflineError, match="kernels download"):
        kernels.load_kernel(repo.repo_id, lockfile=lockfile)
    assert not (repo_cache_folder(repo.repo_id) / "snapshots").exists()
    kernels.get_locked_kernel(repo.repo_id, lockfile=lockfile)
    assert kernels.load_kernel(repo.repo_id, lockfile=lockfile).VERSION == "0.1.0"


def test_kernel_missing_from_the_lock(released, tmp_path, capsys):
    repo, lockfile = _locked(released, tmp_path, capsys)
    with pytest.raises(
        KernelLockError, match=rf"not locked in lock file .*it locks {repo.repo_id}"
    ):
        kernels.load_kernel("kernels-community/other", lockfile=lockfile)
    with pytest.raises(KernelLockError, match="Cannot read lock file"):
        kernels.load_kernel(repo.repo_id, lockfile=tmp_path / "missing.lock")


def test_hugging_face_format_lock_is_read_and_verified(released, tmp_path, capsys):
    """A lock as Hugging Face's kernels writes it: no per-file digests, no trust record."""
    repo, lockfile = _locked(released, tmp_path, capsys)
    entry = json.loads(lockfile.read_text())[0]
    hf_lock = tmp_path / "hf.lock"
    hf_lock.write_text(json.dumps([{k: entry[k] for k in ("repo_id", "sha", "variants")}]))
    assert kernels.get_locked_kernel(repo.repo_id, lockfile=hf_lock).VERSION == "0.1.0"

    entry["variants"]["torch-universal"]["hash"] = "sha256-" + "0" * 64
    bad = tmp_path / "bad.lock"
    bad.write_text(json.dumps([{k: entry[k] for k in ("repo_id", "sha", "variants")}]))
    other = LockedLayerRepository(repo.repo_id, layer_name="SiluAndMul", lockfile=bad)
    with pytest.raises(KernelHashMismatchError, match="cannot be named"):
        other.load()


def test_untrusted_kernel_in_a_foreign_lock_needs_trust(released, tmp_path, capsys):
    stranger = released("0.1.0", org="some-stranger")
    project = write_project(
        tmp_path / "p", {stranger.repo_id: '{ version = ">=0.1", trust-remote-code = true }'}
    )
    entry = lock(project, capsys)[0]
    del entry["trust"]  # as if written by a tool that does not record trust
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    lockfile = foreign / "kernels.lock"
    lockfile.write_text(json.dumps([entry]))
    assert main(["download", str(foreign)]) == 1
    assert "trust_remote_code" in capsys.readouterr().err
    assert main(["download", str(foreign), "--trust-remote-code"]) == 0
    with pytest.raises(UntrustedKernelError):
        kernels.get_locked_kernel(stranger.repo_id, lockfile=lockfile)
    module = kernels.get_locked_kernel(
        stranger.repo_id, lockfile=lockfile, trust_remote_code=["some-stranger"]
    )
    assert module.VERSION == "0.1.0"
    # The project's own lock records the decision, so it loads without the argument.
    assert kernels.get_locked_kernel(stranger.repo_id, lockfile=project / "kernels.lock") is module


def test_lock_is_found_beside_the_calling_package_source(released, tmp_path, capsys, monkeypatch):
    repo = released("0.1.0")
    project = write_project(tmp_path / "checkout", {repo.repo_id: '">=0.1"'})
    lock(project, capsys)
    package = project / "src" / "locked_app_src"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        textwrap.dedent(
            f"""
            from kernels import LockedLayerRepository, get_locked_kernel

            def kernel():
                return get_locked_kernel({repo.repo_id!r})

            REPO = LockedLayerRepository({repo.repo_id!r}, layer_name="SiluAndMul")
            """
        )
    )
    monkeypatch.syspath_prepend(str(project / "src"))
    import locked_app_src

    assert locked_app_src.kernel().VERSION == "0.1.0"
    assert locked_app_src.REPO.load_package() is locked_app_src.kernel()
    assert "the lock of locked_app_src" in str(locked_app_src.REPO)


def test_lock_is_found_in_the_calling_distributions_metadata(
    released, tmp_path, capsys, monkeypatch
):
    repo = released("0.1.0")
    project = write_project(tmp_path / "project", {repo.repo_id: '">=0.1"'})
    lock(project, capsys)
    site = tmp_path / "site-packages"
    (site / "locked_app_dist").mkdir(parents=True)
    (site / "locked_app_dist" / "__init__.py").write_text(
        f"from kernels import load_kernel\n\ndef kernel():\n    return load_kernel({repo.repo_id!r})\n"
    )
    dist_info = site / "locked_app_dist-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: locked-app-dist\nVersion: 0.1\n"
    )
    (dist_info / "top_level.txt").write_text("locked_app_dist\n")
    (dist_info / "kernels.lock").write_text((project / "kernels.lock").read_text())
    monkeypatch.syspath_prepend(str(site))
    import locked_app_dist

    kernels.get_locked_kernel(repo.repo_id, lockfile=project / "kernels.lock")  # fill the cache
    assert locked_app_dist.kernel().VERSION == "0.1.0"


def test_no_lock_for_the_caller(tmp_path, monkeypatch):
    (tmp_path / "lonely_app").mkdir()
    (tmp_path / "pyproject.toml").write_text("[project]\nname='lonely'\n")
    (tmp_path / "lonely_app" / "__init__.py").write_text(
        "from kernels import load_kernel\n\ndef kernel():\n    return load_kernel('kernels-community/x')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import lonely_app

    with pytest.raises(KernelLockError, match="No kernels.lock found for lonely_app"):
        lonely_app.kernel()


def test_lock_download_then_kernelize_offline(hub, released, tmp_path, capsys):
    repo = released("0.1.0", "0.1.1", "0.2.0")
    project = write_project(tmp_path / "project", {repo.repo_id: '">=0.1,<0.2"'})
    lock(project, capsys)
    cache = tmp_path / "ci-cache"  # a fresh cache, as on a CI machine
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            p
            for p in (str(Path(kernels.__file__).parents[1]), os.environ.get("PYTHONPATH", ""))
            if p
        ),
        "HF_HUB_CACHE": str(cache),
    }
    download = run_python("-m", "kernels", "download", str(project), env=env, timeout=300)
    assert download.returncode == 0, download.stderr
    assert f"downloaded {repo.repo_id}" in download.stdout and "verified" in download.stdout

    hub.proxy.stop()  # no Hub at all from here on
    script = textwrap.dedent(
        f"""
        import torch, torch.nn as nn, torch.nn.functional as F
        from kernels import LockedLayerRepository, Mode, kernelize, use_kernel_forward_from_hub, use_kernel_mapping

        @use_kernel_forward_from_hub("SiluAndMul")
        class SiluAndMul(nn.Module):
            def forward(self, input):
                d = input.shape[-1] // 2
                return F.silu(input[..., :d]) * input[..., d:]

        model = nn.Sequential(nn.Linear(4, 8), SiluAndMul())
        repo = LockedLayerRepository({repo.repo_id!r}, layer_name="SiluAndMul", lockfile={str(project / "kernels.lock")!r})
        with use_kernel_mapping({{"SiluAndMul": {{"cpu": repo}}}}):
            kernelize(model, mode=Mode.INFERENCE, use_fallback=False)
        x = torch.randn(3, 4)
        h = model[0](x)
        d = h.shape[-1] // 2
        print(round((model(x) - F.silu(h[..., :d]) * h[..., d:]).mean().item()))
        """
    )
    offline = run_python("-c", script, env={**env, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert offline.returncode == 0, offline.stderr
    assert offline.stdout.strip() == "2"  # v0.1.1 (offset 2) ran, offline


def test_download_of_a_bad_lock_fails_cleanly(tmp_path, cli):
    (tmp_path / "kernels.lock").write_text('[{"repo_id": "a/b"}]')
    result = cli("download", str(tmp_path))
    assert result.returncode == 1
    assert "error:" in result.stderr and "lacks 'sha'" in result.stderr
    assert "Traceback" not in result.stderr
    result = cli("download", str(tmp_path / "nowhere"))
    assert result.returncode == 1 and "kernels lock" in result.stderr


@pytest.mark.parametrize(
    "files",
    [
        ["oops"],
        {"torch-universal": "oops"},
        {"torch-universal": {"x/__init__.py": "md5:1234"}},
        {"torch-universal": {"x/__init__.py": "git-sha1:not-hex"}},
    ],
)
def test_malformed_file_digests_are_a_lock_error(tmp_path, capsys, files):
    entry = {
        "repo_id": "kernels-community/x",
        "sha": "a" * 40,
        "variants": {"torch-universal": {"hash": "sha256-" + "0" * 64}},
        "files": files,
    }
    (tmp_path / "kernels.lock").write_text(json.dumps([entry]))
    assert main(["download", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "per-file digests of kernels-community/x are malformed" in err
    assert "kernels lock" in err and "Traceback" not in err


def test_download_all_variants(hub, tmp_path, capsys):
    repo = hub.create_repo()
    repo.release("0.1.0", variants=("torch-universal", "torch28-cxx11-cu128-x86_64-linux"))
    project = write_project(tmp_path / "p", {repo.repo_id: '">=0.1"'})
    lock(project, capsys)
    assert main(["download", str(project), "--all-variants"]) == 0
    out = capsys.readouterr().out
    assert "torch-universal" in out and "torch28-cxx11-cu128-x86_64-linux" in out
    snapshot = next((repo_cache_folder(repo.repo_id) / "snapshots").iterdir())
    assert sorted(p.name for p in (snapshot / "build").iterdir()) == [
        "torch-universal",
        "torch28-cxx11-cu128-x86_64-linux",
    ]
