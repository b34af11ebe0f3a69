"""Running test cases in the processes of one torch.distributed job.

A test module keeps its cases in a dict ``CASES`` (name -> function without arguments, run
in order on every rank); `run_cases` runs them in one job, so the process group and the imports are paid for once:

- ``backend="gloo"``: `world_size` (two by default) CPU processes, with Triton's interpreter, so
  the kernels run on CPU tensors. Where this process runs the interpreter too (no GPU) they are
  forked from it, starting with the imports it already paid for (torch, transformers and the
  test module: ~8 s of CPU a process on the 2-core CI machine when spawned); else spawned. The group is set up through a
  file in a temporary folder (no port to find), collectives time out after
  `COLLECTIVE_TIMEOUT` seconds, and the whole job is killed after ``timeout`` seconds.
- ``backend="nccl"``: one process a GPU. Under ``torchrun --nproc-per-node 2`` the cases run in
  the torchrun processes themselves (each rank runs pytest, the same tests in the same order);
  under plain pytest on a machine with two GPUs, two processes are spawned as for gloo.

After each case the ranks exchange whether it passed; once a case failed on any rank, the
group may be out of step, so the later cases are reported as not run.

Spawned processes (NCCL) start with this process's ``sys.path`` (``multiprocessing`` passes it
to the child before it unpickles its target), so they import this checkout's `kernels`, this
module and the test module by the names pytest gave them.
"""

from __future__ import annotations

import datetime
import importlib
import os
import queue as queue_module
import tempfile
import time
import traceback

import torch

#: Seconds a collective may wait for the other rank before it raises.
COLLECTIVE_TIMEOUT = 60

NOT_RUN = "not run: an earlier case failed"

#: What the ranks' cases import, imported in the parent before it forks them, so that no rank
#: imports it again: transformers' Llama module (which pulls in its generation utilities and
#: torch._dynamo) and DTensor's op rules were most of a job's first case.
RANK_IMPORTS = (
    "torch.distributed.fsdp",
    "torch.distributed.tensor",
    "torch.distributed.tensor.parallel",
    "transformers.models.llama.modeling_llama",
    "kernels.library",
)


def on_transformers_5() -> bool:
    """Whether the installed transformers is of the 5.x line (`make test-5`'s environment)."""
    import transformers
    from packaging.version import Version

    return Version(transformers.__version__).major >= 5


def same_on_both_lines(what: str):
    """A mark that leaves a slow test out of the transformers 5.x run (`make test-5`): for
    tests whose subject does not depend on the transformers line (`what` says why), which
    `make test-4` runs. They pass on 5.24 too (checked 2026-11-26); the mark keeps
    `make test-5` within its time budget."""
    import pytest

    return pytest.mark.skipif(
        on_transformers_5(),
        reason=f"{what}: the same on both transformers lines, run by make test-4",
    )


