"""Lock files: the exact commits and file hashes of a project's kernels.

``kernels lock PROJECT_DIR`` resolves each ``[tool.kernels.dependencies]`` entry of the
project's pyproject.toml to a commit and writes ``kernels.lock``, a JSON list with one entry
per kernel::

    {
      "repo_id": "kernels-community/activation",
      "repo_type": "kernel",               # or "model" for a kernel published as a model
      "sha": "<commit>",
      "version": ">=0.1,<0.2",            # what pyproject.toml asked for
      "ref": "v0.1.3",                     # the tag or branch it resolved to
      "trust": {"trusted": true, "reason": "organisation kernels-community trusted by default"},
      "variants": {"torch-universal": {"hash": "sha256-<hex>", "hash_type": "git_lfs_concat"}},
      "files": {"torch-universal": {"activation/__init__.py": "git-sha1:<hex>", ...}}
    }

``variants`` is the format of Hugging Face's ``kernels`` (so either tool reads the other's
locks): per build variant, the SHA-256 over each file's path (relative to
``build/<variant>/``, sorted as UTF-8 bytes) followed by its digest, where the digest is the
Git LFS SHA-256 for LFS files and the Git blob SHA-1 otherwise. ``files`` keeps every file's
digest, so a mismatch names the file. ``version``, ``ref``, ``trust`` and ``files`` are ours;
Hugging Face's ``kernels`` ignores them.

``repo_type`` says where the commit lives. Entries written before the Hub had a kernel
repository type have none: they are looked for as kernel repositories (where the Hub moved
them), then as model repositories (an old mirror, or snapshots already in the cache). The
lock's hashes decide whether what was found is the locked code, so the second look can never
load other code.

Locked loads download exactly the locked commit, verify every file of the variant against
the lock and only then import it: a mismatch raises `KernelHashMismatchError` naming the
file, and nothing of that download is imported.

Hugging Face's ``kernels`` 0.17 writes another format, which is read too (and written by
``kernels lock --format hf``)::

    [{"dependency": {"repo-id": "kernels-community/activation", "version": 1},
      "lock": {"commit": "<commit>"}}]

``dependency`` holds ``version`` (an int N: the branch vN) or ``revision`` (a branch, tag or
commit), never both; unknown keys are refused, as their client refuses them. Such an entry
has no file hashes and no trust record: a load pins the commit (logged at INFO, saying the
files are not verified), and the repository must pass the normal trust rules, or be
given ``trust-remote-code`` by the pyproject.toml beside the lock (see `_locked_trust`). A
lock file holds entries of one format: a mix is refused.

The kernels a locked kernel is built on (``kernel-depends`` in any variant's metadata.json,
`kernels.repos.kernel_deps`) are locked too, as entries of their own (`lock_tree`), in
either format, as Hugging Face's ``lock_kernel_tree`` does; a locked load gives the kernel
each dependency at the commit its entry pins.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from ..errors import (
    KernelLockError,
    KernelMappingError,
    KernelOfflineError,
    KernelRepositoryNotFoundError,
    KernelRevisionError,
    KernelVersionSpecError,
)
from . import hubclient
from .base import PackageFunction, warn_function_repository_deprecated
from .bounded_json import MiB, json_type, load_json_file, parse_json, quoted
from .download import (
    FetchedKernel,
    LoadedHubKernel,
    check_fetched_arch,
    fetch_kernel,
    get_kernel_variants,
    import_fetched,
)
from .hashing import HASH_TYPE, combined_hash, verify_variant
from .hubclient import KERNEL_REPO_TYPE, MODEL_REPO_TYPE
from .info import METADATA_FILE, Metadata
from .kernel_deps import KEY as KERNEL_DEPENDS
from .kernel_deps import KernelDependency, dependencies_loaded, parse_kernel_depends
from .project import Dependency, dependency_trust, read_dependencies, untrusted_folder
from .project import _read_toml as read_toml
from .provides import provided_kernel
from .repo_id import fold, is_repo_id
from .trust import TrustArgument, TrustDecision, decide_trust, normalize_trust, require_trust
from .variants import MachineBuild, is_variant_name, machine_for_backend
from .versions import (
    ResolvedRevision,
    all_latest,
    check_version_argument,
    hub_error,
    resolve_latest,
    resolve_revision,
)

logger = logging.getLogger(__name__)

LOCK_FILE = "kernels.lock"

#: The largest lock file read: one kernel's entry, with every file's digest, is a few KiB.
MAX_LOCK_SIZE = 4 * MiB

_RELOCK = "Re-create the lock with `kernels lock PROJECT_DIR`."

#: ``kernels lock --format``: ours (with file hashes and trust), or Hugging Face's 0.17 one.
FORMAT_KERNELS = "kernels"
FORMAT_HF = "hf"
LOCK_FORMATS = (FORMAT_KERNELS, FORMAT_HF)


@dataclass(frozen=True)
class VariantLock:
    """The combined hash of one build variant's files."""

    hash: str
    hash_type: str = HASH_TYPE


