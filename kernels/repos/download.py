"""Downloading kernel repositories from the Hub into huggingface_hub's cache, and importing them.

`get_kernel` is the function API; `LayerRepository.load()` and the lock-based loaders
(`kernels.repos.lock`) go through the same steps:

1. trust: refuse code from organisations that are not trusted (`kernels.repos.trust`);
2. resolve `revision` / `version` to a branch, tag or commit (`kernels.repos.versions`);
3. list the files at that commit and choose the build variant for this machine;
4. ``snapshot_download`` only that variant (``allow_patterns``), with huggingface_hub's
   cache, file locks and progress bars;
5. import the package once per downloaded folder, i.e. per commit and variant.

Steps 2-4 run under the lock of what was asked (`kernels.repos.load_locks`): the threads
and processes of one machine asking for the same kernel at once make one set of Hub requests
and one download; step 5 runs under no lock of ours, so a kernel may load other kernels when
it is imported. A commit never changes: once its variant is complete in the cache (with the
notes of `kernels.repos.cache_records`), loading it asks the Hub nothing.

Offline (``HF_HUB_OFFLINE=1``) or with the Hub unreachable, steps 2-4 are answered from the
cache when it can; otherwise the error says what is missing and how to fetch it.

Every call names the repository type: ``"kernel"`` (the Hub's kernel repositories, the
default) or ``"model"`` (kernels still published as models); the two are never tried one
after the other, since they could hold different code (docs/hub.md#repository-types).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from ..errors import (
    BuildVariantNotFoundError,
    KernelLoadError,
    KernelMetadataError,
    KernelOfflineError,
    KernelRevisionError,
)
from . import archs, cache_records, hubclient, load_locks
from .hashing import verify_variant
from .hubclient import COMMIT_PATTERN, KERNEL_REPO_TYPE, Failure
from .info import METADATA_FILE, Metadata, RepoInfo
from .kernel_deps import KernelDependency, dependencies_loaded
from .layout import PackageLocation, locate_package, read_preference
from .loaded import read_metadata, record_origin
from .loader import import_package
from .local_overrides import LocalOverride, find_local_override
from .repo_id import check_repo_id
from .trust import TrustArgument, TrustDecision, normalize_trust, require_trust
from .variants import (
    PREFERENCE_FILE,
    MachineBuild,
    VariantDecision,
    allow_patterns,
    choose_variant,
    decide_variants,
    machine_for_backend,
    read_preference_file,
    variants_in,
)
from .versions import (
    Request,
    ResolvedRevision,
    all_latest,
    cached_other_type_hint,
    check_request,
    hub_error,
    list_refs,
    require_pin,
    resolve_from_cache,
    resolve_latest,
    resolve_request,
    resolve_revision,
)

logger = logging.getLogger(__name__)

#: How long a resolution made by another process may be used instead of asking the Hub
#: again (docs/hub.md#many-processes); ``0`` turns the sharing off.
REUSE_ENV = "KERNELS_RESOLVE_REUSE_SECONDS"
DEFAULT_REUSE_SECONDS = 60.0


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
    *,
    revision: str | None = None,
    version: str | int | None = None,
    backend: str | None = None,
    user_agent: str | dict | None = None,
    trust_remote_code: bool | list[str] = False,
    check_arch: bool = True,
    repo_type: str = KERNEL_REPO_TYPE,
) -> ModuleType:
    """Download (if needed) and import a kernel from the Hub.

    Only the build variant this machine runs is downloaded, into huggingface_hub's cache
    (``HF_HUB_CACHE``); importing the same commit again returns the same module, and two
    versions of one kernel can be loaded side by side.

    Args:
        repo_id: the Hub repository, e.g. ``"kernels-community/activation"``.
        revision: a branch, tag or full commit hash. Cannot be combined with `version`.
        version: an int N (the branch ``vN``, the Hub's convention) or a PEP 440 specifier
            (the highest ``v<x.y.z>`` tag satisfying it). One of `version` and `revision` must
            be given (``revision="main"`` follows the main branch).
        backend: load the build for this backend: ``"cpu"``, or the backend torch was built
            for (the default).
        user_agent: extra user-agent information sent with every Hub request of this load
            (a ``"name/version"`` string or a dict of names to versions).
        trust_remote_code: allow code from organisations that are not trusted by default or
            configuration: True for any, or a list of organisations / repository ids.
        check_arch: refuse a build whose ``metadata.json`` lists architectures that leave
            out the current GPU's (False loads it anyway, e.g. a kernel with a Triton
            fallback).
        repo_type: ``"kernel"`` (the Hub's kernel repositories) or ``"model"`` for a kernel
            still published as a model repository (an old mirror or a private Hub).

    Raises:
        KernelVersionSpecError (a ValueError): neither `version` nor `revision`, both, or a
            malformed `version`.
        UntrustedKernelError (a ValueError), KernelRepositoryNotFoundError,
        KernelRevisionError, BuildVariantNotFoundError, KernelOfflineError (a
        FileNotFoundError), KernelHubUnsupportedError, KernelDownloadError: all
        `KernelLoadError` subclasses; see docs/hub.md.

    Example:
        ```python
        from kernels import get_kernel

        activation = get_kernel("kernels-community/activation", version=1)
        y = activation.silu_and_mul(x)
        ```
    """
    _check_repo_id(repo_id, repo_type)  # first: an id that is not one is named as such
    require_pin(repo_id, revision=revision, version=version)
    return load_hub_kernel(
        repo_id,
        revision=revision,
        version=version,
        backend=backend,
        trust_remote_code=trust_remote_code,
        user_agent=user_agent,
        check_arch=check_arch,
        repo_type=repo_type,
    ).module


def load_hub_kernel(
    repo_id: str,
    *,
    revision: str | None = None,
    version: str | int | None = None,
    backend: str | None = None,
    trust_remote_code: TrustArgument | list[str] = False,
    user_agent: str | dict | None = None,
    check_arch: bool = True,
    repo_type: str = KERNEL_REPO_TYPE,
) -> LoadedHubKernel:
    """`get_kernel`, returning what was resolved, downloaded and trusted along with the module."""
    _check_repo_id(repo_id, repo_type)
    hubclient.check_user_agent(user_agent)
    machine = machine_for_backend(backend)
    if (local := find_local_override(repo_id)) is not None:
        return _load_local_override(local, repo_type)  # no Hub, no trust check
    trust = require_trust(repo_id, normalize_trust(trust_remote_code))
    request = check_request(repo_id, revision=revision, version=version, repo_type=repo_type)
    with hubclient.user_agent_for(user_agent):
        if all_latest():
            latest = resolve_latest(repo_id, asked=request.asked, repo_type=repo_type)
            fetched = fetch_kernel(latest, machine=machine)
        else:
            fetched = _resolve_and_fetch(request, machine=machine, backend=backend)
        if check_arch:
            check_fetched_arch(fetched)
        # Outside every lock of ours: the kernel's code runs now, and may load other kernels.
        load = dependency_loader(trust_remote_code, backend=backend, check_arch=check_arch)
        with dependencies_loaded(fetched.location.package_dir, repo_id, load):
            loaded = import_fetched(fetched, trust)
    logger.info("Loaded kernel %s; %s", loaded.describe(), trust.reason)
    return loaded


def check_fetched_arch(fetched: FetchedKernel) -> None:
    """Refuse (before import) a fetched build that does not support the current device.

    Raises:
        BuildVariantNotFoundError: its metadata's archs leave out the current GPU's.
        KernelLoadError: its metadata.json is malformed.
    """
    where = f"{fetched.repo_id} ({fetched.resolved.how}), variant {fetched.variant}"
    archs.check_package_arch(fetched.location.package_dir, where=where)


def _resolve_and_fetch(
    request: Request, *, machine: MachineBuild | None = None, backend: str | None = None
) -> FetchedKernel:
    """Resolve `request` and make its variant for `machine` present in the cache, once for
    all the threads and processes of this machine that ask for it at the same time."""
    if hubclient.is_offline():  # only the cache answers: nothing to share
        return fetch_kernel(resolve_request(request), machine=machine)
    # Loads for another backend choose another variant: they share nothing with the others.
    asked = request.asked if backend is None else f"{request.asked} backend={backend}"
    key = load_locks.LoadKey(request.repo_type, request.repo_id, asked)
    folder = hubclient.repo_cache_folder(request.repo_id, request.repo_type)
    with load_locks.hold(key, _lock_folder(request.repo_id, request.repo_type)) as turn:
        shared = turn.in_flight()
        if isinstance(shared, FetchedKernel):
            logger.debug("%s: using what another thread resolved meanwhile", key.describe())
            return shared
        fetched = _recorded(request, key, folder, machine) if turn.across_processes else None
        if fetched is None:
            fetched = fetch_kernel(resolve_request(request), machine=machine)
            _note_resolution(key, folder, fetched)
        turn.publish(fetched)
        return fetched


def reuse_seconds() -> float:
    """How old another process's resolution may be to be used (`REUSE_ENV`).

    Unset: `DEFAULT_REUSE_SECONDS`. ``0`` or any negative number (``-1``) turns reuse off:
    every process asks the Hub itself. A value that is not a number turns it off too, with a
    WARNING: a misspelt setting should err towards asking the Hub, not towards the default.
    """
    raw = os.environ.get(REUSE_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_REUSE_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if seconds != seconds or seconds == float("inf"):  # not a number, or no bound at all
        logger.warning(
            "%s=%r is not a number of seconds; reusing no other process's resolution (set it "
            "to 0 or a negative number to turn reuse off, or unset it for %g s).",
            REUSE_ENV,
            raw,
            DEFAULT_REUSE_SECONDS,
        )
        return 0.0
    return max(seconds, 0.0)


def _recorded(
    request: Request, key: load_locks.LoadKey, folder: Path, machine: MachineBuild | None = None
) -> FetchedKernel | None:
    """The answer another process found for `request` moments ago, if the cache holds it.

    The record is hostile input: it is used only when it answers this very request, is
    younger than `reuse_seconds`, names a branch or tag the request admits that the cache's
    refs map to its commit, and that commit's variant for this machine is complete in the
    cache. Anything else and the request is resolved with the Hub as usual.
    """
    window = reuse_seconds()
    if window <= 0 or request.revision is not None and COMMIT_PATTERN.match(request.revision):
        return None  # turned off; or a commit, which needs no resolving
    record = cache_records.read_resolution(folder, key.digest, key.text)
    if record is None or record.by_this_process():
        # This process asks the Hub each time it is asked, as before; its own threads
        # share answers only while they wait (`load_locks.Turn.in_flight`).
        return None
    age = time.time() - record.time
    if not 0 <= age <= window or not request.admits(record.revision):
        return None
    resolved = ResolvedRevision(
        request.repo_id,
        record.revision,
        record.commit,
        f"{record.how}; resolved {age:.0f} s ago by process {record.pid}",
        repo_type=request.repo_type,
    )
    fetched = _fetch_cached_commit(resolved, machine=machine)
    if fetched is None or fetched.variant != record.variant:
        return None
    logger.debug("%s: using the resolution of process %d", key.describe(), record.pid)
    return fetched


def _note_resolution(key: load_locks.LoadKey, folder: Path, fetched: FetchedKernel) -> None:
    """Write the resolution record other processes may use (`_recorded`)."""
    resolved = fetched.resolved
    if resolved.from_cache or resolved.commit is None or fetched.files is None:
        return  # not the Hub's answer, or not a complete download of the resolved commit
    if COMMIT_PATTERN.match(resolved.revision):
        return  # a commit needs no resolving
    cache_records.record_resolution(
        folder,
        key.digest,
        cache_records.Resolution.now(
            key.text, resolved.revision, fetched.commit, resolved.how, fetched.variant
        ),
    )


def _lock_folder(repo_id: str, repo_type: str) -> Path:
    folder = hubclient.repo_cache_folder(repo_id, repo_type)
    return load_locks.lock_folder(hubclient.cache_dir(), folder.name)


def dependency_loader(
    trust_remote_code: TrustArgument | list[str] = False,
    *,
    backend: str | None = None,
    check_arch: bool = True,
) -> Callable[[KernelDependency], ModuleType]:
    """How a kernel's ``kernel-depends`` load: as Hub kernels, with the kernel's own trust,
    backend and arch check (and, inside its load, its user agent)."""

    def load(dependency: KernelDependency) -> ModuleType:
        return load_hub_kernel(
            dependency.repo_id,
            version=dependency.version,
            revision=dependency.revision,
            backend=backend,
            trust_remote_code=trust_remote_code,
            check_arch=check_arch,
        ).module

    return load


def _load_local_override(local: LocalOverride, repo_type: str) -> LoadedHubKernel:
    """Import the folder ``LOCAL_KERNELS`` names for a repository, as if it came from the Hub."""
    resolved = ResolvedRevision(local.repo_id, "local", None, local.how, repo_type=repo_type)
    fetched = FetchedKernel(
        local.repo_id, resolved, "local", local.location.variant, local.root, local.location
    )
    trust = TrustDecision(local.repo_id, True, f"{local.how} (local code: not trust-checked)")
    logger.info(
        "Loading %s from the local folder %s (LOCAL_KERNELS) instead of the Hub; the revision "
        "or version asked for is ignored.",
        local.repo_id,
        local.folder,
    )
    with dependencies_loaded(local.location.package_dir, local.repo_id, dependency_loader()):
        return import_fetched(fetched, trust)


def import_fetched(fetched: FetchedKernel, trust: TrustDecision) -> LoadedHubKernel:
    """Import a fetched (and, for locks, verified) kernel and record where it came from.

    Raises:
        KernelLoadError: the import failed, or is cyclic (the kernel's import loads the
            kernel itself, directly or through another kernel).
    """
    location = fetched.location
    what = f"{fetched.repo_id}@{fetched.commit[:12]}"
    with load_locks.importing(location.package_dir, what):
        module = import_package(location.package_dir, location.package_name)
    record_origin(
        location.package_dir, RepoInfo(fetched.repo_id, fetched.commit, fetched.repo_type)
    )
    return LoadedHubKernel(module, fetched, trust)


def has_kernel(
    repo_id: str,
    *,
    revision: str | None = None,
    version: str | int | None = None,
    backend: str | None = None,
    trust_remote_code: bool | list[str] = False,
    check_arch: bool = True,
    repo_type: str = KERNEL_REPO_TYPE,
) -> bool:
    """Whether `repo_id` has a build variant this machine can run, without downloading it.

    Returns False when the repository offers no variant for this machine (for `backend`, as
    for `get_kernel`) or, with `check_arch`, when the chosen variant's ``metadata.json``
    lists architectures that leave out the current GPU's (only that file is downloaded). A
    missing repository, revision or version raises as `get_kernel` does, and so does
    neither `version` nor `revision` (a ValueError). Offline, the answer comes from the
    cache. A repository that ``LOCAL_KERNELS`` maps to a folder is answered from that
    folder, with no Hub request, as Hugging Face's client does (a folder that does not
    exist raises, naming the variable). `trust_remote_code` is accepted as Hugging Face's
    client accepts it; nothing is imported, so no code runs and nothing is trust-checked.
    """
    _check_repo_id(repo_id, repo_type)
    require_pin(repo_id, revision=revision, version=version)
    normalize_trust(trust_remote_code)  # a malformed argument fails here as in get_kernel
    machine = machine_for_backend(backend)
    try:
        if find_local_override(repo_id) is not None:
            return True
    except BuildVariantNotFoundError:
        return False
    if all_latest():
        request = check_request(repo_id, revision=revision, version=version, repo_type=repo_type)
        resolved = resolve_latest(repo_id, asked=request.asked, repo_type=repo_type)
    else:
        resolved = resolve_revision(
            repo_id, revision=revision, version=version, repo_type=repo_type
        )
    try:
        metadata = _chosen_variant_metadata(resolved, machine)
    except BuildVariantNotFoundError:
        return False
    if check_arch and metadata is not None:
        return archs.unsupported_arch(metadata) is None
    return True


def _chosen_variant_metadata(resolved: ResolvedRevision, machine: MachineBuild) -> Metadata | None:
    """The metadata of the variant `get_kernel` would load for `machine` at `resolved`
    (downloading only its ``metadata.json``); None when the variant has none.

    Raises:
        BuildVariantNotFoundError: no variant runs on `machine`.
    """
    if hubclient.is_offline() or resolved.from_cache:
        reason = "HF_HUB_OFFLINE is set" if hubclient.is_offline() else "the Hub cannot be reached"
        return _cached_metadata(_fetch_from_cache(resolved, reason=reason, machine=machine))
    cached = _fetch_cached_commit(resolved, machine=machine)
    if cached is not None:
        return _cached_metadata(cached)
    where = f"{resolved.repo_id} ({resolved.how})"
    if (recorded := _recorded_listing(resolved)) is not None:
        offered, prefer = recorded
        variant = choose_variant(offered, where=where, prefer=prefer, machine=machine)
        files: tuple[str, ...] | None = None
    else:
        try:
            listing = _choose_remote_variant(resolved, machine=machine)
        except KernelOfflineError as exc:
            # As get_kernel does: an unreachable Hub is answered from the cache if it can.
            fetched = _fetch_from_cache(resolved, reason=exc.reason, machine=machine)
            return _cached_metadata(fetched)
        variant, files = listing.variant, listing.files
    if files is not None and METADATA_FILE not in files:
        return None
    filename = f"build/{variant}/{METADATA_FILE}"
    try:
        path = hubclient.hub_api().hf_hub_download(
            resolved.repo_id,
            filename,
            revision=resolved.commit or resolved.revision,
            repo_type=resolved.repo_type,
        )
    except Exception as exc:
        if files is None and hubclient.classify(exc) is Failure.ENTRY_NOT_FOUND:
            return None
        raise hub_error(
            exc, resolved.repo_id, f"download {filename} of {where}", resolved.repo_type
        ) from exc
    try:
        return Metadata.read_from_file(path)
    except KernelMetadataError as exc:
        raise KernelLoadError(f"{where}: {filename} is malformed ({exc}).") from exc


def _cached_metadata(fetched: FetchedKernel) -> Metadata:
    return read_metadata(fetched.location.package_dir)


def get_kernel_variants(
    repo_id: str,
    *,
    revision: str | None = None,
    version: str | int | None = None,
    backend: str | None = None,
    repo_type: str = KERNEL_REPO_TYPE,
) -> list[VariantDecision]:
    """Which build variants of a Hub kernel run on this machine (loading builds for
    `backend`, as `get_kernel` does), and why the others do not. One of `version` and
    `revision` must be given, as for `get_kernel`.

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
    require_pin(repo_id, revision=revision, version=version)
    machine = machine_for_backend(backend)
    resolved = resolve_revision(repo_id, revision=revision, version=version, repo_type=repo_type)
    if not (hubclient.is_offline() or resolved.from_cache):
        if (recorded := _recorded_listing(resolved)) is not None:
            offered, prefer = recorded
            return decide_variants(offered, prefer=prefer, machine=machine)
        try:
            offered, prefer, _ = _remote_listing(resolved)
            return decide_variants(offered, prefer=prefer, machine=machine)
        except KernelOfflineError:
            pass  # as get_kernel does: an unreachable Hub is answered from the cache
    snapshot = _cached_snapshot(resolved, reason="the Hub cannot be asked")
    build = snapshot / "build"
    cached = [p.name for p in build.iterdir() if p.is_dir()] if build.is_dir() else []
    where = f"{repo_id} ({resolved.how})"
    return decide_variants(cached, prefer=read_preference(snapshot, where=where), machine=machine)


