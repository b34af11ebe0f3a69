"""``kernels benchmark REPO``: run the benchmark scripts a kernel repository ships."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import CommandError, add_repo_type_argument

HELP = "run the benchmarks/benchmark*.py scripts of a kernel repository and print their timings"
DESCRIPTION = """\
Load the kernel, run every benchmark_<workload> method of the kernels.benchmark.Benchmark
subclasses in the repository's benchmarks/benchmark*.py scripts, check each against its
verify_<workload> reference, time both, and print a table (mean, spread, speedup over the
reference, match). Exit status 1 when a workload fails or differs from its reference.

REPO is a kernel repository folder (with build/ and benchmarks/), or a Hub repository id,
optionally with @REVISION (a branch, tag or commit) or vN (the branch of major version N):
the kernel is downloaded as get_kernel does, and the scripts from the same commit."""
EPILOG = """\
examples:
  kernels benchmark library/activation --iterations 20
  kernels benchmark kernels-community/activation@v1 --output results.json"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("repo", metavar="REPO", help="a kernel repository folder or Hub repo id")
    pin = parser.add_mutually_exclusive_group()
    pin.add_argument("--version", help="Hub only: the kernel version (an int N or a specifier)")
    pin.add_argument("--revision", help="Hub only: a branch, tag or commit")
    parser.add_argument("--iterations", type=_positive, default=100, help="timed calls (100)")
    parser.add_argument("--warmup", type=_non_negative, default=10, help="untimed calls (10)")
    parser.add_argument("--output", type=Path, help="also write the results as JSON to this file")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    add_repo_type_argument(parser)


def run(args: argparse.Namespace) -> int:
    from ..benchmark import find_scripts, format_report, run_benchmarks

    kernel, repo_dir, description = _load(args)
    try:
        scripts = find_scripts(repo_dir)
    except FileNotFoundError as exc:
        raise CommandError(str(exc)) from exc
    try:
        report = run_benchmarks(
            kernel,
            scripts,
            iterations=args.iterations,
            warmup=args.warmup,
            kernel_description=description,
            progress=lambda line: print(f"running {line}", file=sys.stderr),
        )
    except (ImportError, ValueError, SyntaxError) as exc:
        raise CommandError(f"{type(exc).__name__}: {exc}") from exc
    data = report.to_dict()
    if args.output is not None:
        args.output.write_text(json.dumps(data, indent=2) + "\n")
    print(json.dumps(data, indent=2) if args.json else format_report(report))
    return 0 if report.ok else 1


def _load(args: argparse.Namespace):
    """The kernel package, the repository folder holding benchmarks/, and a description."""
    from ..errors import KernelLoadError

    path = Path(args.repo).expanduser()
    if path.is_dir():
        if args.version is not None or args.revision is not None:
            raise CommandError(f"{args.repo} is a folder: --version and --revision are for Hub ids")
        from ..library.paths import built_repository
        from ..repos.local import get_local_kernel

        # A library source folder of a checkout (library/norm) is loaded as built.
        path = built_repository(path)
        try:
            return get_local_kernel(path), path, f"local repository {path.resolve()}"
        except KernelLoadError as exc:
            raise CommandError(str(exc)) from exc
    repo_id, _, pinned = args.repo.partition("@")
    if pinned and (args.version is not None or args.revision is not None):
        raise CommandError(f"{args.repo} names a revision already; drop --version/--revision")
    revision, version = args.revision, args.version
    if pinned:
        revision = pinned
    if isinstance(version, str) and version.isdigit():
        version = int(version)
    from ..repos.repo_id import is_repo_id, shown

    if "/" not in repo_id or not is_repo_id(repo_id):
        # A plain name as typed; anything else escaped, so a look-alike shows what differs.
        plain = args.repo if args.repo.isascii() and args.repo.isprintable() else None
        raise CommandError(
            f"{plain or shown(args.repo)} is neither a folder nor a Hub repository id (org/name, "
            "in ASCII letters, digits, '-', '_' and '.'); give the kernel repository folder or "
            "e.g. kernels-community/activation@v1"
        )
    from ..repos.download import load_hub_kernel

    try:
        loaded = load_hub_kernel(
            repo_id, revision=revision, version=version, repo_type=args.repo_type
        )
    except KernelLoadError as exc:
        raise CommandError(str(exc)) from exc
    fetched = loaded.fetched
    return (
        loaded.module,
        _hub_benchmarks(repo_id, fetched.commit, fetched.repo_type),
        loaded.describe(),
    )


def _hub_benchmarks(repo_id: str, commit: str, repo_type: str) -> Path:
    """The repository's benchmarks/ at `commit`, downloaded into the Hub cache."""
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(
                repo_id, revision=commit, repo_type=repo_type, allow_patterns=["benchmarks/*"]
            )
        )
    except Exception as exc:  # huggingface_hub's errors differ between its major versions
        raise CommandError(f"downloading {repo_id}'s benchmarks/ at {commit[:12]}: {exc}") from exc


def _positive(value: str) -> int:
    number = _non_negative(value)
    if number == 0:
        raise argparse.ArgumentTypeError("must be at least 1")
    return number


def _non_negative(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise argparse.ArgumentTypeError(f"invalid count {value!r}; give a whole number")
    return number
