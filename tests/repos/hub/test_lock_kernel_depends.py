"""`kernels lock` locks each kernel's ``kernel-depends`` tree (every variant, cycles refused,
trust checked before download), and a locked load gives a kernel its dependencies at their
locked commits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernels import KernelLockError, UntrustedKernelError, get_kernel, load_kernel
from kernels.cli import main
from kernels.repos.lock import get_locked_kernel, lock_project

pytestmark = pytest.mark.hub

CPU, OTHER = "torch-cpu", "torch28-cxx11-cu128-x86_64-linux"


def _metadata(depends: list[dict], backend: str) -> str:
    return json.dumps(
        {
            "name": "kernel",
            "id": "_kernel_abc",
            "version": 1,
            "license": "MIT",
            "python-depends": [],
            "backend": {"type": backend},
            "kernel-depends": depends,
        }
    )


def _publish(repo, *, marker: str, depends=None, init: str = "", variants=(CPU,)) -> str:
    """A flat-layout kernel; `depends` maps a variant to its kernel-depends."""
    for variant in variants:
        backend = "cpu" if variant == CPU else "cuda"
        repo.write(
            f"build/{variant}/metadata.json", _metadata((depends or {}).get(variant, []), backend)
        )
        repo.write(f"build/{variant}/__init__.py", f"MARKER = {marker!r}\n{init}")
    return repo.commit(marker)


USES_B = 'from kernels import get_kernel_dep\nB = get_kernel_dep("{b}")\n'


def _project(folder: Path, dependencies: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = "\n".join(f'"{repo}" = {spec}' for repo, spec in dependencies.items())
    (folder / "pyproject.toml").write_text(
        f'[project]\nname = "demo"\nversion = "0.1"\n\n[tool.kernels.dependencies]\n{lines}\n'
    )
    return folder


@pytest.fixture
def tree(hub):
    """a (v1) depends on b (v1) in its CPU variant and on c (tag r1) in its CUDA variant."""
    b, c, a = hub.create_repo(), hub.create_repo(), hub.create_repo()
    b_sha = _publish(b, marker="b-old")
    b.branch("v1")
    c_sha = _publish(c, marker="c")
    c.tag("r1")
    depends = {
        CPU: [{"repo-id": b.repo_id, "version": 1}],
        OTHER: [{"repo-id": c.repo_id, "revision": "r1"}],
    }
    a_sha = _publish(
        a, marker="a", depends=depends, init=USES_B.format(b=b.repo_id), variants=(CPU, OTHER)
    )
    a.branch("v1")
    return a, b, c, {"a": a_sha, "b": b_sha, "c": c_sha}


@pytest.mark.parametrize("format", ["kernels", "hf"])
def test_the_lock_holds_the_tree_and_a_locked_load_uses_it(tree, tmp_path, capsys, format):
    a, b, c, shas = tree
    project = _project(tmp_path / "project", {a.repo_id: "1"})
    assert main(["lock", str(project), "--format", format]) == 0
    capsys.readouterr()
    entries = json.loads((project / "kernels.lock").read_text())
    if format == "hf":
        got = {e["dependency"]["repo-id"]: (e["dependency"], e["lock"]["commit"]) for e in entries}
        assert got[b.repo_id] == ({"repo-id": b.repo_id, "version": 1}, shas["b"])
        assert got[c.repo_id] == ({"repo-id": c.repo_id, "revision": "r1"}, shas["c"])
    else:
        got = {e["repo_id"]: e["sha"] for e in entries}
        assert got == {a.repo_id: shas["a"], b.repo_id: shas["b"], c.repo_id: shas["c"]}
        assert next(e for e in entries if e["repo_id"] == b.repo_id)["version"] == 1

    # b's branch v1 moves on: an unlocked load follows it, the locked one keeps the old b.
    _publish(b, marker="b-new")
    b.branch("v1")
    lockfile = project / "kernels.lock"
    assert get_kernel(b.repo_id, version=1).MARKER == "b-new"
    assert get_locked_kernel(a.repo_id, lockfile=lockfile).B.MARKER == "b-old"
    assert load_kernel(a.repo_id, lockfile=lockfile).B.MARKER == "b-old"  # from the cache


def test_an_older_lock_without_the_dependency_says_to_relock(tree, tmp_path):
    a, _, _, shas = tree
    lockfile = tmp_path / "kernels.lock"
    entry = {"dependency": {"repo-id": a.repo_id, "version": 1}, "lock": {"commit": shas["a"]}}
    lockfile.write_text(json.dumps([entry]))
    with pytest.raises(KernelLockError, match=r"does not lock.*kernels lock PROJECT_DIR"):
        get_locked_kernel(a.repo_id, lockfile=lockfile)


def test_a_cycle_is_refused(hub, tmp_path):
    x, y = hub.create_repo(), hub.create_repo()
    _publish(y, marker="y", depends={CPU: [{"repo-id": x.repo_id, "revision": "main"}]})
    _publish(x, marker="x", depends={CPU: [{"repo-id": y.repo_id, "revision": "main"}]})
    project = _project(tmp_path / "p", {x.repo_id: '{ revision = "main" }'})
    cycle = f"{x.repo_id} -> {y.repo_id} -> {x.repo_id}"
    with pytest.raises(KernelLockError, match=f"Cyclic kernel-depends: {cycle}"):
        lock_project(project)
    assert not (project / "kernels.lock").exists()


def test_an_untrusted_dependency_is_refused_before_any_download(hub, tmp_path):
    stranger = hub.create_repo(org="someone")
    _publish(stranger, marker="s")
    a = hub.create_repo()
    _publish(a, marker="a", depends={CPU: [{"repo-id": stranger.repo_id, "revision": "main"}]})
    project = _project(tmp_path / "p", {a.repo_id: '{ revision = "main" }'})
    hub.proxy.clear()
    with pytest.raises(UntrustedKernelError, match="someone"):
        lock_project(project)
    assert not [p for m in ("GET", "HEAD") for p in hub.proxy.requested(m, r".*someone.*")]


def test_two_commits_of_one_repository_are_refused(tree, tmp_path):
    a, b, _, _ = tree
    _publish(b, marker="b-main")  # main moves past v1
    project = _project(tmp_path / "p", {a.repo_id: "1", b.repo_id: '{ revision = "main" }'})
    with pytest.raises(KernelLockError, match=f"{b.repo_id} is asked for twice"):
        lock_project(project)
    # One commit for both requests is fine.
    b.branch("v1")
    _, locks = lock_project(project)
    assert sorted(lock.repo_id for lock in locks) == sorted([a.repo_id, b.repo_id, tree[2].repo_id])
