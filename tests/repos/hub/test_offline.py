"""Offline mode, an unreachable Hub, interrupted downloads and concurrent downloads.

HF_HUB_OFFLINE is read by huggingface_hub when it is imported, so offline runs happen in a
fresh interpreter (the `python` fixture). "Unreachable" and "interrupted" use the proxy in
front of the test server: stopped, or dropping a connection mid-transfer.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import textwrap
from pathlib import Path

import pytest

import kernels
from kernels import KernelOfflineError
from kernels.repos.hubclient import repo_cache_folder
from tests.support.children import PythonChild

pytestmark = pytest.mark.hub

PROBE = """
import json, sys
import kernels

def attempt(**kwargs):
    try:
        module = kernels.get_kernel(REPO, **kwargs)
        return {"ok": module.VERSION}
    except kernels.KernelLoadError as exc:
        return {"error": type(exc).__name__, "message": str(exc)}

REPO = sys.argv[1] if len(sys.argv) > 1 else None
"""


def probe(python, repo_id: str, calls: str, env: dict[str, str]) -> list[dict]:
    code = PROBE.replace("REPO = sys.argv[1] if len(sys.argv) > 1 else None", f"REPO = {repo_id!r}")
    code += "\nprint(json.dumps([" + calls + "]))\n"
    result = python(code, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_offline_with_a_cache_answers_from_it(released, python):
    repo = released("0.1.0", "0.1.1", "0.2.0")
    assert kernels.get_kernel(repo.repo_id, version=">=0.1,<0.2").VERSION == "0.1.1"
    repo.release("0.1.5")  # published after our download: offline cannot know it
    answers = probe(
        python,
        repo.repo_id,
        """attempt(version=">=0.1,<0.2"), attempt(revision="v0.1.1"), attempt(version=">=0.2"),
        attempt(revision="main")""",
        env={"HF_HUB_OFFLINE": "1"},
    )
    assert answers[0] == {"ok": "0.1.1"}
    assert answers[1] == {"ok": "0.1.1"}
    for missing in answers[2:]:
        assert missing["error"] == "KernelOfflineError"
        assert "HF_HUB_OFFLINE" in missing["message"]
        assert "kernels download" in missing["message"]
    assert "v0.1.1" in answers[2]["message"]  # it says what the cache does have


def test_offline_without_a_cache_says_what_is_missing(released, python, tmp_path):
    repo = released("0.1.0")
    answers = probe(
        python,
        repo.repo_id,
        'attempt(version=">=0.1"), attempt(revision="v0.1.0"), attempt(revision="'
        + "a" * 40
        + '")',
        env={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "empty-cache")},
    )
    for answer in answers:
        assert answer["error"] == "KernelOfflineError", answer
        assert repo.repo_id in answer["message"]
        assert "unset HF_HUB_OFFLINE" in answer["message"]
        assert "kernels download" in answer["message"]


def test_unreachable_hub_uses_the_cache_and_reports_what_it_cannot_answer(released, hub, caplog):
    cached = released("0.1.0", "0.1.1")
    never_fetched = released("0.1.0")
    assert kernels.get_kernel(cached.repo_id, version="<0.2").VERSION == "0.1.1"
    hub.proxy.stop()
    with caplog.at_level(logging.WARNING, logger="kernels"):
        assert kernels.get_kernel(cached.repo_id, version="<0.2").VERSION == "0.1.1"
    assert any("highest cached version" in r.getMessage() for r in caplog.records)
    with pytest.raises(KernelOfflineError) as info:
        kernels.get_kernel(never_fetched.repo_id, version="<0.2")
    message = str(info.value)
    assert hub.endpoint in message and "cannot be reached" in message
    assert "nothing of it is cached" in message
    hub.proxy.start()
    assert kernels.get_kernel(never_fetched.repo_id, version="<0.2").VERSION == "0.1.0"


def test_unreachable_hub_loads_a_cached_commit_and_a_locked_kernel(released, hub, tmp_path):
    """A commit needs no resolving: with the Hub down (and HF_HUB_OFFLINE unset) the cache
    answers get_kernel, has_kernel and the lock loaders alike."""
    from kernels.repos.lock import lock_project

    repo = released("0.1.0")
    never_fetched = released("0.1.0")
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.kernels.dependencies]\n"{repo.repo_id}" = ">=0.1"\n'
    )
    lockfile, _ = lock_project(tmp_path)
    sha = repo.git("rev-parse", "v0.1.0")
    module = kernels.get_locked_kernel(repo.repo_id, lockfile=lockfile)
    hub.proxy.stop()
    assert kernels.get_locked_kernel(repo.repo_id, lockfile=lockfile) is module
    assert kernels.get_kernel(repo.repo_id, revision=sha) is module
    assert kernels.has_kernel(repo.repo_id, revision=sha)
    other_sha = never_fetched.git("rev-parse", "v0.1.0")
    with pytest.raises(KernelOfflineError) as info:
        kernels.has_kernel(never_fetched.repo_id, revision=other_sha)
    message = str(info.value)
    assert "is not in the cache" in message and "cannot be reached" in message


def test_a_cached_commit_is_answered_without_a_request(released, hub):
    """A commit never changes: once get_kernel listed it, has_kernel and get_kernel_variants
    answer from what the cache noted, with no request (and so, with the Hub down, without
    waiting out huggingface_hub's retries)."""
    repo = released("0.1.0")
    sha = repo.git("rev-parse", "v0.1.0")
    kernels.get_kernel(repo.repo_id, revision=sha)
    hub.proxy.clear()
    assert kernels.has_kernel(repo.repo_id, revision=sha)
    decisions = kernels.get_kernel_variants(repo.repo_id, revision=sha)
    assert decisions and isinstance(decisions[0], kernels.VariantAccepted)
    assert hub.proxy.requests == []


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_server_stopped_mid_download_leaves_a_clean_cache_and_a_retry_succeeds(hub):
    payload = os.urandom(3 * 1024 * 1024)
    repo = hub.create_repo()
    repo.release("0.1.0", extra_files={"weights.bin": payload})
    package = repo.repo_id.split("/")[1].replace("-", "_")

    hub.proxy.cut_after(300_000)  # the server dies while sending weights.bin
    with pytest.raises(KernelOfflineError) as info:
        kernels.get_kernel(repo.repo_id, version="==0.1.0")
    assert hub.proxy.cuts == 1 and not hub.proxy.running
    message = str(info.value)
    assert repo.repo_id in message and (
        "did not finish" in message or "cannot be reached" in message
    )

    # Nothing truncated sits in the snapshot: every file there is complete.
    snapshots = repo_cache_folder(repo.repo_id) / "snapshots"
    for path in snapshots.rglob("*"):
        if path.is_file():
            source = repo.path / path.relative_to(next(snapshots.iterdir()))
            assert _sha256(path) == _sha256(source), path

    # While the server is still down, the partial download is not imported.
    with pytest.raises(KernelOfflineError, match="did not finish|cannot be reached"):
        kernels.get_kernel(repo.repo_id, version="==0.1.0")
    assert not [m for m in sys.modules if m.startswith(f"_kernels_{package}_")]

    hub.proxy.start()
    module = kernels.get_kernel(repo.repo_id, version="==0.1.0")
    weights = Path(module.__file__).parent / "weights.bin"
    assert weights.read_bytes() == payload


def test_two_processes_download_the_same_kernel_at_once(hub, tmp_path):
    payload = os.urandom(2 * 1024 * 1024)
    repo = hub.create_repo()
    repo.release("0.1.0", extra_files={"weights.bin": payload})
    code = textwrap.dedent(
        f"""
        import hashlib, json, pathlib, sys, time
        go = pathlib.Path(sys.argv[1])
        import kernels  # import before waiting, so both start downloading together
        import huggingface_hub
        while not go.exists():
            time.sleep(0.01)
        module = kernels.get_kernel({repo.repo_id!r}, version="==0.1.0")
        weights = pathlib.Path(module.__file__).parent / "weights.bin"
        print(json.dumps({{"file": module.__file__, "sha": hashlib.sha256(weights.read_bytes()).hexdigest()}}))
        """
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            p
            for p in (str(Path(kernels.__file__).parents[1]), os.environ.get("PYTHONPATH", ""))
            if p
        ),
        "HF_HUB_CACHE": str(tmp_path / "shared-cache"),  # empty: both must download
    }
    go = tmp_path / "go"
    procs = [PythonChild("-c", code, str(go), env=env) for _ in range(2)]
    go.write_text("")
    outputs = [p.communicate(timeout=120) for p in procs]
    for proc, (_out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert results[0] == results[1]
    assert results[0]["sha"] == hashlib.sha256(payload).hexdigest()
    assert not list((tmp_path / "shared-cache").rglob("*.incomplete"))