@dataclass(frozen=True)
class KernelLock:
    """One kernel in a lock file.

    An entry read from Hugging Face's 0.17 format has no `variants` (hashes), `files` or
    `trust`; its `version` is the int N it asked for (with `ref` ``"vN"``), or its `ref` the
    revision it asked for.
    """

    repo_id: str
    sha: str
    #: Empty only for an entry of Hugging Face's 0.17 format, which records no hashes.
    variants: dict[str, VariantLock]
    version: str | int | None = None
    #: The tag or branch the lock resolved (or, in Hugging Face's format, the revision asked).
    ref: str | None = None
    trust: dict | None = None
    #: variant -> path inside ``build/<variant>/`` -> ``git-sha1:<hex>`` or ``sha256:<hex>``.
    files: dict[str, dict[str, str]] = field(default_factory=dict)
    #: "kernel" or "model"; None in entries written before the Hub had kernel repositories.
    repo_type: str | None = None

    @property
    def hashed(self) -> bool:
        """Whether the entry records file hashes (ours does; Hugging Face's 0.17 format not)."""
        return bool(self.variants)

    @property
    def repo_types(self) -> tuple[str, ...]:
        """Where to look for the locked commit, in order (see the module docstring)."""
        if self.repo_type is not None:
            return (self.repo_type,)
        return (KERNEL_REPO_TYPE, MODEL_REPO_TYPE)

    @classmethod
    def from_json(cls, data: object, *, where: str) -> KernelLock:
        """One entry of a lock file, from its parsed JSON (any value may be given).

        Every field is checked, so that nothing downstream meets a value of the wrong type:
        the repository id is a Hub id, ``sha`` a full commit hash, variant names are build
        variant names (one path component each), hashes and digests have their exact form,
        and file paths stay inside their variant folder. Unknown keys are ignored, as
        locks written by newer versions may carry more.

        An entry with ``dependency`` or ``lock`` is one of Hugging Face's 0.17 format (see the
        module docstring), checked as strictly, unknown keys included.

        Args:
            data: the parsed entry.
            where: how to name the lock (and entry) in messages.

        Raises:
            KernelLockError: the entry is malformed; the message names the field.
        """
        if not isinstance(data, dict):
            raise KernelLockError(f"{where}: each entry must be an object, got {json_type(data)}.")
        if "dependency" in data or "lock" in data:
            return cls._from_hf_json(data, where=where)
        missing = [key for key in ("repo_id", "sha", "variants") if key not in data]
        if missing:
            raise KernelLockError(
                f"{where}: an entry lacks {', '.join(map(repr, missing))}; each needs repo_id, "
                f"sha and variants. {_RELOCK}"
            )
        repo_id = data["repo_id"]
        if not is_repo_id(repo_id):
            raise KernelLockError(
                f"{where}: the entry's repo_id {quoted(repo_id)} is not a Hub repository id "
                f"('org/name' in ASCII letters, digits, '-', '_' and '.'). {_RELOCK}"
            )
        entry = f"{where}: {repo_id}"
        sha = data["sha"]
        if not (isinstance(sha, str) and _COMMIT.fullmatch(sha)):
            raise KernelLockError(
                f"{entry} is locked to {quoted(sha)}, not a commit hash (40 lowercase hex "
                f"digits). {_RELOCK}"
            )
        variants = _variant_locks(data["variants"], entry)
        files = _file_digests(
            data.get("files"), variants, f"{where}: the per-file digests of {repo_id}"
        )
        repo_type = data.get("repo_type")
        if repo_type is not None:
            try:
                hubclient.check_repo_type(repo_type, where=entry)
            except KernelMappingError as exc:
                raise KernelLockError(str(exc)) from None
        return cls(
            repo_id=repo_id,
            sha=sha,
            variants=variants,
            version=_version(data.get("version"), entry),
            ref=_ref(data.get("ref"), entry),
            trust=_trust_record(data.get("trust"), entry),
            files=files,
            repo_type=repo_type,
        )

    @classmethod
    def _from_hf_json(cls, data: dict, *, where: str) -> KernelLock:
        """An entry of Hugging Face's 0.17 format (`from_json` has checked it is an object)."""
        _only_keys(data, ("dependency", "lock"), where, "an entry")
        dependency, lock = data.get("dependency"), data.get("lock")
        if not isinstance(dependency, dict) or not isinstance(lock, dict):
            raise KernelLockError(
                f"{where}: an entry of Hugging Face's lock format needs 'dependency' and 'lock' "
                f'objects, e.g. {{"dependency": {{"repo-id": "org/name", "version": 1}}, '
                f'"lock": {{"commit": "<40 hex>"}}}}, got {quoted(data)}. {_RELOCK}'
            )
        _only_keys(dependency, ("repo-id", "version", "revision"), where, "'dependency'")
        _only_keys(lock, ("commit",), where, "'lock'")
        repo_id = dependency.get("repo-id")
        if not is_repo_id(repo_id):
            raise KernelLockError(
                f"{where}: the entry's repo-id {quoted(repo_id)} is not a Hub repository id "
                f"('org/name' in ASCII letters, digits, '-', '_' and '.'). {_RELOCK}"
            )
        entry = f"{where}: {repo_id}"
        if ("version" in dependency) == ("revision" in dependency):
            raise KernelLockError(
                f"{entry}: 'dependency' must give one of 'version' (an int N, the branch vN) "
                f"and 'revision' (a branch, tag or commit), got {quoted(dependency)}. {_RELOCK}"
            )
        commit = lock.get("commit")
        # Their parser accepts upper-case hex and stores it lower-cased; so do we (ASCII
        # only: str.lower maps some non-ASCII letters to ASCII ones).
        if not (isinstance(commit, str) and commit.isascii() and _COMMIT.fullmatch(commit.lower())):
            raise KernelLockError(
                f"{entry} is locked to {quoted(commit)}, not a commit hash (40 hex digits). "
                f"{_RELOCK}"
            )
        ref: str | None
        if "version" in dependency:
            version = dependency["version"]
            if not isinstance(version, int) or isinstance(version, bool):
                raise KernelLockError(
                    f"{entry}: 'version' in Hugging Face's lock format is an int N (the branch "
                    f"vN), got {quoted(version)}. {_RELOCK}"
                )
            version = _version(version, entry)
            ref = f"v{version}"
        else:
            version, ref = None, dependency["revision"]
            if ref is None:
                raise KernelLockError(f"{entry}: 'revision' is null. {_RELOCK}")
            ref = _ref(ref, entry, what="'revision' must be a branch, tag or commit")
        return cls(
            repo_id=repo_id,
            sha=commit.lower(),
            variants={},
            version=version,
            ref=ref,
            # Their client loads kernel repositories only, so the commit is looked for there.
            repo_type=KERNEL_REPO_TYPE,
        )

    def to_hf_json(self) -> dict:
        """This entry in Hugging Face's 0.17 format: no hashes, files or trust record.

        An int version stays one; anything else is written as the revision it resolved
        (the tag or branch, else the commit), which is what their format can say.

        Raises:
            KernelLockError: the kernel is a model repository, which their client cannot load.
        """
        if self.repo_type == MODEL_REPO_TYPE:
            raise KernelLockError(
                f"{self.repo_id} is a model repository; Hugging Face's lock format has no "
                "repository type and their client loads kernel repositories only. Write this "
                "lock in our format (`kernels lock` without --format hf), or depend on the "
                "kernel repository."
            )
        dependency: dict = {"repo-id": self.repo_id}
        if isinstance(self.version, int):
            dependency["version"] = self.version
        else:
            dependency["revision"] = self.ref or self.sha
        return {"dependency": dependency, "lock": {"commit": self.sha}}

    def to_json(self) -> dict:
        """This entry as its lock file holds it: ours, or Hugging Face's when it has no hashes
        (an entry read from their format; ours always has them)."""
        if not self.hashed:
            return self.to_hf_json()
        data: dict = {"repo_id": self.repo_id}
        if self.repo_type is not None:
            data["repo_type"] = self.repo_type
        data["sha"] = self.sha
        if self.version is not None:
            data["version"] = self.version
        if self.ref is not None:
            data["ref"] = self.ref
        if self.trust is not None:
            data["trust"] = self.trust
        data["variants"] = {
            name: {"hash": lock.hash, "hash_type": lock.hash_type}
            for name, lock in sorted(self.variants.items())
        }
        if self.files:
            data["files"] = {v: dict(sorted(f.items())) for v, f in sorted(self.files.items())}
        return data


