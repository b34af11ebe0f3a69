"""Downloading kernel repositories from the Hub into huggingface_hub's cache, and importing them.

`get_kernel` is the function API; `LayerRepository.load()` and the lock-based loaders
(`kernels.repos.lock`) go through the same steps:

1. trust: refuse code from organisations that are not trusted (`kernels.repos.trust`);
2. resolve `revision` / `version` to a branch, tag or commit (`kernels.repos.versions`);
3. list the files at that commit and choose the build variant for this machine;
4. ``snapshot_download`` only that variant (``allow_patterns``), with huggingface_hub's
   cache, file locks and progress bars;
5. import the package once per downloaded folder, i.e. per commit and variant.

Offline (``HF_HUB_OFFLINE=1``) or with the Hub unreachable, steps 2-4 are answered from the
cache when it can; otherwise the error says what is missing and how to fetch it.

Every call names the repository type: ``"kernel"`` (the Hub's kernel repositories, the
default) or ``"model"`` (kernels still published as models); the two are never tried one
after the other, since they could hold different code (docs/hub.md#repository-types).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from ..errors import (
    BuildVariantNotFoundError,
    KernelLoadError,
    KernelOfflineError,
    KernelRevisionError,
)
from . import hubclient
from .hashing import verify_variant
from .hubclient import COMMIT_PATTERN, KERNEL_REPO_TYPE, Failure
from .info import RepoInfo
from .layout import PackageLocation, locate_package, read_preference
from .loaded import record_origin
from .loader import import_package
from .repo_id import check_repo_id
from .trust import TrustArgument, TrustDecision, normalize_trust, require_trust
from .variants import (
    PREFERENCE_FILE,
    VariantDecision,
    allow_patterns,
    choose_variant,
    decide_variants,
    read_preference_file,
    variants_in,
)
from .versions import (
    ResolvedRevision,
    cached_other_type_hint,
    hub_error,
    list_refs,
    resolve_revision,
)

logger = logging.getLogger(__name__)

#: Where, inside a repository's cache folder, we note the files of each variant we download
#: (``<commit>/<variant>.json``), so an interrupted download is not mistaken offline for a
#: complete one. huggingface_hub 0.x cannot tell them apart when offline; 1.x and later
#: can, and we ask it too.
_FILE_LISTS = ".kernels-files"


@dataclass(frozen=True)
class FetchedKernel:
    """A kernel repository's variant in the cache, ready to import."""

    repo_id: str
    resolved: ResolvedRevision
    commit: str
    variant: str
    snapshot_dir: Path
    location: PackageLocation
    #: The files of the variant (paths relative to ``build/<variant>/``) when known.
    files: tuple[str, ...] | None = None

    @property
    def variant_dir(self) -> Path:
        return self.snapshot_dir / "build" / self.variant

    @property
    def repo_type(self) -> str:
        return self.resolved.repo_type


@dataclass(frozen=True)
class LoadedHubKernel:
    """An imported Hub kernel and everything that was decided on the way."""

    module: ModuleType
    fetched: FetchedKernel
    trust: TrustDecision

    def describe(self) -> str:
        fetched = self.fetched
        return (
            f"{fetched.repo_id} ({fetched.resolved.how}) at commit {fetched.commit[:12]}, "
            f"variant {fetched.variant}"
        )


def package_name_for(repo_id: str) -> str:
    """The package name Hub kernels conventionally use: the repository name, ``-`` -> ``_``."""
    return re.sub(r"\W", "_", repo_id.split("/")[-1].replace("-", "_"))


