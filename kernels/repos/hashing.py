"""The hashes that pin a kernel's files: per file, per build variant, and their check.

A variant's hash is Hugging Face's ``git_lfs_concat``: the SHA-256 over each file's path
(relative to ``build/<variant>/``, sorted as UTF-8 bytes) followed by its digest, where the
digest is the Git LFS SHA-256 for LFS files and the Git blob SHA-1 otherwise. Lock files
(`kernels.repos.lock`) record it, and `install_kernel` checks downloads against it.

Verification covers everything Python could import from the variant folder: every entry is
listed without following links, and what a lock cannot vouch for is refused: a linked
folder, a file link leading outside the repository's cache folder, a pipe, socket or device,
any file the lock does not list. ``__pycache__`` folders are the one thing left out, and only
because kernel code is never imported from bytecode (`kernels.repos.source_import`).
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NoReturn

from ..errors import KernelHashMismatchError, KernelLockError

HASH_TYPE = "git_lfs_concat"
_CHUNK = 1 << 20


def combined_hash(digests: Mapping[str, str]) -> str:
    """The `HASH_TYPE` hash of a variant from its files' digests (path -> ``kind:hex``)."""
    m = hashlib.sha256()
    for path in sorted(digests, key=lambda p: p.encode()):
        m.update(path.encode())
        m.update(bytes.fromhex(digests[path].split(":", 1)[1]))
    return f"sha256-{m.hexdigest()}"


def file_digest(path: Path, kind: str) -> str:
    """``git-sha1:<hex>`` (the Git blob id) or ``sha256:<hex>`` of a file's contents."""
    if kind == "git-sha1":
        m = hashlib.sha1()
        m.update(f"blob {path.stat().st_size}\0".encode())
    elif kind == "sha256":
        m = hashlib.sha256()
    else:
        raise KernelLockError(f"Unknown file digest kind {kind!r}.")
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            m.update(chunk)
    return f"{kind}:{m.hexdigest()}"


# What the walk keeps of each file, to tell whether it changed since it was hashed: its
# path, its link target (None for a regular file) and the identity and times of the data
# read through it. ctime is in it because no one can set it back, unlike mtime.
_Entry = tuple[str, str | None, int, int, int, int, int]
_Listing = tuple[_Entry, ...]


def _repo_folder(variant_dir: Path) -> Path:
    """The repository's own cache folder: ``<repo>`` of ``<repo>/snapshots/<commit>/build/
    <variant>``; outside huggingface_hub's layout, the variant folder itself."""
    parts = variant_dir.parts
    if len(parts) >= 5 and parts[-2] == "build" and parts[-4] == "snapshots":
        return variant_dir.parents[3]
    return variant_dir


def _walk(variant_dir: Path, refuse: Callable[[Path, str], NoReturn]) -> _Listing:
    """Every file of a variant folder, without following links (see `verify_variant`).

    `refuse(path, why)` raises the error for an entry that no lock can vouch for.
    """
    variant_dir = Path(os.path.abspath(variant_dir))
    repo = _repo_folder(variant_dir)
    # A folder between the repository's folder and the variant that is a link makes the
    # variant another folder's files; huggingface_hub makes none of them links.
    folder = variant_dir
    while folder != repo and folder != folder.parent:
        if folder.is_symlink():
            refuse(folder, "is a link to a folder (huggingface_hub's cache holds real folders)")
        folder = folder.parent
    found: list[_Entry] = []
    pending = [variant_dir]  # a stack, not recursion: the folder's depth is not ours to pick
    while pending:
        folder = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError as exc:
            refuse(folder, f"cannot be read ({exc.strerror or exc})")
        for entry in entries:
            path = Path(entry.path)
            try:
                entry.name.encode("utf-8")
            except UnicodeEncodeError:
                refuse(path, "has a name that is not UTF-8, which no lock lists")
            try:
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    if entry.name == "__pycache__":
                        _check_bytecode_folder(path, refuse)
                    else:
                        pending.append(path)
                    continue
                rel = path.relative_to(variant_dir).as_posix()
                if stat.S_ISREG(st.st_mode):
                    found.append(
                        (
                            rel,
                            None,
                            st.st_size,
                            st.st_mtime_ns,
                            st.st_ctime_ns,
                            st.st_dev,
                            st.st_ino,
                        )
                    )
                elif stat.S_ISLNK(st.st_mode):
                    found.append(_linked_file(path, rel, st, repo, refuse))
                else:
                    refuse(path, "is neither a file nor a folder (a pipe, socket or device)")
            except OSError as exc:  # e.g. removed while we look
                refuse(path, f"cannot be read ({exc.strerror or exc})")
    return tuple(sorted(found, key=lambda e: e[0].encode()))


