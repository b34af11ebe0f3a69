"""Loading kernels from many threads and processes at once: no deadlock, one Hub resolution.

A kernel may load other kernels when it is imported; the loads of one machine that ask for
the same kernel at once (threads of one process, torchrun ranks, dataloader workers) make
one set of Hub requests and one download. Requests are counted where they reach the test
server (the proxy in conftest.py), so nothing of huggingface_hub is mocked.

A load that deadlocks never returns: every load here runs in a daemon thread (or a child
process) that the test waits for with a timeout.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels
from kernels import (
    KernelLoadError,
    LayerRepository,
    LockedLayerRepository,
    Mode,
    get_loaded_kernels,
    kernelize,
    use_kernel_forward_from_hub,
    use_kernel_mapping,
)
from kernels.cli import main
from kernels.repos import cache_records, load_locks
from kernels.repos.hubclient import repo_cache_folder
from tests.support.children import ROOT_FILE_POWERS, PythonChild, run_python
from tests.support.hub import SESSION_DIR, SILU_AND_MUL_LAYERS, kernel_init, subprocess_env

if TYPE_CHECKING:  # the fixtures' repository type, for annotations only
    from tests.repos.hub.conftest import HubRepo

pytestmark = pytest.mark.hub

#: Seconds a load may take before the test calls it a deadlock (the CPU is shared).
PATIENCE = 120.0


def package_of(repo: HubRepo) -> str:
    return repo.repo_id.split("/")[1].replace("-", "_")


def release(repo: HubRepo, version: str, *, prelude: str = "", offset: float = 0.0) -> str:
    """Release `version` of a one-variant kernel whose ``__init__`` runs `prelude` first;
    its layer adds `offset` to its output."""
    base = f"build/torch-universal/{package_of(repo)}"
    init = textwrap.dedent(prelude) + "\n" + kernel_init(version, offset, "torch-universal")
    repo.write(f"{base}/__init__.py", init)
    repo.write(f"{base}/layers.py", SILU_AND_MUL_LAYERS.format(offset=offset))
    commit = repo.commit(f"release {version}")
    repo.tag(f"v{version}")
    return commit


def logs_imports(log: Path) -> str:
    """A kernel prelude that appends a line to `log` each time the kernel is imported."""
    return f"open({str(log)!r}, 'a').write('imported\\n')\n"


def loads(repo: HubRepo, how: str = "LayerRepository") -> str:
    """A kernel prelude that loads `repo` (version >= 0.1) when the kernel is imported."""
    where = f"{repo.repo_id!r}, version='>=0.1', repo_type={repo.repo_type!r}"
    if how == "get_kernel":
        return f"import kernels\nINNER = kernels.get_kernel({where})\n"
    return (
        "import kernels\n"
        f"INNER = kernels.LayerRepository({where}, layer_name='SiluAndMul').load_package()\n"
    )


def in_time(load: Callable[[], object], timeout: float = PATIENCE) -> object:
    """Run `load` in a daemon thread; its result, or its exception raised here; a test
    failure when it is still running after `timeout` seconds."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["result"] = load()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        pytest.fail(f"the load still runs after {timeout:.0f} s: it is deadlocked")
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["result"]


def layer(repo: HubRepo) -> LayerRepository:
    return LayerRepository(
        repo.repo_id, layer_name="SiluAndMul", version=">=0.1", repo_type=repo.repo_type
    )


#: Kernel repositories, and (with any huggingface_hub, 0.x included) model repositories.
REPO_TYPES = ["kernel", pytest.param("model", marks=pytest.mark.any_hub_client)]


# --- threads ----------------------------------------------------------------------------


