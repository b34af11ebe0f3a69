"""benchmarks/distributed.py on the CPU: its FSDP2 set-up, interleaved timing and report, with
the tiny Llama for the 1.1B model and two gloo ranks (the GPU run is in docs/distributed.md)."""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile

import pytest
import torch.distributed as dist

from tests.support.distributed import device, run_cases
from tests.support.distributed_llama import build, kernelize_with_library

BENCHMARK = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "distributed.py")


def _benchmark():
    spec = importlib.util.spec_from_file_location("benchmark_distributed", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ours():
    model = build(device())
    kernelize_with_library(model)
    return model


def time_tiny_contenders():
    benchmark = _benchmark()
    makers = {"eager": lambda: build(device()), "ours (kernelized)": _ours}
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "results")
        results = benchmark.run(
            "2x8", benchmark.Path(out), list(makers), rounds=2, warmup=1, makers=makers
        )
        assert [r["contender"] for r in results] == list(makers)
        # The same model and batch: the same loss, whichever forward ran.
        losses = [r["first_loss"] for r in results]
        assert abs(losses[0] - losses[1]) < 1e-4 * losses[0], losses
        assert all(r["step_ms"] > 0 and r["tokens_per_s"] > 0 for r in results)
        if dist.get_rank() == 0:
            with open(os.path.join(out, "distributed.jsonl")) as f:
                rows = [json.loads(line) for line in f]
            assert [r["world_size"] for r in rows] == [2, 2] and rows[0]["backend"] == "gloo"
            table = benchmark.markdown(rows)
            assert "| 2x8 | 2 | yes | ours (kernelized) |" in table, table


CASES = {"time-tiny-contenders": time_tiny_contenders}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_benchmark_runs_on_two_cpu_ranks(case):
    outcome = run_cases(__name__, [case])[case]
    if outcome is not None:
        pytest.fail(outcome, pytrace=False)