def install_kernel(
    repo_id: str,
    *,
    revision: str | None = None,
    version: str | int | None = None,
    backend: str | None = None,
    local_files_only: bool = False,
    user_agent: str | dict | None = None,
    trust_remote_code: bool | list[str] = False,
    variant_locks: Mapping[str, object] | None = None,
    repo_type: str = KERNEL_REPO_TYPE,
) -> Path:
    """Download a kernel's variant for this machine into the cache, without importing it.

    Args:
        repo_id: the Hub repository.
        revision: a branch, tag or full commit hash; or
        version: as for `get_kernel` (one of the two must be given).
        backend: download the build for this backend, as for `get_kernel`.
        local_files_only: only look in the cache (a branch or tag is found by the name the
            cache recorded when it was downloaded).
        user_agent: as for `get_kernel`.
        trust_remote_code: as for `get_kernel`.
        variant_locks: the ``variants`` of a lock entry (variant -> ``{"hash": ...}``); when
            given, the downloaded files are verified against it.
        repo_type: as for `get_kernel`.

    Returns:
        The variant folder, ``<snapshot>/build/<variant>`` (as Hugging Face's client returns
        it; before 0.19 ours returned the package name with it).
    """
    _check_repo_id(repo_id, repo_type)
    require_pin(repo_id, revision=revision, version=version)
    machine = machine_for_backend(backend)
    require_trust(repo_id, normalize_trust(trust_remote_code))
    with hubclient.user_agent_for(user_agent):
        if local_files_only:
            request = check_request(
                repo_id, revision=revision, version=version, repo_type=repo_type
            )
            resolved = resolve_from_cache(request, reason="local_files_only=True.")
            fetched = fetch_kernel(resolved, local_files_only=True, machine=machine)
        else:
            resolved = resolve_revision(
                repo_id, revision=revision, version=version, repo_type=repo_type
            )
            fetched = fetch_kernel(resolved, machine=machine)
    if variant_locks is not None:
        verify_variant(
            fetched.variant_dir,
            variant_locks,
            repo_id=repo_id,
            commit=fetched.commit,
            variant=fetched.variant,
            files=None,
        )
    return fetched.variant_dir