_COMMIT = re.compile(r"[0-9a-f]{40}")
_VARIANT_HASH = re.compile(r"sha256-[0-9a-f]{64}")
_FILE_DIGEST = re.compile(r"git-sha1:[0-9a-f]{40}|sha256:[0-9a-f]{64}")
#: The longest ``ref`` and trust ``reason`` kept: a branch or tag name, a sentence.
_MAX_TEXT = 1024
#: The longest file path inside a variant folder (PATH_MAX on Linux).
_MAX_PATH = 4096


def _variant_locks(value: object, where: str) -> dict[str, VariantLock]:
    if not isinstance(value, dict) or not value:
        raise KernelLockError(
            f"{where}: 'variants' must be an object mapping each build variant to its hash, "
            f'e.g. {{"torch-universal": {{"hash": "sha256-<hex>"}}}}, got {quoted(value)}. '
            f"{_RELOCK}"
        )
    locks = {}
    for name, lock in value.items():
        if not is_variant_name(name):
            raise KernelLockError(
                f"{where}: {quoted(name)} in 'variants' is not a build variant name (such as "
                f"torch-universal or torch28-cxx11-cu128-x86_64-linux). {_RELOCK}"
            )
        if not isinstance(lock, dict) or not (
            isinstance(lock.get("hash"), str) and _VARIANT_HASH.fullmatch(lock["hash"])
        ):
            raise KernelLockError(
                f"{where}: variant {name} must be an object with a 'hash' of the form "
                f"'sha256-<64 hex>', got {quoted(lock)}. {_RELOCK}"
            )
        hash_type = lock.get("hash_type", HASH_TYPE)
        if hash_type != HASH_TYPE:
            raise KernelLockError(
                f"{where} variant {name} has hash_type {quoted(hash_type)}; this version of "
                f"kernels knows {HASH_TYPE!r}."
            )
        locks[name] = VariantLock(lock["hash"], HASH_TYPE)
    return locks


def _file_digests(
    value: object, variants: dict[str, VariantLock], what: str
) -> dict[str, dict[str, str]]:
    """A lock entry's ``files``: variant -> path inside ``build/<variant>/`` -> digest.

    `what` names them in messages ("<lock>: the per-file digests of <repo>").
    """
    if value is None:
        return {}
    problem = _file_digests_problem(value, variants)
    if problem is not None:
        # Checked here so that a hand-edited lock fails as a lock error, not mid-verification.
        raise KernelLockError(
            f"{what} are malformed ({problem}); 'files' maps each locked "
            "variant to {path: 'git-sha1:<40 hex>' or 'sha256:<64 hex>'}, with paths relative "
            f"to build/<variant>/. {_RELOCK}"
        )
    assert isinstance(value, dict)  # _file_digests_problem found none
    return {variant: dict(paths) for variant, paths in value.items()}


def _file_digests_problem(value: object, variants: dict[str, VariantLock]) -> str | None:
    if not isinstance(value, dict):
        return f"'files' is {json_type(value)}, not an object"
    for variant, paths in value.items():
        if variant not in variants:
            return f"{quoted(variant)} is not one of the entry's variants"
        if not isinstance(paths, dict):
            return f"variant {variant} maps to {json_type(paths)}, not an object"
        for path, digest in paths.items():
            if not _is_relative_path(path):
                return f"{quoted(path)} is not a relative path inside build/{variant}/"
            if not (isinstance(digest, str) and _FILE_DIGEST.fullmatch(digest)):
                return f"{quoted(path)} has the digest {quoted(digest)}"
    return None


def _is_relative_path(path: object) -> bool:
    """Whether `path` is a POSIX path that stays inside the folder it is relative to."""
    return (
        isinstance(path, str)
        and 0 < len(path) <= _MAX_PATH
        and "\\" not in path
        and path.isprintable()
        and all(part not in ("", ".", "..") for part in path.split("/"))
    )


def _version(value: object, where: str) -> str | int | None:
    """The ``version`` the pyproject asked for: recorded, so it must be one `kernels` reads."""
    try:
        check_version_argument(value, repo_id=where)
    except KernelVersionSpecError as exc:
        raise KernelLockError(f"{exc} (the lock's 'version') {_RELOCK}") from None
    assert value is None or isinstance(value, (str, int)), value  # as checked just above
    return value


def _ref(
    value: object, where: str, *, what: str = "'ref' must be the tag or branch the lock resolved"
) -> str | None:
    if value is None or (
        isinstance(value, str) and 0 < len(value) <= _MAX_TEXT and value.isprintable()
    ):
        return value
    raise KernelLockError(f"{where}: {what}, got {quoted(value)}. {_RELOCK}")


def _only_keys(value: dict, allowed: tuple[str, ...], where: str, what: str) -> None:
    """Refuse keys Hugging Face's lock format does not have (their parser refuses them too)."""
    unknown = [key for key in value if key not in allowed]
    if unknown:
        raise KernelLockError(
            f"{where}: {what} has unknown key(s) {', '.join(quoted(k) for k in unknown[:5])}; "
            f"Hugging Face's lock format allows {', '.join(allowed)} there. {_RELOCK}"
        )


def _trust_record(value: object, where: str) -> dict | None:
    """The recorded trust decision: ``{"trusted": bool, "reason": str}``, or None."""
    if value is None:
        return None
    reason = value.get("reason", "") if isinstance(value, dict) else None
    if not (
        isinstance(value, dict)
        and isinstance(value.get("trusted"), bool)
        and isinstance(reason, str)
        and len(reason) <= _MAX_TEXT
    ):
        raise KernelLockError(
            f'{where}: \'trust\' must be an object such as {{"trusted": true, "reason": '
            f'"..."}}, got {quoted(value)}. {_RELOCK}'
        )
    return dict(value)  # keys beyond these two, from newer versions, are kept unread


# --- reading and writing locks ---------------------------------------------------------------