@pytest.mark.parametrize("repo_type", REPO_TYPES)
@pytest.mark.parametrize("inner", ["LayerRepository", "get_kernel"])
def test_a_kernel_that_loads_another_kernel_at_import_loads(hub, inner, repo_type):
    inner_repo = hub.create_repo(repo_type=repo_type)
    outer_repo = hub.create_repo(repo_type=repo_type)
    release(inner_repo, "0.1.0")
    release(outer_repo, "0.1.0", prelude=loads(inner_repo, inner))

    outer = in_time(layer(outer_repo).load_package)

    assert outer.INNER.VERSION == "0.1.0"
    inner_folder = repo_cache_folder(inner_repo.repo_id, repo_type)
    assert outer.INNER.__file__.startswith(str(inner_folder))


def test_a_locked_kernel_that_loads_another_locked_kernel_at_import_loads(hub, tmp_path, capsys):
    inner_repo, outer_repo = hub.create_repo(), hub.create_repo()
    project = tmp_path / "project"
    lockfile = project / "kernels.lock"
    release(inner_repo, "0.1.0")
    locked_inner = (
        f"kernels.LockedLayerRepository({inner_repo.repo_id!r}, layer_name='SiluAndMul', "
        f"lockfile={str(lockfile)!r})"
    )
    release(outer_repo, "0.1.0", prelude=f"import kernels\nINNER = {locked_inner}.load_package()\n")
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[project]\nname = "demo"\nversion = "0.1"\n\n[tool.kernels.dependencies]\n'
        f'"{inner_repo.repo_id}" = ">=0.1"\n"{outer_repo.repo_id}" = ">=0.1"\n'
    )
    assert main(["lock", str(project)]) == 0, capsys.readouterr().err
    outer = LockedLayerRepository(outer_repo.repo_id, layer_name="SiluAndMul", lockfile=lockfile)

    assert in_time(outer.load_package).INNER.VERSION == "0.1.0"


@use_kernel_forward_from_hub("ConcurrentSiluAndMul")
class ConcurrentSiluAndMul(nn.Module):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        d = input.shape[-1] // 2
        return F.silu(input[..., :d]) * input[..., d:]


@pytest.mark.parametrize("use_fallback", [True, False])
def test_kernelize_with_a_kernel_that_loads_another_kernel_at_import(hub, use_fallback):
    inner_repo, outer_repo = hub.create_repo(), hub.create_repo()
    release(inner_repo, "0.1.0")
    release(outer_repo, "0.1.0", prelude=loads(inner_repo), offset=7.0)
    mapping = {"ConcurrentSiluAndMul": {"cpu": layer(outer_repo)}}
    model, x = ConcurrentSiluAndMul(), torch.randn(2, 8)
    plain = model(x)

    def run():
        with use_kernel_mapping(mapping, inherit_mapping=False):
            return kernelize(model, device="cpu", mode=Mode.INFERENCE, use_fallback=use_fallback)

    in_time(run)
    torch.testing.assert_close(model(x), plain + 7.0)  # the outer kernel's layer runs


@pytest.mark.parametrize("repo_type", REPO_TYPES)
def test_a_kernel_that_loads_itself_at_import_is_a_clear_error(hub, repo_type):
    repo = hub.create_repo(repo_type=repo_type)
    release(repo, "0.1.0", prelude=loads(repo))

    with pytest.raises(KernelLoadError, match="Cyclic kernel import") as info:
        in_time(layer(repo).load_package)

    assert f"{repo.repo_id}@" in str(info.value)
    assert not [
        k for k in get_loaded_kernels() if k.repo_info and k.repo_info.repo_id == repo.repo_id
    ]
    # The failure left nothing behind: the same cycle fails the same way again.
    with pytest.raises(KernelLoadError, match="Cyclic kernel import"):
        in_time(layer(repo).load_package)


