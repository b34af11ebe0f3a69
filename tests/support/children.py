"""Python child processes that start with torch imported: ``python -c CODE`` and ``python -m
MODULE`` for tests whose subject needs a process of its own (another cache, another environment,
a fresh `kernels`, processes that race each other), at a fraction of the cost of starting one.

Importing torch is most of such a child's CPU time (~3 CPU-seconds on the 2-core CI machine, and
the suite starts some sixty). A child here is forked from a server process (multiprocessing's
forkserver) that has imported torch and nothing else: no `kernels`, no huggingface_hub, no test
code has run in it, so the child imports and initialises all of those afresh, reading its own
environment, as a ``python -c`` started after ``import torch`` would. Each test process starts
one server, on its first child.

What differs from a started interpreter, and where to start one instead: variables the
interpreter itself reads at start-up (``PYTHON*``, e.g. ``PYTHONWARNINGS``) are the server's,
except PYTHONPATH, which sets the child's ``sys.path`` as Python would; variables torch reads
as it is imported are the server's; interpreter options (``-I``, ``-X``, ``-W``) are refused;
and a test of what a fresh interpreter imports, or of a command wrapped by another program,
needs a real one. Where ``os.fork`` is missing, the child is a started interpreter.

``drop_capabilities`` runs the child without some of root's powers, as ``setpriv
--bounding-set=-CAP --inh-caps=-CAP python ...`` would start it: the forked child removes them
from its own effective, permitted and inheritable sets before it runs anything (a started
interpreter, where there is no fork, is wrapped in setpriv). For a user other than root, who
has none of them, it changes nothing.
"""

from __future__ import annotations

import atexit
import functools
import io
import json
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import types
from collections.abc import Mapping, Sequence
from pathlib import Path

#: What the server imports before it forks a child.
PRELOAD = ["torch"]

#: The capabilities `drop_capabilities` takes, by setpriv's names: root's power to read, write
#: and search any file, and to change the mode of files it does not own.
CAPABILITIES = {"dac_override": 1, "dac_read_search": 2, "fowner": 3}
#: All of them: a child without these, even root's, is refused what file permissions refuse
#: (a read-only cache stays read-only to it).
ROOT_FILE_POWERS = tuple(CAPABILITIES)
_CAPABILITY_VERSION_3 = 0x20080522  # linux/capability.h: two 32-bit words a set


def _drop_capabilities(names: Sequence[str]) -> None:
    """Remove the capabilities `names` from this process's effective, permitted and inheritable
    sets (capget and capset, as setpriv's wrapped command ends up)."""
    import ctypes

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Sets(ctypes.Structure):
        _fields_ = [(name, ctypes.c_uint32) for name in ("effective", "permitted", "inheritable")]

    libc = ctypes.CDLL(None, use_errno=True)
    header, sets = Header(_CAPABILITY_VERSION_3, 0), (Sets * 2)()
    if libc.capget(ctypes.byref(header), sets) != 0:
        raise OSError(ctypes.get_errno(), "capget failed")
    keep = ~sum(1 << CAPABILITIES[name] for name in names) & 0xFFFFFFFF  # all are below 32
    for field in ("effective", "permitted", "inheritable"):
        setattr(sets[0], field, getattr(sets[0], field) & keep)
    if libc.capset(ctypes.byref(header), sets) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def _setpriv(names: Sequence[str]) -> list[str]:
    """The setpriv prefix that starts a command without the capabilities `names`."""
    caps = ",".join(f"-{name}" for name in names)
    return ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}"]


@functools.cache
def _context():
    """The forkserver context, preloading torch; None where processes cannot be forked."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return None
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


@functools.cache
def _site_path() -> tuple[str, ...]:
    """``sys.path`` of a ``python -c`` run without PYTHONPATH, less its leading '': the standard
    library and site-packages (with what their .pth files add), in the interpreter's order."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return tuple(json.loads(out.stdout))


def _python_path(args: Sequence[str], env: Mapping[str, str], cwd: str) -> list[str]:
    """The ``sys.path`` Python gives ``python ARGS`` run in `cwd` with environment `env`."""
    path = ["" if args[0] == "-c" else cwd]
    path += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    # site adds a folder (e.g. an editable install's) only where the path lacks it
    path += [entry for entry in _site_path() if entry not in path]
    return path


def _check_args(args: Sequence[str]) -> None:
    if len(args) < 2 or args[0] not in ("-c", "-m"):
        raise ValueError(
            f"a child runs `-c CODE ...` or `-m MODULE ...`; got {list(args)[:2]} (interpreter "
            "options need a started interpreter: subprocess with sys.executable)"
        )


