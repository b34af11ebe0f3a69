"""Regenerate expected_failures.yaml from runs of Hugging Face's suite.

    python -m tests.hf_suite.update [--theirs-python PY] [--workers N]

Runs the suite against our package (recording every outcome, no list applied) and, when
``--theirs-python`` names an environment with their client (``make test-hf-suite-update``
passes .venv-hf's), against theirs. Then:

- a test listed already that still fails keeps its group (category and reason);
- a newly failing test that fails with their client too goes under "network";
- any other newly failing test goes under "not-yet", grouped by the cause of its failure, so
  the groups read as the list of what our package lacks;
- a listed test that passes now, or is gone, leaves the list (counted in the summary).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from tests.hf_suite import expectations, run
from tests.hf_suite.plugin import FAILED


def merge(
    groups: list[expectations.Group],
    ours: dict[str, dict[str, str]],
    theirs: dict[str, dict[str, str]] | None,
) -> tuple[list[expectations.Group], dict[str, int]]:
    """The new list from the old one and the recorded outcomes, and counts for a summary."""
    listed = expectations.by_test(groups)
    kept = {id(g): expectations.Group(g.category, g.reason, []) for g in groups}
    new: dict[tuple[str, str], list[str]] = defaultdict(list)
    counts = {"kept": 0, "added": 0, "dropped": 0}
    for test, result in sorted(ours.items()):
        if result["outcome"] not in FAILED:
            continue
        if test in listed:
            kept[id(listed[test])].tests.append(test)
            counts["kept"] += 1
            continue
        counts["added"] += 1
        if theirs is not None and theirs.get(test, {}).get("outcome") in FAILED:
            new[("network", expectations.NETWORK_REASON)].append(test)
        else:
            cause = result.get("cause") or "no message"
            new[("not-yet", f"{expectations.NOT_YET_REASON}: {cause}")].append(test)
    counts["dropped"] = len(listed) - counts["kept"]
    merged = [g for g in kept.values() if g.tests]
    by_key = {(g.category, g.reason): g for g in merged}
    for (category, reason), tests in new.items():
        if (category, reason) in by_key:
            by_key[(category, reason)].tests.extend(tests)
        else:
            group = expectations.Group(category, reason, tests)
            merged.append(group)
            by_key[(category, reason)] = group
    return merged, counts


def _record(against: str, python: str, workers: str, folder: Path) -> dict:
    path = folder / f"{against}.json"
    status = run.run(against, python, workers, record=str(path))
    if not path.exists():
        raise SystemExit(f"error: the run against {against} recorded nothing (exit {status})")
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--theirs-python", help="an interpreter with their client installed")
    parser.add_argument("--workers", default="auto")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hf-suite-update-") as scratch:
        folder = Path(scratch)
        ours = _record("ours", sys.executable, args.workers, folder)
        theirs = (
            _record("theirs", args.theirs_python, args.workers, folder)
            if args.theirs_python
            else None
        )
    groups, counts = merge(expectations.load(), ours, theirs)
    expectations.LIST_PATH.write_text(expectations.dump(groups), encoding="utf-8")
    outcomes: dict[str, int] = defaultdict(int)
    for result in ours.values():
        outcomes[result["outcome"]] += 1
    print(
        f"{expectations.LIST_PATH}: {counts['kept']} kept, {counts['added']} added, "
        f"{counts['dropped']} dropped. Ours: {dict(sorted(outcomes.items()))}"
    )
    if theirs is None:
        print("(no --theirs-python: new failures were not checked against their client)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
