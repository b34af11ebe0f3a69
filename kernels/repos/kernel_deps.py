"""``kernel-depends``: the kernels a kernel is built on, loaded before it, handed over by
`get_kernel_dep` while it imports.

A variant's ``metadata.json`` may list them, in Hugging Face's format (kernel-builder writes
it from ``kernel-deps`` in ``build.toml``)::

    "kernel-depends": [{"repo-id": "kernels-community/relu", "version": 1},
                       {"repo-id": "me/norm", "revision": "0f3c..."}]

Each entry names a Hub kernel repository and exactly one of ``version`` (an int N: the branch
``vN``) or ``revision`` (a branch, tag or commit); nothing else is allowed. Before the kernel is
imported each dependency is loaded like any Hub kernel (resolved, trust-checked with the
trust given for the kernel, ``LOCAL_KERNELS`` honoured), and during the import
``kernels.get_kernel_dep("kernels-community/relu")`` returns it. A cycle of dependencies is a
`KernelLoadError`.

``kernels lock`` locks the whole tree (every variant's dependencies, `kernels.repos.lock.lock_tree`),
and loads from a lock file (`LockedLayerRepository`, `get_locked_kernel`, `load_kernel`) load
each dependency at the commit the same lock pins for it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, ModuleType

from ..errors import KernelLoadError, KernelMetadataError
from .bounded_json import quoted
from .repo_id import is_repo_id, shown

#: The metadata.json key.
KEY = "kernel-depends"

#: The most dependencies one build may list (kernel-builder's list a handful at most).
MAX_DEPENDENCIES = 64
#: How deep a chain of kernel-depends may go (a kernel, its dependency, theirs...): far above
#: any real kernel, far below Python's recursion limit, which a deeper chain would hit.
MAX_DEPTH = 32

#: The longest revision read (a branch or tag name, or a 40-hex commit).
MAX_REVISION_LENGTH = 255

_FIELDS = ("repo-id", "version", "revision")

# The dependencies of the kernel importing now, in this thread or task.
_current: contextvars.ContextVar[Mapping[str, ModuleType] | None] = contextvars.ContextVar(
    "kernels_kernel_deps", default=None
)
# The kernels whose dependencies are being loaded, outermost first (to name a cycle).
_loading: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "kernels_kernel_deps_loading", default=()
)


@dataclass(frozen=True)
class KernelDependency:
    """One ``kernel-depends`` entry: a Hub kernel and the version or revision to load."""

    repo_id: str
    version: int | None = None
    revision: str | None = None


def parse_kernel_depends(value: object, *, where: str) -> tuple[KernelDependency, ...]:
    """The entries of a ``kernel-depends`` value (any JSON value may be given).

    Raises:
        KernelMetadataError: not a list of entries as the module docstring describes, more
            than `MAX_DEPENDENCIES`, or one repository listed twice.
    """
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _bad(where, f"it must be a list of entries, not {type(value).__name__}")
    if len(value) > MAX_DEPENDENCIES:
        raise _bad(where, f"it lists {len(value)} entries; at most {MAX_DEPENDENCIES} are read")
    deps: dict[str, KernelDependency] = {}
    for index, item in enumerate(value):
        dep = _entry(item, where=f"{where} entry {index}")
        if dep.repo_id in deps:
            raise _bad(where, f"{dep.repo_id} is listed twice")
        deps[dep.repo_id] = dep
    return tuple(deps.values())


def _entry(item: object, *, where: str) -> KernelDependency:
    if not isinstance(item, dict):
        raise _bad(where, 'an entry is an object such as {"repo-id": "org/name", "version": 1}')
    unknown = sorted(quoted(k) for k in item if k not in _FIELDS)
    if unknown:
        raise _bad(where, f"unknown field(s) {', '.join(unknown)}; allowed: {', '.join(_FIELDS)}")
    repo_id = item.get("repo-id")
    if not (isinstance(repo_id, str) and "/" in repo_id and is_repo_id(repo_id)):
        raise _bad(where, f"repo-id {shown(repo_id)} is not a Hub repository id (org/name)")
    version, revision = item.get("version"), item.get("revision")
    if (version is None) == (revision is None):
        raise _bad(where, "exactly one of version and revision must be given")
    if version is not None and (type(version) is not int or version < 0):
        raise _bad(where, f"version must be an integer >= 0, not {quoted(version)}")
    if revision is not None and not (
        isinstance(revision, str)
        and 0 < len(revision) <= MAX_REVISION_LENGTH
        and revision.isascii()
        and revision.isprintable()
    ):
        raise _bad(where, f"revision must be a branch, tag or commit name, not {quoted(revision)}")
    return KernelDependency(repo_id, version, revision)


def _bad(where: str, problem: str) -> KernelMetadataError:
    return KernelMetadataError(
        f"{where}: {KEY} is malformed: {problem}. Nothing was imported; rebuild the kernel with "
        "kernel-builder, or report it to the kernel's authors."
    )


def dependencies_of(package_dir: Path) -> tuple[KernelDependency, ...]:
    """The ``kernel-depends`` of the variant a package folder belongs to (none without a file)."""
    from .loaded import read_metadata, variant_folder
    from .signatures import check_signature

    # Dependencies load before the kernel itself: its signature (when required) must hold
    # before its metadata is parsed and anything it names is imported.
    check_signature(variant_folder(package_dir))
    metadata = read_metadata(package_dir)
    where = str(variant_folder(package_dir) / "metadata.json")
    return parse_kernel_depends(metadata.extra.get(KEY), where=where)


@contextmanager
def dependencies_loaded(
    package_dir: Path, what: str, load: Callable[[KernelDependency], ModuleType]
) -> Iterator[Mapping[str, ModuleType]]:
    """Load the dependencies of the kernel in `package_dir`, and hand them to `get_kernel_dep`
    while the block (the kernel's import) runs.

    Args:
        package_dir: the kernel package about to be imported.
        what: the kernel, as messages name it (a repo id or a folder).
        load: loads one dependency from the Hub (resolved and trust-checked, with the trust
            given for the kernel); passed in because the Hub loader imports this module.

    Raises:
        KernelMetadataError: ``kernel-depends`` is malformed; KernelLoadError: a dependency
            cannot be loaded, or the dependencies form a cycle.
    """
    chain = _loading.get()
    if len(chain) >= MAX_DEPTH:
        shown_chain = " -> ".join((*chain[:3], "...", *chain[-2:], what))
        raise KernelLoadError(
            f"{KEY} nest more than {MAX_DEPTH} kernels deep ({shown_chain}); kernels refuses "
            "to load a chain this deep. Load fewer kernels through kernel-depends (a kernel "
            "can load the rest itself, lazily, with get_kernel)."
        )
    deps = dependencies_of(package_dir)
    modules: dict[str, ModuleType] = {}
    if deps:
        chain_token = _loading.set((*chain, what))
        try:
            for dep in deps:
                if dep.repo_id in (*chain, what):
                    cycle = " -> ".join((*chain, what, dep.repo_id))
                    raise KernelLoadError(
                        f"Cyclic {KEY}: {cycle}. A kernel cannot depend on itself, directly "
                        "or through others; remove one of the dependencies."
                    )
                modules[dep.repo_id] = load(dep)
        finally:
            _loading.reset(chain_token)
    token = _current.set(MappingProxyType(modules))
    try:
        yield modules
    finally:
        _current.reset(token)


def get_kernel_dep(repo_id: str) -> ModuleType:
    """A kernel's dependency, for the kernel's own code while it is imported.

    The dependency must be listed in the ``kernel-depends`` of the kernel's ``metadata.json``
    (kernel-builder writes it from ``kernel-deps`` in ``build.toml``), which fixes its version.

    Raises:
        KernelLoadError: called outside a kernel's import, or `repo_id` is not listed.

    Example:
        ```python
        # in a kernel's __init__.py
        from kernels import get_kernel_dep

        relu = get_kernel_dep("kernels-community/relu")
        ```
    """
    deps = _current.get()
    if deps is None:
        raise KernelLoadError(
            "get_kernel_dep works only while a kernel is imported (from the kernel's own code) "
            "by get_kernel, LayerRepository, get_local_kernel, LOCAL_KERNELS or a locked load. "
            "Outside a kernel, use get_kernel()."
        )
    module = deps.get(repo_id)
    if module is None:
        listed = ", ".join(sorted(deps)) or "none"
        raise KernelLoadError(
            f"{shown(repo_id)} is not among this kernel's dependencies (listed: {listed}). Add it "
            f"to kernel-deps in build.toml (metadata.json's {KEY}) and rebuild the kernel."
        )
    return module