#: A variant folder's listing: one `_Entry` per file, sorted by path.
Listing = _Listing


def list_variant_files(variant_dir: Path, refuse: Callable[[Path, str], NoReturn]) -> Listing:
    """Every file of a variant folder with what tells whether it changed since (path, link
    target, size, mtime_ns, ctime_ns, device, inode), listed without following links.

    Entries that no recorded hash can vouch for (see the module docstring) are passed to
    `refuse(path, why)`, which must raise. ``__pycache__`` folders are left out.
    """
    return _walk(variant_dir, refuse)


def _linked_file(
    path: Path, rel: str, st: os.stat_result, repo: Path, refuse: Callable[[Path, str], NoReturn]
) -> _Entry:
    """A file link is fine where it leads to a file of the repository's own cache folder
    (huggingface_hub's snapshots link each file to ``<repo>/blobs/``)."""
    target = os.path.realpath(path)
    repo_real = os.path.realpath(repo)
    try:
        target_st = os.stat(target)
    except OSError:
        refuse(path, f"is a link to {target}, which does not exist")
    if stat.S_ISDIR(target_st.st_mode):
        refuse(path, f"is a link to the folder {target}")
    if os.path.commonpath([repo_real, target]) != repo_real:
        refuse(path, f"is a link to {target}, outside the repository's cache folder {repo}")
    if not stat.S_ISREG(target_st.st_mode):
        refuse(path, f"is a link to {target}, which is not a regular file")
    return (
        rel,
        os.readlink(path),
        target_st.st_size,
        target_st.st_mtime_ns,
        max(st.st_ctime_ns, target_st.st_ctime_ns),
        target_st.st_dev,
        target_st.st_ino,
    )


def _check_bytecode_folder(folder: Path, refuse: Callable[[Path, str], NoReturn]) -> None:
    """A ``__pycache__`` may hold bytecode only. It is left out of verification because
    kernel packages are never imported from bytecode (`kernels.repos.source_import`), not
    because anything in it is trusted."""
    try:
        entries = list(os.scandir(folder))
    except OSError as exc:
        refuse(folder, f"cannot be read ({exc.strerror or exc})")
    for entry in entries:
        if not (entry.name.endswith(".pyc") and entry.is_file(follow_symlinks=False)):
            refuse(
                Path(entry.path),
                f"is in {folder}, where only Python's .pyc files belong (never read for kernel "
                "code; that folder can be deleted)",
            )


# Variant folders whose files matched a lock: (folder, hash, file digests) -> the listing
# they had then.
_verified: dict[tuple[str, str, tuple | None], _Listing] = {}
_verified_lock = threading.Lock()


