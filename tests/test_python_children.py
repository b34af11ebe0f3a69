"""tests.support.children: a forked child behaves as a started ``python -c`` / ``python -m``."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.support.children import PythonChild, run_python
from tests.support.paths import subprocess_env

# What a script can see of how it was started.
REPORT = """
import json, os, sys
print(json.dumps({
    "argv": sys.argv, "path": sys.path, "cwd": os.getcwd(), "name": __name__,
    "marker": os.environ.get("CHILD_MARKER"), "parent_only": os.environ.get("PARENT_ONLY"),
    "kernels_imported": "kernels" in sys.modules, "hub_imported": "huggingface_hub" in sys.modules,
}))
"""


def _started(*args: str, env, cwd) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_a_child_sees_what_a_started_interpreter_sees(tmp_path, monkeypatch):
    monkeypatch.setenv("PARENT_ONLY", "1")
    env = {k: v for k, v in subprocess_env(CHILD_MARKER="child").items() if k != "PARENT_ONLY"}
    forked = run_python("-c", REPORT, "a b", "c", env=env, cwd=tmp_path, timeout=60)
    started = _started("-c", REPORT, "a b", "c", env=env, cwd=tmp_path)
    assert forked.returncode == started.returncode == 0, forked.stderr + started.stderr
    assert json.loads(forked.stdout) == json.loads(started.stdout)
    report = json.loads(forked.stdout)
    assert report["argv"] == ["-c", "a b", "c"] and report["marker"] == "child"
    assert report["parent_only"] is None and report["name"] == "__main__"
    assert not report["kernels_imported"] and not report["hub_imported"]


def test_a_module_runs_as_main_with_its_arguments(tmp_path):
    package = tmp_path / "lib"
    package.mkdir()
    (package / "tool.py").write_text(REPORT)
    env = {**subprocess_env(), "PYTHONPATH": str(package)}
    forked = run_python("-m", "tool", "--flag", env=env, cwd=tmp_path, timeout=60)
    started = _started("-m", "tool", "--flag", env=env, cwd=tmp_path)
    assert forked.returncode == 0, forked.stderr
    assert json.loads(forked.stdout) == json.loads(started.stdout)
    assert json.loads(forked.stdout)["argv"] == [str(package / "tool.py"), "--flag"]


def test_torch_is_imported_before_the_code_runs(tmp_path):
    code = "import sys; print('torch' in sys.modules)"
    assert run_python("-c", code, env=subprocess_env(), cwd=tmp_path).stdout.strip() == "True"


@pytest.mark.parametrize(
    "code, status, last_line",
    [
        ("import sys; sys.exit(3)", 3, None),
        ("import sys; sys.exit('no luck')", 1, "no luck"),
        ("raise ValueError('broken')", 1, "ValueError: broken"),
        (
            "import os, sys; print('out'); print('err', file=sys.stderr); os.write(2, b'raw')",
            0,
            "raw",
        ),
    ],
)
def test_exit_status_and_errors_are_those_of_python(tmp_path, code, status, last_line):
    forked = run_python("-c", code, env=subprocess_env(), cwd=tmp_path, timeout=60)
    started = _started("-c", code, env=subprocess_env(), cwd=tmp_path)
    assert forked.returncode == started.returncode == status
    assert (forked.stdout, forked.stderr) == (started.stdout, started.stderr)
    if last_line is not None:
        assert forked.stderr.strip().splitlines()[-1] == last_line


def test_exit_handlers_run(tmp_path):
    code = "import atexit; atexit.register(print, 'bye')"
    assert run_python("-c", code, env=subprocess_env(), cwd=tmp_path).stdout == "bye\n"


def test_children_run_at_once_and_a_late_one_is_killed_at_its_timeout(tmp_path):
    wait_for = (
        "import pathlib, sys, time\nwhile not pathlib.Path(sys.argv[1]).exists(): time.sleep(0.01)"
    )
    first = PythonChild("-c", wait_for, str(tmp_path / "second"), cwd=tmp_path)
    second = PythonChild(
        "-c",
        f"open({str(tmp_path / 'second')!r}, 'w')\n{wait_for}",
        str(tmp_path / "first"),
        cwd=tmp_path,
    )
    assert first.poll() is None
    (tmp_path / "first").touch()
    assert (first.wait(60), second.wait(60)) == (0, 0)

    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_python("-c", "import time; time.sleep(60)", cwd=tmp_path, timeout=1)
    assert time.monotonic() - start < 30


def test_interpreter_options_are_refused():
    with pytest.raises(ValueError, match="interpreter options need a started interpreter"):
        PythonChild("-I", "-c", "pass")


WRITE = """
import pathlib, sys
try:
    (pathlib.Path(sys.argv[1]) / sys.argv[2]).write_text("x")
except PermissionError:
    print("refused")
else:
    print("written")
"""


def test_a_child_without_the_file_capabilities_cannot_write_a_read_only_folder(tmp_path):
    """As root, a read-only folder is writable but for the child that drops root's override (a
    user other than root has it refused either way); the parent keeps its own powers."""
    import os

    folder = tmp_path / "read-only"
    folder.mkdir(mode=0o555)
    try:
        plain = run_python("-c", WRITE, str(folder), "plain", timeout=60)
        dropped = run_python(
            "-c", WRITE, str(folder), "dropped", timeout=60, drop_capabilities=("dac_override",)
        )
        assert plain.stdout.strip() == ("written" if os.geteuid() == 0 else "refused")
        assert dropped.stdout.strip() == "refused", dropped.stderr
        assert not (folder / "dropped").exists()
    finally:
        folder.chmod(0o755)
    with pytest.raises(ValueError, match="unknown capabilities \\['sys_admin'\\]"):
        run_python("-c", "pass", drop_capabilities=("sys_admin",))
