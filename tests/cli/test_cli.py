"""The `kernels` command without a Hub: help, exit codes, `check` on folders, `init`, `upload` planning.

The commands that talk to the Hub are tested against the test server in tests/repos/hub/test_cli_hub.py.
"""

from __future__ import annotations

import shlex
import sys

import pytest
import torch

from kernels.cli import COMMANDS, build_parser, main
from kernels.cli import check as check_module
from kernels.cli import init as init_command
from kernels.cli.upload import plan_upload
from tests.support.children import run_python
from tests.support.paths import REPO_ROOT, subprocess_env

BAD_LAYER = """
import torch


class SiluAndMul(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 2.0

    def forward(self, input):
        return input
"""

HELPER_LAYER = """
import torch


class SiluAndMul(torch.nn.Module):
    def helper(self):
        return 1

    def forward(self, input):
        return input
"""


def run(*argv: str) -> int:
    return main(list(argv))


def test_help_lists_every_command(capsys):
    assert run("--help") == 0
    out = capsys.readouterr().out
    for command in COMMANDS:
        assert command in out


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_has_help_with_examples(command, capsys):
    assert run(command, "--help") == 0
    out = capsys.readouterr().out
    assert f"usage: kernels {command}" in out
    assert "examples:" in out


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["bogus"],
        ["versions"],
        ["upload", "."],
        ["check", "x", "--revision", "a", "--version", "1"],
    ],
)
def test_usage_errors_exit_2(argv, capsys):
    assert run(*argv) == 2
    assert "usage:" in capsys.readouterr().err


def test_python_dash_m_kernels(capsys):
    assert run("--version") == 0 and capsys.readouterr().out.startswith("kernels ")
    # One Python of its own (its imports take seconds): `python -m kernels` runs the command
    # and exits with its status, an error message and no traceback.
    result = run_python("-m", "kernels", "check", "/no/such/folder", env=subprocess_env())
    assert result.returncode == 1
    assert result.stderr.startswith("error: /no/such/folder is neither")
    assert "Traceback" not in result.stderr


def test_check_a_good_repository(kernel_repo, capsys):
    repo = kernel_repo("good")
    (repo / "README.md").write_text("# good\n")
    assert run("check", str(repo)) == 0
    out = capsys.readouterr().out
    assert "ok    imports: torch-universal: package activation imports" in out
    assert "ok    layers: torch-universal: SiluAndMul follows the kernel layer rules" in out
    assert "0 failed, 0 warning(s)" in out


def test_check_reports_layer_rule_violations(kernel_repo, capsys):
    repo = kernel_repo("stateful", layers_source=BAD_LAYER)
    assert run("check", str(repo)) == 1
    out = capsys.readouterr().out
    assert "FAIL  layers:" in out and "defines __init__" in out
    repo = kernel_repo("helper", layers_source=HELPER_LAYER)
    assert run("check", str(repo)) == 1
    assert "class members helper" in capsys.readouterr().out


def test_check_reports_import_errors(kernel_repo, capsys):
    repo = kernel_repo("broken", init_source="from . import layers\nimport no_such_dependency\n")
    assert run("check", str(repo)) == 1
    out = capsys.readouterr().out
    assert "FAIL  imports: torch-universal" in out and "no_such_dependency" in out


def test_check_reports_layout_problems(tmp_path, capsys):
    assert run("check", str(tmp_path)) == 1
    assert "build does not exist" in capsys.readouterr().out.replace(str(tmp_path) + "/", "")
    (tmp_path / "build" / "misc").mkdir(parents=True)
    assert run("check", str(tmp_path)) == 1
    out = capsys.readouterr().out
    assert (
        "build/misc is not named like a build variant" in out and "holds no build variants" in out
    )
    (tmp_path / "build" / "torch-universal").mkdir()
    assert run("check", str(tmp_path)) == 1
    assert "FAIL  layout:" in capsys.readouterr().out


