"""``kernels._internals.cli``: the ``kernels`` command (our ``kernels.cli.main``, the console
script's entry point)."""

import kernels.cli
from tests.hf_suite.gaps import gaps_for

__getattr__ = gaps_for(__name__)


def main() -> None:
    """Their entry point reads ``sys.argv`` and ends the process on an error; ours returns the
    exit status."""
    status = kernels.cli.main()
    if status:
        raise SystemExit(status)
