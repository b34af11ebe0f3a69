"""``kernels versions REPO``: the versions and branches of a Hub kernel, and what each offers.

Deprecated, as in Hugging Face's kernels 0.19: ``kernels variants --all-versions`` replaces it.
It still works until 0.20, after a warning on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging

from . import add_repo_type_argument

logger = logging.getLogger(__name__)

#: Hugging Face's kernels 0.19 wording.
DEPRECATION = (
    "`kernels versions` is deprecated and will be removed in kernels 0.20. "
    "Use `kernels variants --all-versions` instead."
)

HELP = "deprecated: use `kernels variants --all-versions`"
DESCRIPTION = """\
Deprecated (removed in kernels 0.20): use `kernels variants --all-versions`.

List the version tags (v<major>.<minor>.<patch>, newest first) and branches of a kernel
repository on the Hub, with each one's commit and build variants. The variant this machine
would load is marked with *. Tags that are not versions are listed apart: version
specifiers never select them."""
EPILOG = """\
examples:
  kernels versions kernels-community/activation
  kernels versions kernels-community/activation --json
  kernels versions old-org/activation --repo-type model"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "repo_id", metavar="REPO", help="Hub repository id, e.g. kernels-community/activation"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_repo_type_argument(parser)


def run(args: argparse.Namespace) -> int:
    from ..errors import BuildVariantNotFoundError
    from ..repos import hubclient
    from ..repos.repo_id import check_repo_id
    from ..repos.variants import PREFERENCE_FILE, choose_variant, read_preference_file, variants_in
    from ..repos.versions import hub_error, list_refs, parse_version_tag

    logger.warning(DEPRECATION)
    repo_id, repo_type = check_repo_id(args.repo_id, where="REPO"), args.repo_type
    refs = list_refs(repo_id, repo_type)
    api = hubclient.hub_api()
    offers: dict[str, tuple[list[str], str | None, str | None]] = {}

    def offered(commit: str) -> tuple[list[str], str | None, str | None]:
        """The variants at `commit`, the one this machine would load, and why none would."""
        if commit not in offers:
            try:
                files = api.list_repo_files(repo_id, revision=commit, repo_type=repo_type)
            except Exception as exc:
                raise hub_error(
                    exc, repo_id, f"list the files of {repo_id} at {commit}", repo_type
                ) from exc
            variants = variants_in(
                {f.split("/")[1] for f in files if f.startswith("build/") and f.count("/") >= 2}
            )
            chosen, problem = None, None
            prefer: str | None = "compiled"
            if PREFERENCE_FILE in files:
                from huggingface_hub import hf_hub_download

                try:
                    path = hf_hub_download(
                        repo_id, PREFERENCE_FILE, revision=commit, repo_type=repo_type
                    )
                except Exception as exc:
                    raise hub_error(
                        exc,
                        repo_id,
                        f"download {PREFERENCE_FILE} of {repo_id} at {commit}",
                        repo_type,
                    ) from exc
                try:
                    prefer = read_preference_file(path, where=f"{repo_id} at {commit[:12]}")
                except BuildVariantNotFoundError as exc:
                    # One ref's broken preference file must not hide the other refs; it is
                    # shown on its row, and nothing there would load.
                    problem, prefer = str(exc), None
            # No variant at this ref runs on this machine: chosen stays None.
            if prefer is not None:
                with contextlib.suppress(BuildVariantNotFoundError):
                    chosen = choose_variant(variants, where=repo_id, prefer=prefer)
            offers[commit] = (variants, chosen, problem)
        return offers[commit]

    versions = sorted(refs.versions().items(), reverse=True)
    # (kind, name, version, commit, variants, chosen variant, problem)
    rows: list[tuple[str, str, str | None, str, list[str], str | None, str | None]] = []
    for version, tag in versions:
        rows.append(("version", tag, str(version), refs.tags[tag], *offered(refs.tags[tag])))
    for branch in sorted(refs.branches, key=lambda b: (b != "main", b)):
        rows.append(
            ("branch", branch, None, refs.branches[branch], *offered(refs.branches[branch]))
        )
    other_tags = sorted(t for t in refs.tags if parse_version_tag(t) is None)

    if args.json:
        print(
            json.dumps(
                {
                    "repo_id": repo_id,
                    "repo_type": repo_type,
                    "refs": [
                        {
                            "kind": kind,
                            "name": name,
                            "version": version,
                            "commit": commit,
                            "variants": variants,
                            "variant_here": chosen,
                            "problem": problem,
                        }
                        for kind, name, version, commit, variants, chosen, problem in rows
                    ],
                    "other_tags": other_tags,
                },
                indent=2,
            )
        )
        return 0

    print(repo_id)
    width = max((len(name) for _, name, *_ in rows), default=4)
    for title, kind in (("versions (newest first)", "version"), ("branches", "branch")):
        print(f"{title}:")
        selected = [r for r in rows if r[0] == kind]
        if not selected:
            print("  none")
        for _, name, _version, commit, variants, chosen, problem in selected:
            shown = (
                ", ".join(f"{v}*" if v == chosen else v for v in variants) or "no build variants"
            )
            print(f"  {name:<{width}}  {commit[:12]}  {shown}")
            if problem:
                print(f"  {'':<{width}}  ! {problem}")
    if other_tags:
        print(f"other tags (not versions): {', '.join(other_tags)}")
    print("* the variant this machine would load")
    return 0