def get_kernel(
    repo_id: str,
    revision: str | None = None,
    version: str | int | None = None,
    *,
    trust_remote_code: bool | list[str] = False,
    user_agent: str | dict | None = None,
    repo_type: str = KERNEL_REPO_TYPE,
) -> ModuleType:
    """Download (if needed) and import a kernel from the Hub.

    Only the build variant this machine runs is downloaded, into huggingface_hub's cache
    (``HF_HUB_CACHE``); importing the same commit again returns the same module, and two
    versions of one kernel can be loaded side by side.

    Args:
        repo_id: the Hub repository, e.g. ``"kernels-community/activation"``.
        revision: a branch, tag or full commit hash. Cannot be combined with `version`.
        version: a PEP 440 specifier (the highest ``v<x.y.z>`` tag satisfying it) or an int N
            (the branch ``vN``). With neither, ``main`` is loaded and a WARNING says so.
        trust_remote_code: allow code from organisations that are not trusted by default or
            configuration: True for any, or a list of organisations / repository ids.
        user_agent: extra user-agent information for the download requests (as
            huggingface_hub's ``snapshot_download`` takes it).
        repo_type: ``"kernel"`` (the Hub's kernel repositories) or ``"model"`` for a kernel
            still published as a model repository (an old mirror or a private Hub).

    Raises:
        UntrustedKernelError, KernelRepositoryNotFoundError, KernelRevisionError,
        KernelVersionSpecError, BuildVariantNotFoundError, KernelOfflineError,
        KernelHubUnsupportedError, KernelDownloadError: all `KernelLoadError` subclasses;
        see docs/hub.md.

    Example:
        ```python
        from kernels import get_kernel

        activation = get_kernel("kernels-community/activation", version=">=0.1,<0.2")
        y = activation.silu_and_mul(x)
        ```
    """
    return load_hub_kernel(
        repo_id,
        revision=revision,
        version=version,
        trust_remote_code=trust_remote_code,
        user_agent=user_agent,
        repo_type=repo_type,
    ).module


def load_hub_kernel(
    repo_id: str,
    *,
    revision: str | None = None,
    version: str | int | None = None,
    trust_remote_code: TrustArgument | list[str] = False,
    user_agent: str | dict | None = None,
    repo_type: str = KERNEL_REPO_TYPE,
) -> LoadedHubKernel:
    """`get_kernel`, returning what was resolved, downloaded and trusted along with the module."""
    _check_repo_id(repo_id, repo_type)
    trust = require_trust(repo_id, normalize_trust(trust_remote_code))
    resolved = resolve_revision(repo_id, revision=revision, version=version, repo_type=repo_type)
    fetched = fetch_kernel(resolved, user_agent=user_agent)
    loaded = import_fetched(fetched, trust)
    logger.info("Loaded kernel %s; %s", loaded.describe(), trust.reason)
    return loaded


def import_fetched(fetched: FetchedKernel, trust: TrustDecision) -> LoadedHubKernel:
    """Import a fetched (and, for locks, verified) kernel and record where it came from."""
    location = fetched.location
    module = import_package(location.package_dir, location.package_name)
    record_origin(
        location.package_dir, RepoInfo(fetched.repo_id, fetched.commit, fetched.repo_type)
    )
    return LoadedHubKernel(module, fetched, trust)


def has_kernel(
    repo_id: str,
    revision: str | None = None,
    version: str | int | None = None,
    *,
    repo_type: str = KERNEL_REPO_TYPE,
) -> bool:
    """Whether `repo_id` has a build variant this machine can run, without downloading it.

    Returns False only when the repository offers no variant for this machine; a missing
    repository, revision or version raises as `get_kernel` does. Offline, the answer comes
    from the cache. `repo_type` is as for `get_kernel`.
    """
    _check_repo_id(repo_id, repo_type)
    resolved = resolve_revision(repo_id, revision=revision, version=version, repo_type=repo_type)
    try:
        if hubclient.is_offline() or resolved.from_cache:
            reason = (
                "HF_HUB_OFFLINE is set" if hubclient.is_offline() else "the Hub cannot be reached"
            )
            _fetch_from_cache(resolved, reason=reason)
        else:
            try:
                _choose_remote_variant(resolved)
            except KernelOfflineError as exc:
                # As get_kernel does: an unreachable Hub is answered from the cache if it can.
                _fetch_from_cache(resolved, reason=getattr(exc, "reason", str(exc)))
    except BuildVariantNotFoundError:
        return False
    return True


