"""``kernels variants REPO``: a Hub kernel's build variants, and whether each runs here."""

from __future__ import annotations

import argparse
import json
from typing import Any

from . import add_repo_type_argument
from ._kernel_refs import version_argument

HELP = "list a Hub kernel's build variants and whether each runs on this machine"
DESCRIPTION = """\
List the build variants of a kernel repository on the Hub, for its newest version by default
(its newest v<N> branch; a repository without such branches has its v<X.Y.Z> tags as
versions), with the one this machine loads, the others that would run here, and why the rest
do not. Nothing is downloaded; offline (HF_HUB_OFFLINE=1) the cached versions answer.

--json prints {"repo_id", "revisions": [{"version", "revision", "variants": [{"variant",
"compatible", "preferred", "reason"}]}]}, the keys of Hugging Face's `kernels variants`."""
EPILOG = """\
examples:
  kernels variants kernels-community/activation
  kernels variants kernels-community/activation --all-versions --only-compatible
  kernels variants kernels-community/activation --revision main --json"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "repo_id", metavar="REPO", help="Hub repository id, e.g. kernels-community/activation"
    )
    selection = parser.add_mutually_exclusive_group()
    selection.add_argument(
        "--all-versions", action="store_true", help="every version, oldest first"
    )
    selection.add_argument(
        "--version",
        type=version_argument,
        help="one version: an integer (the v<N> branch) or 'latest' (the default)",
    )
    selection.add_argument("--revision", help="a branch, tag or commit instead of a version")
    parser.add_argument(
        "--only-compatible", action="store_true", help="list only the variants that run here"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_repo_type_argument(parser)


def run(args: argparse.Namespace) -> int:
    from ..repos.download import get_kernel_variants
    from ..repos.repo_id import check_repo_id
    from ..repos.variants import VariantAccepted
    from . import CommandError
    from ._kernel_refs import kernel_versions, select_revision

    repo_id, repo_type = check_repo_id(args.repo_id, where="REPO"), args.repo_type
    selected: list[tuple[int | str | None, str]]
    if args.all_versions:
        selected = [(v.version, v.ref) for v in kernel_versions(repo_id, repo_type)]
        if not selected:
            raise CommandError(
                f"{repo_id} has no versions (no v<N> branch, no v<X.Y.Z> tag); list a branch's "
                "variants with --revision, e.g. --revision main."
            )
    else:
        selected = [
            select_revision(repo_id, repo_type, version=args.version, revision=args.revision)
        ]

    revisions: list[dict[str, Any]] = []
    for version, ref in selected:
        decisions = get_kernel_variants(repo_id, revision=ref, repo_type=repo_type)
        if args.only_compatible:
            decisions = [d for d in decisions if isinstance(d, VariantAccepted)]
        revisions.append(
            {
                "version": version,
                "revision": ref,
                "variants": [
                    {
                        "variant": d.variant.variant_str,
                        "compatible": isinstance(d, VariantAccepted),
                        "preferred": isinstance(d, VariantAccepted) and d.rank == 0,
                        "reason": None if isinstance(d, VariantAccepted) else d.reason,
                    }
                    for d in decisions
                ],
            }
        )

    if args.json:
        print(json.dumps({"repo_id": repo_id, "revisions": revisions}, indent=2))
        return 0
    for index, entry in enumerate(revisions):
        if index:
            print()
        if entry["version"] is None:
            print(f"Revision {entry['revision']}:")
        else:
            print(f"Version {entry['version']} ({entry['revision']}):")
        print(_table(entry["variants"], only_compatible=args.only_compatible))
    return 0


def _table(variants: list[dict], *, only_compatible: bool) -> str:
    if not variants:
        return (
            "  No compatible variants found." if only_compatible else "  No build variants found."
        )
    width = max(len(v["variant"]) for v in variants)
    lines = []
    for v in variants:
        if v["preferred"]:
            verdict = "compatible, preferred (the one this machine loads)"
        elif v["compatible"]:
            verdict = "compatible"
        else:
            verdict = f"incompatible: {v['reason']}"
        lines.append(f"  {v['variant']:<{width}}  {verdict}")
    return "\n".join(lines)