def fetch_kernel(
    resolved: ResolvedRevision,
    *,
    variant: str | None = None,
    local_files_only: bool = False,
    machine: MachineBuild | None = None,
) -> FetchedKernel:
    """Make the variant of `resolved` for this machine (or `variant`) present in the cache.

    `machine` is the machine to choose the variant for (this one by default;
    `machine_for_backend` gives it for another backend).

    A commit whose variant an earlier download left complete in the cache is used without
    any Hub request: a commit never changes. Otherwise one thread of one process at a time
    lists and downloads a commit; the others then find it in the cache.
    """
    if local_files_only or hubclient.is_offline():
        return _fetch_from_cache(
            resolved,
            variant=variant,
            reason="local_files_only=True" if local_files_only else "HF_HUB_OFFLINE is set",
            machine=machine,
        )
    if resolved.from_cache:
        return _fetch_from_cache(
            resolved, variant=variant, reason="the Hub cannot be reached", machine=machine
        )
    cached = _fetch_cached_commit(resolved, variant=variant, machine=machine)
    if cached is not None or resolved.commit is None:
        return cached or _fetch_online(resolved, variant=variant, machine=machine)
    key = load_locks.LoadKey(resolved.repo_type, resolved.repo_id, f"commit={resolved.commit}")
    with load_locks.hold(key, _lock_folder(resolved.repo_id, resolved.repo_type)):
        # Another thread or process may have downloaded it while this one waited.
        cached = _fetch_cached_commit(resolved, variant=variant, machine=machine)
        return cached or _fetch_online(resolved, variant=variant, machine=machine)


