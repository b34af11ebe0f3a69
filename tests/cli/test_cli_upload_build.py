"""`kernels upload` of a folder that holds a kernel's source and its build script: it sends a
staged copy with build/ made afresh (kernels/cli/_source_build.py), never the folder's own."""

from __future__ import annotations

import json

from kernels.cli import main
from kernels.cli._source_build import build_script
from kernels.cli.upload import plan_upload
from tests.support.paths import LIBRARY


def _listing(folder):
    """Each file under ``folder`` with its bytes (none when it does not exist)."""
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_library_repository_uploads_a_fresh_build_with_symbols(capsys):
    # git holds no build/; one `make library` left behind must stay as it was.
    before = _listing(LIBRARY / "rotary" / "build")
    argv = ["upload", str(LIBRARY / "rotary"), "--repo-id", "kernels-triton/rotary", "--dry-run"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"built {LIBRARY / 'rotary' / 'build'} afresh from its source" in out
    assert f"file(s) from {LIBRARY / 'rotary'} -> kernel repository" in out
    for name in (
        "build.toml",
        "README.md",
        "torch-ext/rotary/__init__.py",
        "build/torch-cuda/__init__.py",
        "build/torch-cuda/_library.py",  # the shared file, copied in
        "build/torch-cuda/metadata.json",
        "build/torch-cuda/symbols.json",
        "build/torch-universal/rotary/rotary.py",
    ):
        assert f"\n  {name}\n" in out, name
    assert _listing(LIBRARY / "rotary" / "build") == before  # the source folder is left as it is


def test_a_scaffolded_repository_uploads_what_its_source_makes(tmp_path, capsys):
    assert main(["init", "my-org/fused-silu", "--dir", str(tmp_path)]) == 0
    repo = tmp_path / "fused-silu"
    assert build_script(repo) == repo / "build.py"
    silu = repo / "torch-ext" / "fused_silu" / "silu.py"
    silu.write_text(silu.read_text() + "\n# changed after the last build\n")
    committed = (repo / "build" / "torch-cuda" / "silu.py").read_bytes()
    plan = plan_upload(
        repo, "my-org/fused-silu", tag=None, branch=None, message=None, staging=tmp_path / "s"
    )
    assert plan.source == repo and plan.folder == tmp_path / "s" / "fused-silu"
    sent = (plan.folder / "build" / "torch-cuda" / "silu.py").read_text()
    assert sent.endswith("# changed after the last build\n")
    assert (repo / "build" / "torch-cuda" / "silu.py").read_bytes() == committed
    meta = json.loads((plan.folder / "build" / "torch-cuda" / "metadata.json").read_text())
    assert set(meta["digest"]["files"]) >= {"silu.py", "symbols.json"}


def test_a_build_script_of_another_project_above_is_not_run(tmp_path):
    """Only our library's build.py is taken from the folder above a repository: importing
    another project's would run it."""
    (tmp_path / "build.py").write_text("raise SystemExit('must not run')\n")
    repo = tmp_path / "demo"
    (repo / "torch-ext" / "demo").mkdir(parents=True)
    (repo / "build.toml").write_text("[general]\nname = 'demo'\n")
    assert build_script(repo) is None
    assert build_script(LIBRARY / "norm") == LIBRARY / "build.py"
