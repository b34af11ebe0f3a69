"""pytest plugin of the oracle run: Hugging Face's test suite against our package.

Loaded with ``-p tests.hf_suite.plugin`` (tests/hf_suite/run.py does it). It

- with ``--hf-suite-against=ours`` serves their private module names from the adapters
  (installed before their conftest is imported); with ``theirs`` (the same suite against their
  own package, which has those names) takes this repository off sys.path, where our `kernels`
  would shadow theirs,
- marks the tests of expected_failures.yaml: skipped (network) or xfail(strict=True), and
  turns an expected collection error of a listed module into a skip,
- with ``--hf-suite-check-stale`` (a run of the whole suite) fails on a listed id that no
  report named (neither a test nor a module's collection error): the list must not name tests
  that are gone,
- with ``--hf-suite-record=FILE`` applies no list and writes each test's outcome and the cause
  of its failure (JSON), for tests/hf_suite/update.py.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from tests.hf_suite import expectations
from tests.hf_suite.fetch import REPO_ROOT

#: The recorded outcomes that count as a failure.
FAILED = {"failed", "error", "collect-error"}


def pytest_addoption(parser):
    group = parser.getgroup("hf-suite", "Hugging Face's suite against our package")
    group.addoption("--hf-suite-against", choices=("ours", "theirs"), default="ours")
    group.addoption("--hf-suite-record", metavar="FILE", help="record outcomes, apply no list")
    group.addoption("--hf-suite-check-stale", action="store_true", help="fail on stale entries")


def cause_of(report) -> str:
    """One line saying why a test failed, with what varies between runs (paths, addresses,
    numbers in quotes) taken out, so tests failing for one reason group together."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        text = crash.message
    else:
        text = str(report.longrepr)
        # A collection error's repr ends with the exception line ("E   ImportError: ...").
        lines = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
        text = next((ln for ln in lines if re.match(r"\w+(Error|Exception|Gap)\b", ln)), text)
    line = text.strip().splitlines()[0] if text.strip() else "no message"
    line = line.removeprefix("tests.hf_suite.gaps.")
    line = re.sub(r"(?<![\w.-])(/[\w.@+-]+)+", "<path>", line)
    line = re.sub(r"0x[0-9a-f]+", "<addr>", line)
    return line[:200]


class _Plugin:
    def __init__(self, config):
        self.config = config
        self.record_path = config.getoption("--hf-suite-record")
        self.check_stale = config.getoption("--hf-suite-check-stale")
        groups = [] if self.record_path else expectations.load()
        self.listed = expectations.by_test(groups)
        self.seen: set[str] = set()
        self.outcomes: dict[str, dict[str, str]] = {}

    # -- applying the list --------------------------------------------------------------

    @pytest.hookimpl(hookwrapper=True)
    def pytest_make_collect_report(self, collector):
        outcome = yield
        report = outcome.get_result()
        group = self.listed.get(report.nodeid)
        if report.failed and group is not None:
            report.outcome = "skipped"
            report.longrepr = (
                str(collector.path),
                0,
                f"expected collection error ({group.category}): {group.reason}",
            )

    def pytest_collection_modifyitems(self, items):
        for item in items:
            group = self.listed.get(item.nodeid)
            if group is None:
                continue
            reason = f"{group.category}: {group.reason}"
            if group.action == "skip":
                item.add_marker(pytest.mark.skip(reason=reason))
            else:
                item.add_marker(pytest.mark.xfail(strict=True, reason=reason))

    # -- recording outcomes -------------------------------------------------------------

    def pytest_collectreport(self, report):
        # Seen here, in the one process that sees every report (pytest-xdist's controller
        # collects nothing itself): an expected collection error arrives as a skip.
        if not report.passed:
            self.seen.add(report.nodeid)
        if self.record_path and report.failed:
            self.outcomes[report.nodeid] = {"outcome": "collect-error", "cause": cause_of(report)}

    def pytest_runtest_logreport(self, report):
        self.seen.add(report.nodeid)
        if not self.record_path:
            return
        previous = self.outcomes.get(report.nodeid, {}).get("outcome")
        if report.failed:
            outcome = "failed" if report.when == "call" else "error"
            if previous not in FAILED:
                self.outcomes[report.nodeid] = {"outcome": outcome, "cause": cause_of(report)}
        elif report.skipped and previous is None:
            self.outcomes[report.nodeid] = {"outcome": "skipped"}
        elif report.passed and report.when == "call" and previous is None:
            self.outcomes[report.nodeid] = {"outcome": "passed"}

    def pytest_sessionfinish(self, session):
        if hasattr(self.config, "workerinput"):
            return
        stale = sorted(set(self.listed) - self.seen) if self.check_stale else []
        if stale:
            print(
                f"\nerror: expected_failures.yaml lists {len(stale)} test ids this run did not "
                f"see (first: {stale[:5]}); refresh it with `make test-hf-suite-update`"
            )
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if self.record_path:
            with open(self.record_path, "w", encoding="utf-8") as out:
                json.dump(self.outcomes, out, indent=0, sort_keys=True)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    # Their conftest imports private names at its top: the finder must be in place first.
    if early_config.known_args_namespace.hf_suite_against == "ours":
        from tests.hf_suite import finder

        finder.install()
        return
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO_ROOT]
    if "kernels" in sys.modules:
        raise pytest.UsageError("our kernels was imported before the run against theirs")


def pytest_configure(config):
    against = config.getoption("--hf-suite-against")
    spec = importlib.util.find_spec("kernels")
    origin = Path(spec.origin).resolve() if spec and spec.origin else None
    # Ours is this repository's package; theirs is installed (in an environment that may
    # itself live inside the repository, as .venv-hf does).
    ours = origin is not None and origin.is_relative_to(REPO_ROOT / "kernels")
    if origin is None or ours != (against == "ours"):
        raise pytest.UsageError(
            f"--hf-suite-against={against}, but `kernels` is {origin}: run through "
            "`python -m tests.hf_suite.run` (our package from this repository, theirs from "
            "an environment where it is installed)"
        )
    config.pluginmanager.register(_Plugin(config), "hf-suite")
