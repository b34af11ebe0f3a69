"""Which versions a Hub kernel has, for the commands that take ``--version`` / ``--revision``
(``variants``, ``describe-api``, ``info``).

A kernel's versions are its ``v<N>`` branches, the convention of Hugging Face's kernels 0.17
and later; a repository without any has its ``v<major>.<minor>.<patch>`` tags as versions
(our older convention, `kernels.repos.versions`). Online the Hub lists them; offline
(``HF_HUB_OFFLINE=1``) the refs huggingface_hub cached when it last downloaded by those names.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Literal

from . import CommandError

_VERSION_BRANCH = re.compile(r"v(\d{1,9})")


@dataclass(frozen=True)
class KernelVersion:
    """One version of a kernel: ``2`` (branch ``v2``) or ``"0.1.0"`` (tag ``v0.1.0``)."""

    version: int | str
    ref: str
    commit: str | None


def version_argument(value: str) -> int | Literal["latest"]:
    """argparse type of ``--version``: an integer >= 0, or ``latest``."""
    if value == "latest":
        return "latest"
    if not value.isdecimal():
        raise argparse.ArgumentTypeError(
            f"version must be an integer (the v<N> branch) or 'latest', got {value!r}"
        )
    return int(value)


def add_kernel_selection(parser: argparse.ArgumentParser) -> None:
    """The arguments of the verbs that read one kernel: a Hub repository id or a local folder,
    at most one of ``--version`` and ``--revision`` (Hub only), and ``--json``."""
    parser.add_argument(
        "kernel", metavar="KERNEL", help="Hub repository id, or a local kernel folder"
    )
    selection = parser.add_mutually_exclusive_group()
    selection.add_argument(
        "--version", type=version_argument, help="the kernel version (v<N> branch; Hub only)"
    )
    selection.add_argument("--revision", help="a branch, tag or commit (Hub only)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def kernel_versions(repo_id: str, repo_type: str) -> list[KernelVersion]:
    """The versions of `repo_id`, oldest first (none when it has no version branch or tag).

    Raises:
        KernelsError: the repository does not exist, the Hub cannot be reached, ...
    """
    from packaging.version import Version

    from ..repos import hubclient
    from ..repos.versions import list_refs, parse_version_tag

    if hubclient.is_offline():
        cached = hubclient.cached_refs(repo_id, repo_type)
        branches = {n: c for n, c in cached.items() if _VERSION_BRANCH.fullmatch(n)}
        tags = {n: c for n, c in cached.items() if n not in branches}
    else:
        refs = list_refs(repo_id, repo_type)
        branches, tags = refs.branches, refs.tags
    numbered = [
        KernelVersion(int(m.group(1)), name, commit)
        for name, commit in branches.items()
        if (m := _VERSION_BRANCH.fullmatch(name))
    ]
    if numbered:
        return sorted(numbered, key=lambda v: v.version)
    tagged = [
        (version, KernelVersion(str(version), name, commit))
        for name, commit in tags.items()
        if (version := parse_version_tag(name)) is not None
    ]
    tagged.sort(key=lambda pair: (pair[0], pair[1].ref))
    # Two tags may spell one version (v1.0.0 and v1.0.00): the last name wins, as in
    # RepoRefs.versions.
    unique: dict[Version, KernelVersion] = dict(tagged)
    return list(unique.values())


def select_revision(
    repo_id: str,
    repo_type: str,
    *,
    version: int | Literal["latest"] | None,
    revision: str | None,
) -> tuple[int | str | None, str]:
    """The version (None for a plain revision) and the ref to read, as ``--version`` /
    ``--revision`` ask: by default the newest version.

    Raises:
        CommandError: the version does not exist, or the repository has no versions.
        KernelsError: as `kernel_versions`.
    """
    if revision is not None:
        return None, revision
    versions = kernel_versions(repo_id, repo_type)
    if version is not None and version != "latest":
        for candidate in versions:
            if candidate.version == version:
                return candidate.version, candidate.ref
        raise CommandError(
            f"Version {version} not found in {repo_id}, available versions: "
            f"{', '.join(str(v.version) for v in versions) or 'none'}."
        )
    if not versions:
        raise CommandError(
            f"No numbered versions found for {repo_id} (no v<N> branch, no v<X.Y.Z> tag). "
            "Specify --revision explicitly (e.g. --revision main)."
        )
    newest = versions[-1]
    return newest.version, newest.ref
