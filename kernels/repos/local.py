"""Kernel repositories on local disk, for kernel authors and for our own kernel library."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from ..errors import KernelLoadError
from ..function_kernels import function_kernel
from . import archs, hubclient
from .base import warn_function_repository_deprecated
from .download import dependency_loader
from .kernel_deps import dependencies_loaded
from .layout import locate_local
from .loader import import_package
from .provides import provided_kernel
from .variants import machine_for_backend


def get_local_kernel(
    repo_path: str | os.PathLike[str],
    package_name: str | None = None,
    *,
    backend: str | None = None,
    trust_remote_code: bool | list[str] = False,
    user_agent: str | dict | None = None,
    check_arch: bool = True,
) -> ModuleType:
    """Import the kernel package of a kernel repository folder.

    The build variant is chosen for this machine (the compiled one that matches the running
    torch, accelerator runtime, C++ ABI, CPU architecture and OS, else ``torch-<backend>`` or
    ``torch-universal``). Importing the same folder twice returns the same module.

    Args:
        repo_path: the repository folder (which holds ``build/``), its ``build/`` folder, or
            one variant folder such as ``build/torch-cuda``, which is imported as it is.
        package_name: the package inside ``build/<variant>/``; may be omitted (Hugging Face's
            0.19 form) when the variant folder is the package itself, or holds only one, or
            one named after the repository folder.
        backend: load builds for this backend: ``"cpu"``, or the backend torch was built
            for (the default), as in Hugging Face's client.
        trust_remote_code: the trust given to the Hub kernels the kernel depends on (its
            metadata.json's ``kernel-depends``), as for `get_kernel`; the folder itself is
            the user's own code and is not trust-checked.
        user_agent: sent with the Hub requests of those dependencies, as for `get_kernel`.
        check_arch: refuse a build whose ``metadata.json`` lists architectures that leave
            out the current GPU's, as for `get_kernel`.

    Raises:
        KernelLoadError: the folder holds no kernel package; BuildVariantNotFoundError when
            none of its variants runs here (the message says why for each).
        KernelMappingError: `backend` is not one this machine runs.

    Example:
        ```python
        from kernels import get_local_kernel

        activation = get_local_kernel("/src/activation")
        y = activation.silu_and_mul(x)
        relu = get_local_kernel("/src/relu/build", backend="cpu")
        ```
    """
    path = Path(repo_path).expanduser()
    machine = machine_for_backend(backend)
    if not path.is_dir():
        raise KernelLoadError(f"Kernel repository folder {path} does not exist.")
    location = locate_local(path, package_name, where=str(path), machine=machine)
    if check_arch:
        archs.check_package_arch(location.package_dir, where=f"{path}, variant {location.variant}")
    load = dependency_loader(trust_remote_code, backend=backend, check_arch=check_arch)
    with (
        hubclient.user_agent_for(user_agent),
        dependencies_loaded(location.package_dir, str(path), load),
    ):
        return import_package(location.package_dir, location.package_name)


@dataclass(frozen=True)
class LocalLayerRepository:
    """A kernel layer from a kernel repository folder on local disk.

    Local repositories are trusted: they are code the user already has.

    Args:
        repo_path: the repository folder (which holds ``build/``), its ``build/`` folder or
            one variant folder, as for `get_local_kernel`.
        package_name: the package inside ``build/<variant>/`` (optional, as for
            `get_local_kernel`: transformers 5.x passes only `repo_path` and `layer_name`).
        layer_name: the class in the package's ``layers`` module, or a function of the
            package (a function kernel).
        check_arch: refuse a build that does not support the current GPU, as for
            `get_kernel`.

    Example:
        ```python
        from kernels import LocalLayerRepository

        repo = LocalLayerRepository(repo_path="/home/me/kernels/activation", layer_name="SiluAndMul")
        SiluAndMul = repo.load()  # the kernel layer class
        ```
    """

    repo_path: Path
    package_name: str | None = field(default=None, kw_only=True)
    layer_name: str = field(kw_only=True)
    check_arch: bool = field(default=True, kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "repo_path", Path(self.repo_path).expanduser())

    def load(self) -> type | Callable:
        """Import the kernel package (cached per folder); return its layer class or function."""
        package = get_local_kernel(self.repo_path, self.package_name, check_arch=self.check_arch)
        return provided_kernel(package, self.layer_name, self)

    def __str__(self) -> str:
        package = f", package {self.package_name}" if self.package_name else ""
        return f"local repository {self.repo_path}{package}, layer {self.layer_name}"


@dataclass(frozen=True)
class LocalFuncRepository:
    """A function kernel from a kernel repository folder on local disk.

    The kernel is the function `func_name` at the top level of the kernel package; it
    replaces a function made kernelizable with `use_kernel_func_from_hub`.

    Example:
        ```python
        from kernels import LocalFuncRepository

        repo = LocalFuncRepository("/src/rotary", func_name="apply_rotary_pos_emb")
        ```
    """

    repo_path: Path
    package_name: str | None = field(default=None, kw_only=True)
    func_name: str = field(kw_only=True)
    check_arch: bool = field(default=True, kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "repo_path", Path(self.repo_path).expanduser())
        if type(self) is LocalFuncRepository:  # the library's own subclass is not deprecated
            warn_function_repository_deprecated("LocalFuncRepository", "LocalLayerRepository")

    @property
    def layer_name(self) -> str:
        return self.func_name

    def load(self) -> type:
        """Import the kernel package and wrap its function as a kernel layer."""
        package = get_local_kernel(self.repo_path, self.package_name, check_arch=self.check_arch)
        return function_kernel(package, self.func_name, self)

    def __str__(self) -> str:
        package = f", package {self.package_name}" if self.package_name else ""
        return f"local repository {self.repo_path}{package}, function {self.func_name}"
