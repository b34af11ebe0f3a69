"""The few things we need from huggingface_hub, the same way on its 0.x, 1.x and 2.x lines.

Every Hub call, the cache layout, offline mode, the endpoint and the token are
huggingface_hub's: this module only smooths over what moved between its releases (where
offline mode is read, which HTTP library raises connection errors, which repository types
it knows) and sorts its exceptions into the few cases `kernels` reports differently.

Kernel repositories are the Hub's ``kernel`` repository type (``/api/kernels/``, cached as
``kernels--<org>--<name>``); huggingface_hub knows that type from 1.10 on. Repositories
still published as models (an old mirror, a private Hub) are asked for with
``repo_type="model"`` explicitly (docs/hub.md#repository-types).
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import errno
import logging
import os
import platform
import re
import stat
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

# A ref file holds a commit hash of 40 or 64 characters (and maybe a newline): anything far
# larger is not one.
_MAX_REF_BYTES = 256

#: A full commit hash: SHA-1 (40 hex) or, for repositories in git's SHA-256 object format,
#: 64 hex (kernels 0.19 takes both); shorter prefixes are not accepted by the Hub as revisions.
COMMIT_PATTERN = re.compile(r"\A(?:[0-9a-f]{40}|[0-9a-f]{64})\Z")  # \Z: "$" takes a "\n"

#: The Hub's repository type for kernels (``huggingface_hub.constants.REPO_TYPE_KERNEL``).
KERNEL_REPO_TYPE = "kernel"
#: Kernel repositories published before the Hub had the kernel type.
MODEL_REPO_TYPE = "model"
REPO_TYPES = (KERNEL_REPO_TYPE, MODEL_REPO_TYPE)

#: The first huggingface_hub release that knows the kernel repository type.
KERNEL_TYPE_MIN_HUB = "1.10"


def check_repo_type(repo_type: object, *, where: str) -> str:
    """Validate a `repo_type` argument: "kernel" (today's Hub) or "model" (older mirrors).

    Raises:
        KernelMappingError: anything else.
    """
    if repo_type not in REPO_TYPES:
        from ..errors import KernelMappingError

        raise KernelMappingError(
            f"{where}: repo_type must be 'kernel' (kernel repositories on today's Hub) or "
            f"'model' (a kernel still published as a model repository), got {repo_type!r}."
        )
    return repo_type


def supports_kernel_repo_type() -> bool:
    """Whether the installed huggingface_hub can address repositories of the kernel type."""
    from huggingface_hub import constants

    return getattr(constants, "REPO_TYPE_KERNEL", None) == KERNEL_REPO_TYPE


def require_repo_type(repo_type: str, repo_id: str) -> None:
    """Refuse, with the cause and the fix, a kernel-type repository huggingface_hub cannot ask for.

    Raises:
        KernelHubUnsupportedError: `repo_type` is "kernel" and huggingface_hub predates it.
    """
    if repo_type != KERNEL_REPO_TYPE or supports_kernel_repo_type():
        return
    import huggingface_hub

    from ..errors import KernelHubUnsupportedError

    raise KernelHubUnsupportedError(
        f"Cannot load {repo_id} from the Hub: the Hub keeps kernels as repositories of type "
        f"'kernel', which huggingface_hub {huggingface_hub.__version__} does not know (it was "
        f"added in huggingface_hub {KERNEL_TYPE_MIN_HUB}). Upgrade it: pip install "
        f"'huggingface_hub>={KERNEL_TYPE_MIN_HUB}' (transformers 4.x pins huggingface_hub<1.0; "
        "transformers 5.x allows it). Without the Hub, our own kernels need no download: "
        "register_kernel_mapping(library_mapping()), or LocalLayerRepository for a kernel "
        "folder. A kernel still published as a model repository loads with repo_type='model'."
    )


#: The caller's `user_agent` for the Hub requests of the load in progress (`user_agent_for`).
_extra_user_agent: contextvars.ContextVar[str | dict | None] = contextvars.ContextVar(
    "kernels_user_agent", default=None
)


@contextlib.contextmanager
def user_agent_for(user_agent: str | dict | None) -> Iterator[None]:
    """Send `user_agent` (a ``"name/version"`` string, or a dict of names to versions) with
    every Hub request made inside the block, by this thread and the loads it starts (the
    kernels a kernel depends on). A context variable, not an argument of every function on
    the way to a Hub call: it is telemetry, and changes nothing that is loaded."""
    check_user_agent(user_agent)
    token = _extra_user_agent.set(user_agent)
    try:
        yield
    finally:
        _extra_user_agent.reset(token)


def check_user_agent(user_agent: object) -> None:
    """Refuse a `user_agent` argument that is neither None, a string nor a dict.

    Raises:
        KernelMappingError (a ValueError): it is something else.
    """
    if user_agent is not None and not isinstance(user_agent, (str, dict)):
        from ..errors import KernelMappingError

        raise KernelMappingError(
            f"user_agent must be a string such as 'my-app/1.0' or a dict such as "
            f"{{'my-app': '1.0'}}, got {type(user_agent).__name__}."
        )


def user_agent(extra: str | dict | None = None) -> str | None:
    """The user agent `kernels` sends with its Hub requests, as Hugging Face's client builds it:
    the caller's own parts first, then ``kernels/<version>; python/<x.y>; backend/<name>;
    platform/<cpu>-<os>; file_type/kernel; torch/<version>``. None when
    ``HF_HUB_DISABLE_TELEMETRY`` is set (huggingface_hub then sends only its own)."""
    from huggingface_hub import constants

    from .._version import __version__

    if constants.HF_HUB_DISABLE_TELEMETRY:
        return None
    parts: list[str] = []
    if isinstance(extra, dict):
        parts += [f"{_ua_token(k)}/{_ua_token(v)}" for k, v in extra.items()]
    elif isinstance(extra, str) and extra.strip():
        parts.append(_ua_token(extra))
    backend, machine = _machine()
    parts += [
        f"kernels/{__version__}",
        f"python/{'.'.join(platform.python_version_tuple()[:2])}",
        f"backend/{backend}",
        f"platform/{machine}",
        "file_type/kernel",
    ]
    import torch

    parts.append(f"torch/{torch.__version__}")
    return "; ".join(parts)


def _ua_token(value: object) -> str:
    # A header value: no line breaks (header injection) and no ";" (it separates the parts).
    return re.sub(r"[\x00-\x1f\x7f;]", " ", str(value)).strip()


def _machine() -> tuple[str, str]:
    """This machine's backend and ``<cpu>-<os>``, as its build variants name them."""
    try:
        from .variants import machine_build

        machine = machine_build()
        return machine.backend, f"{machine.cpu}-{machine.os}"
    except Exception:  # telemetry must never make a load fail
        return "unknown", "unknown"


def hub_api():
    """A `HfApi` for the configured endpoint and token (HF_ENDPOINT, HF_TOKEN, ...), sending
    `kernels`' user agent and the caller's (`user_agent_for`) with every request, its
    downloads (``HfApi.snapshot_download``, ``HfApi.hf_hub_download``) included."""
    from huggingface_hub import HfApi

    from .._version import __version__

    return HfApi(
        library_name="kernels",
        library_version=__version__,
        user_agent=user_agent(_extra_user_agent.get()),
    )


def is_offline() -> bool:
    """Whether HF_HUB_OFFLINE forbids Hub calls, as huggingface_hub reads it."""
    from huggingface_hub import constants

    is_offline_mode = getattr(constants, "is_offline_mode", None)
    if callable(is_offline_mode):
        return bool(is_offline_mode())
    return bool(constants.HF_HUB_OFFLINE)


def endpoint() -> str:
    """The Hub endpoint huggingface_hub talks to (HF_ENDPOINT, default https://huggingface.co)."""
    from huggingface_hub import constants

    return constants.ENDPOINT


def cache_dir() -> Path:
    """The Hub cache folder (HF_HUB_CACHE, else HF_HOME/hub)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def repo_cache_folder(repo_id: str, repo_type: str = KERNEL_REPO_TYPE) -> Path:
    """The cache folder of a repository: ``kernels--<org>--<name>`` for the kernel type,
    ``models--<org>--<name>`` for the model type (huggingface_hub's layout)."""
    from huggingface_hub.file_download import repo_folder_name

    return cache_dir() / repo_folder_name(repo_id=repo_id, repo_type=repo_type)


def cached_refs(repo_id: str, repo_type: str = KERNEL_REPO_TYPE) -> dict[str, str]:
    """Branch and tag names the cache has resolved for `repo_id`, each with its commit.

    huggingface_hub writes ``refs/<name>`` whenever it downloads by a branch or tag name;
    these files are how offline mode answers "which commit is v0.1.2?". The cache is hostile
    input: a file that is not a ref huggingface_hub wrote (a link, larger than a commit hash,
    not ASCII, not a commit hash, unreadable) is ignored with a WARNING naming it.

    Raises:
        KernelLoadError: the ``refs`` folder (or one under it) cannot be listed; the message
            names it.
    """
    from ..errors import KernelLoadError

    refs_dir = repo_cache_folder(repo_id, repo_type) / "refs"
    if not refs_dir.is_dir():
        return {}
    refs: dict[str, str] = {}

    def unlistable(exc: OSError) -> None:
        raise KernelLoadError(
            f"Cannot list {exc.filename or refs_dir} in the Hub cache ({exc.strerror or exc}). "
            f"Fix its permissions, or delete {refs_dir} (the next online load writes it again)."
        ) from None

    for folder, _, files in os.walk(refs_dir, onerror=unlistable):
        for name in files:
            path = Path(folder) / name
            commit = _read_ref(path)
            if commit is not None:
                refs[path.relative_to(refs_dir).as_posix()] = commit
    return refs


def _read_ref(path: Path) -> str | None:
    """The commit a ref file names; None (with a WARNING) when it is not a usable ref."""
    try:
        # Not through a link, and never blocking on a FIFO someone put there.
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        fd = os.open(path, flags)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
            raw = f.read(_MAX_REF_BYTES + 1)
        text = raw.decode("ascii").strip()
    except OSError as exc:
        problem = f"cannot be read ({exc.strerror or exc})"
    except UnicodeDecodeError:
        problem = "is not ASCII text"
    else:
        if COMMIT_PATTERN.match(text):
            return text
        problem = "does not hold a commit hash"
    logger.warning(
        "Ignoring %s in the Hub cache: it %s, so it is not a ref huggingface_hub wrote. Delete "
        "it (an online load by that name writes it again).",
        path,
        problem,
    )
    return None


def cached_commits(repo_id: str, repo_type: str = KERNEL_REPO_TYPE) -> list[str]:
    """Commits that have a snapshot folder in the cache.

    Raises:
        KernelLoadError: the ``snapshots`` folder cannot be listed; the message names it.
    """
    from ..errors import KernelLoadError

    snapshots = repo_cache_folder(repo_id, repo_type) / "snapshots"
    if not snapshots.is_dir():
        return []
    try:
        names = os.listdir(snapshots)
    except OSError as exc:
        raise KernelLoadError(
            f"Cannot list {snapshots} in the Hub cache ({exc.strerror or exc}). Fix its "
            "permissions, or delete it (the next online load downloads again)."
        ) from None
    return sorted(name for name in names if COMMIT_PATTERN.match(name))


class Failure(enum.Enum):
    """Why a Hub call failed, as far as `kernels` tells the cases apart."""

    NOT_FOUND = "not found"  # the repository (or, for olah, its refs) does not exist
    ACCESS_DENIED = "access denied"  # private or gated, and no token (or a wrong one)
    REVISION_NOT_FOUND = "revision not found"
    ENTRY_NOT_FOUND = "entry not found"  # a file does not exist at that revision
    UNREACHABLE = "unreachable"  # no connection, a timeout, offline mode, or a 5xx answer
    OTHER = "other"


def classify(exc: BaseException) -> Failure:
    """Sort an exception raised by a huggingface_hub call into a `Failure`."""
    from huggingface_hub import errors

    if isinstance(exc, getattr(errors, "OfflineModeIsEnabled", ())):
        return Failure.UNREACHABLE
    if isinstance(exc, errors.RevisionNotFoundError):
        return Failure.REVISION_NOT_FOUND
    if isinstance(exc, errors.GatedRepoError):
        return Failure.ACCESS_DENIED
    if isinstance(exc, errors.RepositoryNotFoundError):
        return Failure.NOT_FOUND
    if isinstance(exc, errors.LocalEntryNotFoundError):
        # Raised when the Hub could not be asked and the cache had no answer.
        return Failure.UNREACHABLE
    if isinstance(exc, errors.EntryNotFoundError):
        return Failure.ENTRY_NOT_FOUND
    if isinstance(exc, errors.HfHubHTTPError):
        status = _status(exc)
        if status in (401, 403):
            return Failure.ACCESS_DENIED
        if status == 404:
            return Failure.NOT_FOUND
        if status is None or status >= 500 or status in (408, 429):
            return Failure.UNREACHABLE
        return Failure.OTHER
    if isinstance(exc, _connection_errors()):
        return Failure.UNREACHABLE
    return Failure.OTHER


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _connection_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean "the server could not be reached or stopped answering"."""
    found: list[type[BaseException]] = [ConnectionError, TimeoutError]
    try:
        import requests

        found += [
            requests.exceptions.ConnectionError,
            requests.exceptions.Timeout,
            requests.exceptions.ChunkedEncodingError,
        ]
    except ImportError:
        pass
    for name in ("httpx", "httpx2"):  # huggingface_hub 1.x uses httpx, 2.x its fork httpx2
        try:
            module = __import__(name)
        except ImportError:
            continue
        transport_error = getattr(module, "TransportError", None)
        if isinstance(transport_error, type):
            found.append(transport_error)
    return tuple(found)


def describe(exc: BaseException) -> str:
    """A short description of a huggingface_hub exception: its type and first line.

    Connection errors of requests/urllib3 nest several reprs; only the OS error is kept
    ("ConnectionError: Connection refused"). An error of the local file system (the cache
    cannot be written) keeps its path and says how to fix it.
    """
    local = _local_file_error(exc)
    if local is not None:
        return local
    text = str(exc).strip()
    os_error = re.search(r"\[Errno -?\d+\] ([^\"')\]]+)", text)
    if os_error:
        text = os_error.group(1).strip()
    first = text.splitlines()[0] if text else ""
    if len(first) > 300:
        first = first[:297] + "..."
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _local_file_error(exc: BaseException) -> str | None:
    """Describe an OS error about a file or folder on this machine, or None for other errors.

    The nested-repr shortening of `describe` would cut ``[Errno 13] Permission denied: '<path>'``
    at the quote and lose the path, which is the one thing the user needs.
    """
    if not isinstance(exc, OSError) or isinstance(exc, _connection_errors()):
        return None
    path = exc.filename
    if path is None:
        return None
    text = f"{type(exc).__name__}: {exc.strerror or 'error'}: {os.fsdecode(path)}"
    if exc.filename2 is not None:
        text += f" -> {os.fsdecode(exc.filename2)}"
    cache = cache_dir()
    if exc.errno in _FULL:
        text += (
            f". The disk that holds the Hugging Face cache (HF_HUB_CACHE={cache}) is full: free "
            "space there, or point HF_HUB_CACHE at a folder on another disk"
        )
    elif exc.errno in _UNWRITABLE:
        text += (
            f". The Hugging Face cache (HF_HUB_CACHE={cache}) cannot be written by this user: "
            "point HF_HUB_CACHE at a writable folder (e.g. HF_HUB_CACHE=~/.cache/hf-kernels), or "
            "have the cache's owner make it writable; a read-only shared cache works offline "
            "(HF_HUB_OFFLINE=1) once `kernels download PROJECT_DIR` has filled it"
        )
    return text


#: OS errors that mean "this user cannot write there", as opposed to a missing file.
_UNWRITABLE = frozenset(
    getattr(errno, name) for name in ("EACCES", "EPERM", "EROFS", "ENOTDIR") if hasattr(errno, name)
)
_FULL = frozenset(getattr(errno, name) for name in ("ENOSPC", "EDQUOT") if hasattr(errno, name))


def offline_hint() -> str:
    """What to tell a user whose cache lacks something while the Hub is off limits."""
    if is_offline():
        how = "unset HF_HUB_OFFLINE (or set it to 0) and run once online"
    else:
        how = f"check that {endpoint()} can be reached and run again"
    return (
        f"To fetch it, {how}, or prefetch a project's locked kernels with "
        "`kernels download PROJECT_DIR` (docs/hub.md#offline-use)."
    )
