"""Benchmark and `kernels benchmark`: a kernel repository's benchmarks/benchmark*.py scripts."""

import json
import textwrap

import pytest

from kernels import Benchmark
from kernels.benchmark import find_scripts, time_calls
from kernels.cli import main

INIT = "from . import layers\n\ndef double(x):\n    return x * 2\n"

SCRIPT = """
import torch
from kernels.benchmark import Benchmark


class Doubling(Benchmark):
    seed = 3

    def setup(self):
        self.x = torch.randn(64, 32, device=self.device)

    def benchmark_matches(self):
        self.out = self.kernel.double(self.x)

    def verify_matches(self):
        return self.x + self.x

    def setup_bool(self):
        self.x = torch.ones(4)

    def benchmark_bool(self):
        self.out = self.kernel.double(self.x)

    def verify_bool(self):
        return bool((self.out == 2).all())

    def benchmark_untimed_reference(self):  # no verify_: timed, nothing checked
        self.out = self.kernel.double(torch.zeros(3))
"""

BROKEN = """
import torch
from kernels.benchmark import Benchmark


class Broken(Benchmark):
    def benchmark_differs(self):
        self.out = self.kernel.double(torch.ones(3))

    def verify_differs(self):
        return torch.ones(3)

    def benchmark_raises(self):
        raise RuntimeError("no such shape")
"""


def repo_with(kernel_repo, **scripts):
    root = kernel_repo("doubling", init_source=INIT)
    (root / "benchmarks").mkdir()
    for name, source in scripts.items():
        (root / "benchmarks" / f"{name}.py").write_text(textwrap.dedent(source))
    return root


def test_benchmark_runs_every_workload_and_checks_it(kernel_repo, tmp_path, capsys):
    repo = repo_with(kernel_repo, benchmark_doubling=SCRIPT, helper="x = 1\n")
    out = tmp_path / "results.json"
    argv = ["benchmark", str(repo), "--iterations", "3", "--warmup", "1", "--output", str(out)]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "Benchmark  Workload" in table and "Doubling" in table
    data = json.loads(out.read_text())
    results = {r["workload"]: r for r in data["results"]}
    assert set(results) == {"matches", "bool", "untimed_reference"}  # helper.py is no script
    assert results["matches"]["verified"] is True and results["bool"]["verified"] is True
    assert results["matches"]["timing"]["iterations"] == 3
    assert results["matches"]["speedup"] > 0
    assert results["untimed_reference"]["verified"] is None
    assert results["untimed_reference"]["reference"] is None
    assert data["kernel"].startswith("local repository") and data["machine"]["torch"]
    assert len(data["scripts_sha256"]) == 64


def test_a_differing_or_failing_workload_fails_the_command(kernel_repo, capsys):
    repo = repo_with(kernel_repo, benchmark_broken=BROKEN)
    assert main(["benchmark", str(repo), "--iterations", "1", "--warmup", "0"]) == 1
    out = capsys.readouterr().out
    assert "Broken.differs: output differs from verify_differs()" in out
    assert "Broken.raises: RuntimeError: no such shape" in out


def test_a_repository_without_benchmarks_is_an_error(kernel_repo, capsys):
    repo = kernel_repo("plain")
    assert main(["benchmark", str(repo)]) == 1
    assert "has no benchmark scripts" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="benchmarks/benchmark\\*.py"):
        find_scripts(repo)


def test_hub_only_options_and_bad_repo_ids(kernel_repo, capsys):
    repo = repo_with(kernel_repo, benchmark_doubling=SCRIPT)
    assert main(["benchmark", str(repo), "--version", "1"]) == 1
    assert "--version and --revision are for Hub ids" in capsys.readouterr().err
    assert main(["benchmark", "not-a-folder-or-id"]) == 1
    assert "neither a folder nor a Hub repository id" in capsys.readouterr().err
    assert main(["benchmark", str(repo), "--iterations", "0"]) == 2


def test_time_calls_reports_spread_and_outliers():
    calls = []
    timing = time_calls(lambda: calls.append(1), iterations=5, warmup=2)
    assert len(calls) == 7 and timing.iterations == 5
    assert timing.min_ms <= timing.q1_ms <= timing.q3_ms <= timing.max_ms
    assert timing.iqr_ms >= 0 and 0 <= timing.outliers <= 5


def test_the_base_class_defaults():
    bench = Benchmark()
    assert bench.kernel is None and bench.out is None and bench.seed is None
    bench.setup()
