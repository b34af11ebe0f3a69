"""The three examples of docs/distributed.md, each run as its own program on two CPU ranks
(gloo, Triton's interpreter), killed after a time limit.

torchrun would start a launcher and two fresh interpreters, each importing torch, transformers
and kernels again (~25 s of CPU an example on the 2-core CI machine); the ranks are forked from
this process instead (where it runs Triton's interpreter: `cpu_rank_context`), with the
environment torchrun gives its workers (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), and each runs the script as ``__main__``.

About one run in thirty here (2026-11-24, torch 2.13), a rank aborted after its training step,
in the teardown ("terminate called without an active exception", no Python frame left); about
one DDP run in ten (and once in CI, 2026-11-27) rank 0 hung there instead. gdb showed where
(torch 2.13): freeing the script's DDP model frees its reducer, the last owner of the gloo
process group, whose destructor joins gloo's worker threads while holding the GIL; a worker
still destroying the last allreduce's work drops a Python object there and waits for the GIL.
So each rank ends with ``os._exit`` while the script's objects are still held, as its step is
done. Should a rank still die or hang after both ranks have printed their loss, it is reported
as a warning, not a failure (a hung rank is stopped `TEARDOWN_GRACE` seconds later, after
writing every thread's Python stack to its log: faulthandler, SIGUSR1).
"""

from __future__ import annotations

import faulthandler
import os
import re
import runpy
import signal
import socket
import sys
import time
import traceback
import warnings
from pathlib import Path

import pytest
import torch

from tests.support.distributed import cpu_rank_context, import_before_fork, same_on_both_lines

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "distributed.md"
TIMEOUT = 240
TEARDOWN_GRACE = 45
LOSS_LINE = re.compile(r"rank (\d): loss (\d+\.\d+)")


def examples() -> dict[str, str]:
    """{section title: its python block} for the sections under "## Examples"."""
    text = DOC.read_text().split("## Examples", 1)[1].split("\n## ", 1)[0]
    found = {}
    for section in text.split("\n### ")[1:]:
        title, body = section.split("\n", 1)
        match = re.search(r"```python\n(.*?)```", body, re.S)
        if match:
            found[title.strip()] = match.group(1)
    return found


def test_the_doc_has_an_example_per_engine():
    assert list(examples()) == [
        "DDP",
        "FSDP2",
        "Tensor parallelism with sequence parallel norms",
    ]


def _rank(script: Path, rank: int, world_size: int, port: int, log: Path) -> None:
    """One rank, in a forked child: torchrun's environment, output to ``log``, the script as
    ``__main__``; the exit status says whether it raised."""
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip
    with open(log, "w") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (lives with the rank)
    sys.stderr = sys.stdout
    faulthandler.register(signal.SIGUSR1, file=sys.stdout, all_threads=True)
    torch.set_num_threads(1)  # two ranks share the cores
    try:
        # Held until os._exit, which runs no destructor: freeing the script's objects could
        # deadlock in torch's gloo teardown (module docstring).
        _SCRIPT_GLOBALS.append(runpy.run_path(str(script), run_name="__main__"))
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)


#: In a rank, the globals its script left (`_rank`): never freed.
_SCRIPT_GLOBALS: list[dict] = []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _trained(logs: list[Path]) -> bool:
    """Whether every rank has printed its loss."""
    return all(log.exists() and LOSS_LINE.search(log.read_text()) for log in logs)


def _stop(process) -> None:
    """Kill a rank that ran out of time, after it has written its threads' stacks."""
    os.kill(process.pid, signal.SIGUSR1)
    time.sleep(1.0)
    process.kill()
    process.join()


def run_example(script: Path, world_size: int = 2) -> tuple[str, list[int | None]]:
    """Run ``script`` on ``world_size`` forked CPU ranks: (their output, rank by rank, and
    their exit codes; None for a rank killed for time: at `TIMEOUT`, or `TEARDOWN_GRACE`
    seconds after every rank had printed its loss)."""
    context = cpu_rank_context()
    if context.get_start_method() == "fork":
        import_before_fork()
    port = _free_port()
    logs = [script.with_suffix(f".rank{rank}.log") for rank in range(world_size)]
    ranks = [
        context.Process(target=_rank, args=(script, rank, world_size, port, logs[rank]))
        for rank in range(world_size)
    ]
    for process in ranks:
        process.start()
    deadline = time.monotonic() + TIMEOUT
    while any(process.is_alive() for process in ranks) and time.monotonic() < deadline:
        if _trained(logs):
            deadline = min(deadline, time.monotonic() + TEARDOWN_GRACE)
        ranks[0].join(0.5)
    codes: list[int | None] = []
    for process in ranks:
        if process.is_alive():
            _stop(process)
            codes.append(None)
        else:
            codes.append(process.exitcode)
    output = "".join(f"--- rank {i}:\n{_ends(log.read_text())}" for i, log in enumerate(logs))
    return output, codes


def _ends(text: str, keep: int = 2500) -> str:
    """A rank's log, its middle left out when long: the head holds its loss and the innermost
    frames of a stack dump (most recent call first), the tail an exception's message."""
    if len(text) <= 2 * keep:
        return text
    return f"{text[:keep]}\n[... {len(text) - 2 * keep} characters ...]\n{text[-keep:]}"


@pytest.mark.slow
@same_on_both_lines("the examples, user programs calling what both lines have")
@pytest.mark.parametrize("title", list(examples()))
def test_example_trains_a_step_on_two_cpu_ranks(title, tmp_path, monkeypatch):
    script = tmp_path / "example.py"
    script.write_text(examples()[title])
    # What the doc's CPU command sets (the ranks inherit it); this process already runs the
    # interpreter (tests/conftest.py) and has no GPU.
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.chdir(tmp_path)
    output, codes = run_example(script)
    losses = LOSS_LINE.findall(output)
    if sorted(rank for rank, _ in losses) != ["0", "1"]:
        ending = "still running" if None in codes else f"exit codes {codes}"
        pytest.fail(f"{title}: not every rank printed its loss ({ending})\n{output}")
    if any(code != 0 for code in codes):
        warnings.warn(
            f"{title}: both ranks trained their step, then a rank died or hung in teardown "
            f"(exit codes {codes}; None: killed {TEARDOWN_GRACE} s after the losses):\n{output}",
            stacklevel=1,
        )


def test_a_rank_hung_after_its_loss_is_killed_with_its_stack(tmp_path, monkeypatch):
    """The runner's own guard: a rank that trained, then hangs, is stopped `TEARDOWN_GRACE`
    seconds later (not at `TIMEOUT`), and its log shows where it hung."""
    monkeypatch.setattr(sys.modules[__name__], "TEARDOWN_GRACE", 2)
    script = tmp_path / "hangs.py"
    script.write_text(
        "import os, time\n"
        "def teardown_that_hangs():\n"
        "    time.sleep(600)\n"
        "rank = os.environ['RANK']\n"
        "print(f'rank {rank}: loss 1.2500')\n"
        "if rank == '1':\n"
        "    teardown_that_hangs()\n"
    )
    started = time.monotonic()
    output, codes = run_example(script)
    assert time.monotonic() - started < 30
    assert codes == [0, None]
    assert len(LOSS_LINE.findall(output)) == 2
    rank1 = output.split("--- rank 1:")[1]
    assert re.search(r'File ".*hangs\.py", line 3 in teardown_that_hangs', rank1), rank1
