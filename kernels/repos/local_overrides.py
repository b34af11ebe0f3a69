"""``LOCAL_KERNELS``: Hub kernels replaced by local folders, for kernel development.

The variable has Hugging Face's syntax: ``org/name=/path/to/folder`` entries separated by
``:``, e.g. ``LOCAL_KERNELS=kernels-community/relu=/src/relu:me/norm=~/norm/build``. A folder
may be the kernel repository, its ``build/`` folder or one variant folder (as for
`get_local_kernel`). Every Hub load of a listed repository (`get_kernel`, `LayerRepository`,
kernelize) imports the folder instead: the revision or version asked for is ignored, nothing
is downloaded, and no trust check is made, since the code is the user's own, as for
`LocalLayerRepository`. Each such load logs one INFO line naming the folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import KernelLoadError, KernelMappingError
from .layout import PackageLocation, locate_local
from .repo_id import is_repo_id, shown

#: The environment variable mapping repository ids to local folders.
ENV = "LOCAL_KERNELS"

_SYNTAX = "org/name=/path/to/folder entries separated by ':'"


def local_overrides(value: str | None = None) -> dict[str, Path]:
    """The repository ids `ENV` (or `value`) maps to local folders.

    Empty entries are skipped, so an empty variable or a trailing ``:`` means nothing.

    Raises:
        KernelMappingError: an entry without ``=``, with an id that is not ``org/name``, with
            no folder, or an id listed twice with different folders.
    """
    raw = os.environ.get(ENV, "") if value is None else value
    overrides: dict[str, Path] = {}
    for entry in raw.split(":"):
        if not entry.strip():
            continue
        repo_id, sep, folder = entry.partition("=")
        repo_id = repo_id.strip()
        problem = None
        if not sep:
            problem = "it has no '='"
        elif "/" not in repo_id or not is_repo_id(repo_id):
            problem = f"{shown(repo_id)} is not a Hub repository id (org/name)"
        elif not folder.strip():
            problem = "it names no folder"
        elif repo_id in overrides and overrides[repo_id] != Path(folder).expanduser():
            problem = f"{repo_id} is already mapped to {overrides[repo_id]}"
        if problem is not None:
            raise KernelMappingError(
                f"{ENV} entry {shown(entry)} is malformed: {problem}. {ENV} holds {_SYNTAX}, "
                "e.g. kernels-community/relu=/src/relu; fix or unset it."
            )
        overrides[repo_id] = Path(folder).expanduser()
    return overrides


@dataclass(frozen=True)
class LocalOverride:
    """A repository that `ENV` maps to a local folder, and the package found there."""

    repo_id: str
    folder: Path
    root: Path
    location: PackageLocation

    @property
    def how(self) -> str:
        return f"local folder {self.folder} named by {ENV}"


def find_local_override(repo_id: str) -> LocalOverride | None:
    """The local folder `ENV` maps `repo_id` to, with its package; None when it maps none.

    Raises:
        KernelMappingError: `ENV` is malformed; KernelLoadError: the folder holds no kernel
            that runs here.
    """
    folder = local_overrides().get(repo_id)
    if folder is None:
        return None
    where = f"{repo_id} from {ENV} ({folder})"
    if not folder.is_dir():
        raise KernelLoadError(
            f"{where}: the folder does not exist. Build the kernel there, or remove {repo_id} "
            f"from {ENV} to load it from the Hub."
        )
    location = locate_local(folder, None, where=where)
    return LocalOverride(repo_id, folder, _repository_root(folder, location.variant), location)


def _repository_root(folder: Path, variant: str) -> Path:
    """The repository folder, whichever of the three forms `folder` is."""
    if (folder / "build").is_dir():
        return folder
    if (folder / variant).is_dir():  # a build/ folder
        return folder.parent
    return folder.parent.parent  # one variant folder