def test_check_warns_when_no_variant_runs_here(kernel_repo, capsys):
    repo = kernel_repo("cuda-only", variant="torch27-cxx11-cu126-x86_64-linux")
    assert run("check", str(repo)) == 0
    out = capsys.readouterr().out
    assert "warn  variants: none of the 1 variant(s) runs on this machine" in out
    assert "-     variants: torch27-cxx11-cu126-x86_64-linux does not run here: " in out


def test_check_knows_the_variant_names_of_every_platform(kernel_repo, capsys):
    """Every kind of name today's Hub publishes is read; a malformed one is a warning."""
    for variant in (
        "torch28-cxx11-cu128-x86_64-linux",
        "torch28-cxx11-xpu20251-x86_64-linux",
        "torch28-metal-aarch64-darwin",
        "torch28-cpu-aarch64-darwin",
        "torch28-cu128-x86_64-windows",
        "torch28-cu128-x86_64-linux",  # newer Linux builds drop the ABI tag
        "torch-stable-abi28-cu128-x86_64-linux",
        "tvm-ffi01-cu128-x86_64-linux",
    ):
        repo = kernel_repo("platforms", variant=variant)
    run("check", str(repo))
    out = capsys.readouterr().out
    assert "is not a build variant name" not in out, out
    assert out.count("does not run here: ") + out.count("runs here") == 8
    kernel_repo("platforms", variant="torch28-cxx14-cu128-x86_64-linux")
    run("check", str(repo))
    out = capsys.readouterr().out
    assert "warn  variants: torch28-cxx14-cu128-x86_64-linux is not a build variant name" in out


def test_check_compares_signatures_with_layer_of(kernel_repo, capsys):
    repo = kernel_repo("sig")
    assert run("check", str(repo), "--layer-of", "SiluAndMul=torch.nn:SiLU") == 0
    assert "matches torch.nn.modules.activation.SiLU" in capsys.readouterr().out
    # Both failures in one check (each check imports the repository in a Python of its own).
    argv = ["--layer-of", "SiluAndMul=torch.nn:Bilinear", "--layer-of", "Missing=torch.nn:SiLU"]
    assert run("check", str(repo), *argv) == 1
    out = capsys.readouterr().out
    assert "FAIL  signatures:" in out and "Bilinear" in out
    assert "which `layers` does not define" in out
    assert run("check", str(repo), "--layer-of", "nonsense") == 1
    assert "write LAYER=MODULE:CLASS" in capsys.readouterr().err


def test_check_finds_layer_of_names_a_layers_module_resolves_on_look_up(capsys):
    # Our loss repository resolves CausalLMFusedLoss on first look-up (one layer per
    # transformers line, a module-level __getattr__), as kernels does when it loads a layer.
    pytest.importorskip("transformers")
    repo = REPO_ROOT / "library" / "loss"
    spec = "CausalLMFusedLoss=transformers.models.llama.modeling_llama:LlamaForCausalLM"
    assert run("check", str(repo), "--layer-of", spec) == 0
    out = capsys.readouterr().out
    assert "CausalLMFusedLoss.forward matches" in out, out


def test_init_scaffolds_a_repository_whose_tests_pass(tmp_path, capsys):
    assert run("init", "my-org/fused-silu", "--dir", str(tmp_path)) == 0
    repo = tmp_path / "fused-silu"
    for path in (
        "README.md",
        "build/torch-universal/fused_silu/__init__.py",
        "build/torch-universal/fused_silu/layers.py",
        "tests/test_fused_silu.py",
        "benchmarks/benchmark_fused_silu.py",
    ):
        assert (repo / path).is_file(), path
    assert "my-org/fused-silu" in (repo / "README.md").read_text()
    # The scaffold's own tests pass, without TRITON_INTERPRET set by us, and as many as the guide
    # says: tests/docs/test_init_scaffold.py runs them (a pytest process of its own, once).

    capsys.readouterr()
    assert run("check", str(repo), "--layer-of", "SiLU=torch.nn:SiLU") == 0
    assert "0 failed, 0 warning(s)" in capsys.readouterr().out
    # Its benchmark runs as generated, and matches PyTorch.
    assert run("benchmark", str(repo), "--iterations", "1", "--warmup", "0") == 0
    assert "SiLUWorkloads" in capsys.readouterr().out