def read_lockfile(path: Path) -> list[KernelLock]:
    """The entries of a lock file.

    Raises:
        KernelLockError: it does not exist, cannot be read, is larger than `MAX_LOCK_SIZE`
            (checked before reading it) or is malformed (as `parse_lock`).
    """
    path = Path(path)
    try:
        data = load_json_file(path, error=KernelLockError, limit=MAX_LOCK_SIZE)
    except OSError as exc:
        raise KernelLockError(
            f"Cannot read lock file {path} ({exc.strerror or exc}). Create it with "
            "`kernels lock PROJECT_DIR`."
        ) from exc
    return _entries(data, where=str(path))


def parse_lock(text: str | bytes, *, where: str) -> list[KernelLock]:
    """The entries of a lock file's contents.

    Args:
        text: the contents, as text or bytes (strict UTF-8).
        where: how to name the lock in messages.

    Raises:
        KernelLockError: it is larger than `MAX_LOCK_SIZE`, not UTF-8 JSON nested at most 64
            deep without duplicate keys, not a list, lists a kernel twice, or an entry is
            malformed (as `KernelLock.from_json`).
    """
    return _entries(
        parse_json(text, where=where, error=KernelLockError, limit=MAX_LOCK_SIZE), where
    )


def _entries(data: object, where: str) -> list[KernelLock]:
    if not isinstance(data, list):
        raise KernelLockError(
            f"{where} must hold a JSON array of locked kernels, not {json_type(data)}. {_RELOCK}"
        )
    locks = [
        KernelLock.from_json(entry, where=f"{where} (entry {i + 1})")
        for i, entry in enumerate(data)
    ]
    formats = {lock.hashed for lock in locks}
    if len(formats) > 1:
        # One tool writes a lock file; a mix is a hand edit, and their client refuses ours.
        theirs = [str(i + 1) for i, lock in enumerate(locks) if not lock.hashed]
        raise KernelLockError(
            f"{where} mixes Hugging Face's lock format (entries {', '.join(theirs[:10])}) with "
            "ours; a lock file holds one format. Re-create it with `kernels lock PROJECT_DIR` "
            "(add --format hf for Hugging Face's)."
        )
    seen: dict[str, int] = {}
    for i, lock in enumerate(locks):
        # The Hub compares repository names without ASCII case: two entries would be one repo.
        first = seen.setdefault(fold(lock.repo_id), i)
        if first != i:
            raise KernelLockError(
                f"{where} locks {lock.repo_id} twice (entries {first + 1} and {i + 1}); which "
                f"one counts would be a guess. {_RELOCK}"
            )
    return locks