def _fetch_online(
    resolved: ResolvedRevision, *, variant: str | None, machine: MachineBuild | None = None
) -> FetchedKernel:
    try:
        listing = _choose_remote_variant(resolved, variant=variant, machine=machine)
    except KernelOfflineError as exc:
        reason = exc.reason
        logger.warning("%s: %s Trying the cache.", resolved.repo_id, reason)
        return _fetch_from_cache(resolved, variant=variant, reason=reason, machine=machine)
    return _download(resolved, listing)


def _recorded_listing(resolved: ResolvedRevision) -> tuple[list[str], str] | None:
    """The variants a resolved commit offers and the repository's preference, as an earlier
    listing of that commit noted them in the cache; None when none did.

    A commit never changes, so its listing holds for good: a commit given by hash (or a ref
    that huggingface_hub's cache names it by) is answered without a Hub request, as
    `fetch_kernel` does, and with the Hub down without waiting out huggingface_hub's retries.
    """
    commit = resolved.commit
    if commit is None or not COMMIT_PATTERN.match(commit):
        return None
    if resolved.revision != commit:
        refs = hubclient.cached_refs(resolved.repo_id, resolved.repo_type)
        if refs.get(resolved.revision) != commit:
            return None
    folder = hubclient.repo_cache_folder(resolved.repo_id, resolved.repo_type)
    return cache_records.read_listing(folder, commit)