def test_two_kernels_loading_each_other_from_two_threads_do_not_deadlock(hub):
    """Thread 1 loads A (whose import loads B), thread 2 loads B (whose import loads A)."""
    a, b = hub.create_repo(), hub.create_repo()
    release(a, "0.1.0", prelude=loads(b))
    release(b, "0.1.0", prelude=loads(a))
    start = threading.Barrier(2)
    errors: dict[str, BaseException] = {}

    def load(repo: HubRepo) -> None:
        start.wait()
        try:
            layer(repo).load_package()
        except KernelLoadError as exc:
            errors[repo.repo_id] = exc

    threads = [threading.Thread(target=load, args=(r,), daemon=True) for r in (a, b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(PATIENCE)
    assert not any(t.is_alive() for t in threads), "two kernels importing each other deadlocked"
    # Each thread's own chain is a cycle (A -> B -> A, or B -> A -> B): both say so.
    assert set(errors) == {a.repo_id, b.repo_id}
    assert all("Cyclic kernel import" in str(e) for e in errors.values())


@pytest.mark.parametrize("repo_type", REPO_TYPES)
def test_sixteen_threads_make_one_resolution_one_download_and_one_import(hub, tmp_path, repo_type):
    repo = hub.create_repo(repo_type=repo_type)
    log = tmp_path / "imports.log"
    commit = release(repo, "0.1.0", prelude=logs_imports(log))
    shared = layer(repo)
    # Half share one LayerRepository, as the layers of a model do; half make their own.
    repositories = [shared if i % 2 else layer(repo) for i in range(16)]
    modules: list[object] = []

    def waiting() -> int:
        # The threads queued for this repository's resolution (the first one holds it).
        entries = list(load_locks._entries.items())
        return sum(e.users for key, e in entries if key.repo_id == repo.repo_id)

    hub.proxy.pause()  # the first thread's first request waits at the proxy...
    threads = [
        threading.Thread(target=lambda r=r: modules.append(r.load_package()), daemon=True)
        for r in repositories
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + PATIENCE
    while waiting() < 16 and time.monotonic() < deadline:  # ...until all sixteen ask
        time.sleep(0.01)
    assert waiting() == 16
    hub.proxy.resume()
    for thread in threads:
        thread.join(PATIENCE)
    assert not any(t.is_alive() for t in threads)

    assert len(modules) == 16 and all(m is modules[0] for m in modules)
    assert log.read_text() == "imported\n"
    assert {r.commit for r in repositories} == {commit}
    kind = f"{repo_type}s"
    assert len(hub.proxy.requested("GET", f"/api/{kind}/{repo.repo_id}/refs")) == 1
    # Model repositories' files are served without a prefix.
    resolve = f"{'' if repo_type == 'model' else '/' + kind}/{repo.repo_id}/resolve/.*"
    files = Counter(hub.proxy.requested("GET", resolve))
    assert sorted(files.values()) == [1, 1], files  # __init__.py and layers.py, once each


@pytest.mark.parametrize("repo_type", REPO_TYPES)
def test_a_pinned_commit_complete_in_the_cache_asks_the_hub_nothing(hub, repo_type):
    repo = hub.create_repo(repo_type=repo_type)
    commit = release(repo, "0.1.0")
    first = kernels.get_kernel(repo.repo_id, revision=commit, repo_type=repo_type)
    hub.proxy.clear()

    assert kernels.get_kernel(repo.repo_id, revision=commit, repo_type=repo_type) is first
    assert hub.proxy.requests == []


def test_a_tag_resolved_to_a_cached_commit_is_only_listed(hub):
    repo = hub.create_repo()
    release(repo, "0.1.0")
    kernels.get_kernel(repo.repo_id, version=">=0.1")
    hub.proxy.clear()

    # This process asks the Hub again (a version may have been released since), but only
    # which commit the version is: the commit's files are in the cache.
    kernels.get_kernel(repo.repo_id, version=">=0.1")
    assert hub.proxy.requests == [("GET", f"/api/kernels/{repo.repo_id}/refs")]


# --- processes --------------------------------------------------------------------------

CHILD = """
import json, sys, time
from pathlib import Path

import torch  # imported before the start signal, so the processes ask at once
import kernels

gate, index, repo_id = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
(gate / f"ready-{index}").touch()
deadline = time.monotonic() + 600
while not (gate / "go").exists():
    if time.monotonic() > deadline:
        sys.exit("no start signal")
    time.sleep(0.01)
repo = kernels.LayerRepository(repo_id, layer_name="SiluAndMul", version=">=0.1")
repo.load()
print(json.dumps({"commit": repo.commit}))
"""


def load_in_processes(repo: HubRepo, count: int, gate: Path, **env: str) -> list[str]:
    """Start `count` processes that load `repo` at the same moment; the commits they got."""
    gate.mkdir()
    children = [
        PythonChild(
            "-c", CHILD, str(gate), str(i), repo.repo_id, env=subprocess_env(**env), cwd=SESSION_DIR
        )
        for i in range(count)
    ]
    try:
        deadline = time.monotonic() + 600
        while len(list(gate.glob("ready-*"))) < count:
            assert time.monotonic() < deadline, "the processes did not start"
            assert all(c.poll() is None for c in children), [c.communicate() for c in children]
            time.sleep(0.05)
        (gate / "go").touch()
        results = [c.communicate(timeout=600) for c in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    for child, (_, err) in zip(children, results, strict=True):
        assert child.returncode == 0, err
    return [json.loads(out.strip().splitlines()[-1])["commit"] for out, _ in results]


def hub_calls(hub, repo: HubRepo, commit: str) -> Counter:
    """The requests for `repo` that reached the server, with its names and commit replaced
    by placeholders (so two repositories' requests compare)."""
    calls: Counter = Counter()
    for method, path in hub.proxy.requests:
        if repo.repo_id in path:
            path = path.replace(repo.repo_id, "REPO").replace(commit, "COMMIT")
            calls[(method, path.replace(package_of(repo), "PACKAGE"))] += 1
    return calls


def downloads(calls: Counter) -> dict[str, int]:
    """How often each file was downloaded."""
    return {
        path: n for (method, path), n in calls.items() if method == "GET" and "/resolve/" in path
    }


#: Processes that load one kernel at once, as a node's torchrun ranks do: four wait on each other
#: as eight do (each one more costs a Python importing torch).
RANKS = 4


@pytest.mark.slow
def test_ranks_loading_at_once_make_the_hub_requests_of_one(hub, tmp_path):
    """torchrun ranks loading one kernel: one refs listing, one file listing, one download."""
    alone, repo = hub.create_repo(), hub.create_repo()
    alone_commit = release(alone, "0.1.0")
    (one,) = load_in_processes(alone, 1, tmp_path / "alone")
    baseline = hub_calls(hub, alone, one)
    commit = release(repo, "0.1.0")
    hub.proxy.clear()

    commits = load_in_processes(repo, RANKS, tmp_path / "gate")

    assert one == alone_commit and commits == [commit] * RANKS
    calls = hub_calls(hub, repo, commit)
    assert calls == baseline  # exactly what one process alone asks
    assert calls[("GET", "/api/kernels/REPO/refs")] == 1
    assert sorted(downloads(calls).values()) == [1, 1], calls  # __init__.py and layers.py


@pytest.mark.slow
def test_without_reuse_each_process_lists_the_refs_again(hub, tmp_path):
    """KERNELS_RESOLVE_REUSE_SECONDS=0: the coordination is what saved the listings above."""
    repo = hub.create_repo()
    commit = release(repo, "0.1.0")

    commits = load_in_processes(repo, RANKS, tmp_path / "gate", KERNELS_RESOLVE_REUSE_SECONDS="0")

    assert commits == [commit] * RANKS
    calls = hub_calls(hub, repo, commit)
    assert calls[("GET", "/api/kernels/REPO/refs")] == RANKS
    # Still one download: each later process finds the commit complete in the cache.
    assert sorted(downloads(calls).values()) == [1, 1], calls


def resolution_record(repo: HubRepo) -> Path:
    (path,) = (repo_cache_folder(repo.repo_id) / cache_records.FOLDER / "asked").glob("*.json")
    return path


def load_version_in_a_process(python, repo: HubRepo, version: str, **env: str) -> str:
    result = python(
        f"""
        import kernels
        print(kernels.get_kernel({repo.repo_id!r}, version={version!r}).VERSION)
        """,
        env=env or None,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "tamper", ["not json", "another version", "in the future", "a commit not in the cache"]
)
def test_a_resolution_record_that_does_not_hold_is_ignored_and_rewritten(
    hub, python, released, tamper
):
    repo = released("0.1.0", "0.2.0")
    # This (test) process writes the record; the child process below is "another process".
    assert kernels.get_kernel(repo.repo_id, version=">=0.2").VERSION == "0.2.0"
    path = resolution_record(repo)
    record = json.loads(path.read_text())
    if tamper == "not json":
        path.write_text('{"format": 1, "asked": ')
    elif tamper == "another version":  # cached, complete, but not what was asked
        kernels.get_kernel(repo.repo_id, version="<0.2")
        record.update(revision="v0.1.0", commit=repo.git("rev-parse", "v0.1.0"))
        path.write_text(json.dumps(record))
    elif tamper == "in the future":
        path.write_text(json.dumps({**record, "time": record["time"] + 3600}))
    else:
        path.write_text(json.dumps({**record, "commit": "0" * 40}))
    hub.proxy.clear()

    assert load_version_in_a_process(python, repo, ">=0.2") == "0.2.0"

    assert len(hub.proxy.requested("GET", f"/api/kernels/{repo.repo_id}/refs")) == 1
    rewritten = json.loads(path.read_text())
    assert rewritten["commit"] == repo.git("rev-parse", "v0.2.0")
    assert rewritten["revision"] == "v0.2.0"


def test_a_recent_resolution_of_another_process_is_used(hub, python, released):
    repo = released("0.1.0")
    kernels.get_kernel(repo.repo_id, version=">=0.1")  # this process resolves first
    repo.release("0.1.1")  # too recent for the window: the other process's answer stands
    hub.proxy.clear()

    assert load_version_in_a_process(python, repo, ">=0.1") == "0.1.0"
    assert hub.proxy.requests == []
    # Past the window (here: none), the Hub is asked again.
    assert (
        load_version_in_a_process(python, repo, ">=0.1", KERNELS_RESOLVE_REUSE_SECONDS="0")
        == "0.1.1"
    )


def test_a_read_only_cache_loads_without_coordination(hub, python, released, tmp_path):
    repo = released("0.1.0")
    cache = tmp_path / "cache"
    load_version_in_a_process(python, repo, ">=0.1", HF_HUB_CACHE=str(cache))
    for folder, _, files in os.walk(cache):
        os.chmod(folder, 0o555)
        for name in files:
            os.chmod(Path(folder) / name, 0o444)
    code = textwrap.dedent(
        f"""
        import logging
        logging.basicConfig(level=logging.DEBUG, format="%(name)s %(message)s")
        import kernels
        print("VERSION", kernels.get_kernel({repo.repo_id!r}, version=">=0.1").VERSION)
        """
    )
    try:
        result = run_python(
            "-c",
            code,
            env=subprocess_env(HF_HUB_CACHE=str(cache)),
            timeout=PATIENCE,
            cwd=SESSION_DIR,
            # root writes anywhere: the child runs without the capabilities that let it
            drop_capabilities=ROOT_FILE_POWERS,
        )
    finally:
        for folder, _, _ in os.walk(cache):
            os.chmod(folder, 0o755)
    assert result.returncode == 0, result.stderr
    assert "VERSION 0.1.0" in result.stdout
    assert "without coordinating with other processes" in result.stderr


# --- the records, as hostile input --------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(data=st.one_of(st.binary(max_size=300), st.text(max_size=300).map(str.encode)))
def test_any_bytes_in_a_record_read_as_nothing_or_a_checked_record(tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("records")
    commit = "a" * 40
    paths = [
        folder / cache_records.FOLDER / "asked" / "digest.json",
        folder / cache_records.FOLDER / commit / "listing.json",
        folder / cache_records.FOLDER / commit / "torch-universal.json",
    ]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    record = cache_records.read_resolution(folder, "digest", "kernel:org/name:version=>=0.1")
    assert record is None or len(record.commit) == 40
    listing = cache_records.read_listing(folder, commit)
    assert listing is None or all(isinstance(v, str) for v in listing[0])
    files = cache_records.read_files(folder, commit, "torch-universal")
    assert files is None or all(isinstance(f, str) for f in files)


@settings(max_examples=200, deadline=None)
@given(
    fields=st.dictionaries(
        st.sampled_from(
            ["format", "asked", "revision", "commit", "how", "variant", "time", "pid", "host"]
        ),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(),
            st.floats(),
            st.text(max_size=50),
            st.lists(st.integers(), max_size=3),
        ),
    )
)
def test_mutated_resolution_records_are_refused_or_checked(tmp_path_factory, fields):
    folder = tmp_path_factory.mktemp("records")
    good = cache_records.Resolution.now(
        "kernel:org/name:version=>=0.1", "v0.1.0", "b" * 40, "tag v0.1.0", "torch-universal"
    )
    cache_records.record_resolution(folder, "digest", good)
    path = folder / cache_records.FOLDER / "asked" / "digest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
    record = cache_records.read_resolution(folder, "digest", good.asked)
    if record is not None:
        assert record.asked == good.asked and len(record.commit) == 40
        assert isinstance(record.time, (int, float)) and not isinstance(record.time, bool)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_forked_child_waits_for_its_parent_and_is_not_blocked_for_ever(tmp_path):
    """A dataloader worker forked while a thread of its parent resolves a kernel."""
    key = load_locks.LoadKey("kernel", "org/name", "version=>=0.1")
    held, release_it = threading.Event(), threading.Event()

    def parent_thread() -> None:
        with load_locks.hold(key, tmp_path):
            held.set()
            release_it.wait()

    thread = threading.Thread(target=parent_thread, daemon=True)
    thread.start()
    assert held.wait(PATIENCE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork in a threaded process
        pid = os.fork()
    if pid == 0:  # the child: the parent's thread does not exist here
        signal.alarm(60)  # a child stuck on a lock it inherited dies instead of hanging
        try:
            with load_locks.hold(key, tmp_path) as turn:
                os._exit(0 if turn.across_processes else 2)
        except BaseException:
            os._exit(3)
    time.sleep(0.5)
    child_done, _ = os.waitpid(pid, os.WNOHANG)
    assert child_done == 0, "the child did not wait for the parent's file lock"
    release_it.set()
    thread.join(PATIENCE)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def test_a_process_waiting_for_another_says_what_for_and_where(tmp_path, monkeypatch, caplog):
    from filelock import FileLock

    monkeypatch.setattr(load_locks, "_PATIENCE_SECONDS", 0.2)
    key = load_locks.LoadKey("kernel", "org/name", "version=>=0.1")
    other_process = FileLock(str(tmp_path / f"{key.digest}.lock"))  # its own file handle
    other_process.acquire()
    got: list[bool] = []

    def wait() -> None:
        with load_locks.hold(key, tmp_path) as turn:
            got.append(turn.across_processes)

    with caplog.at_level("INFO", logger="kernels"):
        thread = threading.Thread(target=wait, daemon=True)
        thread.start()
        deadline = time.monotonic() + PATIENCE
        while "Waiting for another process" not in caplog.text:
            assert time.monotonic() < deadline and not got
            time.sleep(0.05)
        other_process.release()
        thread.join(PATIENCE)
    assert got == [True]
    assert f"org/name (version=>=0.1) (lock file {tmp_path}" in caplog.text