def get_kernel_variants(
    repo_id: str,
    revision: str | None = None,
    version: str | int | None = None,
    *,
    repo_type: str = KERNEL_REPO_TYPE,
) -> list[VariantDecision]:
    """Which build variants of a Hub kernel run on this machine, and why the others do not.

    Nothing is downloaded: the decision comes from the file listing at the resolved revision
    (offline, from the cached variants). Accepted variants come first, best first (their
    `rank` 0 is the one `get_kernel` loads); rejected ones carry the `reason`.

    Example:
        ```python
        from kernels import VariantAccepted, get_kernel_variants

        for decision in get_kernel_variants("kernels-community/activation", version=1):
            name = decision.variant.variant_str
            if isinstance(decision, VariantAccepted):
                print(f"{name}: runs here")
            else:
                print(f"{name}: rejected ({decision.reason})")
        ```
    """
    _check_repo_id(repo_id, repo_type)
    resolved = resolve_revision(repo_id, revision=revision, version=version, repo_type=repo_type)
    if not (hubclient.is_offline() or resolved.from_cache):
        try:
            offered, prefer, _ = _remote_listing(resolved)
            return decide_variants(offered, prefer=prefer)
        except KernelOfflineError:
            pass  # as get_kernel does: an unreachable Hub is answered from the cache
    snapshot = _cached_snapshot(resolved, reason="the Hub cannot be asked")
    build = snapshot / "build"
    cached = [p.name for p in build.iterdir() if p.is_dir()] if build.is_dir() else []
    where = f"{repo_id} ({resolved.how})"
    return decide_variants(cached, prefer=read_preference(snapshot, where=where))


def install_kernel(
    repo_id: str,
    revision: str,
    local_files_only: bool = False,
    variant_locks: Mapping[str, object] | None = None,
    *,
    trust_remote_code: bool | list[str] = False,
    repo_type: str = KERNEL_REPO_TYPE,
) -> tuple[str, Path]:
    """Download a kernel's variant for this machine into the cache, without importing it.

    Args:
        repo_id: the Hub repository.
        revision: a branch, tag or full commit hash.
        local_files_only: only look in the cache.
        variant_locks: the ``variants`` of a lock entry (variant -> ``{"hash": ...}``); when
            given, the downloaded files are verified against it.
        trust_remote_code: as for `get_kernel`.
        repo_type: as for `get_kernel`.

    Returns:
        The package name and the variant folder (``.../build/<variant>``).
    """
    _check_repo_id(repo_id, repo_type)
    require_trust(repo_id, normalize_trust(trust_remote_code))
    if local_files_only:
        hubclient.require_repo_type(repo_type, repo_id)
        resolved = ResolvedRevision(
            repo_id,
            revision,
            revision if COMMIT_PATTERN.match(revision) else None,
            revision,
            repo_type=repo_type,
        )
        fetched = _fetch_from_cache(resolved, reason="local_files_only=True")
    else:
        fetched = fetch_kernel(resolve_revision(repo_id, revision=revision, repo_type=repo_type))
    if variant_locks is not None:
        verify_variant(
            fetched.variant_dir,
            variant_locks,
            repo_id=repo_id,
            commit=fetched.commit,
            variant=fetched.variant,
            files=None,
        )
    return fetched.location.package_name, fetched.variant_dir