def _fetch_cached_commit(
    resolved: ResolvedRevision, *, variant: str | None = None, machine: MachineBuild | None = None
) -> FetchedKernel | None:
    """The variant of the resolved commit, when the cache holds it complete; else None.

    Only what an earlier download noted counts: the variants the commit offers and the
    repository's preference (so the choice is the one the Hub's listing would give), the
    variant's file list, and, for a branch or tag, huggingface_hub's ref naming this commit
    (so offline loads by that name keep finding it). No Hub request is made.
    """
    listing = _recorded_listing(resolved)
    if listing is None:
        return None
    offered, prefer = listing
    commit = resolved.commit
    assert commit is not None  # a recorded listing is a commit's
    folder = hubclient.repo_cache_folder(resolved.repo_id, resolved.repo_type)
    if variant is None:
        try:
            variant = choose_variant(
                offered, where=resolved.repo_id, prefer=prefer, machine=machine
            )
        except BuildVariantNotFoundError:
            return None  # the Hub's listing gives the error, with its own words
    elif variant not in offered:
        return None
    files = cache_records.read_files(folder, commit, variant)
    snapshot = folder / "snapshots" / commit
    if files is None or not snapshot.is_dir():
        return None
    variant_dir = snapshot / "build" / variant
    if not all((variant_dir / f).is_file() for f in files):
        return None
    try:
        _check_complete(resolved, snapshot, variant, "the cache answers for an immutable commit")
    except KernelOfflineError:
        return None
    logger.debug(
        "%s (%s): commit %s is complete in the cache", resolved.repo_id, resolved.how, commit[:12]
    )
    return _fetched(resolved, snapshot, variant, files)


