"""Which commit of a Hub kernel repository a `revision` or `version` means.

* ``version="<PEP 440 specifier>"``: the highest tag ``v<major>.<minor>.<patch>`` (optionally
  with a pre-release, post-release or dev suffix, e.g. ``v0.2.0rc1``) that satisfies it. Other
  tags are ignored; pre-releases count only when the specifier names one (``>=0.2.0rc1``).
* ``version=N`` (an int): the branch ``vN``, the convention of newer Hub kernels.
* ``revision``: a branch, tag or full commit hash, taken as is.
* neither: the ``main`` branch, with a WARNING that the kernel is unpinned.

Repositories are of the Hub's ``kernel`` type unless ``repo_type="model"`` says otherwise
(`kernels.repos.hubclient`). Online, tags and branches come from huggingface_hub's
``list_repo_refs``. Offline
(``HF_HUB_OFFLINE=1``) or when the Hub cannot be reached, the answer comes from the refs
huggingface_hub cached when it last downloaded by a tag or branch name.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field, replace

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from ..errors import (
    KernelDownloadError,
    KernelOfflineError,
    KernelRepositoryNotFoundError,
    KernelRevisionError,
    KernelVersionSpecError,
)
from . import hubclient
from .bounded_json import quoted
from .hubclient import COMMIT_PATTERN, KERNEL_REPO_TYPE, MODEL_REPO_TYPE, Failure

logger = logging.getLogger(__name__)

#: Tags that are versions: ``v`` + major.minor.patch, optionally followed by a PEP 440
#: pre-, post- or dev-release suffix (``v1.2.3``, ``v1.2.3rc1``, ``v1.2.3.post1``).
VERSION_TAG_PATTERN = re.compile(
    r"^v(\d+\.\d+\.\d+(?:[-_.]?(?:a|b|rc|alpha|beta|c|pre|preview|post|dev)[-_.]?\d*)*)$"
)


@dataclass(frozen=True)
class RepoRefs:
    """The branches and tags of a repository, each with its commit."""

    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    def versions(self) -> dict[Version, str]:
        """Version tags by version (the highest tag name wins when two spell one version)."""
        found: dict[Version, str] = {}
        for name in sorted(self.tags):
            version = parse_version_tag(name)
            if version is not None:
                found[version] = name
        return found

    def version_branches(self) -> dict[int, str]:
        """Branches named ``v<N>``, by N."""
        return {int(name[1:]): name for name in self.branches if re.fullmatch(r"v\d+", name)}


@dataclass(frozen=True)
class ResolvedRevision:
    """What to download: a branch, tag or commit name, and the commit it stands for."""

    repo_id: str
    #: The name to download by: a tag or branch (so the cache records it for offline use)
    #: or a commit hash.
    revision: str
    #: The commit, when known before downloading (None only offline for a branch or tag
    #: that the cache resolves while downloading).
    commit: str | None
    #: How the revision was chosen, for logs and errors, e.g. "tag v0.1.2, the highest
    #: version satisfying >=0.1,<0.2".
    how: str
    #: True when the answer came from the cache because the Hub was off limits.
    from_cache: bool = False
    #: The Hub repository type: "kernel", or "model" for kernels published as models.
    repo_type: str = KERNEL_REPO_TYPE


def parse_version_tag(name: str) -> Version | None:
    """The version a tag like ``v1.2.3`` names, or None when the tag is not a version."""
    match = VERSION_TAG_PATTERN.match(name)
    if match is None:
        return None
    try:
        version = Version(match.group(1))
    except InvalidVersion:
        return None
    return None if version.local else version


#: The longest version specifier read: real ones are a few dozen characters.
MAX_VERSION_SPEC_LENGTH = 1000

#: The highest int version (the branch ``v<N>``): real ones are single digits.
MAX_VERSION_BRANCH = 2**31 - 1


def check_version_argument(version: object, *, repo_id: str) -> SpecifierSet | int | None:
    """Validate a `version` argument: None, an int N >= 0, or a PEP 440 specifier string.

    Any object may be given (it may come from a pyproject.toml or a lock file): whatever is
    not one of those raises the package's error.

    Raises:
        KernelVersionSpecError: anything else, including a malformed specifier, an int above
            `MAX_VERSION_BRANCH` or a string longer than `MAX_VERSION_SPEC_LENGTH`.
    """
    if version is None:
        return None
    if isinstance(version, bool) or not isinstance(version, (int, str)):
        raise KernelVersionSpecError(
            f"{repo_id}: version must be a PEP 440 specifier string such as '>=0.1,<0.2' or an "
            f"int N for the branch vN, got {quoted(version)}."
        )
    if isinstance(version, int):
        if not 0 <= version <= MAX_VERSION_BRANCH:
            raise KernelVersionSpecError(
                f"{repo_id}: version={quoted(version)} names no branch; an int version N means "
                f"the branch vN and must be from 0 to {MAX_VERSION_BRANCH}."
            )
        return version
    if not version.strip():
        raise KernelVersionSpecError(
            f"{repo_id}: version is an empty string; give a specifier such as '>=0.1,<0.2', or "
            "version=None to follow main."
        )
    if len(version) > MAX_VERSION_SPEC_LENGTH:
        raise KernelVersionSpecError(
            f"{repo_id}: version is a string of {len(version)} characters, {quoted(version)}; "
            f"a specifier may be at most {MAX_VERSION_SPEC_LENGTH}, e.g. '>=0.1,<0.2'."
        )
    try:
        return SpecifierSet(version)
    except InvalidSpecifier:
        hint = ""
        try:
            bare = Version(version.strip().lstrip("v"))
            hint = f" For exactly that version write '=={bare}', for its patch releases '~={bare}'."
        except InvalidVersion:
            pass
        raise KernelVersionSpecError(
            f"{repo_id}: version={quoted(version)} is not a PEP 440 version specifier; write "
            f"bounds such as '>=0.1,<0.2' or '==0.1.*'.{hint}"
        ) from None


def list_refs(repo_id: str, repo_type: str = KERNEL_REPO_TYPE) -> RepoRefs:
    """Branches and tags of `repo_id` on the Hub (one ``list_repo_refs`` call).

    Raises:
        KernelHubUnsupportedError: a kernel-type repository and a huggingface_hub < 1.10.
        KernelRepositoryNotFoundError: the repository does not exist or is not accessible.
        KernelOfflineError: offline mode, or the Hub cannot be reached.
        KernelDownloadError: any other failure.
    """
    if hubclient.is_offline():
        reason = "HF_HUB_OFFLINE is set, so the Hub is not asked."
        raise KernelOfflineError(
            f"Cannot list the versions of {repo_id}: {reason} Unset HF_HUB_OFFLINE (or set it "
            "to 0) and run again.",
            reason=reason,
        )
    hubclient.require_repo_type(repo_type, repo_id)
    try:
        refs = hubclient.hub_api().list_repo_refs(repo_id, repo_type=repo_type)
    except Exception as exc:
        error = hub_error(exc, repo_id, f"list the branches and tags of {repo_id}", repo_type)
        if isinstance(error, KernelRepositoryNotFoundError):
            error = KernelRepositoryNotFoundError(f"{error}{_other_type_hint(repo_id, repo_type)}")
        raise error from exc
    return RepoRefs(
        branches={b.name: b.target_commit for b in refs.branches},
        tags={t.name: t.target_commit for t in refs.tags},
    )


def _other_type_hint(repo_id: str, repo_type: str) -> str:
    """Where a repository was not found: does one of the other type exist? (One more call.)

    Never followed silently: the two could hold different code, so the user chooses.
    """
    other = MODEL_REPO_TYPE if repo_type == KERNEL_REPO_TYPE else KERNEL_REPO_TYPE
    if other == KERNEL_REPO_TYPE and not hubclient.supports_kernel_repo_type():
        return ""
    try:
        hubclient.hub_api().list_repo_refs(repo_id, repo_type=other)
    except Exception:
        return ""
    return (
        f" A {other} repository named {repo_id} exists: if it holds this kernel, ask for it "
        f"with repo_type={other!r} (docs/hub.md#repository-types)."
    )


def hub_error(
    exc: BaseException, repo_id: str, doing: str, repo_type: str = KERNEL_REPO_TYPE
) -> Exception:
    """Turn a huggingface_hub exception into the `kernels` error that says what to do.

    `doing` completes "while trying to ...", e.g. "download org/name at v0.1.0".
    """
    failure = hubclient.classify(exc)
    where = hubclient.endpoint()
    kind = "Kernel repository" if repo_type == KERNEL_REPO_TYPE else "Model repository"
    if failure in (Failure.NOT_FOUND, Failure.ENTRY_NOT_FOUND):
        # A 404 from a repository-level call: some servers (olah) do not say "repository".
        return KernelRepositoryNotFoundError(
            f"{kind} {repo_id} was not found on {where} (while trying to {doing}). "
            "Check the repository id; if it is private or gated, log in with `hf auth login` or "
            "set HF_TOKEN."
        )
    if failure is Failure.ACCESS_DENIED:
        return KernelRepositoryNotFoundError(
            f"Access to {kind.lower()} {repo_id} on {where} was denied (while trying to "
            f"{doing}): it is private or gated. Log in with `hf auth login` or set HF_TOKEN to "
            f"a token that may read it. ({hubclient.describe(exc)})"
        )
    if failure is Failure.UNREACHABLE:
        # Only the Hub can answer here (the loaders catch this error and ask the cache
        # themselves), so the fix is reaching the Hub, not prefetching.
        if hubclient.is_offline():
            reason = "HF_HUB_OFFLINE is set, so the Hub is not asked."
            fix = "Unset HF_HUB_OFFLINE (or set it to 0) and run again."
        else:
            reason = f"{where} cannot be reached ({hubclient.describe(exc)})."
            fix = f"Check the connection to {where} (HF_ENDPOINT) and run again."
        return KernelOfflineError(f"Could not {doing}: {reason} {fix}", reason=reason)
    return KernelDownloadError(f"Could not {doing} on {where}: {hubclient.describe(exc)}")


@dataclass(frozen=True)
class Request:
    """A checked request for a revision of a Hub repository (`check_request`)."""

    repo_id: str
    repo_type: str
    #: The branch, tag or full commit hash asked for ("main" when neither a revision nor a
    #: version was given); None for a version.
    revision: str | None
    wanted: SpecifierSet | int | None
    #: The version as the caller wrote it, for messages (SpecifierSet reorders it).
    shown: str

    @property
    def asked(self) -> str:
        """What was asked, in one line: the key of its resolution (`kernels.repos.load_locks`)."""
        if self.revision is not None:
            if COMMIT_PATTERN.match(self.revision):
                return f"commit={self.revision}"
            return f"revision={self.revision!r}"
        if isinstance(self.wanted, int):
            return f"version={self.wanted} (branch v{self.wanted})"
        return f"version={self.wanted}"

    def admits(self, name: str) -> bool:
        """Whether the branch or tag `name` is one this request may resolve to."""
        if self.revision is not None:
            return name == self.revision
        if isinstance(self.wanted, int):
            return name == f"v{self.wanted}"
        assert isinstance(self.wanted, SpecifierSet)
        version = parse_version_tag(name)
        return version is not None and self.wanted.contains(
            version, prereleases=bool(self.wanted.prereleases)
        )


def check_request(
    repo_id: str,
    *,
    revision: str | None = None,
    version: str | int | None = None,
    repo_type: str = KERNEL_REPO_TYPE,
) -> Request:
    """Validate what is asked of `repo_id`, without any Hub call; warn when it is unpinned.

    Raises:
        KernelVersionSpecError: both `revision` and `version`, or a malformed `version`.
        KernelRevisionError: a `revision` that is no name.
        KernelHubUnsupportedError: a kernel-type repository and a huggingface_hub < 1.10.
    """
    if revision is not None and version is not None:
        raise KernelVersionSpecError(
            f"{repo_id}: got both revision={revision!r} and version={version!r}; give one of them."
        )
    wanted = check_version_argument(version, repo_id=repo_id)
    if revision is not None and (not isinstance(revision, str) or not revision.strip()):
        raise KernelRevisionError(
            f"{repo_id}: revision must be a branch, tag or commit name, got {revision!r}."
        )
    hubclient.require_repo_type(repo_type, repo_id)
    if revision is None and wanted is None:
        logger.warning(
            "Kernel %s is unpinned: loading the main branch, which its authors may change "
            "incompatibly at any time. Pin it with version='>=X.Y,<X.Z' (or revision=...).",
            repo_id,
        )
        revision = "main"
    shown = version.strip() if isinstance(version, str) else str(wanted)
    return Request(repo_id, repo_type, revision, wanted, shown)


def require_pin(
    repo_id: str,
    *,
    revision: object,
    version: object,
    error: type[Exception] = KernelVersionSpecError,
    repository: bool = False,
) -> None:
    """Refuse a request for a Hub kernel that names neither a version nor a revision (as
    Hugging Face's client does since 0.19: ``main`` may change incompatibly at any time).
    Its message opens with the sentence of theirs for the same case: a repository's
    (`repository`) or a function's.

    Raises:
        error (a ValueError): neither was given; the message says how to pin.
    """
    if revision is None and version is None:
        opening = (
            "Either a revision or a version must be specified"
            if repository
            else "A kernel version or revision must be specified"
        )
        raise error(
            f"{opening} ({repo_id}). Use version=N for the stable API branch vN (e.g. "
            "version=1), version='>=0.1,<0.2' for the highest v<x.y.z> tag in a range, or "
            "revision='<branch, tag or commit>' (revision='main' for the main branch, which "
            "may change incompatibly at any time)."
        )


#: The module of transformers 4.x that builds its default mapping when it is imported, from
#: repositories that name no version (it predates the rule of 0.19).
_TRANSFORMERS_4_MAPPING_MODULE = "transformers.integrations.hub_kernels"


def made_by_transformers_4_default_mapping(depth: int = 3) -> bool:
    """Whether the repository being constructed is one of transformers 4.x's default mapping.

    transformers 4.57 (which pins no `kernels`) writes ``LayerRepository(repo_id=...,
    layer_name=...)`` without a version at import time and catches only ImportError there:
    refusing those would make every model module that imports its decorators fail to import.
    Only a caller frame in that module, on a transformers older than 5, qualifies.
    """
    import sys

    frame = sys._getframe(1)
    for _ in range(depth):
        frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            return False
        if frame.f_globals.get("__name__") == _TRANSFORMERS_4_MAPPING_MODULE:
            transformers = sys.modules.get("transformers")
            version = getattr(transformers, "__version__", "")
            return version.split(".", 1)[0].isdecimal() and int(version.split(".", 1)[0]) < 5
    return False


#: When set to 1/on/yes/true, every Hub kernel resolves to its newest numbered version (the
#: highest branch ``v<N>``), whatever was asked or locked (Hugging Face's client, 0.19).
ALL_LATEST_ENV = "UNSTABLE_KERNELS_ALL_LATEST"


def all_latest() -> bool:
    """Whether `ALL_LATEST_ENV` is set: numbered versions override requests and lock pins."""
    return os.environ.get(ALL_LATEST_ENV, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def resolve_latest(
    repo_id: str, *, asked: str, repo_type: str = KERNEL_REPO_TYPE, local_files_only: bool = False
) -> ResolvedRevision:
    """The newest numbered version of `repo_id` (its highest ``v<N>`` branch), for
    `ALL_LATEST_ENV`: from the Hub, or from the refs of the cache when offline, with
    `local_files_only`, or when the Hub cannot be reached. Logs a WARNING naming what it
    overrides (`asked`).

    Raises:
        KernelRevisionError (a ValueError): the repository has no numbered version.
        KernelRepositoryNotFoundError, KernelDownloadError: as `list_refs`.
    """
    from_cache = local_files_only or hubclient.is_offline()
    if not from_cache:
        hubclient.require_repo_type(repo_type, repo_id)
        try:
            branches = list_refs(repo_id, repo_type).branches
        except KernelOfflineError:
            from_cache = True
    if from_cache:
        branches = hubclient.cached_refs(repo_id, repo_type)
    numbered = {int(n[1:]): n for n in branches if re.fullmatch(r"v\d+", n) and len(n) < 12}
    if not numbered:
        where = "in the local cache" if from_cache else f"on {hubclient.endpoint()}"
        raise KernelRevisionError(
            f"Cannot load the latest version of {repo_id}: it has no numbered version "
            f"(branch v<N>) {where}, and {ALL_LATEST_ENV} is set, which requires one. Unset "
            f"{ALL_LATEST_ENV} to load what was asked ({asked})."
        )
    branch = numbered[max(numbered)]
    commit = branches[branch]
    logger.warning(
        "%s is enabled: overriding requested %s and any lockfile pin for '%s' with %s (%s). "
        "Kernel API changes may break your code.",
        ALL_LATEST_ENV,
        asked,
        repo_id,
        branch,
        commit,
    )
    how = f"branch {branch}, the latest version ({ALL_LATEST_ENV})"
    return ResolvedRevision(
        repo_id, branch, commit, how, from_cache=from_cache, repo_type=repo_type
    )


def resolve_revision(
    repo_id: str,
    *,
    revision: str | None = None,
    version: str | int | None = None,
    from_cache: bool = True,
    repo_type: str = KERNEL_REPO_TYPE,
) -> ResolvedRevision:
    """Decide which branch, tag or commit of `repo_id` (a repository of `repo_type`) to load.

    With `from_cache` (the default), offline or with the Hub unreachable the refs in the
    cache answer; without it, only the Hub does (`kernels lock` must not pin what an old
    cache remembers).

    Raises:
        KernelVersionSpecError: both `revision` and `version`, or a malformed `version`.
        KernelRevisionError: nothing matches; the message lists the versions and branches
            that exist.
        KernelRepositoryNotFoundError, KernelOfflineError, KernelDownloadError: as `list_refs`.
    """
    request = check_request(repo_id, revision=revision, version=version, repo_type=repo_type)
    return resolve_request(request, from_cache=from_cache)


def resolve_request(request: Request, *, from_cache: bool = True) -> ResolvedRevision:
    """`resolve_revision` for a request `check_request` has validated."""
    repo_id, repo_type, revision = request.repo_id, request.repo_type, request.revision
    if revision is not None and COMMIT_PATTERN.match(revision):
        # A commit is immutable: nothing to resolve, and no Hub call needed.
        return ResolvedRevision(
            repo_id, revision, revision, f"commit {revision}", repo_type=repo_type
        )
    try:
        refs = list_refs(repo_id, repo_type)
    except KernelOfflineError as offline:
        if not from_cache:
            raise
        return _resolve_from_cache(
            repo_id, repo_type, revision, request.wanted, offline, request.shown
        )
    return replace(
        _resolve(repo_id, revision, request.wanted, refs, request.shown), repo_type=repo_type
    )


def resolve_from_cache(request: Request, *, reason: str) -> ResolvedRevision:
    """`resolve_request` without the Hub (``local_files_only``): a commit as it is, a branch
    or tag by name (the cache finds it when downloading), a version from the cached refs.

    Raises:
        KernelOfflineError: no cached ref satisfies a version; `reason` says why only the
            cache was asked.
    """
    repo_id, repo_type, revision = request.repo_id, request.repo_type, request.revision
    if revision is not None:
        commit = revision if COMMIT_PATTERN.match(revision) else None
        how = f"commit {revision}" if commit else f"{revision} (resolved from the cache)"
        return ResolvedRevision(
            repo_id, revision, commit, how, from_cache=commit is None, repo_type=repo_type
        )
    offline = KernelOfflineError(reason, reason=reason)
    return _resolve_from_cache(repo_id, repo_type, None, request.wanted, offline, request.shown)


def _resolve(
    repo_id: str,
    revision: str | None,
    wanted: SpecifierSet | int | None,
    refs: RepoRefs,
    shown: str,
) -> ResolvedRevision:
    if revision is not None:
        if revision in refs.branches:
            return ResolvedRevision(
                repo_id, revision, refs.branches[revision], f"branch {revision}"
            )
        if revision in refs.tags:
            return ResolvedRevision(repo_id, revision, refs.tags[revision], f"tag {revision}")
        raise KernelRevisionError(
            f"{repo_id} has no branch or tag named {revision!r}. {_what_exists(refs)} A "
            "commit must be given as its full 40-character hash."
        )
    if isinstance(wanted, int):
        branch = f"v{wanted}"
        if branch not in refs.branches:
            raise KernelRevisionError(
                f"{repo_id} has no branch {branch} (version={wanted} selects the branch "
                f"v{wanted}). {_what_exists(refs)}"
            )
        return ResolvedRevision(repo_id, branch, refs.branches[branch], f"branch {branch}")

    assert isinstance(wanted, SpecifierSet)
    versions = refs.versions()
    best = best_version(versions, wanted)
    if best is None:
        raise KernelRevisionError(
            f"No version of {repo_id} satisfies {shown!r}. {_what_exists(refs)}"
            + _prerelease_hint(versions, wanted)
        )
    tag = versions[best]
    return ResolvedRevision(
        repo_id, tag, refs.tags[tag], f"tag {tag}, the highest version satisfying {shown!r}"
    )


def best_version(versions: dict[Version, str], wanted: SpecifierSet) -> Version | None:
    """The highest of `versions` that satisfies `wanted`; pre-releases only when it names one."""
    allowed = list(wanted.filter(versions, prereleases=bool(wanted.prereleases)))
    return max(allowed) if allowed else None


def _prerelease_hint(versions: dict[Version, str], wanted: SpecifierSet) -> str:
    if any(wanted.contains(v, prereleases=True) for v in versions if v.is_prerelease):
        return (
            " Pre-releases satisfy it, but are only chosen when the specifier names one "
            "(e.g. '>=0.2.0rc1')."
        )
    return ""


def _what_exists(refs: RepoRefs) -> str:
    versions = sorted(refs.versions())
    shown = ", ".join(str(v) for v in versions) or "none"
    branches = ", ".join(sorted(refs.branches)) or "none"
    other_tags = sorted(t for t in refs.tags if parse_version_tag(t) is None)
    others = f" Other tags: {', '.join(other_tags)}." if other_tags else ""
    return f"Versions (tags v<x.y.z>): {shown}. Branches: {branches}.{others}"


def _resolve_from_cache(
    repo_id: str,
    repo_type: str,
    revision: str | None,
    wanted: SpecifierSet | int | None,
    offline: KernelOfflineError,
    shown: str,
) -> ResolvedRevision:
    """Answer from the refs huggingface_hub cached, when the Hub is off limits."""
    cached = hubclient.cached_refs(repo_id, repo_type)
    reason = offline.reason
    name = revision if revision is not None else f"v{wanted}" if isinstance(wanted, int) else None
    if name is not None:
        if name in cached:
            logger.info(
                "%s: the Hub is off limits; using the cached %s -> %s",
                repo_id,
                name,
                cached[name][:12],
            )
            return ResolvedRevision(
                repo_id,
                name,
                cached[name],
                f"{name} (resolved from the cache)",
                from_cache=True,
                repo_type=repo_type,
            )
        raise KernelOfflineError(
            f"{reason} The cache has never resolved {name!r} of {repo_id}"
            f"{_cached_names(cached)}.{cached_other_type_hint(repo_id, repo_type)} "
            f"{hubclient.offline_hint()}"
        )

    assert isinstance(wanted, SpecifierSet)
    versions = {v: n for n in sorted(cached) if (v := parse_version_tag(n)) is not None}
    best = best_version(versions, wanted)
    if best is None:
        raise KernelOfflineError(
            f"{reason} No version of {repo_id} satisfying {shown!r} is in "
            f"the cache{_cached_names(cached)}.{cached_other_type_hint(repo_id, repo_type)} "
            f"{hubclient.offline_hint()}"
        )
    tag = versions[best]
    logger.warning(
        "%s: the Hub is off limits; using %s, the highest cached version satisfying %r "
        "(a newer one may exist on the Hub)",
        repo_id,
        tag,
        shown,
    )
    return ResolvedRevision(
        repo_id,
        tag,
        cached[tag],
        f"tag {tag}, the highest cached version satisfying {shown!r}",
        from_cache=True,
        repo_type=repo_type,
    )


def cached_other_type_hint(repo_id: str, repo_type: str) -> str:
    """Offline: say so when the cache holds the other repository type of the same name."""
    other = MODEL_REPO_TYPE if repo_type == KERNEL_REPO_TYPE else KERNEL_REPO_TYPE
    if not hubclient.cached_refs(repo_id, other) and not hubclient.cached_commits(repo_id, other):
        return ""
    return (
        f" The cache does hold {repo_id} as a {other} repository (downloaded before kernels "
        f"became their own repository type?): to use it, ask for it with repo_type={other!r}."
    )


def _cached_names(cached: dict[str, str]) -> str:
    if not cached:
        return " (nothing of it is cached)"
    return f" (cached: {', '.join(sorted(cached))})"