def fetch_kernel(
    resolved: ResolvedRevision,
    *,
    variant: str | None = None,
    local_files_only: bool = False,
    user_agent: str | dict | None = None,
) -> FetchedKernel:
    """Make the variant of `resolved` for this machine (or `variant`) present in the cache."""
    if local_files_only or hubclient.is_offline():
        return _fetch_from_cache(
            resolved,
            variant=variant,
            reason="local_files_only=True" if local_files_only else "HF_HUB_OFFLINE is set",
        )
    if resolved.from_cache:
        return _fetch_from_cache(resolved, variant=variant, reason="the Hub cannot be reached")
    try:
        chosen, files = _choose_remote_variant(resolved, variant=variant)
    except KernelOfflineError as exc:
        reason = getattr(exc, "reason", str(exc))
        logger.warning("%s: %s Trying the cache.", resolved.repo_id, reason)
        return _fetch_from_cache(resolved, variant=variant, reason=reason)
    return _download(resolved, chosen, files, user_agent=user_agent)


def _remote_listing(resolved: ResolvedRevision) -> tuple[list[str], str, list[str]]:
    """The variants at the resolved revision, the repository's preference and all its files."""
    repo_id = resolved.repo_id
    revision = resolved.commit or resolved.revision
    where = f"{repo_id} ({resolved.how})"
    api = hubclient.hub_api()
    try:
        repo_files = api.list_repo_files(repo_id, revision=revision, repo_type=resolved.repo_type)
    except Exception as exc:
        raise _revision_error(exc, resolved, f"list the files of {where}") from exc

    offered = variants_in(
        {p.split("/")[1] for p in repo_files if p.startswith("build/") and p.count("/") >= 2}
    )
    prefer = "compiled"
    if PREFERENCE_FILE in repo_files:
        from huggingface_hub import hf_hub_download

        try:
            path = hf_hub_download(
                repo_id, PREFERENCE_FILE, revision=revision, repo_type=resolved.repo_type
            )
        except Exception as exc:
            raise hub_error(
                exc, repo_id, f"download {PREFERENCE_FILE} of {where}", resolved.repo_type
            ) from exc
        prefer = read_preference_file(path, where=where)
    return offered, prefer, repo_files


def _choose_remote_variant(
    resolved: ResolvedRevision, *, variant: str | None = None
) -> tuple[str, tuple[str, ...]]:
    """List the files at the resolved revision and pick the variant (no download)."""
    where = f"{resolved.repo_id} ({resolved.how})"
    offered, prefer, repo_files = _remote_listing(resolved)
    if variant is None:
        variant = choose_variant(offered, where=where, prefer=prefer)
    elif variant not in offered:
        raise BuildVariantNotFoundError(
            f"{where} has no build variant {variant}. It offers: {', '.join(offered) or 'none'}."
        )
    prefix = f"build/{variant}/"
    files = tuple(sorted(p[len(prefix) :] for p in repo_files if p.startswith(prefix)))
    return variant, files


def _revision_error(exc: BaseException, resolved: ResolvedRevision, doing: str) -> Exception:
    """A listing or download at a revision failed: say whether the repo or the revision is missing."""
    failure = hubclient.classify(exc)
    if failure in (
        Failure.NOT_FOUND,
        Failure.ENTRY_NOT_FOUND,
        Failure.REVISION_NOT_FOUND,
        Failure.ACCESS_DENIED,
    ):
        # Some servers answer "repository not found" for a revision that does not exist.
        try:
            refs = list_refs(resolved.repo_id, resolved.repo_type)
        except KernelLoadError as repo_error:
            return repo_error
        branches = ", ".join(sorted(refs.branches)) or "none"
        tags = ", ".join(sorted(refs.tags)) or "none"
        return KernelRevisionError(
            f"{resolved.repo_id} has no revision {resolved.revision!r}. Branches: {branches}. "
            f"Tags: {tags}."
        )
    return hub_error(exc, resolved.repo_id, doing, resolved.repo_type)


