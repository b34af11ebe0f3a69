"""``kernels init NAME``: scaffold a new Triton kernel repository."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from . import CommandError

HELP = "scaffold a new Triton kernel repository with a layer, tests and a benchmark stub"
DESCRIPTION = """\
Create the folder NAME (or DIR/NAME) with a Triton kernel repository in the Hub layout:
an example element-wise kernel with a backward pass, a kernel layer, tests against PyTorch
that run on CPU through Triton's interpreter (TRITON_INTERPRET=1), a triton.testing
benchmark stub and a README. NAME may be a Hub repo id (org/name); the folder and the
package are named after its last part (dashes become underscores in the package)."""
EPILOG = """\
examples:
  kernels init my-org/fused-silu
  cd fused-silu && pytest tests && kernels check ."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name", metavar="NAME", help="repository name or Hub repo id, e.g. my-org/fused-silu"
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path("."),
        help="create the repository in this folder (default: .)",
    )
    parser.add_argument(
        "--force", action="store_true", help="write into an existing, non-empty folder"
    )


def run(args: argparse.Namespace) -> int:
    from ..repos.repo_id import is_repo_id, shown
    from .scaffold import files

    repo_id = args.name
    # ASCII only: the name becomes a Hub repository id and a Python package name.
    if not (
        re.fullmatch(r"(?:[A-Za-z0-9][A-Za-z0-9_.-]*/)?[A-Za-z][A-Za-z0-9_-]*", repo_id)
        and is_repo_id(repo_id)
    ):
        raise CommandError(
            f"{shown(repo_id)} is not a usable name: use ASCII letters, digits, '-' and '_', "
            "starting with a letter, optionally prefixed by an organisation "
            "('my-org/fused-silu')"
        )
    name = repo_id.split("/")[-1]
    package = name.replace("-", "_")
    if "/" not in repo_id:
        repo_id = f"<your-org>/{name}"
    target = args.dir / name
    if target.exists() and any(target.iterdir()) and not args.force:
        raise CommandError(f"{target} exists and is not empty; choose another NAME or pass --force")
    for relative, content in files(repo_id=repo_id, name=name, package=package).items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        print(f"wrote {path}")
    print(f"\nNext: cd {target} && pytest tests && kernels check .")
    return 0
