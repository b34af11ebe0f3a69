"""Where the kernel package sits inside a kernel repository folder (Hub layout).

Two layouts are accepted under ``build/<variant>/``:

* ``build/<variant>/<package_name>/__init__.py``, the documented layout;
* ``build/<variant>/__init__.py``, the newer layout where the variant folder is the
  package itself and `package_name` may be omitted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import KernelLoadError
from .variants import PREFERENCE_FILE, choose_variant, read_preference_file

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
) -> PackageLocation:
    """Find the package to import in the repository folder `repo_dir`.

    Args:
        repo_dir: the repository folder (the one that holds ``build/``).
        package_name: the package to import, or None to take the only one there is.
        where: how to name the repository in errors (a path or a Hub repo id).
        variant: the build variant to use; by default the best one for this machine among
            the folders under ``build/``, honouring the repository's ``kernel-variants.json``.
    """
    build = repo_dir / "build"
    if not build.is_dir():
        raise KernelLoadError(
            f"{where} is not a kernel repository: {build} does not exist. A kernel repository "
            "holds build/<variant>/<package>/__init__.py (see docs/kernel-repos.md)."
        )
    if variant is None:
        variant = choose_variant(
            (p.name for p in build.iterdir() if p.is_dir()),
            where=where,
            prefer=read_preference(repo_dir, where=where),
        )
    variant_dir = build / variant

    if package_name is not None:
        if not _IDENTIFIER.match(package_name):
            raise KernelLoadError(
                f"package_name must be a Python identifier such as 'activation', got {package_name!r}."
            )
        if (variant_dir / package_name / "__init__.py").is_file():
            return PackageLocation(variant_dir / package_name, package_name, variant)
        if (variant_dir / "__init__.py").is_file():
            return PackageLocation(variant_dir, package_name, variant)
        raise KernelLoadError(
            f"{where} has no package '{package_name}' in build/{variant}/. "
            f"Packages there: {', '.join(_packages_in(variant_dir)) or 'none'}."
        )

    if (variant_dir / "__init__.py").is_file():
        return PackageLocation(variant_dir, _fallback_name(repo_dir), variant)
    packages = _packages_in(variant_dir)
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
    return sorted(p.name for p in folder.iterdir() if (p / "__init__.py").is_file())


def _fallback_name(repo_dir: Path) -> str:
    name = re.sub(r"\W", "_", repo_dir.name)
    return name if _IDENTIFIER.match(name) else "kernel"
