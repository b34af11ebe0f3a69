"""The ``kernels`` command (also ``python -m kernels``).

Each subcommand is a module of this package with ``HELP`` (one line for ``kernels --help``),
``DESCRIPTION`` and ``EPILOG`` (for ``kernels CMD --help``), ``configure(parser)`` to add
its arguments and ``run(args) -> int``. Adding a command is adding a module and its name to
`COMMANDS` (a ``-`` in a command's name is ``_`` in its module's).

Exit codes: 0 success, 1 an error (printed on stderr as ``error: ...``, without a
traceback when it is one `kernels` expects, such as a missing repository), 2 a usage error,
130 interrupted (Ctrl-C; quietly). Only the standard library is imported until the arguments are
parsed (`kernels` imports torch on first use of its API), so ``kernels --help`` answers at once.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import sys
from collections.abc import Iterator, Sequence

#: Subcommands, in the order ``kernels --help`` lists them (their modules in this package).
COMMANDS: tuple[str, ...] = (
    "demo",
    "explain",
    "variants",
    "versions",
    "describe-api",
    "info",
    "cache",
    "lock",
    "download",
    "check",
    "verify-signature",
    "benchmark",
    "init",
    "upload",
)

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class CommandError(Exception):
    """An expected failure of a command: printed as ``error: <message>``, exit status 1."""


def add_repo_type_argument(parser: argparse.ArgumentParser) -> None:
    """``--repo-type kernel|model``, for the commands that address one Hub repository."""
    parser.add_argument(
        "--repo-type",
        choices=("kernel", "model"),
        default="kernel",
        help="the Hub repository type: kernel (default; where the Hub keeps kernels) or model "
        "(a kernel still published as a model repository, e.g. on an old mirror)",
    )


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="kernels",
        description="Run the demo, explain what kernelize would do with a model, and find, "
        "lock, download, check, benchmark, scaffold and publish kernel repositories.",
        epilog="Run `kernels COMMAND --help` for a command's options. Docs: docs/hub.md.",
    )
    parser.add_argument("--version", action="version", version=f"kernels {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="log more (-v: INFO, -vv: DEBUG)"
    )
    # -v also after the command (`kernels demo -v`); unset there, the value before it stays.
    verbosity = argparse.ArgumentParser(add_help=False)
    verbosity.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS,
        help="log more (-v: INFO, e.g. what kernelize swaps; -vv: DEBUG)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        module = importlib.import_module(f"{__name__}.{name.replace('-', '_')}")
        sub = subparsers.add_parser(
            name,
            help=module.HELP,
            description=getattr(module, "DESCRIPTION", module.HELP),
            epilog=getattr(module, "EPILOG", None),
            formatter_class=argparse.RawDescriptionHelpFormatter,
            parents=[verbosity],
        )
        module.configure(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``kernels`` command with `argv` (default: ``sys.argv[1:]``); returns the exit status."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        # Ctrl-C, wherever it lands (a command's import of torch takes seconds): the shell's
        # convention, 128 + SIGINT, and no traceback.
        return EXIT_INTERRUPTED


def _main(argv: Sequence[str] | None) -> int:
    from ..errors import KernelsError

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version (0) or a usage error (2)
        return int(exc.code or 0) if isinstance(exc.code, int) else EXIT_USAGE
    with _logging_to_stderr(args.verbose):
        try:
            return int(args.run(args) or EXIT_OK)
        except (KernelsError, CommandError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_ERROR


@contextlib.contextmanager
def _logging_to_stderr(verbosity: int) -> Iterator[None]:
    """Log the `kernels` logger tree to stderr while a command runs (never the root logger).

    The logger's level and handlers are restored afterwards, so calling `main()` from Python
    leaves the caller's logging configuration as it was.
    """
    logger = logging.getLogger("kernels")
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    handler.setLevel(level)
    saved = logger.level
    if logger.getEffectiveLevel() > level:
        logger.setLevel(level)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is at the time of the record."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass
