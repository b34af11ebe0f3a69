"""``kernels lock PROJECT_DIR``: pin a project's kernels to commits and file hashes."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "resolve the kernels in pyproject.toml and write kernels.lock"
DESCRIPTION = """\
Resolve each kernel in [tool.kernels.dependencies] of PROJECT_DIR/pyproject.toml to a
commit and write PROJECT_DIR/kernels.lock: the repository, the version asked for, the tag
or branch and commit it resolved to, the trust decision, and the hashes of every build
variant's files (taken from the Hub's file listing; only metadata.json files are downloaded).
The kernels each one is built on (kernel-depends in any variant's metadata.json) are locked
too, recursively, with the kernel's trust; a cycle, or one repository resolving to two
commits, is an error.

Kernels from organisations that are not trusted are refused unless the entry says
trust-remote-code = true (or the organisation is trusted by configuration).

--format hf writes Hugging Face's kernels 0.17 format instead (repository, int version or
revision, commit), for projects that their client also reads. It keeps no file hashes and
no trust record: loads pin the commit but verify no file, and a kernel from an untrusted
organisation then needs trust-remote-code in this pyproject.toml (beside the lock) or
trust_remote_code=... at load. An entry whose version is a specifier is written as the
revision it resolved to; a model repository cannot be written."""
EPILOG = """\
pyproject.toml:
  [tool.kernels.dependencies]
  "kernels-community/activation" = ">=0.1,<0.2"
  "kernels-community/moe" = 1       # the branch v1, as Hugging Face's kernels writes it
  "my-org/fused-mlp" = { version = ">=1.0,<2", trust-remote-code = true }

examples:
  kernels lock .
  kernels lock . --format hf    # Hugging Face's format (no hashes)
  kernels download .            # then prefetch what the lock pins"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "project_dir", metavar="PROJECT_DIR", type=Path, help="folder with pyproject.toml"
    )
    parser.add_argument(
        "--format",
        choices=("kernels", "hf"),
        default="kernels",
        help="kernels (default: with file hashes and trust) or hf (Hugging Face's kernels "
        "0.17 format, without them)",
    )


def run(args: argparse.Namespace) -> int:
    from ..repos.lock import lock_project

    path, locks = lock_project(args.project_dir, format=args.format)
    for lock in locks:
        pinned = f"{lock.ref} ({lock.sha[:12]})" if lock.ref else lock.sha[:12]
        asked = f" {lock.version}" if lock.version is not None else ""
        trust = (lock.trust or {}).get("reason")
        print(
            f"locked {lock.repo_id}{asked} -> {pinned}, {len(lock.variants)} variant(s)"
            + (f"; {trust}" if trust else "")
        )
    if args.format == "hf":
        print(f"wrote {path} in Hugging Face's format: commits only, no file hashes")
    else:
        print(f"wrote {path}")
    return 0