def verify_variant(
    variant_dir: Path,
    variants: Mapping[str, object],
    *,
    repo_id: str,
    commit: str,
    variant: str,
    files: Mapping[str, Mapping[str, str]] | None,
    where: str = "the lock",
) -> None:
    """Check a downloaded variant's files against a lock before anything imports them.

    Args:
        variant_dir: the variant's folder (``<snapshot>/build/<variant>``).
        variants: the lock's variant hashes (variant -> an object with ``hash``, or a dict
            with a ``"hash"`` key, as Hugging Face's lock files hold them).
        repo_id, commit, variant: what was downloaded, for the messages.
        files: the lock's per-file digests (variant -> path -> digest), when it has them.
        where: how to name the lock in the messages.

    Every call lists the folder again (names, kinds, link targets); the files are hashed
    again unless that listing and each file's size, times and inode are as they were when
    they last matched this lock.

    Raises:
        KernelLockError: the lock has no hash for this variant, or its hashes are malformed.
        KernelHashMismatchError: a file is missing, extra or different, or an entry is one
            no lock can vouch for (see the module docstring); the message names it.
    """
    lock = variants.get(variant)
    if lock is None:
        raise KernelLockError(
            f"{where} has no hash for variant {variant} of {repo_id} (it locks "
            f"{', '.join(sorted(variants)) or 'no variants'}). Re-run `kernels lock` with a "
            "kernel version that has this variant."
        )
    expected_hash = lock["hash"] if isinstance(lock, Mapping) else getattr(lock, "hash", None)
    if not isinstance(expected_hash, str):
        raise KernelLockError(
            f"{where}: the hash of {repo_id} variant {variant} is {expected_hash!r}, not a "
            "string. Re-create the lock with `kernels lock`."
        )
    expected = (files or {}).get(variant)
    problem = f"{repo_id} at {commit[:12]}, variant {variant}, does not match {where}"
    snapshot = variant_dir.parent.parent

    def refuse(path: Path, why: str) -> NoReturn:
        raise KernelHashMismatchError(
            f"{problem}: {path} {why}. Nothing was imported. If you did not put it there, the "
            f"cache was tampered with: delete {snapshot} and download the kernel again "
            "(`kernels download PROJECT_DIR`, or load it with the Hub reachable)."
        )

    # The listing is taken on every call, so that a file added, removed, relinked or
    # rewritten since the last check is seen; only the hashing is skipped when nothing
    # changed.
    listing = _walk(variant_dir, refuse)
    key = (
        os.path.realpath(variant_dir),
        expected_hash,
        None if expected is None else tuple(sorted(expected.items())),
    )
    with _verified_lock:
        if _verified.get(key) == listing:
            return

    on_disk = [entry[0] for entry in listing]
    if expected:
        listed = set(on_disk)
        for rel in sorted(set(expected) | listed):
            shown = f"build/{variant}/{rel}"
            if rel not in listed:
                raise KernelHashMismatchError(
                    f"{problem}: file {shown} is missing from the download ({variant_dir}). "
                    "Nothing was imported."
                )
            if rel not in expected:
                raise KernelHashMismatchError(
                    f"{problem}: file {shown} is not in the lock. Nothing was imported."
                )
            kind = expected[rel].split(":", 1)[0]
            actual = _digest(variant_dir / rel, kind, refuse)
            if actual != expected[rel]:
                raise KernelHashMismatchError(
                    f"{problem}: file {shown} has {actual}, the lock records {expected[rel]}. "
                    "Nothing was imported. If the kernel changed legitimately, re-run "
                    "`kernels lock`; otherwise the download or the cache was tampered with."
                )
        if combined_hash(expected) != expected_hash:
            raise KernelLockError(
                f"{where} is inconsistent for {repo_id} variant {variant}: its file digests do "
                "not add up to its variant hash. Re-create it with `kernels lock`."
            )
    else:
        # A lock without per-file digests (e.g. written by Hugging Face's kernels): compare
        # the combined hash, telling LFS files (SHA-256 blob names) from Git blobs in the cache.
        digests = {
            rel: _digest(variant_dir / rel, _blob_kind(variant_dir / rel), refuse)
            for rel in on_disk
        }
        actual_hash = combined_hash(digests)
        if actual_hash != expected_hash:
            raise KernelHashMismatchError(
                f"{problem}: its files hash to {actual_hash}, the lock records {expected_hash}. "
                f"The lock has no per-file digests, so the file cannot be named; files: "
                f"{', '.join(on_disk)}. Nothing was imported."
            )
    with _verified_lock:
        _verified[key] = listing


def _digest(path: Path, kind: str, refuse: Callable[[Path, str], NoReturn]) -> str:
    try:
        return file_digest(path, kind)
    except OSError as exc:
        refuse(path, f"cannot be read ({exc.strerror or exc})")


def _blob_kind(path: Path) -> str:
    target = path.resolve().name if path.is_symlink() else ""
    return "sha256" if len(target) == 64 else "git-sha1"
