"""``kernels info KERNEL``: a kernel's metadata, backends and dependencies, without importing it."""

from __future__ import annotations

import argparse
import json
from typing import Any

from . import CommandError, add_repo_type_argument
from ._kernel_refs import add_kernel_selection

HELP = "describe a kernel: name, version, license, backends and dependencies (nothing imported)"
DESCRIPTION = """\
Show what the metadata.json of a kernel says (name, version, minimum kernels version,
license, upstream, source), the backends its build variants cover, and the kernels and Python
packages it depends on (its kernel-depends, followed on the Hub to theirs). The metadata is
that of the variant this machine would load; no kernel code is imported or run.

KERNEL is a Hub repository id (its newest version by default; --version N for the v<N>
branch, --revision for a branch, tag or commit) or a local folder: a kernel repository, its
build/ folder or one build/<variant>/ folder.

--dep-tree draws the kernel dependencies as a tree (with --json: "dependency_tree", a nested
object). --json prints the keys of Hugging Face's `kernels info --json`: "repo_id" and
"revision" (or "path"), "variant", "name", "version", "kernels_minver", "license",
"upstream", "source", "python_depends", "backends", "kernel_depends"."""
EPILOG = """\
examples:
  kernels info kernels-community/activation
  kernels info kernels-community/activation --version 1 --dep-tree
  kernels info ./library/norm --json"""

#: How deep and how many kernel dependencies are followed (a hostile chain must end).
MAX_DEPTH = 16
MAX_KERNELS = 256


def configure(parser: argparse.ArgumentParser) -> None:
    add_kernel_selection(parser)
    parser.add_argument(
        "--dep-tree",
        action="store_true",
        help="show the kernel dependencies as a tree (a nested object with --json)",
    )
    add_repo_type_argument(parser)


def run(args: argparse.Namespace) -> int:
    from ..repos.info import Metadata
    from ._kernel_files import (
        describe_where,
        hub_variant_file,
        local_kernel_folder,
        local_variant_file,
    )

    path = local_kernel_folder(args.kernel, version=args.version, revision=args.revision)
    if path is not None:
        found = local_variant_file(path, "metadata.json")
        source: dict[str, Any] = {"path": str(path)}
        where = str(path)
    else:
        from ..repos.repo_id import check_repo_id
        from ._kernel_refs import select_revision

        repo_id = check_repo_id(args.kernel, where="KERNEL")
        version, revision = select_revision(
            repo_id, args.repo_type, version=args.version, revision=args.revision
        )
        where = describe_where(repo_id, version, revision)
        found = hub_variant_file(repo_id, args.repo_type, revision, "metadata.json", where=where)
        source = {"repo_id": repo_id, "revision": revision}
    # A build made before kernel-builder wrote metadata has none: every field is then unknown.
    metadata = Metadata.read_from_file(found.path) if found.path else Metadata()
    info: dict[str, Any] = {
        **source,
        "variant": found.variant,
        "name": metadata.name,
        "version": metadata.version,
        "kernels_minver": metadata.kernels_minver,
        "license": metadata.license,
        "upstream": metadata.upstream,
        "source": metadata.source,
        "backends": _backends(found.offered),
    }
    tree, kernel_depends, python_depends = _dependencies(metadata, where=where)
    info["python_depends"] = sorted(python_depends)
    info["kernel_depends"] = sorted(kernel_depends)
    if args.dep_tree:
        info["dependency_tree"] = tree
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        _print_text(info)
    return 0


def _backends(variants: tuple[str, ...]) -> list[str]:
    """The backends the variants are built for (``universal`` for torch-universal)."""
    from ..errors import KernelMetadataError
    from ..repos.variants import BuildVariant

    backends = set()
    for name in variants:
        try:
            variant = BuildVariant.parse(name)
        except KernelMetadataError:
            continue  # not a variant this client knows: it names no backend we can trust
        backends.add(variant.backend or "universal")
    return sorted(backends)


def _dependencies(metadata, *, where: str) -> tuple[dict, set[str], set[str]]:
    """The kernel-depends tree (repo id -> its own tree), every kernel in it, and the Python
    dependencies of them all."""
    from ..repos.kernel_deps import KEY, parse_kernel_depends

    kernels: set[str] = set()
    python = set(metadata.python_depends)

    def follow(meta, where: str, chain: tuple[str, ...]) -> dict:
        tree: dict[str, dict] = {}
        for dep in parse_kernel_depends(meta.extra.get(KEY), where=where):
            kernels.add(dep.repo_id)
            if dep.repo_id in chain:
                raise CommandError(
                    f"kernel-depends form a cycle: {' -> '.join((*chain, dep.repo_id))}."
                )
            if len(chain) >= MAX_DEPTH or len(kernels) > MAX_KERNELS:
                raise CommandError(
                    f"{where}: kernel-depends go deeper than {MAX_DEPTH} levels or name more "
                    f"than {MAX_KERNELS} kernels; not followed further."
                )
            dep_meta, dep_where = _hub_metadata(dep)
            python.update(dep_meta.python_depends)
            tree[dep.repo_id] = follow(dep_meta, dep_where, (*chain, dep.repo_id))
        return dict(sorted(tree.items()))

    return follow(metadata, where, (where,)), kernels, python


def _hub_metadata(dep):
    """The metadata of a kernel dependency, for the variant this machine would load."""
    from ..repos.hubclient import KERNEL_REPO_TYPE
    from ..repos.info import Metadata
    from ._kernel_files import describe_where, hub_variant_file

    revision = dep.revision if dep.revision is not None else f"v{dep.version}"
    where = describe_where(dep.repo_id, dep.version, revision)
    # Dependencies name kernel repositories (kernel-builder's kernel-depends).
    found = hub_variant_file(dep.repo_id, KERNEL_REPO_TYPE, revision, "metadata.json", where=where)
    return (Metadata.read_from_file(found.path) if found.path else Metadata()), where


def _print_text(info: dict[str, Any]) -> None:
    def shown(value: object) -> str:
        return "-" if value is None else str(value)

    from ._kernel_files import print_kernel_source

    print_kernel_source(info)
    print(f"Name: {shown(info['name'])}")
    print(f"Version: {shown(info['version'])}")
    print(f"Minimum kernels version: {shown(info['kernels_minver'])}")
    print(f"License: {shown(info['license'])}")
    print(f"Upstream: {shown(info['upstream'])}")
    print(f"Source: {shown(info['source'])}")
    if "dependency_tree" in info:
        print("Kernel dependencies:")
        print(f"  {info.get('repo_id', info.get('path'))}")
        for line in tree_lines(info["dependency_tree"]):
            print(f"  {line}")
    else:
        print(f"Kernel dependencies: {', '.join(info['kernel_depends']) or '-'}")
    print(f"Python dependencies: {', '.join(info['python_depends']) or '-'}")
    print(f"Backends: {', '.join(info['backends']) or '-'}")


def tree_lines(tree: dict, prefix: str = "") -> list[str]:
    """An ASCII drawing of a nested {name: subtree} dict, one line a node."""
    lines = []
    for index, (name, subtree) in enumerate(tree.items()):
        last = index == len(tree) - 1
        lines.append(f"{prefix}{'`-- ' if last else '|-- '}{name}")
        lines.extend(tree_lines(subtree, prefix + ("    " if last else "|   ")))
    return lines