def write_lockfile(
    path: Path, locks: Iterable[KernelLock], *, format: str = FORMAT_KERNELS
) -> None:
    """Write `locks` to `path` (atomically: a reader sees the old lock or the new one).

    Args:
        format: `FORMAT_KERNELS` (ours: hashes, trust, what was asked and resolved) or
            `FORMAT_HF` (Hugging Face's 0.17 format: repository, version or revision, commit).

    Raises:
        KernelLockError: an unknown format, a lock the format cannot express (see
            `KernelLock.to_hf_json`), or locks that would not read back (e.g. a Hub listing
            gave a path or digest of the wrong form); nothing is written then.
    """
    if format not in LOCK_FORMATS:
        raise KernelLockError(
            f"Unknown lock format {quoted(format)}; use one of {', '.join(LOCK_FORMATS)}."
        )
    locks = list(locks)
    if format == FORMAT_HF:
        entries = [lock.to_hf_json() for lock in locks]
    else:
        unhashed = [lock.repo_id for lock in locks if not lock.hashed]
        if unhashed:
            raise KernelLockError(
                f"Cannot write {', '.join(unhashed)} in our lock format: no file hashes were "
                "recorded for it. Re-create the lock with `kernels lock PROJECT_DIR`."
            )
        entries = [lock.to_json() for lock in locks]
    text = json.dumps(entries, indent=2) + "\n"
    # What is written must be what `read_lockfile` accepts: the values came from the Hub.
    parse_lock(text, where=f"the lock about to be written to {path}")
    tmp = Path(path).with_suffix(".lock.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def lock_dependency(dependency: Dependency) -> KernelLock:
    """Resolve one dependency to a commit and hash every variant's files (no download).

    The file digests come from the Hub's file listing (Git blob ids, LFS SHA-256).

    Raises:
        UntrustedKernelError: the dependency's organisation is not trusted (the lock would
            otherwise carry code nobody agreed to run).
        and the errors of `resolve_revision`.
    """
    repo_id, repo_type = dependency.repo_id, dependency.repo_type
    trust = require_trust(repo_id, dependency.trust_remote_code)
    resolved = resolve_revision(
        repo_id,
        revision=dependency.revision,
        version=dependency.version,
        from_cache=False,
        repo_type=repo_type,
    )
    commit = resolved.commit
    api = hubclient.hub_api()
    try:
        if commit is None:
            commit = api.repo_info(repo_id, revision=resolved.revision, repo_type=repo_type).sha
        entries = list(
            api.list_repo_tree(
                repo_id, revision=commit, path_in_repo="build", recursive=True, repo_type=repo_type
            )
        )
    except Exception as exc:
        raise hub_error(
            exc, repo_id, f"list the files of {repo_id} at {commit}", repo_type
        ) from exc
    files: dict[str, dict[str, str]] = {}
    for entry in entries:
        blob_id = getattr(entry, "blob_id", None)
        if blob_id is None:  # a folder
            continue
        parts = entry.path.split("/")
        if len(parts) < 3 or not is_variant_name(parts[1]):
            continue
        lfs = getattr(entry, "lfs", None)
        lfs_sha = getattr(lfs, "sha256", None) or (
            lfs.get("sha256") if isinstance(lfs, dict) else None
        )
        digest = f"sha256:{lfs_sha}" if lfs_sha else f"git-sha1:{blob_id}"
        files.setdefault(parts[1], {})["/".join(parts[2:])] = digest
    if not files:
        raise KernelLockError(
            f"{repo_id} ({resolved.how}) has no build variants (no build/<variant>/ files); "
            "it is not a kernel repository."
        )
    return KernelLock(
        repo_id=repo_id,
        sha=commit,
        variants={v: VariantLock(combined_hash(f)) for v, f in files.items()},
        version=dependency.version if dependency.revision is None else None,
        ref=resolved.revision if resolved.revision != commit else None,
        trust=trust.as_json(),
        files=files,
        repo_type=repo_type,
    )


def lock_tree(dependencies: Iterable[Dependency]) -> list[KernelLock]:
    """Lock each dependency and, recursively, the ``kernel-depends`` of every build variant
    of what it resolved to (every variant: the lock serves machines of every kind).

    A dependency is locked with the trust given for the kernel that lists it, and its trust
    is checked before anything of it is listed or downloaded. The lock holds one entry per
    repository: two requests of one repository (a project's own and a kernel's, or two
    kernels') must resolve to the same commit.

    Raises:
        KernelLockError: a cycle of ``kernel-depends``, or one repository resolved to two
            commits; and the errors of `lock_dependency`.
        KernelMetadataError: a variant's ``kernel-depends`` is malformed.
    """
    locks: dict[str, KernelLock] = {}
    asked: dict[str, str] = {}
    for dependency in dependencies:
        _lock_with_depends(dependency, locks, asked, chain=(), by="pyproject.toml")
    return list(locks.values())


def _lock_with_depends(
    dependency: Dependency,
    locks: dict[str, KernelLock],
    asked: dict[str, str],
    *,
    chain: tuple[str, ...],
    by: str,
) -> None:
    key = fold(dependency.repo_id)
    lock = lock_dependency(dependency)
    existing = locks.get(key)
    if existing is not None:
        if existing.sha != lock.sha:
            raise KernelLockError(
                f"{dependency.repo_id} is asked for twice and the two resolve to different "
                f"commits: {asked[key]} -> {existing.sha[:12]}, and {dependency.requirement} "
                f"by {by} -> {lock.sha[:12]}. A lock holds one commit per repository: make "
                "both ask for the same version."
            )
        return
    locks[key] = lock
    asked[key] = f"{dependency.requirement} by {by}"
    for dep in _kernel_depends(lock):
        path = (*chain, lock.repo_id)
        if fold(dep.repo_id) in {fold(r) for r in path}:
            cycle = " -> ".join((*path, dep.repo_id))
            raise KernelLockError(
                f"Cyclic kernel-depends: {cycle}. A kernel cannot depend on itself, directly "
                "or through others; it cannot be locked."
            )
        _lock_with_depends(
            Dependency(
                dep.repo_id,
                version=dep.version,
                revision=dep.revision,
                trust_remote_code=dependency.trust_remote_code,
            ),
            locks,
            asked,
            chain=path,
            by=f"the kernel-depends of {lock.repo_id}",
        )


def _kernel_depends(lock: KernelLock) -> list[KernelDependency]:
    """The ``kernel-depends`` of every variant of a locked commit, each request once."""
    api = hubclient.hub_api()
    repo_type = lock.repo_type or KERNEL_REPO_TYPE
    found: dict[KernelDependency, None] = {}
    for variant in sorted(lock.files):
        if METADATA_FILE not in lock.files[variant]:
            continue
        filename = f"build/{variant}/{METADATA_FILE}"
        where = f"{lock.repo_id} at commit {lock.sha[:12]}: {filename}"
        try:
            path = api.hf_hub_download(
                lock.repo_id, filename, revision=lock.sha, repo_type=repo_type
            )
        except Exception as exc:
            raise hub_error(exc, lock.repo_id, f"download {where}", repo_type) from exc
        metadata = Metadata.read_from_file(path)
        for dep in parse_kernel_depends(metadata.extra.get(KERNEL_DEPENDS), where=where):
            found.setdefault(dep)
    return list(found)


def lock_project(
    project_dir: Path, *, format: str = FORMAT_KERNELS
) -> tuple[Path, list[KernelLock]]:
    """Resolve every kernel in ``[tool.kernels.dependencies]``, and the kernels they are
    built on (`lock_tree`), and write ``kernels.lock``.

    Args:
        format: as for `write_lockfile`. Ours is the default: Hugging Face's format keeps
            no file hashes, so loads from it pin the commit but verify no file.
    """
    project_dir = Path(project_dir)
    if format not in LOCK_FORMATS:
        raise KernelLockError(
            f"Unknown lock format {quoted(format)}; use one of {', '.join(LOCK_FORMATS)}."
        )
    locks = lock_tree(read_dependencies(project_dir))
    path = project_dir / LOCK_FILE
    write_lockfile(path, locks, format=format)
    return path, locks


# --- loading locked kernels ---------------------------------------------------------------


@dataclass(frozen=True)
class LockSource:
    """Where a lock came from: a file, or a distribution's metadata."""

    description: str
    locks: tuple[KernelLock, ...]
    #: The project folder (with pyproject.toml) the lock sits in; None for a distribution's.
    project_dir: Path | None = None

    def find(self, repo_id: str) -> KernelLock:
        for lock in self.locks:
            if lock.repo_id == repo_id:
                return lock
        listed = ", ".join(lock.repo_id for lock in self.locks) or "nothing"
        raise KernelLockError(
            f"{repo_id} is not locked in {self.description} (it locks {listed}). Add it to "
            "[tool.kernels.dependencies] in pyproject.toml and run `kernels lock PROJECT_DIR`."
        )


def lock_source(lockfile: str | os.PathLike[str] | None, *, caller: str | None) -> LockSource:
    """The lock to use: `lockfile` when given, else the calling package's.

    The calling package's lock is the ``kernels.lock`` in its distribution's metadata (how
    Hugging Face's kernels ships locks in wheels), else the nearest ``kernels.lock`` beside a
    pyproject.toml above the calling module's file (a source checkout).
    """
    if lockfile is not None:
        path = Path(lockfile)
        return LockSource(f"lock file {path}", tuple(read_lockfile(path)), _project_of(path))
    if caller is None:
        raise KernelLockError(
            "Cannot tell which package is asking for a locked kernel; pass lockfile=... "
            "(the path of kernels.lock)."
        )
    module = sys.modules.get(caller)
    top = caller.split(".")[0]
    for dist_name in importlib.metadata.packages_distributions().get(top, []):
        where = f"the {LOCK_FILE} of distribution {dist_name}"
        try:
            text = importlib.metadata.distribution(dist_name).read_text(LOCK_FILE)
        except importlib.metadata.PackageNotFoundError:
            continue
        except UnicodeDecodeError as exc:
            raise KernelLockError(
                f"{where} is not UTF-8 text (byte {exc.start} is {exc.object[exc.start]:#04x}); "
                f"reinstall {dist_name}, or pass lockfile=..."
            ) from None
        if text is not None:
            return LockSource(where, tuple(parse_lock(text, where=where)))
    source_file = getattr(module, "__file__", None)
    stopped = ""
    if source_file:
        for folder in Path(source_file).resolve().parents:
            # Only the user's own folders: a lock planted in /tmp or another user's folder
            # would pin commits and grant trust (kernels.repos.project.untrusted_folder).
            why = untrusted_folder(folder)
            if why is not None:
                stopped = f" (the search stopped at {folder}: {why})"
                logger.info("Not searching %s for %s: %s", folder, LOCK_FILE, why)
                break
            candidate = folder / LOCK_FILE
            if candidate.is_file():
                logger.info("Locked kernels of %s come from %s", caller, candidate)
                return LockSource(
                    f"lock file {candidate}",
                    tuple(read_lockfile(candidate)),
                    _project_of(candidate),
                )
            if (folder / "pyproject.toml").is_file():
                break
    raise KernelLockError(
        f"No {LOCK_FILE} found for {caller}: its distribution's metadata has none, and there is "
        f"none beside the pyproject.toml above {source_file or 'it'}{stopped}. Run `kernels lock "
        "PROJECT_DIR` (and reinstall the project), or pass lockfile=..."
    )


def _project_of(lockfile: Path) -> Path | None:
    """The folder of `lockfile` when a pyproject.toml sits beside it (the project's lock)."""
    folder = Path(lockfile).parent
    return folder if (folder / "pyproject.toml").is_file() else None


def calling_module() -> str | None:
    """The name of the first module on the stack outside the `kernels` package."""
    frame = inspect.currentframe()
    try:
        while frame is not None:
            name = frame.f_globals.get("__name__")
            if name and name != "kernels" and not name.startswith("kernels."):
                return name
            frame = frame.f_back
        return None
    finally:
        del frame


def _locked_trust(
    lock: KernelLock, source: LockSource, trust_remote_code: TrustArgument
) -> TrustDecision:
    recorded = lock.trust or {}
    if recorded.get("trusted") is True:
        decision = TrustDecision(
            lock.repo_id,
            True,
            f"trusted when locked ({recorded.get('reason', 'no reason recorded')}), per "
            f"{source.description}",
        )
        logger.info("Trusting kernel code from %s: %s", lock.repo_id, decision.reason)
        return decision
    # No record (Hugging Face's format): the project's own pyproject.toml may grant it, as
    # it granted it when `kernels lock` wrote this lock. A lock from a distribution's
    # metadata has no pyproject.toml beside it, so only the normal rules apply there.
    if (
        lock.trust is None
        and source.project_dir is not None
        and not decide_trust(lock.repo_id, trust_remote_code).trusted
    ):
        granted = dependency_trust(source.project_dir, lock.repo_id)
        decision = decide_trust(lock.repo_id, granted)
        if decision.trusted:
            decision = TrustDecision(
                lock.repo_id,
                True,
                f"trust-remote-code for it in {source.project_dir / 'pyproject.toml'} "
                f"({decision.reason})",
            )
            logger.info("Trusting kernel code from %s: %s", lock.repo_id, decision.reason)
            return decision
    return require_trust(lock.repo_id, trust_remote_code)


def fetch_locked(
    lock: KernelLock,
    *,
    variant: str | None = None,
    local_files_only: bool = False,
    machine: MachineBuild | None = None,
) -> FetchedKernel:
    """Make the locked commit's variant present in the cache (not yet verified).

    An entry that names its repository type is fetched from that type only. One written
    before repository types is looked for as a kernel repository, then as a model one.

    Raises:
        the errors of `fetch_kernel`; for an entry of no type, those of the first look.
    """
    first_error: Exception | None = None
    for repo_type in lock.repo_types:
        if (
            lock.repo_type is None
            and repo_type == KERNEL_REPO_TYPE
            and not hubclient.supports_kernel_repo_type()
        ):
            continue  # an old entry, and a huggingface_hub that can only ask for models
        hubclient.require_repo_type(repo_type, lock.repo_id)
        resolved = ResolvedRevision(
            lock.repo_id,
            lock.sha,
            lock.sha,
            f"locked commit {lock.sha[:12]}",
            repo_type=repo_type,
        )
        try:
            fetched = fetch_kernel(
                resolved, variant=variant, local_files_only=local_files_only, machine=machine
            )
        except (KernelRepositoryNotFoundError, KernelRevisionError, KernelOfflineError) as exc:
            if len(lock.repo_types) == 1:
                raise
            first_error = first_error or exc
            continue
        if first_error is not None:
            logger.info(
                "%s: the lock entry names no repository type and no kernel repository has "
                "commit %s; using the model repository that does (verified against the lock)",
                lock.repo_id,
                lock.sha[:12],
            )
        return fetched
    assert first_error is not None
    raise first_error


def _verify_locked(fetched: FetchedKernel, lock: KernelLock, where: str) -> None:
    if not lock.hashed:
        # Hugging Face's format records only the commit: what the Hub serves for it is used.
        logger.info(
            "%s: %s records no file hashes (Hugging Face's lock format), so the files of "
            "commit %s are used unverified; `kernels lock PROJECT_DIR` writes a lock with "
            "hashes",
            lock.repo_id,
            where,
            lock.sha[:12],
        )
        return
    verify_variant(
        fetched.variant_dir,
        lock.variants,
        repo_id=lock.repo_id,
        commit=fetched.commit,
        variant=fetched.variant,
        files=lock.files,
        where=where,
    )


def _load_locked(
    repo_id: str,
    source: LockSource,
    *,
    local_files_only: bool,
    trust_remote_code: TrustArgument,
    backend: str | None = None,
    check_arch: bool = True,
) -> LoadedHubKernel:
    lock = source.find(repo_id)
    trust = _locked_trust(lock, source, trust_remote_code)
    machine = machine_for_backend(backend)
    if all_latest():
        # The lock's pin is overridden (UNSTABLE_KERNELS_ALL_LATEST): its hashes are those
        # of another commit, so the latest one is loaded unverified, as a Hub kernel.
        latest = resolve_latest(
            lock.repo_id,
            asked=f"locked commit {lock.sha}",
            repo_type=lock.repo_types[0],
            local_files_only=local_files_only,
        )
        fetched = fetch_kernel(latest, local_files_only=local_files_only, machine=machine)
    else:
        fetched = fetch_locked(lock, local_files_only=local_files_only, machine=machine)
        _verify_locked(fetched, lock, source.description)
    if check_arch:
        check_fetched_arch(fetched)

    def load_dependency(dependency: KernelDependency) -> ModuleType:
        # The kernel's kernel-depends load from the same lock, at their locked commits.
        wanted = fold(dependency.repo_id)
        locked = next((other for other in source.locks if fold(other.repo_id) == wanted), None)
        if locked is None:
            raise KernelLockError(
                f"{repo_id} depends on {dependency.repo_id} (kernel-depends in its "
                f"metadata.json), which {source.description} does not lock; it was written "
                "before locks held kernel-depends. Re-create it with `kernels lock PROJECT_DIR`."
            )
        return _load_locked(
            locked.repo_id,
            source,
            local_files_only=local_files_only,
            trust_remote_code=trust_remote_code,
            backend=backend,
            check_arch=check_arch,
        ).module

    with dependencies_loaded(fetched.location.package_dir, repo_id, load_dependency):
        imported = import_fetched(fetched, trust)
    checked = "lock overridden: latest version, unverified" if all_latest() else _checked(lock)
    loaded = LoadedLockedKernel(imported.module, fetched, trust, checked=checked)
    logger.info("Loaded locked kernel %s (%s); %s", loaded.describe(), loaded.checked, trust.reason)
    return loaded


@dataclass(frozen=True)
class LoadedLockedKernel(LoadedHubKernel):
    """A kernel imported from a lock, and what the lock let us check."""

    #: "verified", or what was checked instead (a lock of Hugging Face's format has no hashes).
    checked: str = field(default="verified", kw_only=True)


def _checked(lock: KernelLock) -> str:
    """What a locked load checked, for messages."""
    return "verified" if lock.hashed else "commit pinned, no hashes to verify"


def load_kernel(
    repo_id: str,
    *,
    lockfile: str | os.PathLike[str] | None = None,
    backend: str | None = None,
    check_arch: bool = True,
    trust_remote_code: bool | list[str] = False,
) -> ModuleType:
    """Import a locked kernel that is already in the cache (no Hub call).

    Use after ``kernels download PROJECT_DIR``, e.g. offline or in CI. The files are
    verified against the lock before they are imported.

    Args:
        repo_id: the Hub repository, as listed in the lock.
        lockfile: the ``kernels.lock`` to read; by default the calling package's.
        backend: load the build for this backend, as for `get_kernel`.
        check_arch: refuse a build that does not support the current GPU, as for
            `get_kernel`.
        trust_remote_code: needed only when the lock does not record the kernel as trusted.

    Example:
        ```python
        from kernels import load_kernel

        activation = load_kernel("kernels-community/activation", lockfile="kernels.lock")
        ```
    """
    source = lock_source(lockfile, caller=calling_module() if lockfile is None else None)
    return _load_locked(
        repo_id,
        source,
        local_files_only=True,
        trust_remote_code=normalize_trust(trust_remote_code),
        backend=backend,
        check_arch=check_arch,
    ).module


def get_locked_kernel(
    repo_id: str,
    *,
    lockfile: str | os.PathLike[str] | None = None,
    trust_remote_code: bool | list[str] = False,
    user_agent: str | dict | None = None,
    check_arch: bool = True,
    local_files_only: bool = False,
) -> ModuleType:
    """Download (if needed), verify and import the locked commit of a kernel.

    Args:
        repo_id: the Hub repository, as listed in the lock.
        lockfile: the ``kernels.lock`` to read; by default the calling package's.
        trust_remote_code: needed only when the lock does not record the kernel as trusted.
        user_agent: sent with the Hub requests of this load, as for `get_kernel`.
        check_arch: refuse a build that does not support the current GPU, as for
            `get_kernel`.
        local_files_only: only use the cache, as `load_kernel` does.
    """
    source = lock_source(lockfile, caller=calling_module() if lockfile is None else None)
    with hubclient.user_agent_for(user_agent):
        return _load_locked(
            repo_id,
            source,
            local_files_only=local_files_only,
            trust_remote_code=normalize_trust(trust_remote_code),
            check_arch=check_arch,
        ).module


def download_locked(
    project_dir: Path, *, all_variants: bool = False, trust_remote_code: TrustArgument = False
) -> list[tuple[KernelLock, list[FetchedKernel]]]:
    """Download and verify every kernel in ``PROJECT_DIR/kernels.lock``.

    Args:
        all_variants: download every locked variant, not only the one this machine runs.
        trust_remote_code: for kernels whose lock entry records no trust decision (locks
            written by other tools), as for `get_kernel`.
    """
    path = Path(project_dir) / LOCK_FILE
    source = LockSource(f"lock file {path}", tuple(read_lockfile(path)), _project_of(path))
    done = []
    for lock in source.locks:
        trust = _locked_trust(lock, source, trust_remote_code)
        variants: Sequence[str | None] = [None]
        if all_variants:
            variants = sorted(lock.variants) if lock.hashed else _offered_variants(lock)
        fetched_all = []
        for variant in variants:
            fetched = fetch_locked(lock, variant=variant)
            _verify_locked(fetched, lock, source.description)
            fetched_all.append(fetched)
        logger.info(
            "Downloaded %s at %s (%s, %s); %s",
            lock.repo_id,
            lock.sha[:12],
            ", ".join(f.variant for f in fetched_all),
            _checked(lock),
            trust.reason,
        )
        done.append((lock, fetched_all))
    return done


def _offered_variants(lock: KernelLock) -> list[str]:
    """Every build variant at the locked commit, for an entry that lists none (no hashes)."""
    decisions = get_kernel_variants(lock.repo_id, revision=lock.sha, repo_type=lock.repo_types[0])
    return sorted(decision.variant.variant_str for decision in decisions)


@dataclass(frozen=True)
class LockedLayerRepository:
    """A kernel layer from the commit of a Hub kernel that a lock file pins.

    The files are downloaded if needed and verified against the lock before import.

    Args:
        repo_id: the Hub repository, as listed in the lock.
        layer_name: the class in the kernel package's ``layers`` module.
        lockfile: the ``kernels.lock`` to read. By default, the lock of the package that
            creates this repository (its distribution's metadata, else the ``kernels.lock``
            beside its source checkout's pyproject.toml).
        trust_remote_code: needed only when the lock does not record the kernel as trusted.
        check_arch: refuse a build that does not support the current GPU, as for
            `get_kernel`.

    Example:
        ```python
        from kernels import LockedLayerRepository

        repo = LockedLayerRepository("kernels-community/activation", layer_name="SiluAndMul")
        ```
    """

    repo_id: str
    layer_name: str = field(kw_only=True)
    lockfile: Path | None = field(default=None, kw_only=True)
    trust_remote_code: bool | tuple[str, ...] = field(default=False, kw_only=True)
    check_arch: bool = field(default=True, kw_only=True)
    _caller: str | None = field(default=None, init=False, repr=False, compare=False)
    _loaded: LoadedHubKernel | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.repo_id, str) or "/" not in self.repo_id:
            raise KernelMappingError(
                f"LockedLayerRepository needs a Hub repository id 'org/name', got {self.repo_id!r}."
            )
        if self.lockfile is not None:
            object.__setattr__(self, "lockfile", Path(self.lockfile))
        else:
            object.__setattr__(self, "_caller", calling_module())
        object.__setattr__(self, "trust_remote_code", normalize_trust(self.trust_remote_code))

    def load(self) -> type | Callable:
        """Download (if needed), verify and import the locked kernel; return the layer class
        (or the kernel function) it provides as `layer_name`."""
        return provided_kernel(self.load_package(), self.layer_name, self)

    def load_package(self) -> ModuleType:
        """Download (if needed), verify and import the locked kernel; the first load's
        module is kept, and later loads return it.

        As for `LayerRepository`, no lock is held while the kernel's code is imported, so a
        locked kernel may load other kernels at import.
        """
        loaded = self._loaded
        if loaded is None:
            source = lock_source(self.lockfile, caller=self._caller)
            loaded = _load_locked(
                self.repo_id,
                source,
                local_files_only=False,
                trust_remote_code=self.trust_remote_code,
                check_arch=self.check_arch,
            )
            with _repo_lock:
                if self._loaded is None:
                    object.__setattr__(self, "_loaded", loaded)
                else:  # another thread published first: every caller gets that one
                    loaded = self._loaded
        return loaded.module

    def __deepcopy__(self, memo: dict) -> LockedLayerRepository:
        return self

    def __reduce__(self):
        # Pickles what was asked (and whose lock a default lockfile means), not what loaded.
        return (
            _rebuild_locked,
            (
                self.repo_id,
                self.layer_name,
                self.lockfile,
                self.trust_remote_code,
                self.check_arch,
                self._caller,
            ),
        )

    def __str__(self) -> str:
        source = f"lock file {self.lockfile}" if self.lockfile else f"the lock of {self._caller}"
        text = f"{self.repo_id} (locked by {source})"
        loaded = self._loaded
        if loaded is not None:
            fetched = loaded.fetched
            text += (
                f" -> commit {fetched.commit[:12]}, variant {fetched.variant}, "
                f"{getattr(loaded, 'checked', 'verified')}; "
                f"{loaded.trust.reason}"
            )
        return f"{text}, layer {self.layer_name}"