def under_torchrun() -> bool:
    """Whether this process is one rank of a job torchrun (or another launcher) started."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ


def nccl_skip_reason(world_size: int) -> str | None:
    """Why a job of `world_size` ranks cannot run on NCCL here, or None: under torchrun it runs
    in torchrun's processes, so their number must be `world_size`; else it spawns one process
    a GPU."""
    if under_torchrun():
        started = int(os.environ["WORLD_SIZE"])
        if started != world_size:
            return (
                f"this job needs {world_size} ranks, torchrun started {started} "
                f"(torchrun --nproc-per-node {world_size} -m pytest ... -m gpu)"
            )
        return None
    if torch.cuda.device_count() < world_size:
        return (
            f"needs {world_size} CUDA GPUs (torchrun --nproc-per-node {world_size} -m pytest "
            "... -m gpu, or plain pytest on a machine with that many)"
        )
    return None


def device() -> torch.device:
    """The device the current job's cases run on: this rank's GPU under NCCL, else the CPU."""
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def run_cases(
    module: str, cases: list[str], *, backend: str = "gloo", world_size: int = 2, timeout=240
) -> dict[str, str | None]:
    """Run the cases named `cases` of `module` (from its ``CASES``) in one job: {case: None
    where it passed on every rank, else what failed, rank by rank}."""
    if backend == "nccl" and under_torchrun():
        return _run_in_this_process(module, cases)
    return _spawn(module, cases, backend, world_size, timeout)


def fail_unless_all_passed(outcomes: dict[str, str | None]) -> None:
    """Fail the calling test, naming every case of the job that failed (with its tracebacks) and
    those that passed, unless all passed.

    A job is one test item, not one item per case: pytest-xdist hands the items of a module to
    any idle worker, and each worker would set up a module-scoped job of its own, so a job
    parametrized by case ran once for each worker that took one of its cases, side by side."""
    import pytest

    failed = {case: outcome for case, outcome in outcomes.items() if outcome is not None}
    if failed:
        passed = [case for case, outcome in outcomes.items() if outcome is None]
        report = "\n\n".join(f"=== {case}:\n{outcome}" for case, outcome in failed.items())
        pytest.fail(
            f"{len(failed)} of {len(outcomes)} cases failed: {', '.join(failed)}; passed: "
            f"{', '.join(passed) or 'none'}\n\n{report}",
            pytrace=False,
        )


def _run_in_this_process(module: str, cases: list[str]) -> dict[str, str | None]:
    import torch.distributed as dist

    if not dist.is_initialized():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT))
    outcomes = _run(module, cases)
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, outcomes)
    return _merge(dict(enumerate(gathered)), cases)


def cpu_rank_context():
    """The ``multiprocessing`` context for CPU ranks: fork where this process already runs
    Triton's interpreter (its kernels were made interpreted when imported) and holds no CUDA
    state, so that ranks start with its imports; else spawn (a GPU machine: the ranks set
    ``TRITON_INTERPRET`` before they import triton)."""
    import torch.multiprocessing as mp

    fork = os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_initialized()
    return mp.get_context("fork" if fork else "spawn")


def import_before_fork(*modules: str) -> None:
    """Import `RANK_IMPORTS` and `modules` here, before ranks are forked from this process."""
    for name in (*RANK_IMPORTS, *modules):
        importlib.import_module(name)


def _spawn(module, cases, backend, world_size, timeout) -> dict[str, str | None]:
    import torch.multiprocessing as mp

    context = cpu_rank_context() if backend == "gloo" else mp.get_context("spawn")
    if context.get_start_method() == "fork":
        import_before_fork(module)
    results = context.Queue()
    with tempfile.TemporaryDirectory() as folder:
        init_file = os.path.join(folder, "rendezvous")
        processes = [
            context.Process(
                target=_child,
                args=(rank, world_size, init_file, backend, module, cases, results),
                daemon=True,
            )
            for rank in range(world_size)
        ]
        for process in processes:
            process.start()
        outcomes: dict[int, dict] = {}
        deadline = time.monotonic() + timeout
        try:
            while len(outcomes) < world_size and time.monotonic() < deadline:
                try:
                    rank, outcome = results.get(timeout=1)
                    outcomes[rank] = outcome
                except queue_module.Empty:
                    if any(p.exitcode not in (None, 0) for p in processes):
                        break  # a rank died without reporting; the other may be stuck
        finally:
            timed_out = len(outcomes) < world_size and time.monotonic() >= deadline
            for process in processes:
                process.join(timeout=10 if len(outcomes) == world_size else 0)
                if process.is_alive():
                    process.kill()
                    process.join()
    for rank, process in enumerate(processes):
        if rank not in outcomes:
            why = f"timed out after {timeout} s" if timed_out else f"exited with {process.exitcode}"
            outcomes[rank] = {case: f"rank {rank} {why} without reporting" for case in cases}
    return _merge(outcomes, cases)


def _merge(outcomes: dict[int, dict], cases: list[str]) -> dict[str, str | None]:
    merged = {}
    for case in cases:
        failures = [
            f"--- rank {rank}:\n{outcome.get(case)}"
            for rank, outcome in sorted(outcomes.items())
            if outcome.get(case) is not None
        ]
        merged[case] = "\n".join(failures) or None
    return merged


def _child(rank, world_size, init_file, backend, module, cases, results) -> None:
    # Before anything imports triton: the interpreter runs the kernels on CPU tensors.
    if backend == "gloo":
        os.environ["TRITON_INTERPRET"] = "1"
    # What torchrun sets: transformers 5.x's distributed loading (``from_pretrained(...,
    # tp_plan=...)``) reads the world size and local rank from the environment.
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size))
    import torch.distributed as dist

    if backend == "nccl":
        torch.cuda.set_device(rank)
    torch.set_num_threads(1)  # two ranks share the CPU cores
    dist.init_process_group(
        backend,
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT),
    )
    try:
        results.put((rank, _run(module, cases)))
    finally:
        dist.destroy_process_group()


def _run(module: str, cases: list[str]) -> dict[str, str | None]:
    """Run the cases in order on this rank; {case: None or the traceback}."""
    import torch.distributed as dist

    functions = importlib.import_module(module).CASES
    outcomes: dict[str, str | None] = {}
    failed = False
    for case in cases:
        if failed:
            outcomes[case] = NOT_RUN
            continue
        try:
            functions[case]()
            outcome = None
        except Exception:
            outcome = traceback.format_exc()
        passed: list = [None] * dist.get_world_size()
        dist.all_gather_object(passed, outcome is None)
        if outcome is None and not all(passed):
            outcome = "passed here, failed on another rank"
        outcomes[case] = outcome
        failed = not all(passed)
    return outcomes
