"""The few things we need from huggingface_hub, the same way on its 0.x, 1.x and 2.x lines.

Every Hub call, the cache layout, offline mode, the endpoint and the token are
huggingface_hub's: this module only smooths over what moved between its releases (where
offline mode is read, which HTTP library raises connection errors) and sorts its exceptions
into the few cases `kernels` reports differently.
"""

from __future__ import annotations

import enum
import re
from pathlib import Path

#: A full commit hash; shorter prefixes are not accepted by the Hub as revisions.
COMMIT_PATTERN = re.compile(r"^[0-9a-f]{40}$")


def hub_api():
    """A `HfApi` for the configured endpoint and token (HF_ENDPOINT, HF_TOKEN, ...)."""
    from huggingface_hub import HfApi

    return HfApi()


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


def repo_cache_folder(repo_id: str) -> Path:
    """The cache folder of a model repository (``models--<org>--<name>``)."""
    from huggingface_hub.file_download import repo_folder_name

    return cache_dir() / repo_folder_name(repo_id=repo_id, repo_type="model")


def cached_refs(repo_id: str) -> dict[str, str]:
    """Branch and tag names the cache has resolved for `repo_id`, each with its commit.

    huggingface_hub writes ``refs/<name>`` whenever it downloads by a branch or tag name;
    these files are how offline mode answers "which commit is v0.1.2?".
    """
    refs_dir = repo_cache_folder(repo_id) / "refs"
    if not refs_dir.is_dir():
        return {}
    refs: dict[str, str] = {}
    for path in refs_dir.rglob("*"):
        if path.is_file():
            commit = path.read_text().strip()
            if COMMIT_PATTERN.match(commit):
                refs[path.relative_to(refs_dir).as_posix()] = commit
    return refs


def cached_commits(repo_id: str) -> list[str]:
    """Commits that have a snapshot folder in the cache."""
    snapshots = repo_cache_folder(repo_id) / "snapshots"
    if not snapshots.is_dir():
        return []
    return sorted(p.name for p in snapshots.iterdir() if COMMIT_PATTERN.match(p.name))


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
    ("ConnectionError: Connection refused").
    """
    text = str(exc).strip()
    os_error = re.search(r"\[Errno -?\d+\] ([^\"')\]]+)", text)
    if os_error:
        text = os_error.group(1).strip()
    first = text.splitlines()[0] if text else ""
    if len(first) > 300:
        first = first[:297] + "..."
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


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