def _rebuild_locked(
    repo_id, layer_name, lockfile, trust_remote_code, check_arch=True, caller=None
) -> LockedLayerRepository:
    repo = LockedLayerRepository(
        repo_id,
        layer_name=layer_name,
        lockfile=lockfile,
        trust_remote_code=trust_remote_code,
        check_arch=check_arch,
    )
    if lockfile is None:
        object.__setattr__(repo, "_caller", caller)
    return repo


# Guards only the publication of a first load, never a load itself.
_repo_lock = threading.Lock()


@dataclass(frozen=True)
class LockedFuncRepository(PackageFunction):
    """A function kernel from the commit of a Hub kernel that a lock file pins.

    The kernel is the function `func_name` at the top level of the locked kernel package; it
    replaces a function made kernelizable with `use_kernel_func_from_hub` (or
    `use_kernelized_func`). Locks, verification and trust are those of
    `LockedLayerRepository`.

    Example:
        ```python
        from kernels import LockedFuncRepository

        repo = LockedFuncRepository("kernels-community/rotary", func_name="apply_rotary_pos_emb")
        ```
    """

    repo_id: str
    func_name: str = field(kw_only=True)
    lockfile: Path | None = field(default=None, kw_only=True)
    trust_remote_code: bool | tuple[str, ...] = field(default=False, kw_only=True)
    check_arch: bool = field(default=True, kw_only=True)
    # The package source: lock lookup, verification and import are LockedLayerRepository's.
    _package: LockedLayerRepository = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        warn_function_repository_deprecated("LockedFuncRepository", "LockedLayerRepository")
        package = LockedLayerRepository(
            self.repo_id,
            layer_name=self.func_name,
            lockfile=self.lockfile,
            trust_remote_code=self.trust_remote_code,
            check_arch=self.check_arch,
        )
        object.__setattr__(self, "lockfile", package.lockfile)
        object.__setattr__(self, "trust_remote_code", package.trust_remote_code)
        object.__setattr__(self, "_package", package)

    def __reduce__(self):
        return (_rebuild_locked_func, (self._package.__reduce__()[1], self.func_name))