def _download(
    resolved: ResolvedRevision,
    variant: str,
    files: tuple[str, ...],
    *,
    user_agent: str | dict | None = None,
) -> FetchedKernel:
    from huggingface_hub import snapshot_download

    repo_id = resolved.repo_id
    where = f"{repo_id} ({resolved.how})"
    logger.debug("downloading %s, variant %s (%d files)", where, variant, len(files))
    if resolved.commit is not None:
        # Written before downloading: if the download is interrupted, the cache answers
        # offline with an incomplete variant, and this list shows what is missing.
        _record_files(resolved, resolved.commit, variant, files)
    try:
        snapshot = Path(
            snapshot_download(
                repo_id,
                revision=resolved.revision,
                repo_type=resolved.repo_type,
                allow_patterns=allow_patterns([variant]),
                user_agent=user_agent,
            )
        )
    except Exception as exc:
        if hubclient.classify(exc) is Failure.UNREACHABLE:
            raise KernelOfflineError(
                f"The download of {where}, variant {variant}, did not finish: "
                f"{hubclient.endpoint()} stopped answering ({hubclient.describe(exc)}). What was "
                "downloaded stays in the cache and is not used until the download completes; "
                "run again when the Hub can be reached."
            ) from exc
        raise _revision_error(exc, resolved, f"download {where}") from exc
    commit = snapshot.name
    if resolved.commit is not None and commit != resolved.commit:
        # The branch or tag moved between listing and downloading; what we downloaded is
        # what it points at now.
        logger.warning(
            "%s moved from commit %s to %s while downloading; using %s",
            where,
            resolved.commit[:12],
            commit[:12],
            commit[:12],
        )
        return _fetched(resolved, snapshot, variant, None)
    variant_dir = snapshot / "build" / variant
    missing = [f for f in files if not (variant_dir / f).is_file()]
    if missing:
        # huggingface_hub 0.x answers from a partial cache when the Hub stops answering.
        raise KernelOfflineError(
            f"The download of {where} did not finish: {len(missing)} file(s) of variant "
            f"{variant} are missing ({', '.join(missing[:5])}). {hubclient.offline_hint()}"
        )
    if resolved.commit is None:
        _record_files(resolved, commit, variant, files)
    return _fetched(resolved, snapshot, variant, files)


def _fetched(
    resolved: ResolvedRevision, snapshot: Path, variant: str, files: tuple[str, ...] | None
) -> FetchedKernel:
    repo_id = resolved.repo_id
    package = package_name_for(repo_id)
    variant_dir = snapshot / "build" / variant
    name = package if (variant_dir / package / "__init__.py").is_file() else None
    location = locate_package(snapshot, name, where=f"{repo_id} ({resolved.how})", variant=variant)
    return FetchedKernel(repo_id, resolved, snapshot.name, variant, snapshot, location, files)


def _fetch_from_cache(
    resolved: ResolvedRevision, *, variant: str | None = None, reason: str
) -> FetchedKernel:
    """Find the variant of `resolved` in the cache, without any Hub call."""

    reason = reason.rstrip(".")

    repo_id = resolved.repo_id
    where = f"{repo_id} ({resolved.how})"
    snapshot = _cached_snapshot(resolved, reason=reason)
    build = snapshot / "build"
    cached = variants_in(p.name for p in build.iterdir() if p.is_dir()) if build.is_dir() else []
    if variant is None:
        try:
            variant = choose_variant(
                cached, where=where, prefer=read_preference(snapshot, where=where)
            )
        except BuildVariantNotFoundError as exc:
            raise BuildVariantNotFoundError(
                f"{exc} (Only the cache was asked, because {reason}: the variants listed are "
                f"the cached ones.) {hubclient.offline_hint()}"
            ) from None
    elif variant not in cached:
        raise KernelOfflineError(
            f"{where}: variant {variant} is not in the cache (cached: {', '.join(cached) or 'none'}) "
            f"and the Hub cannot be asked: {reason}. {hubclient.offline_hint()}"
        )
    _check_complete(resolved, snapshot, variant, reason)
    return _fetched(resolved, snapshot, variant, _read_marker(resolved, snapshot.name, variant))


