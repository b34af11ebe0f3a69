"""Kernel repositories on the Hugging Face Hub."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING

from ..errors import KernelMappingError
from .base import PackageFunction, warn_function_repository_deprecated
from .hubclient import KERNEL_REPO_TYPE, check_repo_type, check_user_agent
from .provides import provided_kernel
from .repo_id import check_repo_id
from .trust import normalize_trust
from .versions import (
    check_version_argument,
    made_by_transformers_4_default_mapping,
    require_pin,
)

if TYPE_CHECKING:
    from .download import LoadedHubKernel

#: Set on the repositories of transformers 4.x's default mapping: `kernelize` keeps a layer's
#: forward (with a WARNING) where one cannot be loaded, whatever `use_fallback` says.
LEGACY_FALLBACK_ATTRIBUTE = "_falls_back_when_unloadable"


def falls_back_when_unloadable(repository: object) -> bool:
    """Whether `kernelize` keeps a layer's forward where `repository` cannot be loaded even
    without ``KernelizeFallback.CANNOT_LOAD``: transformers 4.x's default mapping, written for
    the fallback of kernels before 0.19."""
    return getattr(repository, LEGACY_FALLBACK_ATTRIBUTE, False) is True


# Guards only the publication of a first load, never a load itself.
_publish_lock = threading.Lock()


@dataclass(frozen=True)
class LayerRepository:
    """A kernel layer from a kernel repository on the Hugging Face Hub.

    The repository is resolved, downloaded and imported on the first `load()` (by
    `kernelize`); later loads return the same module, so a registered mapping keeps using
    the commit it resolved first. Construct a new `LayerRepository` to resolve again.

    Args:
        repo_id: the Hub repository, e.g. ``"kernels-community/activation"``.
        layer_name: the class in the kernel package's ``layers`` module.
        revision: a branch, tag or full commit hash. Cannot be combined with `version`.
        version: an int N for the branch ``vN`` (the Hub's convention), or a PEP 440
            specifier such as ``">=0.1,<0.2"`` (the highest ``v<x.y.z>`` tag that satisfies
            it). One of `revision` and `version` must be given (a ValueError otherwise;
            ``revision="main"`` follows the main branch).
        trust_remote_code: run code from an organisation that is not trusted by default or
            by configuration: True for any, or a list of organisations / repository ids
            (docs/hub.md#trust).
        user_agent: extra user-agent information for the Hub requests of its load, as for
            `get_kernel` (not part of the repository's identity).
        check_arch: refuse a build that does not support the current GPU, as for
            `get_kernel`.
        repo_type: ``"kernel"`` (the Hub's kernel repositories, the default) or ``"model"``
            for a kernel still published as a model repository (docs/hub.md#repository-types).

    Example:
        ```python
        from kernels import LayerRepository

        repo = LayerRepository("kernels-community/activation", layer_name="SiluAndMul", version=1)
        ```
    """

    repo_id: str
    layer_name: str = field(kw_only=True)
    revision: str | None = field(default=None, kw_only=True)
    version: str | int | None = field(default=None, kw_only=True)
    trust_remote_code: bool | tuple[str, ...] = field(default=False, kw_only=True)
    user_agent: str | dict | None = field(default=None, kw_only=True, compare=False)
    check_arch: bool = field(default=True, kw_only=True)
    repo_type: str = field(default=KERNEL_REPO_TYPE, kw_only=True)
    # What the first load() resolved; not part of the repository's identity.
    _loaded: LoadedHubKernel | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Fail when the mapping is written, not when kernelize first runs; the id first, so no
        # look-alike of a trusted organisation is ever compared with one.
        check_repo_id(self.repo_id, where="LayerRepository repo_id", error=KernelMappingError)
        check_repo_type(self.repo_type, where=f"LayerRepository('{self.repo_id}')")
        if self.revision is not None and self.version is not None:
            raise KernelMappingError(
                f"LayerRepository('{self.repo_id}') got both revision={self.revision!r} and "
                f"version={self.version!r}; give one of them."
            )
        if made_by_transformers_4_default_mapping():
            # transformers 4.x's import-time mapping keeps the behaviour it was written for
            # (docs/transformers.md): it passes no use_fallback, so its kernels fall back when
            # they cannot load, and those it names without a version follow main. Anyone
            # else's unpinned repository is refused.
            object.__setattr__(self, LEGACY_FALLBACK_ATTRIBUTE, True)
            if self.revision is None and self.version is None:
                object.__setattr__(self, "revision", "main")
        require_pin(
            f"LayerRepository('{self.repo_id}')",
            revision=self.revision,
            version=self.version,
            error=KernelMappingError,
            repository=True,
        )
        check_version_argument(self.version, repo_id=self.repo_id)
        check_user_agent(self.user_agent)
        object.__setattr__(
            self,
            "trust_remote_code",
            normalize_trust(
                self.trust_remote_code,
                where=f"LayerRepository('{self.repo_id}').trust_remote_code",
            ),
        )

    def load(self) -> type | Callable:
        """Download (if needed) and import the kernel package; return the layer class (or the
        kernel function) it provides as `layer_name`. Resolves once per instance."""
        return provided_kernel(self.load_package(), self.layer_name, self)

    def load_package(self) -> ModuleType:
        """Download (if needed) and import the kernel package; the first load's module is
        kept, and later loads return it.

        Threads that load at once share one resolution and download (`load_hub_kernel`);
        no lock is held while the kernel's code is imported, so the kernel may itself load
        other kernels at import (kernels.repos.load_locks explains why this cannot deadlock).
        """
        loaded = self._loaded
        if loaded is None:
            from .download import load_hub_kernel

            loaded = load_hub_kernel(
                self.repo_id,
                revision=self.revision,
                version=self.version,
                trust_remote_code=self.trust_remote_code,
                user_agent=self.user_agent,
                check_arch=self.check_arch,
                repo_type=self.repo_type,
            )
            with _publish_lock:
                if self._loaded is None:
                    object.__setattr__(self, "_loaded", loaded)
                else:  # another thread published first: every caller gets that one
                    loaded = self._loaded
        return loaded.module

    def __deepcopy__(self, memo: dict) -> LayerRepository:
        return self  # an immutable value; the loaded module must not be copied

    def __reduce__(self):
        # Pickles what was asked, not what was loaded.
        return (
            _rebuild,
            (
                self.repo_id,
                self.layer_name,
                self.revision,
                self.version,
                self.trust_remote_code,
                self.repo_type,
                self.user_agent,
                self.check_arch,
            ),
        )

    @property
    def commit(self) -> str | None:
        """The commit the first `load()` resolved to, or None before it."""
        loaded = self._loaded
        return None if loaded is None else loaded.fetched.commit

    def __str__(self) -> str:
        # Never touches the network: shows what was asked and, once loaded, what it resolved to.
        pin = (
            f"version {self.version}"
            if self.version is not None
            else f"revision {self.revision or 'main'}"
        )
        loaded = self._loaded
        if loaded is not None:
            fetched = loaded.fetched
            pin += (
                f" -> commit {fetched.commit[:12]}, variant {fetched.variant}; "
                f"{loaded.trust.reason}"
            )
        kind = "" if self.repo_type == KERNEL_REPO_TYPE else f"{self.repo_type} repository "
        return f"{kind}{self.repo_id} ({pin}), layer {self.layer_name}"


def _rebuild(
    repo_id,
    layer_name,
    revision,
    version,
    trust_remote_code,
    repo_type=KERNEL_REPO_TYPE,
    user_agent=None,
    check_arch=True,
) -> LayerRepository:
    return LayerRepository(
        repo_id,
        layer_name=layer_name,
        revision=revision,
        version=version,
        trust_remote_code=trust_remote_code,
        user_agent=user_agent,
        check_arch=check_arch,
        repo_type=repo_type,
    )


@dataclass(frozen=True)
class FuncRepository(PackageFunction):
    """A function kernel from a kernel repository on the Hugging Face Hub.

    The kernel is the function `func_name` at the top level of the kernel package; it
    replaces a function made kernelizable with `use_kernel_func_from_hub` (newer transformers
    tag ``apply_rotary_pos_emb`` as ``"rotary_pos_emb"``). Versions, revisions, trust,
    repository types and caching are those of `LayerRepository`.

    Example:
        ```python
        from kernels import FuncRepository

        repo = FuncRepository("kernels-triton/rotary", func_name="apply_rotary_pos_emb", version=1)
        ```
    """

    repo_id: str
    func_name: str = field(kw_only=True)
    revision: str | None = field(default=None, kw_only=True)
    version: str | int | None = field(default=None, kw_only=True)
    trust_remote_code: bool | tuple[str, ...] = field(default=False, kw_only=True)
    user_agent: str | dict | None = field(default=None, kw_only=True, compare=False)
    check_arch: bool = field(default=True, kw_only=True)
    repo_type: str = field(default=KERNEL_REPO_TYPE, kw_only=True)
    # The package source: resolution, download and import are LayerRepository's.
    _package: LayerRepository = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        warn_function_repository_deprecated("FuncRepository", "LayerRepository")
        check_repo_id(self.repo_id, where="FuncRepository repo_id", error=KernelMappingError)
        require_pin(
            f"FuncRepository('{self.repo_id}')",
            revision=self.revision,
            version=self.version,
            error=KernelMappingError,
            repository=True,
        )
        package = LayerRepository(
            self.repo_id,
            layer_name=self.func_name,
            revision=self.revision,
            version=self.version,
            trust_remote_code=self.trust_remote_code,
            user_agent=self.user_agent,
            check_arch=self.check_arch,
            repo_type=self.repo_type,
        )
        object.__setattr__(self, "trust_remote_code", package.trust_remote_code)
        object.__setattr__(self, "_package", package)

    @property
    def commit(self) -> str | None:
        """The commit the first `load()` resolved to, or None before it."""
        return self._package.commit

    def __reduce__(self):
        return (
            _rebuild_func,
            (
                self.repo_id,
                self.func_name,
                self.revision,
                self.version,
                self.trust_remote_code,
                self.repo_type,
                self.user_agent,
                self.check_arch,
            ),
        )


def _rebuild_func(
    repo_id,
    func_name,
    revision,
    version,
    trust_remote_code,
    repo_type=KERNEL_REPO_TYPE,
    user_agent=None,
    check_arch=True,
) -> FuncRepository:
    return FuncRepository(
        repo_id,
        func_name=func_name,
        revision=revision,
        version=version,
        trust_remote_code=trust_remote_code,
        user_agent=user_agent,
        check_arch=check_arch,
        repo_type=repo_type,
    )
