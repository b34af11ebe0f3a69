"""``kernels download PROJECT_DIR``: prefetch every kernel a project's lock pins."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "download (and verify) the kernels in PROJECT_DIR/kernels.lock, for offline use and CI"
DESCRIPTION = """\
Download the locked commit of every kernel in PROJECT_DIR/kernels.lock into the Hugging Face
cache (HF_HUB_CACHE) and verify each file against the lock. Afterwards the project can load
them with HF_HUB_OFFLINE=1 (LockedLayerRepository, load_kernel, get_locked_kernel).

By default only the build variant this machine runs is downloaded; --all-variants fetches
every locked variant (e.g. to fill a cache shared by machines of several kinds)."""
EPILOG = """\
examples:
  kernels download .
  HF_HUB_CACHE=/shared/hf-cache kernels download . --all-variants"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "project_dir", metavar="PROJECT_DIR", type=Path, help="folder with kernels.lock"
    )
    parser.add_argument(
        "--all-variants",
        action="store_true",
        help="download every locked build variant, not only this machine's",
    )
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow kernels from untrusted organisations whose lock entry records no trust decision",
    )


def run(args: argparse.Namespace) -> int:
    from ..repos.lock import LOCK_FILE, download_locked

    locked = download_locked(
        args.project_dir,
        all_variants=args.all_variants,
        trust_remote_code=bool(args.trust_remote_code),
    )
    if not locked:
        print(f"{args.project_dir / LOCK_FILE} locks no kernels: nothing to download")
    for lock, fetched in locked:
        variants = ", ".join(f.variant for f in fetched)
        checked = "verified" if lock.hashed else "no file hashes in the lock to verify"
        print(f"downloaded {lock.repo_id} at {lock.sha[:12]} ({variants}), {checked}")
    return 0