def _cached_snapshot(resolved: ResolvedRevision, *, reason: str) -> Path:
    """The cached snapshot folder of the resolved revision, without any Hub call."""
    from huggingface_hub import snapshot_download

    repo_id = resolved.repo_id
    try:
        return Path(
            snapshot_download(
                repo_id,
                revision=resolved.commit or resolved.revision,
                repo_type=resolved.repo_type,
                allow_patterns=[PREFERENCE_FILE],
                local_files_only=True,
            )
        )
    except Exception as exc:
        raise KernelOfflineError(
            f"{repo_id} ({resolved.how}) is not in the cache ({hubclient.cache_dir()}), and the "
            f"Hub cannot be asked: {reason.rstrip('.')}."
            f"{cached_other_type_hint(repo_id, resolved.repo_type)} {hubclient.offline_hint()}"
        ) from exc


def _marker_path(resolved: ResolvedRevision, commit: str, variant: str) -> Path:
    folder = hubclient.repo_cache_folder(resolved.repo_id, resolved.repo_type)
    return folder / _FILE_LISTS / commit / f"{variant}.json"


def _record_files(
    resolved: ResolvedRevision, commit: str, variant: str, files: tuple[str, ...]
) -> None:
    """Note which files the variant has at this commit, for offline completeness checks."""
    path = _marker_path(resolved, commit, variant)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{id(files)}.tmp")
        tmp.write_text(json.dumps(list(files)))
        tmp.replace(path)
    except OSError as exc:  # a read-only cache still works; it just cannot be checked offline
        logger.debug("could not record the file list of %s: %s", resolved.repo_id, exc)


def _read_marker(resolved: ResolvedRevision, commit: str, variant: str) -> tuple[str, ...] | None:
    path = _marker_path(resolved, commit, variant)
    try:
        return tuple(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def _check_complete(resolved: ResolvedRevision, snapshot: Path, variant: str, reason: str) -> None:
    """Refuse a cached variant that an interrupted download left incomplete."""
    from huggingface_hub import snapshot_download

    repo_id = resolved.repo_id
    where = f"{repo_id} ({resolved.how})"
    reason = reason.rstrip(".")
    advice = (
        f"The download of {where} did not finish; variant {variant} in the cache is incomplete "
        f"and the Hub cannot be asked ({reason}). {hubclient.offline_hint()}"
    )
    # huggingface_hub >= 1.x knows each commit's file list and raises when files are missing.
    try:
        snapshot_download(
            repo_id,
            revision=snapshot.name,
            repo_type=resolved.repo_type,
            allow_patterns=allow_patterns([variant]),
            local_files_only=True,
        )
    except Exception as exc:
        raise KernelOfflineError(f"{advice} ({hubclient.describe(exc)})") from exc
    expected = _read_marker(resolved, snapshot.name, variant)
    if expected is None:
        logger.debug(
            "%s: no record of a complete download of %s; trusting the cache", where, variant
        )
        return
    variant_dir = snapshot / "build" / variant
    missing = [f for f in expected if not (variant_dir / f).is_file()]
    if missing:
        raise KernelOfflineError(f"{advice} Missing: {', '.join(missing[:5])}.")


def _check_repo_id(repo_id: object, repo_type: object = KERNEL_REPO_TYPE) -> None:
    # Before trust is decided or the Hub asked: an id that is not ASCII could be a look-alike
    # of a trusted organisation, and one that is not a str would fail deep inside a Hub call.
    check_repo_id(repo_id)
    hubclient.check_repo_type(repo_type, where=f"{repo_id!r}")


__all__ = [
    "FetchedKernel",
    "LoadedHubKernel",
    "fetch_kernel",
    "get_kernel",
    "get_kernel_variants",
    "has_kernel",
    "install_kernel",
    "load_hub_kernel",
]