@dataclass(frozen=True)
class _Listing:
    """What the file listing at a revision offers, and the variant chosen from it."""

    offered: list[str]
    prefer: str
    variant: str
    #: The variant's files, relative to ``build/<variant>/``.
    files: tuple[str, ...]


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
        try:
            path = api.hf_hub_download(
                repo_id, PREFERENCE_FILE, revision=revision, repo_type=resolved.repo_type
            )
        except Exception as exc:
            raise hub_error(
                exc, repo_id, f"download {PREFERENCE_FILE} of {where}", resolved.repo_type
            ) from exc
        prefer = read_preference_file(path, where=where)
    return offered, prefer, repo_files


def _choose_remote_variant(
    resolved: ResolvedRevision, *, variant: str | None = None, machine: MachineBuild | None = None
) -> _Listing:
    """List the files at the resolved revision and pick the variant (no download)."""
    where = f"{resolved.repo_id} ({resolved.how})"
    offered, prefer, repo_files = _remote_listing(resolved)
    if variant is None:
        variant = choose_variant(offered, where=where, prefer=prefer, machine=machine)
    elif variant not in offered:
        raise BuildVariantNotFoundError(
            f"{where} has no build variant {variant}. It offers: {', '.join(offered) or 'none'}."
        )
    prefix = f"build/{variant}/"
    files = tuple(sorted(p[len(prefix) :] for p in repo_files if p.startswith(prefix)))
    return _Listing(offered, prefer, variant, files)


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


