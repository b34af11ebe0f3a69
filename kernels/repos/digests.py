"""The file digests of a build's ``metadata.json``, checked before any of its code runs.

kernel-builder records the digest of every file of a build variant in its ``metadata.json``
(Hugging Face's `kernels` 0.17 checks it in ``kernels verify-signature``)::

    "digest": {"algorithm": "sha256", "files": {"__init__.py": "<base64 of the digest>", ...}}

Every file of the variant folder is covered except its own ``metadata.json`` and
``metadata.json.sigstore``, Python bytecode (``*.pyc``, ``__pycache__``), as their client
computes it. A file missing, extra or different refuses the load.

Hashing a large build on every load would cost seconds, so a Hub snapshot's check leaves a
receipt in the repository's cache folder, ``.kernels-files/<commit>/verified/<variant>.json``.
It vouches for the variant folder, the digests it matched and the listing of the files then
(`kernels.repos.hashing`: path, link target, size, times and inode), sealed with an HMAC
keyed by a secret only this user can read (`kernels.repos.receipt_key`). A later load lists
the folder again and hashes nothing when the seal holds for that listing. A receipt written
by anyone else (another user of a shared cache, a process that can write the cache but not
read the user's key) does not verify, so it is ignored and the files are hashed again: a file
swapped behind a forged receipt is caught. (Whoever can write the cache can rewrite
``metadata.json`` itself too: the digests guard against corrupted or altered files, not a
replaced build; locks and signatures do that.) Local folders change while they are developed,
so they are checked on every load and keep no receipt.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NoReturn

from ..errors import KernelHashMismatchError, KernelMetadataError
from .bounded_json import json_type, quoted
from .cache_records import FOLDER, read_json, write_json
from .hashing import Listing, list_variant_files
from .hubclient import COMMIT_PATTERN
from .info import METADATA_FILE, Metadata
from .receipt_key import holds, seal
from .requirements import describe_kernel
from .variants import VARIANT_PATTERN

logger = logging.getLogger(__name__)

#: Digest algorithms of the format, and the size of their digests in bytes.
ALGORITHMS = {"sha256": 32, "sha512": 64}

# Files of a variant folder the digests leave out, as Hugging Face's client does.
_UNHASHED = {METADATA_FILE, f"{METADATA_FILE}.sigstore"}

_MAX_FILES = 100_000
_MAX_PATH = 4096
_MAX_RECEIPT_BYTES = 4096
_RECEIPT_FORMAT = 2
_RECEIPTS = "verified"
_CHUNK = 1 << 20


def check_digests(metadata: Metadata, variant_dir: Path, *, trust_receipt: bool = True) -> None:
    """Check the files of `variant_dir` against the digests of its ``metadata.json``, if it
    has any (builds without them load unchecked, as in Hugging Face's client).

    Args:
        metadata: the variant's metadata.
        variant_dir: the variant folder, in a Hub snapshot or a local folder.
        trust_receipt: whether an earlier check's receipt may stand in for hashing;
            ``kernels verify-signature`` hashes every file regardless (a receipt is only as
            trustworthy as whoever can write the cache).

    Raises:
        KernelMetadataError: ``digest`` is malformed (its algorithm, a path or a digest).
        KernelHashMismatchError: a file is missing, extra or different, or an entry is one
            no digest can vouch for (a link out of the repository, a pipe...); the message
            names it. Nothing was imported.
    """
    raw = metadata.extra.get("digest")
    if raw is None:
        return
    variant_dir = Path(os.path.abspath(variant_dir))
    kernel = describe_kernel(metadata, variant_dir)
    algorithm, expected = _parse_digest(raw, kernel)
    receipt = receipt_path(variant_dir)
    fix = (
        f"If you did not change it, the cache was tampered with: delete {variant_dir.parents[1]} "
        "and download the kernel again."
        if receipt is not None
        else "Rebuild the kernel (kernel-builder writes the digests), or remove 'digest' from "
        "its metadata.json while you develop it."
    )
    problem = f"Refusing to load {kernel}: its files do not match the digests in its metadata.json"

    def refuse(path: Path | str, why: str) -> NoReturn:
        raise KernelHashMismatchError(f"{problem}: {path} {why}. Nothing was imported. {fix}")

    listing = _hashed_files(variant_dir, refuse)
    stamp = _stamp(algorithm, expected)
    if (
        trust_receipt
        and receipt is not None
        and _receipt_holds(receipt, variant_dir, stamp, listing)
    ):
        return
    on_disk = {entry[0] for entry in listing}
    for rel in sorted(on_disk | set(expected), key=str.encode):
        if rel not in on_disk:
            refuse(
                f"file {rel}", f"is listed with a {algorithm} digest but missing ({variant_dir})"
            )
        if rel not in expected:
            refuse(variant_dir / rel, "is not listed in the digests")
        actual = _file_digest(variant_dir / rel, algorithm, refuse)
        if actual != expected[rel]:
            refuse(
                variant_dir / rel,
                f"has {algorithm} {actual}, and metadata.json records {expected[rel]}",
            )
    if receipt is not None:
        _write_receipt(receipt, variant_dir, stamp, listing)


def _hashed_files(variant_dir: Path, refuse: Callable[[Path, str], NoReturn]) -> Listing:
    """The entries of the variant folder's listing that the digests cover."""
    return tuple(
        entry
        for entry in list_variant_files(variant_dir, refuse)
        if entry[0] not in _UNHASHED and not entry[0].endswith(".pyc")
    )


def variant_digests(
    variant_dir: str | os.PathLike[str], algorithm: str = "sha256"
) -> dict[str, str]:
    """The ``digest.files`` that kernel-builder would record for `variant_dir`: each file's
    path (relative, ``/``-separated) and the base64 of its `algorithm` digest, covering the
    files `check_digests` checks.

    Raises:
        ValueError: `algorithm` is not one of `ALGORITHMS`.
        KernelHashMismatchError: an entry no digest can vouch for (a link out of the folder,
            a pipe...) or a file that cannot be read; the message names it.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown digest algorithm {algorithm!r}; one of {', '.join(ALGORITHMS)}")
    folder = Path(os.path.abspath(variant_dir))

    def refuse(path: Path | str, why: str) -> NoReturn:
        raise KernelHashMismatchError(f"Cannot compute the digests of {folder}: {path} {why}.")

    return {
        entry[0]: _file_digest(folder / entry[0], algorithm, refuse)
        for entry in _hashed_files(folder, refuse)
    }


def _parse_digest(raw: object, kernel: str) -> tuple[str, dict[str, str]]:
    where = f"{kernel}: its metadata.json 'digest'"
    fix = "Rebuild it with kernel-builder, or report it to the kernel's authors."
    if not isinstance(raw, Mapping):
        raise KernelMetadataError(f"{where} must be an object, not {json_type(raw)}. {fix}")
    algorithm, files = raw.get("algorithm"), raw.get("files")
    if algorithm not in ALGORITHMS:
        raise KernelMetadataError(
            f"{where}: 'algorithm' is {quoted(algorithm)}; it must be one of "
            f"{', '.join(ALGORITHMS)}. {fix}"
        )
    if not isinstance(files, Mapping) or len(files) > _MAX_FILES:
        raise KernelMetadataError(
            f"{where}: 'files' must be an object of at most {_MAX_FILES} paths, got "
            f"{json_type(files)}. {fix}"
        )
    size = ALGORITHMS[algorithm]
    for path, value in files.items():
        if not _relative_path(path):
            raise KernelMetadataError(
                f"{where}: {quoted(path)} is not a path inside the variant folder. {fix}"
            )
        if _decoded_size(value) != size:
            raise KernelMetadataError(
                f"{where}: the digest of {quoted(path)} is {quoted(value)}, not the base64 of "
                f"a {algorithm} digest. {fix}"
            )
    return algorithm, dict(files)


def _relative_path(path: object) -> bool:
    """A path relative to the variant folder, in the listing's spelling (``a/b.py``)."""
    if not isinstance(path, str) or not 0 < len(path) <= _MAX_PATH or "\\" in path:
        return False
    parts = path.split("/")
    return all(part not in ("", ".", "..") and part.isprintable() for part in parts)


def _decoded_size(value: object) -> int | None:
    if not isinstance(value, str) or len(value) > 100:
        return None
    try:
        return len(base64.b64decode(value, validate=True))
    except (binascii.Error, ValueError):
        return None


def _file_digest(path: Path, algorithm: str, refuse) -> str:
    m = hashlib.new(algorithm)
    try:
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                m.update(chunk)
    except OSError as exc:
        refuse(path, f"cannot be read ({exc.strerror or exc})")
    return base64.b64encode(m.digest()).decode()


def _stamp(algorithm: str, files: Mapping[str, str]) -> str:
    """What a receipt vouches for: these digests (another metadata.json needs another check)."""
    canonical = json.dumps([algorithm, sorted(files.items())])
    return hashlib.sha256(canonical.encode()).hexdigest()


def hub_variant_of(path: str | os.PathLike[str]) -> Path | None:
    """The Hub snapshot's variant folder (``<repo>/snapshots/<commit>/build/<variant>``) that
    the package folder `path` is (the flat layout) or lies directly in; None outside the
    snapshot layout (a local folder).

    This is how the checks of a load are keyed on the variant that was fetched, whatever the
    layout inside it: where ``metadata.json`` sits (or whether there is one) does not decide
    whether a folder is a Hub build.
    """
    path = Path(os.path.abspath(path))
    for candidate in (path, path.parent):
        if receipt_path(candidate) is not None:
            return candidate
    return None


def receipt_path(variant_dir: Path, kind: str = _RECEIPTS) -> Path | None:
    """Where a Hub snapshot's variant keeps its receipt of ``kind`` (a folder name: these
    digests', or the signatures' in `kernels.repos.signatures`); None outside
    huggingface_hub's layout (``<repo>/snapshots/<commit>/build/<variant>``), i.e. for local
    folders."""
    parts = variant_dir.parts
    if len(parts) < 5 or parts[-2] != "build" or parts[-4] != "snapshots":
        return None
    commit, variant = parts[-3], parts[-1]
    if not COMMIT_PATTERN.match(commit) or not VARIANT_PATTERN.match(variant):
        return None
    return variant_dir.parents[3] / FOLDER / commit / kind / f"{variant}.json"


def _sealed(variant_dir: Path, stamp: str, listing: Listing) -> str:
    """What a digest receipt's seal covers: this folder, these digests, these files as listed."""
    return json.dumps([str(variant_dir), stamp, [list(e) for e in listing]])


def _receipt_holds(path: Path, variant_dir: Path, stamp: str, listing: Listing) -> bool:
    """Whether the receipt at `path` is this user's, for these digests and this listing."""
    data = read_json(path, _MAX_RECEIPT_BYTES)
    fine = (
        isinstance(data, dict)
        and data.get("format") == _RECEIPT_FORMAT
        and holds("digests", _sealed(variant_dir, stamp, listing), data.get("seal"))
    )
    if not fine:
        logger.debug("no usable digest receipt at %s; hashing the files", path)
    return fine


def _write_receipt(path: Path, variant_dir: Path, stamp: str, listing: Listing) -> None:
    """Write the receipt whole or not at all; a read-only cache (or no key) only remembers less."""
    code = seal("digests", _sealed(variant_dir, stamp, listing))
    if code is not None:
        write_json(path, {"format": _RECEIPT_FORMAT, "seal": code})
