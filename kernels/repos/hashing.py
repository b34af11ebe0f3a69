"""The hashes that pin a kernel's files: per file, per build variant, and their check.

A variant's hash is Hugging Face's ``git_lfs_concat``: the SHA-256 over each file's path
(relative to ``build/<variant>/``, sorted as UTF-8 bytes) followed by its digest, where the
digest is the Git LFS SHA-256 for LFS files and the Git blob SHA-1 otherwise. Lock files
(`kernels.repos.lock`) record it, and `install_kernel` checks downloads against it.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Mapping
from pathlib import Path

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


def _files_on_disk(variant_dir: Path) -> list[str]:
    """The files of a variant folder, without the bytecode Python writes when importing."""
    found = []
    for root, dirs, names in os.walk(variant_dir):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in names:
            found.append((Path(root) / name).relative_to(variant_dir).as_posix())
    return sorted(found)


_verified: set[tuple[Path, str]] = set()
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

    Raises:
        KernelLockError: the lock has no hash for this variant.
        KernelHashMismatchError: a file is missing, extra or different; the message names it.
    """
    lock = variants.get(variant)
    if lock is None:
        raise KernelLockError(
            f"{where} has no hash for variant {variant} of {repo_id} (it locks "
            f"{', '.join(sorted(variants)) or 'no variants'}). Re-run `kernels lock` with a "
            "kernel version that has this variant."
        )
    expected_hash = lock["hash"] if isinstance(lock, Mapping) else lock.hash  # type: ignore[attr-defined]
    key = (variant_dir.resolve(), expected_hash)
    with _verified_lock:
        if key in _verified:
            return

    on_disk = _files_on_disk(variant_dir)
    expected = (files or {}).get(variant)
    problem = f"{repo_id} at {commit[:12]}, variant {variant}, does not match {where}"
    if expected:
        for rel in sorted(set(expected) | set(on_disk)):
            shown = f"build/{variant}/{rel}"
            if rel not in on_disk:
                raise KernelHashMismatchError(
                    f"{problem}: file {shown} is missing from the download ({variant_dir}). "
                    "Nothing was imported."
                )
            if rel not in expected:
                raise KernelHashMismatchError(
                    f"{problem}: file {shown} is not in the lock. Nothing was imported."
                )
            kind = expected[rel].split(":", 1)[0]
            actual = file_digest(variant_dir / rel, kind)
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
            rel: file_digest(variant_dir / rel, _blob_kind(variant_dir / rel)) for rel in on_disk
        }
        actual_hash = combined_hash(digests)
        if actual_hash != expected_hash:
            raise KernelHashMismatchError(
                f"{problem}: its files hash to {actual_hash}, the lock records {expected_hash}. "
                f"The lock has no per-file digests, so the file cannot be named; files: "
                f"{', '.join(on_disk)}. Nothing was imported."
            )
    with _verified_lock:
        _verified.add(key)


def _blob_kind(path: Path) -> str:
    target = path.resolve().name if path.is_symlink() else ""
    return "sha256" if len(target) == 64 else "git-sha1"
