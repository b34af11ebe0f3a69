"""One file of the build variant this machine would load, from a local kernel folder or a Hub
kernel, without importing anything (for ``describe-api`` and ``info``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import CommandError


@dataclass(frozen=True)
class VariantFile:
    """Where a variant's file is (it may not exist locally), and what was chosen."""

    path: Path | None
    variant: str
    #: Every variant the kernel offers (folder names), for the backends it supports.
    offered: tuple[str, ...]


def print_kernel_source(info: Mapping[str, Any]) -> None:
    """The opening lines of a text report on one kernel: where it was read from (a Hub
    repository at a revision, or a local path) and the variant that was read."""
    if "repo_id" in info:
        print(f"Repository: {info['repo_id']}")
        print(f"Revision: {info['revision']}")
    else:
        print(f"Path: {info['path']}")
    print(f"Variant: {info['variant']}")


def local_kernel_folder(kernel: str, *, version: object, revision: object) -> Path | None:
    """The local folder the KERNEL argument names, or None when it is a Hub repository id.

    Raises:
        CommandError: it looks like a path but is not a folder, or a folder was given with
            ``--version`` / ``--revision`` (which select a version on the Hub).
    """
    path = Path(kernel).expanduser()
    if path.is_dir():
        if version is not None or revision is not None:
            raise CommandError(
                f"--version and --revision cannot be used with a local path ({kernel}): "
                "they select a version on the Hub."
            )
        from ..library.paths import built_repository

        # A library source folder of a checkout (library/norm) is read as built.
        return built_repository(path)
    if path.exists() or path.is_absolute() or kernel.startswith(("./", "../", "~")):
        raise CommandError(
            f"Not a local kernel directory: {kernel} is not a folder. Give a kernel repository "
            "folder, its build/ or one build/<variant>/ folder, or a Hub repository id "
            "(org/name)."
        )
    return None


def local_variant_file(path: Path, filename: str) -> VariantFile:
    """`filename` of the variant of the local folder `path` (a repository, its ``build/`` or one
    variant folder) this machine would load; ``path`` is None when that variant lacks it."""
    from ..repos.layout import read_preference
    from ..repos.variants import choose_variant, variants_in

    if (path / "build").is_dir():
        build, root = path / "build", path
    elif variants_in(p.name for p in path.iterdir() if p.is_dir()):
        build, root = path, path.parent
    elif (path / "metadata.json").is_file() or (path / "symbols.json").is_file():
        target = path / filename
        return VariantFile(target if target.is_file() else None, path.name, (path.name,))
    else:
        raise CommandError(
            f"Cannot find a build variant for this system in {path}: it is not a kernel folder, "
            "having no build/ folder, no build variant folder such as torch-cuda "
            "and no metadata.json. Give the repository folder, its build/ "
            "or one build/<variant>/."
        )
    offered = tuple(variants_in(p.name for p in build.iterdir() if p.is_dir()))
    variant = choose_variant(
        offered, where=str(path), prefer=read_preference(root, where=str(path))
    )
    # No fallback to another variant: what is described must be what this machine loads.
    target = build / variant / filename
    return VariantFile(target if target.is_file() else None, variant, offered)


def hub_variant_file(repo_id: str, repo_type: str, revision: str, filename: str, *, where: str) -> VariantFile:  # fmt: skip
    """`filename` of the variant of `repo_id` at `revision` this machine would load, downloaded
    into the cache (read from it offline); ``path`` is None when that variant lacks it.

    Raises:
        CommandError: no variant runs here, or the file is not cached offline.
        KernelsError: the repository or revision does not exist, the Hub cannot be reached.
    """
    from huggingface_hub import hf_hub_download

    from ..repos import hubclient
    from ..repos.download import get_kernel_variants
    from ..repos.variants import VariantAccepted, describe_decisions
    from ..repos.versions import hub_error

    decisions = get_kernel_variants(repo_id, revision=revision, repo_type=repo_type)
    offered = tuple(d.variant.variant_str for d in decisions)
    accepted = [d for d in decisions if isinstance(d, VariantAccepted)]
    if not accepted:
        listing = describe_decisions(decisions) or "  (no build variants at all)"
        raise CommandError(f"{where} has no build variant for this machine:\n{listing}")
    variant = accepted[0].variant.variant_str
    try:
        path = hf_hub_download(
            repo_id,
            f"build/{variant}/{filename}",
            revision=revision,
            repo_type=repo_type,
            local_files_only=hubclient.is_offline(),
        )
    except Exception as exc:
        if hubclient.is_offline():
            raise CommandError(
                f"{filename} of {where} (variant: {variant}) is not in the cache, and "
                "HF_HUB_OFFLINE is set: unset it to download it."
            ) from exc
        # The listing above found the repository at this revision, so a 404 here is the
        # file's (some servers, olah among them, do not say which is missing).
        failure = hubclient.classify(exc)
        if failure in (hubclient.Failure.ENTRY_NOT_FOUND, hubclient.Failure.NOT_FOUND):
            return VariantFile(None, variant, offered)
        raise hub_error(exc, repo_id, f"download {filename} of {where}", repo_type) from exc
    return VariantFile(Path(path), variant, offered)


def describe_where(repo_id: str, version: int | str | None, revision: str) -> str:
    """``org/name (version: 2, revision: v2)``, how messages name what was asked for."""
    asked = (
        f"revision: {revision}" if version is None else f"version: {version}, revision: {revision}"
    )
    return f"{repo_id} ({asked})"
