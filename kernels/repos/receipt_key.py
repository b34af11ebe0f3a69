"""The user's secret that makes verification receipts unforgeable by other cache writers.

A receipt (`kernels.repos.digests`, `kernels.repos.signatures`) lets a warm load skip hashing
files or verifying a signature. It lives in the Hub cache, which other users or processes
may be able to write (a shared ``HF_HOME``, a cache mounted from elsewhere). So every receipt
carries an HMAC-SHA256 over what it vouches for, keyed with 32 random bytes that only this
user can read: ``$KERNELS_STATE_DIR/receipt.key``, by default
``$XDG_STATE_HOME/kernels/receipt.key`` (``~/.local/state/kernels/receipt.key``), outside
the shared cache. A receipt whose code does not verify is ignored and the files are checked
again; a cache writer who cannot read the key cannot make one that verifies.

The key is refused (receipts are then neither trusted nor written, and every load verifies
in full, with one WARNING saying why) when its folder or file belongs to another user, is
readable or writable by the group or others, is a link, or is not exactly 32 bytes. It is
created atomically (written under a temporary name with mode 0600, then linked into place,
so a reader never sees half a key and two processes that race agree on one).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import logging
import os
import stat
from pathlib import Path

logger = logging.getLogger(__name__)

#: Overrides the folder that holds the key (default ``$XDG_STATE_HOME/kernels``).
ENV_STATE_DIR = "KERNELS_STATE_DIR"
KEY_FILE = "receipt.key"
KEY_SIZE = 32

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# Keys already read, by folder: a load checks several receipts.
_keys: dict[Path, bytes] = {}


def state_dir() -> Path:
    """The user-private folder of `kernels`' state (the receipt key)."""
    explicit = os.environ.get(ENV_STATE_DIR)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "kernels"


class KeyRefused(Exception):
    """The key cannot be used; the message says why."""


def receipt_key() -> bytes | None:
    """This user's receipt key, created on first use; None where no trustworthy key can be had
    (receipts are then not used: every load verifies in full)."""
    folder = state_dir()
    key = _keys.get(folder)
    if key is not None:
        return key
    try:
        key = _keys[folder] = _load_or_create(folder)
        return key
    except KeyRefused as exc:
        _warn_once(str(exc))
    except OSError as exc:
        _warn_once(f"cannot read or create {folder / KEY_FILE} ({exc.strerror or exc})")
    return None


def seal(purpose: str, payload: str) -> str | None:
    """The code (hex) vouching for `payload` as a receipt of `purpose`; None without a key."""
    key = receipt_key()
    if key is None:
        return None
    return hmac.new(key, f"{purpose}\0{payload}".encode(), hashlib.sha256).hexdigest()


def holds(purpose: str, payload: str, code: object) -> bool:
    """Whether `code` is this user's seal of `payload` for `purpose` (constant-time)."""
    if not isinstance(code, str):
        return False
    expected = seal(purpose, payload)
    return expected is not None and hmac.compare_digest(expected, code)


def _load_or_create(folder: Path) -> bytes:
    _private_folder(folder)
    path = folder / KEY_FILE
    try:
        return _read_key(path)
    except FileNotFoundError:
        pass
    tmp = folder / f".{KEY_FILE}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(KEY_SIZE))
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):  # another process won: use its key
            os.link(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return _read_key(path)


def _private_folder(folder: Path) -> None:
    """Create `folder` (0700) or check that it is this user's and no one else's."""
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700, parents=True)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode):
        raise KeyRefused(f"{folder} is not a folder (a link?)")
    if _foreign(info):
        raise KeyRefused(f"{folder} belongs to user {info.st_uid}, not to you")
    if info.st_mode & 0o077:
        # Ours: make it private rather than refuse (an older tool created it 0755).
        os.chmod(folder, 0o700)


def _read_key(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise KeyRefused(f"{path} is not a regular file")
        if _foreign(info):
            raise KeyRefused(f"{path} belongs to user {info.st_uid}, not to you")
        if info.st_mode & 0o077:
            raise KeyRefused(
                f"{path} can be read or written by others (mode {stat.filemode(info.st_mode)}); "
                "delete it (a new one is made) or chmod 600 it"
            )
        key = f.read(KEY_SIZE + 1)
    if len(key) != KEY_SIZE:
        raise KeyRefused(f"{path} is not a {KEY_SIZE}-byte key; delete it (a new one is made)")
    return key


def _foreign(info: os.stat_result) -> bool:
    """Whether a file belongs to another user (never on systems without user ids)."""
    return hasattr(os, "getuid") and info.st_uid != os.getuid()


@functools.lru_cache(maxsize=8)
def _warn_once(why: str) -> None:
    logger.warning(
        "Verification receipts are not used: %s. Every kernel load checks its files and "
        "signature in full (slower, never less safe). See docs/security.md#receipts.",
        why,
    )


__all__ = ["ENV_STATE_DIR", "KEY_FILE", "holds", "receipt_key", "seal", "state_dir"]