def _download(resolved: ResolvedRevision, listing: _Listing) -> FetchedKernel:

    variant, files = listing.variant, listing.files
    repo_id = resolved.repo_id
    where = f"{repo_id} ({resolved.how})"
    logger.debug("downloading %s, variant %s (%d files)", where, variant, len(files))
    if resolved.commit is not None:
        # Written before downloading: if the download is interrupted, the cache answers
        # offline with an incomplete variant, and this list shows what is missing.
        _record_files(resolved, resolved.commit, variant, files)
    try:
        snapshot = Path(
            hubclient.hub_api().snapshot_download(
                repo_id,
                revision=resolved.revision,
                repo_type=resolved.repo_type,
                allow_patterns=allow_patterns([variant]),
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
    # Last, once the variant is complete: with these notes the commit loads without the Hub.
    folder = hubclient.repo_cache_folder(repo_id, resolved.repo_type)
    cache_records.record_listing(folder, commit, listing.offered, listing.prefer)
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
    resolved: ResolvedRevision,
    *,
    variant: str | None = None,
    reason: str,
    machine: MachineBuild | None = None,
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
                cached, where=where, prefer=read_preference(snapshot, where=where), machine=machine
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

    repo_id = resolved.repo_id
    try:
        return Path(
            hubclient.hub_api().snapshot_download(
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


def _record_files(
    resolved: ResolvedRevision, commit: str, variant: str, files: tuple[str, ...]
) -> None:
    """Note which files the variant has at this commit, for offline completeness checks."""
    folder = hubclient.repo_cache_folder(resolved.repo_id, resolved.repo_type)
    cache_records.record_files(folder, commit, variant, files)


def _read_marker(resolved: ResolvedRevision, commit: str, variant: str) -> tuple[str, ...] | None:
    folder = hubclient.repo_cache_folder(resolved.repo_id, resolved.repo_type)
    return cache_records.read_files(folder, commit, variant)


def _check_complete(resolved: ResolvedRevision, snapshot: Path, variant: str, reason: str) -> None:
    """Refuse a cached variant that an interrupted download left incomplete."""

    repo_id = resolved.repo_id
    where = f"{repo_id} ({resolved.how})"
    reason = reason.rstrip(".")
    advice = (
        f"The download of {where} did not finish; variant {variant} in the cache is incomplete "
        f"and the Hub cannot be asked ({reason}). {hubclient.offline_hint()}"
    )
    # huggingface_hub >= 1.x knows each commit's file list and raises when files are missing.
    try:
        hubclient.hub_api().snapshot_download(
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
