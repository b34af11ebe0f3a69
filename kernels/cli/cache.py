"""``kernels cache ls``: the kernel versions in huggingface_hub's cache, with their variants."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

from . import CommandError

HELP = "list the kernel versions in the Hugging Face cache and the build variants cached for each"
DESCRIPTION = """\
`kernels cache ls` lists the kernel repositories in huggingface_hub's cache (HF_HUB_CACHE,
else HF_HOME/hub; --cache-dir for another), one row per cached version (a v<N> branch or a
v<X.Y.Z> tag the cache has resolved), with its size, when it was last accessed and modified,
and the build variants downloaded for it. Snapshots no version names (a commit downloaded by
hash, the main branch) are not listed. Nothing is imported and the Hub is not asked.

It reads the cache with huggingface_hub's scan_cache_dir, for the Hub's `kernel` repository
type, which huggingface_hub knows from 1.10 on.

--json prints {"cache_dir", "repos": [{"repo_id", "size_on_disk", "last_accessed",
"last_modified", "versions": [{"version", "size_on_disk", "last_accessed", "last_modified",
"variants"}]}]}, the keys of Hugging Face's `kernels cache ls --json` (times in seconds since
the epoch, sizes in bytes)."""
EPILOG = """\
examples:
  kernels cache ls
  kernels cache ls --json
  kernels cache ls --cache-dir /shared/hf-cache --show-warnings"""

HEADERS = ("ID", "SIZE", "LAST_ACCESSED", "LAST_MODIFIED", "VERSION", "VARIANTS")
_VERSION_BRANCH = re.compile(r"v(\d{1,9})")


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="cache_command", metavar="ACTION", required=True)
    ls = actions.add_parser(
        "ls",
        help="list cached kernel versions and their build variants",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ls.add_argument("--cache-dir", type=Path, help="the cache to list (default: HF_HUB_CACHE)")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.add_argument(
        "--no-truncate",
        action="store_true",
        help="print full values even where the table is wider than the terminal",
    )
    ls.add_argument(
        "--show-warnings",
        action="store_true",
        help="name each cache inconsistency found (by default only their count is shown)",
    )


def run(args: argparse.Namespace) -> int:
    from ..repos import hubclient

    if not hubclient.supports_kernel_repo_type():
        import huggingface_hub

        raise CommandError(
            f"`kernels cache ls` needs huggingface_hub >= {hubclient.KERNEL_TYPE_MIN_HUB}: this "
            f"environment has huggingface_hub {huggingface_hub.__version__}, whose cache scanner "
            "does not know the Hub's `kernel` repository type, where kernels are kept. Upgrade "
            f"it (pip install -U 'huggingface_hub>={hubclient.KERNEL_TYPE_MIN_HUB}')."
        )
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.utils import CacheNotFound

    cache_dir = (args.cache_dir or hubclient.cache_dir()).expanduser().resolve()
    try:
        cache = scan_cache_dir(cache_dir)
    except CacheNotFound:
        cache = None
    except (OSError, ValueError) as exc:
        raise CommandError(f"Cannot scan kernel cache {cache_dir}: {exc}") from exc

    repos = [entry for repo in (cache.repos if cache else ()) if (entry := _repo_entry(repo))]
    repos.sort(key=lambda entry: entry["repo_id"])
    if args.json:
        public = [{**repo, "versions": [_public(v) for v in repo["versions"]]} for repo in repos]
        print(json.dumps({"cache_dir": str(cache_dir), "repos": public}, indent=2))
    elif not repos:
        print(f"No cached kernel versions found in {cache_dir}.")
    else:
        table, truncated = _table(repos, None if args.no_truncate else _terminal_width())
        print(table)
        if truncated:
            print("Hint: Use `--no-truncate` or `--json` to display full values.", file=sys.stderr)
    warnings = cache.warnings if cache else []
    if warnings and args.show_warnings:
        for warning in warnings:
            print(f"Warning: {str(warning).rstrip('.')}. Repo ignored.", file=sys.stderr)
    elif warnings:
        print(
            f"Warning: Found {len(warnings)} cache inconsistencies. Re-run with "
            "`--show-warnings` to display them.",
            file=sys.stderr,
        )
    return 0


def _repo_entry(repo) -> dict | None:
    """A kernel repository's versions in the cache, or None (another type, or no version)."""
    if repo.repo_type != "kernel":
        return None
    versions = []
    for ref, revision in repo.refs.items():
        key = _version_key(ref)
        if key is None:
            continue
        last_accessed = max(
            (f.blob_last_accessed for f in revision.files),
            default=revision.snapshot_path.stat().st_atime,
        )
        versions.append(
            (
                key,
                {
                    "version": ref,
                    "size_on_disk": revision.size_on_disk,
                    "last_accessed": last_accessed,
                    "last_modified": revision.last_modified,
                    "variants": _cached_variants(revision),
                    # For the table only (dropped from the JSON below).
                    "_size": revision.size_on_disk_str,
                    "_modified": revision.last_modified_str,
                },
            )
        )
    if not versions:
        return None
    versions.sort(key=lambda pair: pair[0])
    return {
        "repo_id": repo.repo_id,
        "size_on_disk": repo.size_on_disk,
        "last_accessed": repo.last_accessed,
        "last_modified": repo.last_modified,
        "versions": [entry for _, entry in versions],
    }


