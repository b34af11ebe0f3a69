"""The `kernels` command starts fast and stops quietly: it imports torch only when a command
needs it (not for --help or a usage error), and Ctrl-C is exit status 130 without a traceback.

These need a real interpreter of their own (what it imports at start-up is the subject), not
the forked children of tests/support/children.py, which have torch imported already.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kernels
from kernels import cli
from tests.support.paths import subprocess_env

# Runs the command as its console script does, then reports which heavy modules were imported.
PROBE = """
import json, sys
from kernels.cli import main
status = main(sys.argv[1:])
print(json.dumps({"status": status, "imported": sorted(
    m for m in ("torch", "triton", "numpy", "huggingface_hub", "transformers") if m in sys.modules
)}))
"""


def probe(*argv: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
    )
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    "argv",
    [
        ("--help",),
        ("init", "--help"),
        ("benchmark", "--help"),
        ("--version",),
        ("no-such-command",),
    ],
)
def test_help_and_usage_errors_import_no_torch(argv):
    outcome = probe(*argv)
    assert outcome["status"] in (0, 2)
    assert outcome["imported"] == [], f"`kernels {' '.join(argv)}` imported {outcome['imported']}"


def test_the_public_api_is_still_there_on_first_use():
    # `import kernels` is light; the names come on first use (and `from kernels import *`).
    namespace: dict[str, object] = {}
    exec("from kernels import *", namespace)
    assert set(kernels.__all__) <= set(namespace)
    assert kernels.kernelize is namespace["kernelize"]
    assert kernels.layer.kernelize.kernelize is kernels.kernelize  # submodules, as before
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        kernels.no_such_name  # noqa: B018


def test_the_lazy_names_agree_with_all_and_the_typed_imports():
    import ast
    from pathlib import Path

    tree = ast.parse(Path(kernels.__file__).read_text())
    typed = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
        for stmt in node.body
        if isinstance(stmt, ast.ImportFrom)
        for alias in stmt.names
    }
    lazy = set(kernels._SOURCES)
    assert typed == lazy
    assert set(kernels.__all__) == lazy | {"__version__"}
    for name in lazy:
        assert getattr(kernels, name).__module__.startswith("kernels.")


def test_ctrl_c_in_a_command_is_status_130_without_output(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.importlib.import_module("kernels.cli.check"), "run", interrupted)
    assert cli.main(["check", "."]) == 130
    assert capsys.readouterr() == ("", "")


def test_ctrl_c_while_the_parser_is_built_is_status_130(monkeypatch, capsys):
    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["--help"]) == 130
    assert capsys.readouterr() == ("", "")


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT is a POSIX signal")
def test_sigint_while_a_command_imports_torch_exits_quietly():
    # `kernels explain demo` imports torch and transformers first: seconds in which a user's
    # Ctrl-C used to print a traceback of wherever the import was.
    child = subprocess.Popen(
        [sys.executable, "-m", "kernels", "explain", "demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
    )
    # Inside the imports: once torch's shared library is mapped (a fixed sleep raced a loaded
    # machine's interpreter start, before any handler of ours exists).
    maps = Path(f"/proc/{child.pid}/maps")
    deadline = time.monotonic() + 60
    while child.poll() is None and time.monotonic() < deadline:
        if "libtorch" in maps.read_text():
            break
        time.sleep(0.02)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 130, out + err
    assert "Traceback" not in err, err