def _rebuild_locked_func(package_args: tuple, func_name: str) -> LockedFuncRepository:
    package = _rebuild_locked(*package_args)
    repo = LockedFuncRepository(
        package.repo_id,
        func_name=func_name,
        lockfile=package.lockfile,
        trust_remote_code=package.trust_remote_code,
        check_arch=package.check_arch,
    )
    object.__setattr__(repo, "_package", package)  # keeps the caller whose lock it means
    return repo


def write_egg_lockfile(cmd, basename, filename) -> None:
    """setuptools ``egg_info.writers`` hook: ship a project's kernels.lock in its metadata.

    Registered by our own pyproject.toml (``[project.entry-points."egg_info.writers"]``), it
    runs when setuptools builds any project whose build environment has `kernels`
    installed, and copies that project's ``kernels.lock`` into its ``.egg-info`` / wheel
    metadata, where `load_kernel` finds it.
    """
    project = Path.cwd()
    pyproject = project / "pyproject.toml"
    if not pyproject.is_file():
        return  # not a project that declares kernels: leave its metadata alone
    try:
        table = read_toml(pyproject)
    except Exception as exc:  # setuptools runs this for every build: never break an unrelated one
        logger.debug("kernels: %s cannot be read (%s); no kernels.lock added", pyproject, exc)
        return
    tool = table.get("tool")
    kernels_table = tool.get("kernels") if isinstance(tool, dict) else None
    if not isinstance(kernels_table, dict) or kernels_table.get("dependencies") is None:
        return  # no [tool.kernels.dependencies]: not a project that locks kernels
    lock = project / LOCK_FILE
    if not lock.is_file():
        logger.warning(
            "Lock file %s does not exist: the package's metadata will hold no kernels.lock, "
            "so load_kernel / LockedLayerRepository cannot find its kernels. Run "
            "`kernels lock %s` and build again.",
            lock,
            project,
        )
    # None deletes a kernels.lock an earlier (editable) build left in the metadata.
    cmd.write_or_delete_file(basename, filename, lock.read_text() if lock.is_file() else None)


__all__ = [
    "KernelLock",
    "LockedFuncRepository",
    "LockedLayerRepository",
    "VariantLock",
    "download_locked",
    "get_locked_kernel",
    "load_kernel",
    "lock_project",
]
