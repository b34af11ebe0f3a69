"""A project's kernel dependencies, as its ``pyproject.toml`` lists them.

```toml
[tool.kernels.dependencies]
"kernels-community/activation" = ">=0.1,<0.2"     # a version specifier
"kernels-community/moe" = 1                         # the branch v1
"my-org/fused-mlp" = { version = ">=1.0,<2", trust-remote-code = true }
"someone/experiment" = { revision = "3f1c0d..." }  # a branch, tag or commit
"old-org/mirrored" = { version = ">=0.1", repo-type = "model" }  # published as a model repo
```
"""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import KernelLockError, KernelsError
from .bounded_json import MiB, decode_utf8, quoted, read_bounded
from .hubclient import KERNEL_REPO_TYPE, check_repo_type
from .repo_id import fold, is_repo_id
from .trust import TrustArgument, normalize_trust
from .versions import check_version_argument

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: The largest pyproject.toml read: big projects' are tens of KiB.
MAX_PYPROJECT_SIZE = 4 * MiB

#: The longest ``revision`` read: a branch or tag name, or a 40-character commit hash.
MAX_REVISION_LENGTH = 256

# Each key of an entry's table, and the spelling pyproject.toml conventions also allow.
_ALIASES = {
    "version": ("version",),
    "revision": ("revision",),
    "trust-remote-code": ("trust-remote-code", "trust_remote_code"),
    "repo-type": ("repo-type", "repo_type"),
}
_TABLE_PATH = ("tool", "kernels", "dependencies")
_TABLE_KEYS = {spelling for spellings in _ALIASES.values() for spelling in spellings}


@dataclass(frozen=True)
class Dependency:
    """One kernel a project depends on."""

    repo_id: str
    version: str | int | None = None
    revision: str | None = None
    trust_remote_code: TrustArgument = False
    #: "kernel" (the Hub's kernel repositories) or "model" (kernels published as models).
    repo_type: str = KERNEL_REPO_TYPE

    @property
    def requirement(self) -> str:
        """How the pyproject pins it, for the lock and for messages."""
        if self.revision is not None:
            return f"revision {self.revision}"
        if self.version is not None:
            return str(self.version)
        return "main (unpinned)"


def read_dependencies(project_dir: Path) -> list[Dependency]:
    """The ``[tool.kernels.dependencies]`` of ``project_dir/pyproject.toml``.

    Raises:
        KernelLockError: no pyproject.toml, one larger than `MAX_PYPROJECT_SIZE`, not UTF-8
            TOML, or a malformed table or entry (the message names it).
    """
    path = Path(project_dir) / "pyproject.toml"
    if not path.is_file():
        raise KernelLockError(
            f"{path} does not exist; `kernels lock` reads the kernels a project depends on from "
            "[tool.kernels.dependencies] in its pyproject.toml."
        )
    table = _read_toml(path)
    for depth, key in enumerate(_TABLE_PATH):
        value = table.get(key)
        if value is None:
            raise KernelLockError(
                f"{path} has no [tool.kernels.dependencies] table. Add one, e.g.\n"
                '[tool.kernels.dependencies]\n"kernels-community/activation" = ">=0.1,<0.2"'
            )
        if not isinstance(value, dict):
            name = ".".join(_TABLE_PATH[: depth + 1])
            raise KernelLockError(f"[{name}] in {path} must be a table, not {_toml_type(value)}.")
        table = value
    return [_dependency(repo_id, value, path) for repo_id, value in table.items()]


def dependency_trust(project_dir: Path, repo_id: str) -> TrustArgument:
    """The ``trust-remote-code`` that ``project_dir/pyproject.toml`` gives `repo_id`.

    For lock entries that record no trust decision (Hugging Face's lock format): the
    project that wrote the lock beside its pyproject.toml said there whom it trusts.
    False when there is no pyproject.toml, no ``[tool.kernels.dependencies]`` table, or no
    entry for `repo_id` (compared without ASCII case, as the Hub compares ids).

    Raises:
        KernelLockError: the pyproject.toml or its table is malformed (as `read_dependencies`).
    """
    path = Path(project_dir) / "pyproject.toml"
    if not path.is_file():
        return False
    table: object = _read_toml(path)
    for key in _TABLE_PATH:
        if not isinstance(table, dict) or key not in table:
            return False
        table = table[key]
    wanted = fold(repo_id)
    for dependency in read_dependencies(project_dir):
        if fold(dependency.repo_id) == wanted:
            return dependency.trust_remote_code
    return False


