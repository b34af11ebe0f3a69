"""The CLI tests' `kernels check` runs forked children (tests/support/children.py) in place of
new interpreters: each variant it checks is imported in a process of its own, and starting an
interpreter (importing torch) is most of that process's CPU time. tests/repos/test_hf_forms.py
checks variants in real interpreters."""

from __future__ import annotations

import pytest

from kernels.cli import check
from tests.support import children


def _forked(args: list[str], env: dict[str, str], timeout: float):
    return children.run_python(*args, env=env, timeout=timeout)


@pytest.fixture(autouse=True)
def forked_variant_checks(monkeypatch):
    monkeypatch.setattr(check, "run_python", _forked)
