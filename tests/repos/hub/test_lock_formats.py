"""Hugging Face's lock format (``kernels`` 0.17 to 0.19): read everywhere a lock is read, written by
``kernels lock --format hf``, and checked against their own client (.venv-hf, 0.19.1) both ways.

Their format records the dependency (``repo-id`` with an int ``version`` or a ``revision``)
and the commit, nothing else: loads pin the commit, verify no file (said at INFO), and a
repository from an untrusted organisation needs trust given at load or by the
pyproject.toml beside the lock.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

import kernels
from kernels import KernelLockError, LockedLayerRepository, UntrustedKernelError
from kernels.cli import main
from kernels.repos.hubclient import repo_cache_folder
from kernels.repos.lock import read_lockfile
from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.hub

HF_PYTHON = REPO_ROOT / ".venv-hf" / "bin" / "python"
needs_hf_client = pytest.mark.skipif(
    not HF_PYTHON.exists(), reason="Hugging Face's kernels client (.venv-hf) is not installed"
)


def write_project(folder: Path, dependencies: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = "\n".join(f'"{repo}" = {spec}' for repo, spec in dependencies.items())
    (folder / "pyproject.toml").write_text(
        f'[project]\nname = "demo"\nversion = "0.1"\n\n[tool.kernels.dependencies]\n{lines}\n'
    )
    return folder


def hf_entry(repo_id: str, commit: str, **dependency) -> dict:
    """One entry exactly as their ``KernelLocks.to_json`` writes it (key order included)."""
    return {"dependency": {"repo-id": repo_id, **dependency}, "lock": {"commit": commit}}


def write_hf_lock(folder: Path, *entries: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "kernels.lock"
    path.write_text(json.dumps(list(entries), indent=2))  # their writer: indent 2, no newline
    return path


def run_hf_client(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run `code` with Hugging Face's client, isolated from our package (-I: no PYTHONPATH,
    no current folder on the path), with this session's Hub settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    # With telemetry off, kernels 0.17.2 sent the user agent "...; python/3.11.7; ", whose
    # trailing space httpx refuses as a header value. Telemetry only ever reaches HF_ENDPOINT,
    # the local test server here.
    env["HF_HUB_DISABLE_TELEMETRY"] = "0"
    return subprocess.run(
        [str(HF_PYTHON), "-I", "-c", textwrap.dedent(code)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _versioned(hub):
    """A kernel repository with branches v1 and v2 (a commit each), as their versions are."""
    repo = hub.create_repo()
    repo.write_kernel(version="1.0", offset=1.0)
    v1 = repo.commit("v1")
    repo.branch("v1")
    repo.write_kernel(version="2.0", offset=2.0)
    v2 = repo.commit("v2")
    repo.branch("v2")
    return repo, v1, v2


def test_hf_lock_loads_through_every_locked_api(hub, tmp_path, capsys, caplog):
    repo, v1, v2 = _versioned(hub)
    lockfile = write_hf_lock(tmp_path / "p", hf_entry(repo.repo_id, v1, version=1))
    (entry,) = read_lockfile(lockfile)
    assert (entry.sha, entry.version, entry.ref, entry.repo_type) == (v1, 1, "v1", "kernel")
    assert not entry.hashed

    assert main(["download", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert f"downloaded {repo.repo_id} at {v1[:12]}" in out
    assert "no file hashes in the lock to verify" in out

    with caplog.at_level(logging.INFO, logger="kernels"):
        module = kernels.load_kernel(repo.repo_id, lockfile=lockfile)  # cache only
    assert module.VERSION == "1.0"  # the locked commit, not v2
    assert "records no file hashes (Hugging Face's lock format)" in caplog.text
    assert "commit pinned, no hashes to verify" in caplog.text

    locked = LockedLayerRepository(repo.repo_id, layer_name="SiluAndMul", lockfile=lockfile)
    assert locked.load().__name__ == "SiluAndMul"
    assert locked.load_package() is module
    assert "commit pinned, no hashes" in str(locked) and "verified" not in str(locked)
    assert kernels.get_locked_kernel(repo.repo_id, lockfile=lockfile) is module


def test_hf_revision_entry_pins_its_commit_not_the_branch_head(hub, tmp_path):
    repo, v1, v2 = _versioned(hub)
    lockfile = write_hf_lock(tmp_path / "p", hf_entry(repo.repo_id, v1, revision="v2"))
    (entry,) = read_lockfile(lockfile)
    assert (entry.version, entry.ref) == (None, "v2")
    # The commit counts, as in their client: what was asked is a record only.
    assert kernels.get_locked_kernel(repo.repo_id, lockfile=lockfile).VERSION == "1.0"


def test_hf_lock_download_all_variants_lists_the_commit(hub, tmp_path, capsys):
    repo = hub.create_repo()
    sha = repo.release("0.1.0", variants=("torch-universal", "torch28-cxx11-cu128-x86_64-linux"))
    write_hf_lock(tmp_path / "p", hf_entry(repo.repo_id, sha, revision="v0.1.0"))
    assert main(["download", str(tmp_path / "p"), "--all-variants"]) == 0
    out = capsys.readouterr().out
    assert "torch-universal" in out and "torch28-cxx11-cu128-x86_64-linux" in out
    snapshot = repo_cache_folder(repo.repo_id) / "snapshots" / sha
    assert sorted(p.name for p in (snapshot / "build").iterdir()) == [
        "torch-universal",
        "torch28-cxx11-cu128-x86_64-linux",
    ]


def test_hf_lock_of_an_untrusted_org_needs_trust(released, tmp_path, capsys):
    stranger = released("0.1.0", org="some-stranger")
    sha = stranger.git("rev-parse", "v0.1.0")
    entry = hf_entry(stranger.repo_id, sha, revision="v0.1.0")
    # A lock with no pyproject.toml beside it: only the normal trust rules.
    foreign = write_hf_lock(tmp_path / "foreign", entry)
    with pytest.raises(UntrustedKernelError, match="trust_remote_code"):
        kernels.get_locked_kernel(stranger.repo_id, lockfile=foreign)
    assert main(["download", str(tmp_path / "foreign")]) == 1
    assert "Refusing" in capsys.readouterr().err
    module = kernels.get_locked_kernel(
        stranger.repo_id, lockfile=foreign, trust_remote_code=["some-stranger"]
    )
    assert module.VERSION == "0.1.0"

    # The project's pyproject.toml lists it without trust: still refused.
    plain = write_project(tmp_path / "plain", {stranger.repo_id: '">=0.1"'})
    write_hf_lock(plain, entry)
    with pytest.raises(UntrustedKernelError):
        kernels.get_locked_kernel(stranger.repo_id, lockfile=plain / "kernels.lock")

    # Its pyproject.toml says trust-remote-code, as `kernels lock` required: trusted.
    project = write_project(
        tmp_path / "project",
        {stranger.repo_id: '{ version = ">=0.1", trust-remote-code = true }'},
    )
    write_hf_lock(project, entry)
    locked = LockedLayerRepository(
        stranger.repo_id, layer_name="SiluAndMul", lockfile=project / "kernels.lock"
    )
    assert locked.load_package() is module
    assert "trust-remote-code for it in" in str(locked)
    assert main(["download", str(project)]) == 0


def test_lock_format_hf_writes_their_format(hub, released, tmp_path, capsys):
    repo, v1, _ = _versioned(hub)
    tagged = released("0.1.0", "0.1.1")
    project = write_project(tmp_path / "p", {repo.repo_id: "1", tagged.repo_id: '">=0.1,<0.2"'})
    assert main(["lock", str(project), "--format", "hf"]) == 0
    out = capsys.readouterr().out
    assert "in Hugging Face's format: commits only, no file hashes" in out
    written = json.loads((project / "kernels.lock").read_text())
    assert written == [
        hf_entry(repo.repo_id, v1, version=1),
        # A specifier has no place in their format: the tag it resolved to stands for it.
        hf_entry(tagged.repo_id, tagged.git("rev-parse", "v0.1.1"), revision="v0.1.1"),
    ]
    assert kernels.get_locked_kernel(tagged.repo_id, lockfile=project / "kernels.lock").VERSION == (
        "0.1.1"
    )

    # Ours stays the default: the same project locks with hashes.
    assert main(["lock", str(project)]) == 0
    assert all(entry["variants"] for entry in json.loads((project / "kernels.lock").read_text()))


def test_lock_format_hf_refuses_model_repositories(released, tmp_path, capsys):
    model = released("0.1.0", repo_type="model")
    project = write_project(
        tmp_path / "p", {model.repo_id: '{ version = ">=0.1", repo-type = "model" }'}
    )
    assert main(["lock", str(project), "--format", "hf"]) == 1
    err = capsys.readouterr().err
    assert "model repository" in err and "Traceback" not in err
    assert not (project / "kernels.lock").exists()


@needs_hf_client
def test_their_client_reads_what_lock_format_hf_writes(hub, tmp_path, capsys):
    repo, v1, _ = _versioned(hub)
    project = write_project(tmp_path / "p", {repo.repo_id: "1"})
    assert main(["lock", str(project), "--format", "hf"]) == 0
    result = run_hf_client(
        f"""
        from pathlib import Path
        from kernels._rust import KernelLocks
        from kernels._internals.locking import get_locked_kernel_revision

        lockfile = Path({str(project / "kernels.lock")!r})
        locks, dependency = get_locked_kernel_revision({repo.repo_id!r}, lockfile)
        print(dependency.version, locks[dependency].commit)
        print(KernelLocks.from_json(lockfile.read_text()).to_json())
        """,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    first, rest = result.stdout.split("\n", 1)
    assert first == f"KernelVersion.Version(version=1) {v1}"
    # Byte for byte what their writer makes of it, but for our closing newline.
    assert rest.rstrip("\n") == (project / "kernels.lock").read_text().rstrip("\n")


@needs_hf_client
def test_their_client_refuses_our_format_so_hf_is_opt_in(hub, tmp_path, capsys):
    repo, _, _ = _versioned(hub)
    project = write_project(tmp_path / "p", {repo.repo_id: "1"})
    assert main(["lock", str(project)]) == 0
    result = run_hf_client(
        f"""
        from pathlib import Path
        from kernels._rust import KernelLocks

        KernelLocks.from_json(Path({str(project / "kernels.lock")!r}).read_text())
        """,
        cwd=tmp_path,
    )
    assert result.returncode != 0 and "unknown field `repo_id`" in result.stderr


@needs_hf_client
def test_we_load_a_lock_their_client_wrote(hub, tmp_path):
    repo, v1, v2 = _versioned(hub)
    lockfile = tmp_path / "theirs" / "kernels.lock"
    lockfile.parent.mkdir()
    result = run_hf_client(
        f"""
        from pathlib import Path
        from kernels._rust import KernelDependency, KernelLock, KernelLocks, KernelVersion

        locks = KernelLocks({{
            KernelDependency({repo.repo_id!r}, KernelVersion.Version(1)): KernelLock({v1!r}),
            KernelDependency("kernels-community/other", KernelVersion.Revision("main")):
                KernelLock({v2.upper()!r}),
        }})
        Path({str(lockfile)!r}).write_text(locks.to_json())
        """,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    first, other = read_lockfile(lockfile)
    assert (first.repo_id, first.sha, first.version, first.ref) == (repo.repo_id, v1, 1, "v1")
    assert (other.sha, other.version, other.ref) == (v2, None, "main")
    assert kernels.get_locked_kernel(repo.repo_id, lockfile=lockfile).VERSION == "1.0"


def test_a_mixed_lock_is_refused_where_locks_are_read(released, tmp_path, capsys):
    repo = released("0.1.0")
    project = write_project(tmp_path / "p", {repo.repo_id: '">=0.1"'})
    assert main(["lock", str(project)]) == 0
    ours = json.loads((project / "kernels.lock").read_text())
    sha = ours[0]["sha"]
    mixed = write_hf_lock(
        tmp_path / "mixed", ours[0], hf_entry("kernels-community/other", sha, version=1)
    )
    with pytest.raises(KernelLockError, match=r"mixes Hugging Face's lock format \(entries 2\)"):
        kernels.get_locked_kernel(repo.repo_id, lockfile=mixed)
    assert main(["download", str(tmp_path / "mixed")]) == 1
    assert "a lock file holds one format" in capsys.readouterr().err


def test_hf_lock_in_a_distributions_metadata(released, tmp_path, monkeypatch):
    """Their wheels ship kernels.lock in the metadata; no pyproject.toml there grants trust."""
    trusted = released("0.1.0")
    stranger = released("0.1.0", org="some-stranger")
    site = tmp_path / "site-packages"
    (site / "hf_locked_app").mkdir(parents=True)
    (site / "hf_locked_app" / "__init__.py").write_text(
        "from kernels import get_locked_kernel\n\n"
        "def kernel(repo_id):\n    return get_locked_kernel(repo_id)\n"
    )
    dist_info = site / "hf_locked_app-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: hf-locked-app\nVersion: 0.1\n"
    )
    (dist_info / "top_level.txt").write_text("hf_locked_app\n")
    write_hf_lock(
        dist_info,
        hf_entry(trusted.repo_id, trusted.git("rev-parse", "v0.1.0"), revision="v0.1.0"),
        hf_entry(stranger.repo_id, stranger.git("rev-parse", "v0.1.0"), revision="v0.1.0"),
    )
    # A pyproject.toml that trusts the stranger, where the metadata is: not the project's.
    write_project(site, {stranger.repo_id: '{ version = ">=0.1", trust-remote-code = true }'})
    monkeypatch.syspath_prepend(str(site))
    import hf_locked_app

    assert hf_locked_app.kernel(trusted.repo_id).VERSION == "0.1.0"
    with pytest.raises(UntrustedKernelError):
        hf_locked_app.kernel(stranger.repo_id)


@needs_hf_client
def test_their_client_loads_the_kernel_a_format_hf_lock_pins(hub, tmp_path):
    """The whole way: their get_locked_kernel reads our --format hf lock and downloads the
    pinned commit from the same Hub (a newer v1 head must not be what it loads)."""
    repo = hub.create_repo()
    package = repo.repo_id.split("/")[1].replace("-", "_")
    metadata = {
        "name": package.replace("_", "-"),
        "id": f"_{package}_universal",
        "version": 1,
        "license": "Apache-2.0",
        "python-depends": [],
        "backend": {"type": "cuda"},
    }
    repo.write_kernel(version="1.0", offset=1.0)
    repo.write("build/torch-universal/metadata.json", json.dumps(metadata))
    pinned = repo.commit("v1")
    repo.branch("v1")
    project = write_project(tmp_path / "p", {repo.repo_id: "1"})
    assert main(["lock", str(project), "--format", "hf"]) == 0
    repo.write_kernel(version="1.1", offset=2.0)  # v1 moves on after the lock
    repo.write("build/torch-universal/metadata.json", json.dumps(metadata))
    repo.commit("v1.1")
    repo.branch("v1")
    result = run_hf_client(
        f"""
        from pathlib import Path
        from kernels import get_locked_kernel

        module = get_locked_kernel(
            {repo.repo_id!r}, lockfile=Path({str(project / "kernels.lock")!r}),
            trust_remote_code=True,
        )
        print(module.VERSION)
        """,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-1] == "1.0", pinned
