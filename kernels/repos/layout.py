"""Where the kernel package sits inside a kernel repository folder (Hub layout).

Three layouts are accepted under ``build/<variant>/``:

* ``build/<variant>/__init__.py``, the current layout where the variant folder is the
  package itself and `package_name` may be omitted;
* ``build/<variant>/<package_name>/__init__.py``, the older layout;
* ``build/<variant>/<id>.zip`` beside ``metadata.json`` saying ``"build-layout": "zip"``,
  the package packed in one archive and imported from it (`kernels.repos.archive`).

Some builds carry both of the first two (the older one as a compatibility module). The
variant folder's own package is then imported, as Hugging Face's client does: importing the
other one as well in the same process would register the kernel's ``TORCH_LIBRARY``
namespace twice.

A local folder (`locate_local`) may be the repository, its ``build/`` folder or one variant
folder, the three forms Hugging Face's ``get_local_kernel`` and ``LOCAL_KERNELS`` accept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import KernelLoadError
from .archive import has_archive
from .info import METADATA_FILE
from .variants import (
    PREFERENCE_FILE,
    MachineBuild,
    choose_variant,
    read_preference_file,
    variants_in,
)

_IDENTIFIER = re.compile(r"^[A-Za-z_]\w*$")


@dataclass(frozen=True)
class PackageLocation:
    """A kernel package found in a repository folder."""

    package_dir: Path
    package_name: str
    variant: str


def locate_package(
    repo_dir: Path,
    package_name: str | None,
    *,
    where: str,
    variant: str | None = None,
    machine: MachineBuild | None = None,
) -> PackageLocation:
    """Find the package to import in the repository folder `repo_dir`.

    Args:
        repo_dir: the repository folder (the one that holds ``build/``).
        package_name: the package to import, or None to take the only one there is.
        where: how to name the repository in errors (a path or a Hub repo id).
        variant: the build variant to use; by default the best one for this machine among
            the folders under ``build/``, honouring the repository's ``kernel-variants.json``.
        machine: the machine to choose the variant for (this one by default).
    """
    build = repo_dir / "build"
    if not build.is_dir():
        raise KernelLoadError(
            f"{where} is not a kernel repository: {build} does not exist. A kernel repository "
            "holds build/<variant>/__init__.py or build/<variant>/<package>/__init__.py "
            "(see docs/kernel-repos.md)."
        )
    return _locate_in_build(
        build, repo_dir, package_name, where=where, variant=variant, machine=machine
    )


def locate_local(
    path: Path, package_name: str | None, *, where: str, machine: MachineBuild | None = None
) -> PackageLocation:
    """Find the package to import in a local folder given by a user.

    `path` may be a repository folder (with ``build/``), a ``build/`` folder (with variant
    folders), or one variant folder, which is then loaded without checking that it runs here:
    naming it is the user's choice.

    Raises:
        KernelLoadError: `path` is none of these; BuildVariantNotFoundError (a subclass) when
            no variant in it runs on this machine.
    """
    if (path / "build").is_dir():
        return locate_package(path, package_name, where=where, machine=machine)
    subfolders = [p.name for p in path.iterdir() if p.is_dir()]
    if variants_in(subfolders):
        # A build/ folder: the preference file, if any, sits beside it at the repository root.
        return _locate_in_build(
            path, path.parent, package_name, where=where, variant=None, machine=machine
        )
    if (path / "metadata.json").is_file() or (path / "__init__.py").is_file() or subfolders:
        fallback = path.parent.parent.name if path.parent.name == "build" else path.name
        return _package_in_variant(
            path, package_name, variant=path.name, where=where, fallback=fallback
        )
    raise KernelLoadError(
        f"{where} is not a kernel repository: {path / 'build'} does not exist, and the folder "
        "is neither a build/ folder (it holds no variant folders such as torch-cuda or "
        "torch29-cxx11-cu128-x86_64-linux) nor one variant folder (it holds no metadata.json "
        "and no package). Give the repository folder, its build/ or one build/<variant>/."
    )


def _locate_in_build(
    build: Path,
    repo_dir: Path,
    package_name: str | None,
    *,
    where: str,
    variant: str | None,
    machine: MachineBuild | None,
) -> PackageLocation:
    if variant is None:
        variant = choose_variant(
            (p.name for p in build.iterdir() if p.is_dir()),
            where=where,
            prefer=read_preference(repo_dir, where=where),
            machine=machine,
        )
    return _package_in_variant(
        build / variant, package_name, variant=variant, where=where, fallback=repo_dir.name
    )


def _package_in_variant(
    variant_dir: Path, package_name: str | None, *, variant: str, where: str, fallback: str
) -> PackageLocation:
    if package_name is not None and not _IDENTIFIER.match(package_name):
        raise KernelLoadError(
            f"package_name must be a Python identifier such as 'activation', got {package_name!r}."
        )
    # The variant folder's own package first, even when a package is named (see above).
    if (variant_dir / "__init__.py").is_file():
        return PackageLocation(variant_dir, package_name or _fallback_name(fallback), variant)
    packages = _packages_in(variant_dir)
    if package_name is not None and package_name in packages:
        return PackageLocation(variant_dir / package_name, package_name, variant)
    if (
        (package_name is not None or not packages)
        and has_archive(variant_dir)
        or (not packages and (variant_dir / METADATA_FILE).is_file())
    ):
        # The zip layout (or a build without its package): the loader reads the archive's
        # name from the metadata once the variant is verified, and says what is missing.
        return PackageLocation(variant_dir, package_name or _fallback_name(fallback), variant)
    if package_name is not None:
        raise KernelLoadError(
            f"{where} has no package '{package_name}' in build/{variant}/. "
            f"Packages there: {', '.join(packages) or 'none'}."
        )
    if len(packages) == 1:
        return PackageLocation(variant_dir / packages[0], packages[0], variant)
    raise KernelLoadError(
        f"{where} holds {'no package' if not packages else 'several packages'} in build/{variant}/"
        f"{' (' + ', '.join(packages) + ')' if packages else ''}; pass package_name=... to say "
        "which one to import."
    )


def read_preference(repo_dir: Path, *, where: str) -> str:
    """The variant preference a repository folder states ("compiled" when it states none)."""
    path = repo_dir / PREFERENCE_FILE
    if not path.is_file():
        return "compiled"
    return read_preference_file(path, where=where)


def _packages_in(folder: Path) -> list[str]:
    if not folder.is_dir():
        return []
    return sorted(
        p.name
        for p in folder.iterdir()
        if _IDENTIFIER.match(p.name) and (p / "__init__.py").is_file()
    )


def _fallback_name(folder_name: str) -> str:
    name = re.sub(r"\W", "_", folder_name)
    return name if _IDENTIFIER.match(name) else "kernel"
