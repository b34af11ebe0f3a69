"""Run Hugging Face's test suite of their `kernels` client, offline, against a `kernels`.

    python -m tests.hf_suite.run [--against ours|theirs] [--python PY] [--workers N]
                                 [--record FILE] [PYTEST_ARGS...]

``ours`` (the default): this repository's package, their private module names served by the
adapters, the tests of expected_failures.yaml skipped or xfail(strict=True); anything else that
fails fails the run. ``theirs``: the same suite against their package, installed in the
environment of ``--python`` (``make test-hf-suite-theirs``: .venv-hf), which shows which tests
need the network or a GPU. The suite is fetched first (tests/hf_suite/fetch.py, cached).

Every run is offline (HF_HUB_OFFLINE=1) with a Hugging Face home of its own, so neither the
user's cache nor the network takes part. pytest's exit status is the run's; 5 (no tests
collected) is a failure like any other non-zero status.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

from tests.hf_suite import fetch

REPO_ROOT = fetch.REPO_ROOT


def command(python: str, against: str, workers: str, record: str | None, extra: list[str]):
    suite = fetch.suite_dir()
    args = [
        python, "-m", "pytest",
        "-p", "tests.hf_suite.plugin", f"--hf-suite-against={against}",
        "-c", str(suite / "pytest.ini"), "--rootdir", str(suite),
        # The summary names failures and errors only: the hundreds of listed xfails, each with
        # its reason, would bury them (the list says why each is there).
        "-p", "no:cacheprovider", "-q", "-rfE",
    ]  # fmt: skip
    if workers != "0":
        args += ["-n", workers]
    if record:
        args += ["--hf-suite-record", record]
    # Their test files are named as in their tree (tests/test_layer.py::...), under the suite.
    extra = [str(suite / a) if a.startswith("tests/") else a for a in extra]
    selects = any(a == "-k" or "::" in a or a.endswith(".py") for a in extra)
    if not selects and not record:
        args.append("--hf-suite-check-stale")
    if not any(a.endswith(".py") or "::" in a for a in extra):
        args.append(str(suite / "tests"))
    return args + extra


def run(
    against: str = "ours",
    python: str = sys.executable,
    workers: str = "auto",
    record: str | None = None,
    extra: list[str] | None = None,
) -> int:
    suite = fetch.fetch()
    with tempfile.TemporaryDirectory(prefix="hf-suite-home-") as home:
        env = dict(os.environ)
        for name in ("HF_HUB_CACHE", "HF_TOKEN", "KERNELS_CACHE", "LOCAL_KERNELS"):
            env.pop(name, None)
        env.update(
            HF_HUB_OFFLINE="1",
            HF_HOME=home,
            # Their module-level imports of the plugin's package need the repository on the
            # path in every process (pytest-xdist's workers too); against theirs the plugin
            # takes it off again before `kernels` is imported.
            PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])),
            OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
        )
        # CPU machines run Triton kernels through its interpreter (tests/conftest.py).
        env.setdefault("TRITON_INTERPRET", "1")
        cwd = REPO_ROOT if against == "ours" else suite
        args = command(python, against, workers, record, extra or [])
        status = subprocess.run(args, env=env, cwd=cwd).returncode
    if status == 5:
        print("error: pytest collected no tests of Hugging Face's suite", file=sys.stderr)
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", choices=("ours", "theirs"), default="ours")
    parser.add_argument("--python", default=sys.executable, help="the interpreter to test in")
    parser.add_argument("--workers", default="auto", help="pytest-xdist workers (0: none)")
    parser.add_argument("--record", help="write outcomes to this JSON file, apply no list")
    known, extra = parser.parse_known_args(argv)
    try:
        return run(known.against, known.python, known.workers, known.record, extra)
    except fetch.FetchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