def untrusted_folder(folder: Path) -> str | None:
    """Why a folder's ``kernels.lock`` must not be read by a search, or None when it may be.

    A lock found by searching (a locked load called without ``lockfile=``) pins commits and
    grants trust, so it must be the user's own: the folder must belong to this user (or to
    root, who can change anything anyway) and be writable by nobody else. A folder another
    user owns, or one that is group- or world-writable (``/tmp``, a shared scratch folder),
    is where anyone could plant a lock. A folder that cannot be inspected counts as foreign.
    """
    try:
        info = os.stat(folder)
    except OSError as exc:
        return f"it cannot be inspected ({exc.strerror or exc})"
    if hasattr(os, "getuid") and info.st_uid not in (os.getuid(), 0):
        return f"it belongs to another user (uid {info.st_uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"other users can write it (mode {stat.filemode(info.st_mode)})"
    return None


def _read_toml(path: Path) -> dict:
    try:
        raw = read_bounded(path, limit=MAX_PYPROJECT_SIZE, error=KernelLockError)
    except OSError as exc:
        raise KernelLockError(f"Cannot read {path} ({exc.strerror or exc}).") from exc
    text = decode_utf8(raw, where=str(path), error=KernelLockError, kind="TOML")
    try:
        return tomllib.loads(text)
    except RecursionError:
        # tomllib recurses once per level of nested arrays and inline tables.
        raise KernelLockError(
            f"{path} nests arrays or inline tables too deeply to be read as TOML."
        ) from None
    except ValueError as exc:  # TOMLDecodeError, or an integer too long to convert
        raise KernelLockError(f"{path} is not valid TOML: {exc}") from exc


def _dependency(repo_id: str, value: object, path: Path) -> Dependency:
    where = f"{quoted(repo_id)} in [tool.kernels.dependencies] of {path}"
    if not is_repo_id(repo_id):
        raise KernelLockError(
            f"[tool.kernels.dependencies] of {path}: the key {quoted(repo_id)} is not a Hub "
            "repository id; write it as 'org/name' with ASCII letters, digits, '-', '_' and '.', "
            'e.g. "kernels-community/activation" = ">=0.1,<0.2".'
        )
    try:
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            check_version_argument(value, repo_id=repo_id)
            return Dependency(repo_id, version=value)
        if isinstance(value, dict):
            return _table_dependency(repo_id, value, where)
    except KernelLockError:
        raise
    except KernelsError as exc:  # a malformed specifier, trust list or repository type
        raise KernelLockError(f"{where}: {exc}") from None
    raise KernelLockError(
        f"{where} must be a version specifier string, an int (the branch vN) or a table with "
        f"version / revision / trust-remote-code / repo-type, got {_toml_type(value)} "
        f"{quoted(value)}."
    )


def _table_dependency(repo_id: str, value: dict, where: str) -> Dependency:
    unknown = set(value) - _TABLE_KEYS
    if unknown:
        raise KernelLockError(
            f"{where} has unknown keys {', '.join(sorted(map(_key, unknown)))}; use version, "
            "revision, trust-remote-code and repo-type."
        )
    given = {}
    for key, spellings in _ALIASES.items():
        present = [s for s in spellings if s in value]
        if len(present) > 1:
            raise KernelLockError(f"{where} gives both {' and '.join(present)}; give one.")
        if present:
            given[key] = value[present[0]]
    version = given.get("version")
    revision = given.get("revision")
    if version is not None and revision is not None:
        raise KernelLockError(f"{where} gives both version and revision; give one.")
    check_version_argument(version, repo_id=repo_id)
    if revision is not None and not (
        isinstance(revision, str) and revision.strip() and len(revision) <= MAX_REVISION_LENGTH
    ):
        raise KernelLockError(
            f"{where}: revision must be a branch, tag or commit name (a string of at most "
            f"{MAX_REVISION_LENGTH} characters), got {_toml_type(revision)} {quoted(revision)}."
        )
    trust = given.get("trust-remote-code", False)
    if not isinstance(trust, bool) and not (
        isinstance(trust, list) and all(isinstance(name, str) for name in trust)
    ):
        raise KernelLockError(
            f"{where}: trust-remote-code must be true, false or a list of organisations / "
            f"repository ids, got {_toml_type(trust)} {quoted(trust)}."
        )
    return Dependency(
        repo_id,
        version=version,
        revision=revision,
        trust_remote_code=normalize_trust(trust, where=f"{where}: trust-remote-code"),
        repo_type=check_repo_type(
            given.get("repo-type", KERNEL_REPO_TYPE), where=f"{where}: repo-type"
        ),
    )


def _key(key: str) -> str:
    """A TOML key for a message: as written when short and printable, else quoted."""
    return key if len(key) <= 40 and key.isprintable() else quoted(key)


def _toml_type(value: object) -> str:
    """How TOML names the type of a parsed value, with its article: ``"an array"``."""
    if isinstance(value, bool):
        return "a boolean"
    return {
        str: "a string",
        int: "an integer",
        float: "a float",
        list: "an array",
        dict: "a table",
    }.get(type(value), "a date or time")