def _streams(stdout: str, stderr: str) -> None:
    """Point file descriptors 1 and 2, and Python's streams over them, at the two files."""
    for fd, path in ((1, stdout), (2, stderr)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), encoding="utf-8"
    )
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )


def _exit_status(exit: SystemExit) -> int:
    """The status Python exits with for `exit` (a message is printed, as Python does)."""
    if exit.code is None:
        return 0
    if isinstance(exit.code, int):
        return exit.code
    print(exit.code, file=sys.stderr)
    return 1


def _child(
    args: list[str],
    env: dict[str, str],
    cwd: str,
    path: list[str],
    stdout: str,
    stderr: str,
    drop: Sequence[str] = (),
) -> None:
    """The child's body: become ``python ARGS`` (without the capabilities `drop`), run it, exit
    with its status."""
    if drop:
        _drop_capabilities(drop)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    _streams(stdout, stderr)
    sys.path[:] = path
    status = 0
    try:
        if args[0] == "-c":
            sys.argv = ["-c", *args[2:]]
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(args[1], "<string>", "exec"), main.__dict__)
        else:
            sys.argv = [args[1], *args[2:]]  # runpy puts the module's file first
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    except SystemExit as exit:
        status = _exit_status(exit)
    except BaseException as error:
        # As Python prints it: from the script's frames on, without this function's.
        error = error.with_traceback(error.__traceback__.tb_next)
        sys.excepthook(type(error), error, error.__traceback__)
        status = 1
    atexit._run_exitfuncs()  # Python runs them at exit; os._exit below would skip them
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(status)


class PythonChild:
    """A ``python ARGS`` child with its output captured, used as `subprocess.Popen` is:
    `pid`, `poll`, `wait`, `communicate` (text), `kill`, `returncode`.

    `args` start with ``-c CODE`` or ``-m MODULE``; `env` is the child's whole environment
    (default: this process's), `cwd` its working directory (default: this process's);
    `drop_capabilities` names capabilities of `CAPABILITIES` the child runs without.
    """

    def __init__(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        drop_capabilities: Sequence[str] = (),
    ) -> None:
        _check_args(args)
        unknown = set(drop_capabilities) - CAPABILITIES.keys()
        if unknown:
            raise ValueError(f"unknown capabilities {sorted(unknown)}; known: {list(CAPABILITIES)}")
        self.args = [sys.executable, *args]
        self._output = tempfile.TemporaryDirectory(prefix="python-child-")
        self._paths = (f"{self._output.name}/stdout", f"{self._output.name}/stderr")
        env = dict(os.environ if env is None else env)
        cwd = os.path.abspath(cwd if cwd is not None else os.getcwd())
        context = _context()
        if context is None:
            self._process = None
            command = [*_setpriv(drop_capabilities), *self.args] if drop_capabilities else self.args
            with open(self._paths[0], "w") as out, open(self._paths[1], "w") as err:
                self._popen = subprocess.Popen(command, env=env, cwd=cwd, stdout=out, stderr=err)
            return
        path = _python_path(args, env, cwd)
        self._process = context.Process(
            target=_child,
            args=(list(args), env, cwd, path, *self._paths, tuple(drop_capabilities)),
            daemon=False,
        )
        self._process.start()

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._process is None else self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode if self._process is None else self._process.exitcode

    def poll(self) -> int | None:
        if self._process is None:
            return self._popen.poll()
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        if self._process is None:
            return self._popen.wait(timeout)
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self._process.exitcode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Wait for the child to exit; its stdout and stderr."""
        self.wait(timeout)
        out, err = (Path(p).read_text(errors="replace") for p in self._paths)
        return out, err

    def kill(self) -> None:
        if self._process is None:
            self._popen.kill()
        elif self._process.exitcode is None:
            self._process.kill()


def run_python(
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout: float | None = None,
    drop_capabilities: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """Run ``python ARGS`` (``-c CODE ...`` or ``-m MODULE ...``) in a `PythonChild` and wait;
    as ``subprocess.run(..., capture_output=True, text=True)``: a child still running after
    `timeout` seconds is killed and `subprocess.TimeoutExpired` raised."""
    child = PythonChild(*args, env=env, cwd=cwd, drop_capabilities=drop_capabilities)
    try:
        out, err = child.communicate(timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        raise
    return subprocess.CompletedProcess(child.args, child.wait(), out, err)
