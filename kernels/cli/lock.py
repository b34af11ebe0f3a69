"""``kernels lock PROJECT_DIR``: pin a project's kernels to commits and file hashes."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "resolve the kernels in pyproject.toml and write kernels.lock"
DESCRIPTION = """\
Resolve each kernel in [tool.kernels.dependencies] of PROJECT_DIR/pyproject.toml to a
commit and write PROJECT_DIR/kernels.lock: the repository, the version asked for, the tag
or branch and commit it resolved to, the trust decision, and the hashes of every build
variant's files (taken from the Hub's file listing; nothing is downloaded).

Kernels from organisations that are not trusted are refused unless the entry says
trust-remote-code = true (or the organisation is trusted by configuration)."""
EPILOG = """\
pyproject.toml:
  [tool.kernels.dependencies]
  "kernels-community/activation" = ">=0.1,<0.2"
  "my-org/fused-mlp" = { version = ">=1.0,<2", trust-remote-code = true }

examples:
  kernels lock .
  kernels download .        # then prefetch what the lock pins"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "project_dir", metavar="PROJECT_DIR", type=Path, help="folder with pyproject.toml"
    )


def run(args: argparse.Namespace) -> int:
    from ..repos.lock import lock_project

    path, locks = lock_project(args.project_dir)
    for lock in locks:
        pinned = f"{lock.ref} ({lock.sha[:12]})" if lock.ref else lock.sha[:12]
        asked = f" {lock.version}" if lock.version is not None else ""
        trust = (lock.trust or {}).get("reason")
        print(
            f"locked {lock.repo_id}{asked} -> {pinned}, {len(lock.variants)} variant(s)"
            + (f"; {trust}" if trust else "")
        )
    print(f"wrote {path}")
    return 0
