"""A real Hub-compatible server for the Hub tests: olah, serving git repositories we create.

Kernel repositories are made as git repositories (commits, tags, branches) under
``<session tmp>/mirrors/kernels/<org>/<name>``, which olah (a Hub-compatible mirror server of
local git repositories) serves to huggingface_hub over HTTP on 127.0.0.1 as repositories of the
Hub's ``kernel`` type, as the Hub does today; ``create_repo(repo_type="model")`` makes one under ``mirrors/models/``
instead, for kernels still published as models.

Tests that need the kernel type are skipped where huggingface_hub predates it (< 1.10, the
transformers 4.57 environment); they run in the transformers 5.x environment (`make test-5`).
Tests marked ``any_hub_client`` run in both. Between the client and olah sits `Proxy`, a
plain TCP relay the tests can stop, restart or make drop a connection mid-transfer, to
test an unreachable Hub and interrupted downloads. Nothing of huggingface_hub is mocked.

The session gets its own HF_HUB_CACHE and kernels configuration: tests/support/hub.py sets
them, imported by tests/conftest.py before anything imports huggingface_hub, which reads them once.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.support import children
from tests.support.hub import (
    ENDPOINT,
    HF_CACHE,
    MIRRORS,
    OLAH_PORT,
    PROXY_PORT,
    SESSION_DIR,
    SILU_AND_MUL_LAYERS,
    kernel_init,
)
from tests.support.paths import REPO_ROOT, subprocess_env

DEFAULT_OLAH = REPO_ROOT / ".venv-tf5" / "bin" / "olah-cli"


if "huggingface_hub" in sys.modules:  # pragma: no cover - depends on collection order
    from huggingface_hub import constants as _constants

    if _constants.ENDPOINT != ENDPOINT:
        raise RuntimeError(
            "huggingface_hub was imported before tests/support/hub.py (imported by "
            "tests/conftest.py) could point it at the test server, so it reads the real Hub; "
            "something outside tests/ imported it first (a pytest plugin, PYTHONSTARTUP): run "
            "pytest without it."
        )


class Proxy:
    """A TCP relay from 127.0.0.1:`port` to the olah server that tests can break.

    `stop()` closes the port and every open connection (the server is gone), `start()`
    opens it again, and `cut_after(n)` lets the next responses through until one
    connection has relayed `n` bytes from the server, then stops as if the server died.
    `pause()` holds every request at the proxy (counted, not yet forwarded) until
    `resume()`, so a test can make many clients ask while the first one waits.
    `sent` keeps what clients sent (request lines and headers), so tests can check what
    huggingface_hub put on the wire (the token, the user agent), and `requests` every
    request that reached the server, as ``(method, path)``, in order of arrival, so tests
    can count Hub calls across threads and processes.
    """

    def __init__(self, port: int, upstream_port: int):
        self.port = port
        self.upstream_port = upstream_port
        self._listener: socket.socket | None = None
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._cut_after: int | None = None
        self.cuts = 0
        self.sent = bytearray()
        self.requests: list[tuple[str, str]] = []
        self._flowing = threading.Event()
        self._flowing.set()

    @property
    def running(self) -> bool:
        return self._listener is not None

    def start(self) -> None:
        if self._listener is not None:
            return
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        for attempt in range(50):  # the old listener may take a moment to let go
            try:
                listener.bind(("127.0.0.1", self.port))
                break
            except OSError:
                if attempt == 49:
                    raise
                time.sleep(0.05)
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            connections, self._connections = self._connections, set()
        if listener is not None:
            _close(listener)  # shutdown() wakes the thread blocked in accept()
        for conn in connections:
            _close(conn)

    def cut_after(self, nbytes: int | None) -> None:
        self._cut_after = nbytes

    def pause(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def clear(self) -> None:
        """Forget what clients sent so far."""
        with self._lock:
            self.sent.clear()
            self.requests.clear()

    def requested(self, method: str, path_pattern: str) -> list[str]:
        """The paths of the `method` requests so far whose path (query excluded) matches
        the regular expression `path_pattern` in full."""
        with self._lock:
            requests = list(self.requests)
        return [
            path
            for m, path in requests
            if m == method and re.fullmatch(path_pattern, path.partition("?")[0])
        ]

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:
                _close(client)
                continue
            with self._lock:
                if self._listener is not listener:
                    _close(client)
                    _close(upstream)
                    return
                self._connections |= {client, upstream}
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_server: bool) -> None:
        relayed = 0
        requests = None if from_server else _RequestSplitter()
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if requests is not None:
                    arrived = requests.feed(data)
                    with self._lock:
                        self.requests += arrived
                        if len(self.sent) < 1 << 22:
                            self.sent += data
                    self._flowing.wait()
                limit = self._cut_after if from_server else None
                if limit is not None and relayed + len(data) > limit:
                    sink.sendall(data[: max(0, limit - relayed)])
                    self.cuts += 1
                    self._cut_after = None
                    self.stop()
                    return
                sink.sendall(data)
                relayed += len(data)
        except OSError:
            pass
        finally:
            _close(source)
            _close(sink)


class _RequestSplitter:
    """Splits the bytes a client sends on one connection into HTTP/1.1 requests.

    A keep-alive connection carries several requests, and one ``recv`` may hold part of a
    request or several: bytes are buffered until a head (request line and headers, ending
    in a blank line) is complete, then its body (``Content-Length`` bytes) is skipped. The
    Hub clients send no chunked request bodies.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._body_left = 0

    def feed(self, data: bytes) -> list[tuple[str, str]]:
        """The requests whose head `data` completes, as ``(method, path)``."""
        self._buffer += data
        found = []
        while True:
            if self._body_left:
                skipped = min(self._body_left, len(self._buffer))
                del self._buffer[:skipped]
                self._body_left -= skipped
                if self._body_left:
                    break
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            head = bytes(self._buffer[:end]).decode("latin-1")
            del self._buffer[: end + 4]
            line, *headers = head.split("\r\n")
            parts = line.split(" ")
            if len(parts) == 3 and parts[2].startswith("HTTP/"):
                found.append((parts[0], parts[1]))
            for header in headers:
                name, _, value = header.partition(":")
                if name.strip().lower() == "content-length" and value.strip().isdigit():
                    self._body_left = int(value.strip())
        return found


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