def _version_key(ref: str) -> tuple | None:
    """Sort key of a ref that names a version (v<N> branches first, by N; then v<X.Y.Z>
    tags, by version), or None."""
    from ..repos.versions import parse_version_tag

    if match := _VERSION_BRANCH.fullmatch(ref):
        return (0, int(match.group(1)))
    version = parse_version_tag(ref)
    return None if version is None else (1, version)


def _cached_variants(revision) -> list[str]:
    """The build variants of a cached revision that have at least one file downloaded."""
    from ..repos.variants import variants_in

    build = revision.snapshot_path / "build"
    names = {
        f.file_path.relative_to(build).parts[0]
        for f in revision.files
        if build in f.file_path.parents
    }
    return variants_in(names)


def _public(version: dict) -> dict:
    return {key: value for key, value in version.items() if not key.startswith("_")}


def _ago(timestamp: float) -> str:
    """``3 days ago``, as huggingface_hub's own cache listing words times."""
    seconds = max(0.0, time.time() - timestamp)
    for unit, size in (("year", 365 * 86400), ("month", 30 * 86400), ("week", 7 * 86400),
                       ("day", 86400), ("hour", 3600), ("minute", 60)):  # fmt: skip
        if seconds >= size:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if count > 1 else ''} ago"
    return "a few seconds ago"


def _terminal_width() -> int:
    """The terminal's width: COLUMNS if set, else the terminal's own, else 80."""
    return shutil.get_terminal_size().columns


def _column_caps(widths: list[int], width: int) -> list[int]:
    """Column widths that fit `width` characters (one space between columns), taken from the
    widest column first; a column keeps room for its header and for ``x...``."""
    caps = list(widths)
    floors = [max(len(header), 4) for header in HEADERS]
    budget = width - (len(caps) - 1)
    while sum(caps) > budget:
        shrinkable = [i for i, cap in enumerate(caps) if cap > floors[i]]
        if not shrinkable:
            break  # every column at its floor: the lines wrap
        caps[max(shrinkable, key=lambda i: caps[i])] -= 1
    return caps


def _table(repos: list[dict], width: int | None = None) -> tuple[str, bool]:
    """The table, fitted to `width` characters unless None (long cells end in ``...``), and
    whether a cell was cut."""
    rows: list[tuple[str, ...]] = []
    for repo in repos:
        for version in repo["versions"]:
            variants = version["variants"] or ["-"]
            rows.append(
                (
                    f"kernel/{repo['repo_id']}",
                    version["_size"],
                    _ago(version["last_accessed"]),
                    version["_modified"],
                    version["version"],
                    variants[0],
                )
            )
            # One variant a line: the metadata columns stay empty on the lines after the first.
            rows.extend(("", "", "", "", "", variant) for variant in variants[1:])
    widths = [max(len(row[i]) for row in (HEADERS, *rows)) for i in range(len(HEADERS))]
    truncated = False
    if width is not None:
        widths = _column_caps(widths, width)
        cut = [
            tuple(
                c if len(c) <= w else c[: w - 3] + "..." for c, w in zip(row, widths, strict=True)
            )
            for row in rows
        ]
        truncated = cut != rows
        rows = cut

    def line(cells: tuple[str, ...]) -> str:
        padded = [
            cell.rjust(width) if header == "SIZE" else cell.ljust(width)
            for cell, width, header in zip(cells, widths, HEADERS, strict=True)
        ]
        return " ".join(padded).rstrip()

    lines = [line(HEADERS), " ".join("-" * w for w in widths), *map(line, rows)]
    return "\n".join(lines), truncated
