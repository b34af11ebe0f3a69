"""Importing a kernel package of the library: the one place that knows where and how.

Every internal user (the layer mapping's repositories aside, which load through
`kernels.LocalLayerRepository` when kernelize asks), the aten overrides, the compile backend,
the fused generation loop, our attention, the benchmarks and the tests call
`load_library_package`, so that how the library is found (`library_path`) and which variant
runs are decided here.
"""

from __future__ import annotations

from types import ModuleType

from ..errors import KernelMappingError
from ..repos.local import get_local_kernel
from .paths import library_path
from .registry import repository_names

# Filled once per repository. A plain dict rather than ``functools.cache``: torch.compile traces
# into a cached function's body (and its file system calls), but reads a dict entry as a constant.
_packages: dict[str, ModuleType] = {}


def load_library_package(repo: str) -> ModuleType:
    """The kernel package of the library's repository ``repo`` (``library/<repo>``), imported
    once per process as kernelize imports it.

    It is ``get_local_kernel(library_path() / repo, repo)``: the variant chosen for this machine,
    under the module name `kernels.get_local_kernel` gives that folder, so the package is the
    same module that `library_mapping`'s repositories load.

    Args:
        repo: a repository of `kernels.library.registry.REPOSITORIES`: ``"activation"``,
            ``"norm"``, ``"rotary"``, ``"loss"`` or ``"attention"``.

    Raises:
        KernelMappingError: ``repo`` is not a repository of the library (the message lists them).
        KernelLoadError: the package cannot be imported (as for `kernels.get_local_kernel`).

    Example:
        ```python
        from kernels.library import load_library_package

        norm = load_library_package("norm")
        y = norm.rms_norm(x, weight, 1e-6)
        ```
    """
    package = _packages.get(repo)
    if package is None:
        known = repository_names()
        if repo not in known:
            raise KernelMappingError(
                f"The kernel library has no repository {repo!r}; it has: {', '.join(known)}."
            )
        package = _packages[repo] = get_local_kernel(library_path() / repo, repo)
    return package