class HubRepo:
    """A kernel repository on the test server: a git repository we commit, tag and branch."""

    def __init__(self, repo_id: str, path: Path, repo_type: str = "kernel"):
        self.repo_id = repo_id
        self.path = path
        self.repo_type = repo_type

    def git(self, *args: str) -> str:
        result = subprocess.run(
            ["git", "-c", "user.name=Kernel Author", "-c", "user.email=author@example.com", *args],
            cwd=self.path,
            capture_output=True,
            text=True,
            check=True,
        )
        return result.stdout.strip()

    def write(self, relative: str, content: str | bytes) -> HubRepo:
        target = self.path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
        return self

    def write_kernel(
        self,
        *,
        version: str = "0.0.0",
        offset: float = 0.0,
        variants: tuple[str, ...] = ("torch-universal",),
        package: str | None = None,
        layers_source: str | None = None,
        extra_files: dict[str, str | bytes] | None = None,
    ) -> HubRepo:
        """Write (or overwrite) the kernel package in each variant; removes other variants."""
        package = package or self.repo_id.split("/")[1].replace("-", "_")
        shutil.rmtree(self.path / "build", ignore_errors=True)
        for variant in variants:
            base = f"build/{variant}/{package}"
            self.write(f"{base}/__init__.py", kernel_init(version, offset, variant))
            self.write(
                f"{base}/layers.py", layers_source or SILU_AND_MUL_LAYERS.format(offset=offset)
            )
            for name, content in (extra_files or {}).items():
                self.write(f"{base}/{name}", content)
        return self

    def commit(self, message: str = "update") -> str:
        self.git("add", "-A")
        self.git("commit", "-q", "--allow-empty", "-m", message)
        return self.git("rev-parse", "HEAD")

    def tag(self, name: str, *, annotated: bool = False, ref: str = "HEAD") -> HubRepo:
        if annotated:
            self.git("tag", "-a", name, "-m", f"release {name}", ref)
        else:
            self.git("tag", name, ref)
        return self

    def branch(self, name: str, ref: str = "HEAD") -> HubRepo:
        self.git("branch", "-f", name, ref)
        return self

    def release(self, version: str, *, offset: float | None = None, **kernel) -> str:
        """Commit a kernel reporting `version` and tag it ``v<version>``; returns the commit."""
        self.write_kernel(version=version, offset=float(offset or 0.0), **kernel)
        sha = self.commit(f"release {version}")
        self.tag(f"v{version}")
        return sha


