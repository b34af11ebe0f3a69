"""``kernels._internals.cli``: the ``kernels`` command (our ``kernels.cli.main``, the console
script's entry point)."""

import importlib
from pathlib import Path

import kernels.cli
from tests.hf_suite.gaps import gaps_for

_gap = gaps_for(__name__)


def __getattr__(name: str):
    # ``from kernels._internals.cli import cache`` asks the package for the attribute before
    # importing the submodule: answer with the adapter module where one exists, not a gap.
    if (Path(__file__).parent / f"{name}.py").is_file():
        return importlib.import_module(f"{__name__}.{name}")
    return _gap(name)


def main() -> None:
    """Their entry point reads ``sys.argv`` and ends the process on an error; ours returns the
    exit status."""
    status = kernels.cli.main()
    if status:
        raise SystemExit(status)
