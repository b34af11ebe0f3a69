"""``kernels._internals._versions``: which commit a version or revision of a Hub kernel
means, our `kernels.repos.versions` (`check_request`, `resolve_request`,
`resolve_from_cache`)."""

from __future__ import annotations

from huggingface_hub.hf_api import GitRefInfo

from kernels.repos.versions import check_request, resolve_from_cache, resolve_request
from tests.hf_suite.gaps import gaps_for

__getattr__ = gaps_for(__name__)


def resolve_version_spec_as_ref(repo_id: str, version_spec: int, local_files_only: bool):
    """The ref (branch ``vN``) that version `version_spec` of `repo_id` resolves to; with
    `local_files_only`, from the cached refs only (our `KernelOfflineError` when none is)."""
    request = check_request(repo_id, version=version_spec)
    if local_files_only:
        resolved = resolve_from_cache(
            request, reason="local_files_only=True was given, so the Hub is not asked."
        )
    else:
        resolved = resolve_request(request)
    return GitRefInfo(
        name=resolved.revision,
        ref=f"refs/heads/{resolved.revision}",
        target_commit=resolved.commit or resolved.revision,
    )
