"""Kernel-builder's file digests of a build variant, computed here apart from the code under test
(`kernels.repos.digests`), so that tests check it against an independent reckoning."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path


def sha256_digests(variant: Path) -> dict[str, str]:
    """``digest.files`` of ``metadata.json`` for the folder ``variant``: each file's path relative
    to it and the base64 of its SHA-256; the metadata and its signature bundle are left out."""
    return {
        path.relative_to(variant).as_posix(): base64.b64encode(
            hashlib.sha256(path.read_bytes()).digest()
        ).decode()
        for path in sorted(variant.rglob("*"))
        if path.is_file() and not path.name.startswith("metadata.json")
    }