def test_check_dot_in_a_fresh_scaffold_passes_without_warnings(tmp_path, monkeypatch, capsys):
    # The README's path: `kernels init` then `cd fused-silu && kernels check .`.
    assert run("init", "my-org/fused-silu", "--dir", str(tmp_path)) == 0
    monkeypatch.chdir(tmp_path / "fused-silu")
    capsys.readouterr()
    assert run("check", ".") == 0
    out = capsys.readouterr().out
    assert "0 failed, 0 warning(s)" in out, out
    assert "torch-universal (fused_silu)" in out, out


SCAFFOLD_ON_CPU = """
import sys
import torch
from kernels import get_local_kernel
kernel = get_local_kernel(sys.argv[1])
try:
    kernel.silu(torch.ones(4))
except RuntimeError as exc:
    print(exc)
"""


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="the failure is that of a machine without GPU"
)
def test_a_scaffolded_kernel_on_a_cpu_says_to_set_triton_interpret(tmp_path):
    assert run("init", "fused-silu", "--dir", str(tmp_path)) == 0
    env = subprocess_env()
    env.pop("TRITON_INTERPRET", None)
    result = run_python("-c", SCAFFOLD_ON_CPU, str(tmp_path / "fused-silu"), env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "active drivers" not in result.stdout
    assert "got CPU tensors" in result.stdout and "set TRITON_INTERPRET=1" in result.stdout


def test_init_refuses_to_overwrite_and_bad_names(tmp_path, capsys):
    assert run("init", "thing", "--dir", str(tmp_path)) == 0
    assert run("init", "thing", "--dir", str(tmp_path)) == 1
    assert "not empty" in capsys.readouterr().err
    assert run("init", "thing", "--dir", str(tmp_path), "--force") == 0
    for bad in ("1abc", "a b", "../escape", "org/name/extra"):
        assert run("init", bad, "--dir", str(tmp_path)) == 1
        assert "not a usable name" in capsys.readouterr().err


def test_init_accepts_what_its_rule_states_and_names_the_rule_it_enforces(tmp_path, capsys):
    # kernel-builder's rule: two characters at least (the message used to leave that out).
    assert run("init", "x", "--dir", str(tmp_path)) == 1
    assert "at least two characters" in capsys.readouterr().err
    assert "two or more" in init_command.DESCRIPTION
    assert run("init", "x1", "--dir", str(tmp_path)) == 0


def test_init_into_a_file_is_an_error_not_a_traceback(tmp_path, capsys):
    file = tmp_path / "notes.txt"
    file.write_text("")
    assert run("init", "fused-silu", "--dir", str(file)) == 1
    assert capsys.readouterr().err == (
        f"error: {file} is not a folder; pass --dir a folder to create fused-silu in\n"
    )
    # A file where the kernel's folder would go, and one further up the path.
    (tmp_path / "fused-silu").write_text("")
    assert run("init", "fused-silu", "--dir", str(tmp_path)) == 1
    assert "fused-silu is not a folder" in capsys.readouterr().err
    assert run("init", "fused-silu", "--dir", str(file / "sub")) == 1
    assert capsys.readouterr().err.startswith(f"error: cannot write {file / 'sub'}")


def test_init_says_how_to_run_the_tests_with_this_python(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(init_command.shutil, "which", lambda name: sys.executable)
    steps = init_command.next_steps(tmp_path / "fused-silu")
    assert steps == f"cd {tmp_path / 'fused-silu'} && python -m pytest tests && kernels check ."
    # `make demo`'s environment has no pytest: the hint installs it first, in this Python.
    real_find_spec = init_command.importlib.util.find_spec
    monkeypatch.setattr(
        init_command.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "pytest" else real_find_spec(name, *a),
    )
    monkeypatch.setattr(init_command.shutil, "which", lambda name: None)
    steps = init_command.next_steps(tmp_path / "fused-silu")
    python = shlex.quote(sys.executable)
    assert f"&& {python} -m pip install pytest && {python} -m pytest tests &&" in steps
    assert run("init", "fused-silu", "--dir", str(tmp_path)) == 0
    assert capsys.readouterr().out.endswith(f"Next: {steps}\n")


def test_download_of_an_empty_lock_says_there_is_nothing_to_download(tmp_path, capsys):
    (tmp_path / "kernels.lock").write_text("[]\n")
    assert run("download", str(tmp_path)) == 0
    assert capsys.readouterr().out == (
        f"{tmp_path / 'kernels.lock'} locks no kernels: nothing to download\n"
    )


@pytest.mark.parametrize(
    "argv, verbosity",
    [
        (["demo", "-v"], 1),
        (["-v", "demo"], 1),
        (["demo", "-vv"], 2),
        (["demo"], 0),
        (["check", ".", "--verbose"], 1),
    ],
)
def test_verbose_is_accepted_after_the_command_too(argv, verbosity):
    assert build_parser().parse_args(argv).verbose == verbosity


def test_upload_plan_checks_the_repository_and_leaves_out_caches(
    kernel_repo, tmp_path, capsys, monkeypatch
):
    repo = kernel_repo("up")
    (repo / "README.md").write_text("# up\n")
    (repo / "build" / "torch-universal" / "activation" / "__pycache__").mkdir()
    (repo / "build" / "torch-universal" / "activation" / "__pycache__" / "x.pyc").write_bytes(b"0")
    (repo / ".git").mkdir()
    (repo / ".git" / "HEAD").write_text("ref")
    checked, reports = [], {}
    check = check_module.check_repository

    def check_once(path, where):
        checked.append(str(path))
        if str(path) not in reports:
            reports[str(path)] = check(path, where=where)
        return reports[str(path)]

    monkeypatch.setattr(check_module, "check_repository", check_once)
    plan = plan_upload(repo, "my-org/up", tag="v0.1.0", branch=None, message=None)
    assert plan.files == (
        "README.md",
        "build/torch-universal/activation/__init__.py",
        "build/torch-universal/activation/layers.py",
    )
    assert plan.message == "Upload kernel my-org/up v0.1.0"
    # The command checks the repository again: the report of the check above, rather than a
    # second import of the repository in a Python of its own.
    assert run("upload", str(repo), "--repo-id", "my-org/up", "--tag", "v0.1.0", "--dry-run") == 0
    assert checked == [str(repo), str(repo)]
    out = capsys.readouterr().out
    assert "3 file(s)" in out and "tag v0.1.0" in out and "nothing was uploaded" in out
    assert "  build/torch-universal/activation/layers.py" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--repo-id", "no-org"], "write it as 'org/name'"),
        (["--repo-id", "my-org/up", "--tag", "0.1.0"], "not a version tag"),
        (["--repo-id", "my-org/up", "--tag", "v1.0"], "not a version tag"),
        (["--repo-id", "my-org/up", "--tag", "latest"], "not a version tag"),
    ],
)
def test_upload_rejects_bad_arguments_before_any_request(kernel_repo, argv, message, capsys):
    repo = kernel_repo("up")
    assert run("upload", str(repo), *argv, "--dry-run") == 1
    assert message in capsys.readouterr().err


def test_upload_refuses_a_repository_that_fails_check(kernel_repo, capsys):
    repo = kernel_repo("bad", layers_source=BAD_LAYER)
    assert run("upload", str(repo), "--repo-id", "my-org/bad", "--dry-run") == 1
    err = capsys.readouterr().err
    assert "fails `kernels check`" in err and "defines __init__" in err
