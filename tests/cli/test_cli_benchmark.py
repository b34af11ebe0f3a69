"""`kernels benchmark` on our library: its --help's examples run, and the library repositories'
benchmarks time every workload against PyTorch and match it (on the CPU through Triton's
interpreter; tests/conftest.py sets TRITON_INTERPRET=1 where there is no GPU)."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from kernels.cli import benchmark as benchmark_command
from kernels.cli import main
from tests.support.paths import LIBRARY, REPO_ROOT

#: The library repositories that ship benchmarks/ (docs/writing-kernels.md, section 7).
BENCHMARKED = ("activation", "norm")


def help_examples() -> list[list[str]]:
    """The arguments of each `kernels benchmark` example of the command's --help."""
    return [
        shlex.split(line.strip())[2:]
        for line in benchmark_command.EPILOG.splitlines()
        if line.strip().startswith("kernels benchmark ")
    ]


def test_the_help_examples_that_name_a_folder_run(monkeypatch, capsys):
    local = [argv for argv in help_examples() if (REPO_ROOT / argv[0]).is_dir()]
    assert local, "kernels benchmark --help no longer shows a library folder"
    monkeypatch.chdir(REPO_ROOT)
    for argv in local:
        # The example's own options, and few calls: through the interpreter each takes ms.
        argv = [a for a in argv if not re.fullmatch(r"\d+", a) and a != "--iterations"]
        assert main(["benchmark", *argv, "--iterations", "1", "--warmup", "0"]) == 0, argv
        assert "Match" in capsys.readouterr().out


@pytest.mark.parametrize("repo", BENCHMARKED)
def test_library_benchmarks_time_every_workload_against_pytorch(repo, tmp_path, capsys):
    output = tmp_path / "results.json"
    status = main(
        ["benchmark", str(LIBRARY / repo), "--iterations", "1", "--warmup", "0"]
        + ["--output", str(output)]
    )
    results = json.loads(output.read_text())
    capsys.readouterr()
    assert status == 0, results
    workloads = results["results"]
    assert len(workloads) >= 2
    for workload in workloads:
        assert workload["verified"] is True, workload
        assert workload["reference"] is not None, workload  # timed against PyTorch
