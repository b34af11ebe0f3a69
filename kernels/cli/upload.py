"""``kernels upload PATH --repo-id ID [--tag vX.Y.Z]``: publish a kernel repository on the Hub."""

from __future__ import annotations

import argparse
import fnmatch
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import CommandError, add_repo_type_argument

HELP = "publish a kernel repository folder on the Hub (optionally tagging a version)"
DESCRIPTION = """\
Where PATH holds a kernel's source (build.toml, torch-ext/) and its build script (its own
build.py, as `kernels init` writes it, or library/build.py for a repository of our library),
build/ is made afresh from the source first, in a staged copy of PATH (PATH is left as it is).
Check that as `kernels check` does, then upload it to the Hub repository ID with
huggingface_hub (creating it as a kernel repository, the Hub's type for kernels, if needed;
--repo-type model publishes to a model repository instead) in one commit, and with --tag create
the version tag v<major>.<minor>.<patch> on that commit. Bytecode, caches, virtual
environments and benchmark results are left out. Authenticate with `hf auth login` or HF_TOKEN;
HF_ENDPOINT selects the server."""
EPILOG = """\
examples:
  kernels upload . --repo-id my-org/fused-silu --dry-run
  kernels upload . --repo-id my-org/fused-silu --tag v0.1.0"""

IGNORE_PATTERNS = (
    ".git/*",
    "*/__pycache__/*",
    "__pycache__/*",
    "*.pyc",
    ".pytest_cache/*",
    ".ruff_cache/*",
    ".venv*/*",
    "benchmarks/results/*",
    ".DS_Store",
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH", type=Path, help="the kernel repository folder")
    parser.add_argument(
        "--repo-id", required=True, metavar="ID", help="the Hub repository, e.g. my-org/fused-silu"
    )
    parser.add_argument(
        "--tag", metavar="vX.Y.Z", help="create this version tag on the uploaded commit"
    )
    parser.add_argument("--branch", metavar="BRANCH", help="upload to this branch (default: main)")
    parser.add_argument("--private", action="store_true", help="create the repository as private")
    parser.add_argument("--message", "-m", help="the commit message")
    parser.add_argument(
        "--dry-run", action="store_true", help="check and list what would be uploaded; send nothing"
    )
    add_repo_type_argument(parser)


@dataclass(frozen=True)
class UploadPlan:
    """Everything `kernels upload` will send, decided before any HTTP call."""

    folder: Path
    repo_id: str
    files: tuple[str, ...]
    tag: str | None
    branch: str | None
    message: str
    repo_type: str = "kernel"
    #: The folder the user named, when `folder` is a staged copy of it with a fresh build.
    source: Path | None = None


def plan_upload(
    path: Path,
    repo_id: str,
    *,
    tag: str | None,
    branch: str | None,
    message: str | None,
    repo_type: str = "kernel",
    staging: Path | None = None,
) -> UploadPlan:
    """Validate the arguments and the repository, and list the files to upload.

    Where `path` holds a kernel's source and its build script (`_source_build.build_script`),
    the plan is for a copy of it under `staging` (which must outlive the upload) with
    ``build/`` made afresh; without `staging` such a folder is sent as it is.

    Raises:
        CommandError: a bad repo id or tag, a source that does not build, or a repository
            that fails `kernels check`.
    """
    import re

    from ..repos.repo_id import is_repo_id, shown
    from ..repos.versions import parse_version_tag
    from ._source_build import build_script, stage
    from .check import check_repository

    if "/" not in repo_id or not is_repo_id(repo_id):
        raise CommandError(
            f"--repo-id {shown(repo_id)}: write it as 'org/name' in ASCII letters, digits, '-', "
            "'_' and '.' (the Hub's repository ids)"
        )
    if tag is not None and (
        not re.fullmatch(r"v\d+\.\d+\.\d+\S*", tag) or parse_version_tag(tag) is None
    ):
        raise CommandError(
            f"--tag {tag!r} is not a version tag: write v<major>.<minor>.<patch> (e.g. v0.1.0, "
            "v1.2.0rc1) so that version specifiers can select it"
        )
    if not path.is_dir():
        raise CommandError(f"{path} is not a folder")
    source = None
    if staging is not None and build_script(path) is not None:
        source, path = path, stage(path, staging, _ignored)
    report = check_repository(path, where=str(source or path))
    failures = [text for status, text in report.lines if status == "FAIL"]
    if failures:
        raise CommandError(
            f"{path} fails `kernels check`; fix it first:\n  " + "\n  ".join(failures)
        )
    files = tuple(
        sorted(
            rel
            for p in path.rglob("*")
            if p.is_file() and not _ignored(rel := p.relative_to(path).as_posix())
        )
    )
    default = f"Upload kernel {repo_id}" + (f" {tag}" if tag else "")
    return UploadPlan(path, repo_id, files, tag, branch, message or default, repo_type, source)


def _ignored(relative: str) -> bool:
    return any(fnmatch.fnmatch(relative, pattern) for pattern in IGNORE_PATTERNS)


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="kernels-upload-") as staging:
        return _run(args, Path(staging))


def _run(args: argparse.Namespace, staging: Path) -> int:
    plan = plan_upload(
        args.path,
        args.repo_id,
        tag=args.tag,
        branch=args.branch,
        message=args.message,
        repo_type=args.repo_type,
        staging=staging,
    )
    if plan.source is not None:
        print(f"built {plan.source / 'build'} afresh from its source (in a staged copy)")
    target = f"{plan.repo_type} repository {plan.repo_id}" + (
        f" (branch {plan.branch})" if plan.branch else ""
    )
    print(
        f"{len(plan.files)} file(s) from {plan.source or plan.folder} -> {target}"
        + (f", tag {plan.tag}" if plan.tag else "")
    )
    for name in plan.files:
        print(f"  {name}")
    if args.dry_run:
        print("dry run: nothing was uploaded")
        return 0
    commit = upload(plan, private=args.private)
    print(f"uploaded commit {commit}" + (f", tagged {plan.tag}" if plan.tag else ""))
    return 0


def upload(plan: UploadPlan, *, private: bool = False) -> str:
    """Send `plan` with huggingface_hub; returns the new commit."""
    from ..repos import hubclient
    from ..repos.versions import hub_error

    repo_type = plan.repo_type
    hubclient.require_repo_type(repo_type, plan.repo_id)
    api = hubclient.hub_api()
    try:
        api.create_repo(plan.repo_id, private=private, exist_ok=True, repo_type=repo_type)
        if plan.branch:
            # The Hub commits only onto a branch that exists (a new vN branch, for int
            # versions, would otherwise be "revision not found"); it starts at main.
            api.create_branch(plan.repo_id, branch=plan.branch, exist_ok=True, repo_type=repo_type)
        info = api.upload_folder(
            folder_path=plan.folder,
            repo_id=plan.repo_id,
            repo_type=repo_type,
            revision=plan.branch,
            commit_message=plan.message,
            allow_patterns=list(plan.files),
        )
        commit = getattr(info, "oid", None) or str(info)
        if plan.tag:
            api.create_tag(
                plan.repo_id,
                tag=plan.tag,
                revision=commit,
                tag_message=plan.message,
                repo_type=repo_type,
            )
    except Exception as exc:
        raise hub_error(
            exc, plan.repo_id, f"upload {plan.folder} to {plan.repo_id}", repo_type
        ) from exc
    return commit
