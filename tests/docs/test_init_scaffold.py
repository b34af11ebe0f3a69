"""`kernels init --help` and docs/writing-kernels.md describe the scaffold `kernels init` writes.

Both list the repository's files; these tests compare each list with a fresh scaffold, so a file
added to or dropped from the templates (kernels/cli/scaffold.py) fails here until the help and
the guide say so. The guide's test count is checked by running the scaffold's own tests.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kernels.cli import init as init_command
from kernels.cli import main
from tests.support.children import run_python
from tests.support.paths import subprocess_env

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "writing-kernels.md"
NAME, PACKAGE = "fused-silu", "fused_silu"


@pytest.fixture(scope="module")
def scaffold(tmp_path_factory) -> Path:
    parent = tmp_path_factory.mktemp("init")
    assert main(["init", f"my-org/{NAME}", "--dir", str(parent)]) == 0
    return parent / NAME


def written(root: Path) -> set[str]:
    """The scaffold's files, relative to its folder, with build/ as one entry (the build writes it)."""
    files = set()
    for path in root.rglob("*"):
        relative = path.relative_to(root)
        if not path.is_file() or "__pycache__" in relative.parts:
            continue
        files.add("build/" if relative.parts[0] == "build" else relative.as_posix())
    return files


def test_help_lists_every_top_level_entry_of_the_scaffold(scaffold):
    # The help's listing: two-space indented lines whose first word is a path.
    listed = {
        match.group(1).replace("<package>", PACKAGE)
        for match in re.finditer(r"^  (\S+)", init_command.DESCRIPTION, re.MULTILINE)
    }
    # Python's bytecode cache appears once the scaffold's own tests (below) have run in it.
    entries = [p for p in scaffold.iterdir() if p.name != "__pycache__"]
    top_level = {p.name + ("/" if p.is_dir() else "") for p in entries}
    top_level = {"torch-ext/fused_silu/" if p == "torch-ext/" else p for p in top_level}
    assert listed == top_level


def guide_tree() -> set[str]:
    """The files of the scaffold as section 1 of the guide draws them (a `tree`-style block)."""
    text = GUIDE.read_text()
    block = re.search(rf"^```\n{NAME}/\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    assert block, f"{GUIDE.name} no longer draws the scaffold's tree under '{NAME}/'"
    files, folders = set(), []
    for line in block.group(1).splitlines():
        entry = re.match(r"^((?:│   |    )*)[├└]── (\S+)", line)
        if not entry:
            continue  # a continued comment
        depth = len(entry.group(1)) // 4
        del folders[depth:]
        name = entry.group(2)
        path = "/".join(folders + [name.rstrip("/")])
        if name.endswith("/") and name != "build/":
            # A folder drawn with its files inside it (or, as torch-ext/fused_silu/, two levels).
            folders.append(name.rstrip("/"))
        else:
            files.add(path + ("/" if name == "build/" else ""))
    return files


def test_the_guide_draws_the_files_the_scaffold_writes(scaffold):
    assert guide_tree() == written(scaffold)


@pytest.mark.slow
def test_the_scaffold_passes_its_tests_as_many_as_the_guide_says(scaffold):
    claimed = re.search(r"python -m pytest tests -q\s+# (\d+) passed", GUIDE.read_text())
    assert claimed, f"{GUIDE.name} no longer says how many tests the scaffold runs"
    env = subprocess_env()
    env.pop("TRITON_INTERPRET", None)  # the generated conftest must set it by itself on a CPU
    run = run_python(
        "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider", cwd=scaffold, env=env, timeout=600
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"{claimed.group(1)} passed" in run.stdout, run.stdout
    check = run_python(
        "-m", "kernels", "check", ".", "--layer-of", "SiLU=torch.nn:SiLU", cwd=scaffold, timeout=600
    )
    assert check.returncode == 0, check.stdout + check.stderr
