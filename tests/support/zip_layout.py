"""Kernel build variants in the ZIP build layout (``"build-layout": "zip"``), written the way
kernel-builder packs them: the package's Python files in ``build/<variant>/<id>.zip`` (its top
level is the package), compiled modules beside the archive, and the digests of every file of
the variant (the archive included) in ``metadata.json``."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Mapping
from pathlib import Path

from tests.support.digests import sha256_digests

KERNEL_ID = "_zipped_universal_1a2b3c4"

#: A package whose __init__ imports a module beside the archive, one in it and a subpackage.
MEMBERS = {
    "__init__.py": (
        "from . import _native\nfrom ._ops import OPS\nfrom . import layers\n"
        "from .layers import LAYER\n"
    ),
    "_ops.py": "OPS = 'ops'\n",
    "layers/__init__.py": (
        "import torch\n\nLAYER = 'layer'\n\n\nclass SiluAndMul(torch.nn.Module):\n"
        "    def forward(self, x):\n        d = x.shape[-1] // 2\n"
        "        return torch.nn.functional.silu(x[..., :d]) * x[..., d:] + 7.0\n"
    ),
    "configs/device.json": '{"block_size": 1024}',
}

#: Files beside the archive (kernel-builder puts the compiled ops module there).
BESIDE = {"_native.py": "VALUE = 'native'\n"}


def write_zip_variant(
    variant_dir: Path,
    *,
    kernel_id: str = KERNEL_ID,
    members: Mapping[str, str | bytes] = MEMBERS,
    beside: Mapping[str, str] = BESIDE,
    digest: bool = True,
    **metadata: object,
) -> Path:
    """Write a ZIP-layout variant in `variant_dir` and return it; `metadata` adds or
    overrides keys of its ``metadata.json``."""
    variant_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(variant_dir / f"{kernel_id}.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    for name, content in beside.items():
        (variant_dir / name).write_text(content)
    write_metadata(variant_dir, kernel_id=kernel_id, digest=digest, **metadata)
    return variant_dir


def write_metadata(
    variant_dir: Path, *, kernel_id: str = KERNEL_ID, digest: bool = True, **extra: object
) -> None:
    """(Re)write the variant's ``metadata.json``, with the digests of its files as they are."""
    meta: dict[str, object] = {
        "name": "zipped",
        "id": kernel_id,
        "version": 1,
        "build-layout": "zip",
        "kernels-minver": "0.19.0",
        "license": "Apache-2.0",
        "python-depends": [],
        "backend": {"type": "cuda"},
    }
    if digest:
        meta["digest"] = {"algorithm": "sha256", "files": sha256_digests(variant_dir)}
    meta.update(extra)
    (variant_dir / "metadata.json").write_text(json.dumps(meta))