class HubServer:
    """The olah server behind the proxy, and a factory of repositories on it."""

    def __init__(self, olah: Path, proxy: Proxy):
        self.olah = olah
        self.proxy = proxy
        self.endpoint = ENDPOINT
        self.cache = HF_CACHE
        self.session_dir = SESSION_DIR
        self._process: subprocess.Popen | None = None

    def start(self) -> None:
        work = SESSION_DIR / "olah"
        work.mkdir(exist_ok=True)
        config = work / "olah.toml"
        config.write_text(
            textwrap.dedent(
                f"""
                [basic]
                host = "127.0.0.1"
                port = {OLAH_PORT}
                mirror-netloc = "127.0.0.1:{PROXY_PORT}"
                mirror-lfs-netloc = "127.0.0.1:{PROXY_PORT}"
                repos-path = "{work / "olah-cache"}"
                mirrors-path = ["{MIRRORS}"]

                [accessibility]
                offline = true
                """
            )
        )
        log = open(work / "olah.log", "wb")  # noqa: SIM115 - closed with the process
        self._log_path = work / "olah.log"
        self._process = subprocess.Popen(
            [str(self.olah), "-c", str(config)],
            cwd=work,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                pytest.fail(f"olah exited at start-up:\n{self.log_tail()}", pytrace=False)
            try:
                socket.create_connection(("127.0.0.1", OLAH_PORT), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            self.stop()
            pytest.fail(f"olah did not open port {OLAH_PORT} in 60 s:\n{self.log_tail()}")
        self.proxy.start()

    def stop(self) -> None:
        self.proxy.stop()
        if self._process is not None and self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGTERM)
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def repo(self, repo_id: str, *, repo_type: str = "kernel") -> HubRepo:
        """The repository `repo_id`, created (empty, on `main`) if it does not exist yet."""
        path = MIRRORS / f"{repo_type}s" / repo_id
        if path.is_dir():
            return HubRepo(repo_id, path, repo_type)
        return self.create_repo(repo_id, repo_type=repo_type)

    def create_repo(
        self,
        repo_id: str | None = None,
        *,
        org: str = "kernels-community",
        repo_type: str = "kernel",
    ) -> HubRepo:
        """A new, empty git repository served as `repo_id` (a unique name by default), as a
        repository of `repo_type` ("kernel", or "model" for kernels published as models)."""
        if repo_id is None:
            repo_id = f"{org}/kernel-{uuid.uuid4().hex[:8]}"
        path = MIRRORS / f"{repo_type}s" / repo_id
        path.mkdir(parents=True)
        repo = HubRepo(repo_id, path, repo_type)
        repo.git("init", "-q", "-b", "main")
        repo.write("README.md", f"# {repo_id}\n")
        return repo


def _olah_path() -> Path:
    return Path(os.environ.get("KERNELS_TEST_OLAH") or DEFAULT_OLAH)


@pytest.fixture(scope="session")
def hub_server():
    """The running test server (olah behind the proxy); stopped at the end of the session."""
    olah = _olah_path()
    if not olah.is_file() or not os.access(olah, os.X_OK):
        pytest.fail(
            f"The Hub tests need the olah test server, but {olah} does not exist. Run "
            "`make hub-server` (it creates .venv-tf5 with olah), or set KERNELS_TEST_OLAH to the "
            "path of an olah-cli executable.",
            pytrace=False,
        )
    server = HubServer(olah, Proxy(PROXY_PORT, OLAH_PORT))
    try:
        server.start()
        yield server
    finally:
        server.stop()


def _hub_client_knows_kernel_type() -> bool:
    from kernels.repos.hubclient import supports_kernel_repo_type

    return supports_kernel_repo_type()


@pytest.fixture
def hub(hub_server, request):
    """The test server, with the proxy up and no fault pending after each test."""
    if "any_hub_client" not in request.keywords and not _hub_client_knows_kernel_type():
        import huggingface_hub

        pytest.skip(
            f"huggingface_hub {huggingface_hub.__version__} does not know the kernel repository "
            "type; this test runs in the transformers 5.x environment (`make test-5`)"
        )
    hub_server.proxy.cut_after(None)
    hub_server.proxy.resume()
    hub_server.proxy.start()
    hub_server.proxy.clear()
    yield hub_server
    hub_server.proxy.cut_after(None)
    hub_server.proxy.resume()
    hub_server.proxy.start()


@pytest.fixture
def released(hub):
    """A factory: released(*versions, org=...) -> a repository with one tagged commit per version."""

    def make(
        *versions: str, org: str = "kernels-community", repo_type: str = "kernel", **kernel
    ) -> HubRepo:
        repo = hub.create_repo(org=org, repo_type=repo_type)
        for i, version in enumerate(versions):
            repo.release(version, offset=float(i + 1), **kernel)
        return repo

    return make


def _child_env(env: dict[str, str | None] | None) -> dict[str, str]:
    """This session's environment with `env` applied; a None value unsets the variable."""
    merged = {**subprocess_env(), **(env or {})}
    return {name: value for name, value in merged.items() if value is not None}


def run_python(code: str, *, env: dict[str, str | None] | None = None, timeout: float = 120):
    """Run `code` in a fresh interpreter (tests.support.children) with this session's Hub
    settings; returns the result."""
    return children.run_python(
        "-c", textwrap.dedent(code), env=_child_env(env), cwd=SESSION_DIR, timeout=timeout
    )


def run_cli(*args: str, env: dict[str, str | None] | None = None, timeout: float = 120):
    """Run ``python -m kernels ARGS`` in a fresh interpreter (tests.support.children) with this
    session's Hub settings."""
    return children.run_python(
        "-m", "kernels", *args, env=_child_env(env), cwd=SESSION_DIR, timeout=timeout
    )


@pytest.fixture
def python():
    """run_python as a fixture: python(code, env=...) -> CompletedProcess."""
    return run_python


@pytest.fixture
def cli():
    """run_cli as a fixture: cli(*args, env=...) -> CompletedProcess."""
    return run_cli
