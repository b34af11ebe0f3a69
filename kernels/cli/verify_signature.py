"""``kernels verify-signature REPO VERSION``: check a Hub kernel's sigstore signatures."""

from __future__ import annotations

import argparse

from . import add_repo_type_argument

HELP = "verify the sigstore signature and file digests of a Hub kernel's build variants"
DESCRIPTION = """\
Download a kernel's build variant for this machine (or, with --all-variants, every variant)
into the Hugging Face cache, and verify each: its metadata.json against the sigstore
signature beside it (metadata.json.sigstore), then every file against the digests of the
signed metadata.json. Nothing is imported. One line per variant; the exit status is 1 if
any variant fails (or is unsigned, or has no digests, unless filtered out).

Accepted signers are kernels-community's build workflows (as in Hugging Face's client),
those in KERNELS_SIGNERS and those given with --signer. The trust root is the one shipped
with the sigstore package (no network; KERNELS_SIGSTORE_REFRESH=1 refreshes it first).
Needs the sigstore package: pip install 'kernels[signatures]'. See docs/security.md."""
EPILOG = """\
examples:
  kernels verify-signature kernels-community/activation 1
  kernels verify-signature kernels-community/activation 1 --all-variants --filter-unsigned
  kernels verify-signature me/relu '>=0.2' \\
      --signer https://github.com/me/relu/.github/workflows/build.yaml@refs/heads/main"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "repo_id", metavar="REPO", help="Hub repository id, e.g. kernels-community/activation"
    )
    parser.add_argument(
        "version",
        metavar="VERSION",
        help="an int N (the branch vN, as in Hugging Face's client) or a version specifier "
        "such as '>=0.2,<0.3' (the highest matching v<x.y.z> tag)",
    )
    parser.add_argument(
        "--all-variants",
        action="store_true",
        help="verify every build variant, not only this machine's",
    )
    parser.add_argument(
        "--filter-unsigned", action="store_true", help="skip variants without a signature"
    )
    parser.add_argument(
        "--filter-no-digest",
        action="store_true",
        help="skip variants whose metadata.json is missing or has no file digests",
    )
    parser.add_argument(
        "--signer",
        action="append",
        default=[],
        metavar="WORKFLOW_URI",
        help="also accept builds signed by this GitHub workflow "
        "(https://github.com/ORG/REPO/.github/workflows/FILE.yaml@REF); repeatable",
    )
    add_repo_type_argument(parser)


def run(args: argparse.Namespace) -> int:
    from ..repos.download import fetch_kernel
    from ..repos.repo_id import check_repo_id
    from ..repos.signatures import Status, policies_with, verify_variant
    from ..repos.versions import resolve_revision

    repo_id = check_repo_id(args.repo_id, where="REPO")
    policies = policies_with(args.signer, where="--signer")
    version: str | int = int(args.version) if args.version.isdigit() else args.version
    resolved = resolve_revision(repo_id, version=version, repo_type=args.repo_type)
    if args.all_variants:
        variant_dirs = [
            fetch_kernel(resolved, variant=name).variant_dir for name in _offered(resolved)
        ]
    else:
        variant_dirs = [fetch_kernel(resolved).variant_dir]
    skipped = {
        Status.BUNDLE_MISSING: args.filter_unsigned,
        Status.METADATA_MISSING: args.filter_no_digest,
        Status.DIGEST_MISSING: args.filter_no_digest,
    }
    print(f"{repo_id} ({resolved.how}) at commit {resolved.commit or '?'}:")
    failed = False
    for variant_dir in variant_dirs:
        # Every file is hashed: a receipt in the cache is no evidence here.
        result = verify_variant(variant_dir, policies, trust_receipt=False)
        if result.ok:
            print(f"  ok       {result.summary()}")
        elif skipped.get(result.status):
            print(f"  skipped  {result.summary()}")
        else:
            print(f"  FAILED   {result.summary()}")
            failed = True
    return 1 if failed else 0


def _offered(resolved) -> list[str]:
    """Every variant the resolved commit offers, whether or not it runs here."""
    from ..repos.download import get_kernel_variants

    decisions = get_kernel_variants(
        resolved.repo_id,
        revision=resolved.commit or resolved.revision,
        repo_type=resolved.repo_type,
    )
    return [decision.variant.variant_str for decision in decisions]
