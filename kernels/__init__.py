"""kernels: swap the forward of tagged PyTorch layers for fast kernels.

Tag layers with `use_kernel_forward_from_hub`, register where their kernels come from with
`register_kernel_mapping` or `use_kernel_mapping`, and call `kernelize(model, mode=...)`.
See docs/layers.md.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

from ._version import __version__

# The public names are imported on first use (PEP 562), not here: `import kernels` must not import
# torch, so that the `kernels` command (kernels.cli, a subpackage) answers --help at once and can
# be interrupted quietly. Type checkers read the imports below; `_SOURCES` says the same to
# Python; `__all__` names both (tests/cli/test_cli_startup.py checks that the three agree).
if TYPE_CHECKING:
    from .benchmark import Benchmark
    from .errors import (
        BuildVariantNotFoundError,
        KernelDownloadError,
        KernelHashMismatchError,
        KernelHubUnsupportedError,
        KernelLayerError,
        KernelLoadError,
        KernelLockError,
        KernelMappingError,
        KernelMetadataError,
        KernelOfflineError,
        KernelRepositoryNotFoundError,
        KernelRevisionError,
        KernelsError,
        KernelSignatureError,
        KernelTaggingError,
        KernelVerificationError,
        KernelVersionSpecError,
        NoKernelError,
        UntrustedKernelError,
    )
    from .layer.decorators import (
        use_kernel_forward_from_hub,
        use_kernel_func_from_hub,
        use_kernelized_func,
    )
    from .layer.explain import explain
    from .layer.fallback import KernelizeFallback
    from .layer.kernelize import kernelize
    from .layer.kernelized import (
        KernelizedFunc,
        KernelizedLayer,
        KernelizedLayers,
        get_kernelized_layers,
    )
    from .layer.tagging import replace_kernel_forward_from_hub
    from .library import library_mapping
    from .mapping.device import CUDAProperties, Device, ROCMProperties
    from .mapping.mode import Mode
    from .mapping.registry import register_kernel_mapping, use_kernel_mapping
    from .repos.download import get_kernel, get_kernel_variants, has_kernel, install_kernel
    from .repos.hub import FuncRepository, LayerRepository
    from .repos.info import Metadata, RepoInfo
    from .repos.kernel_deps import get_kernel_dep
    from .repos.loaded import LoadedKernel, get_loaded_kernels
    from .repos.local import LocalFuncRepository, LocalLayerRepository, get_local_kernel
    from .repos.lock import (
        LockedFuncRepository,
        LockedLayerRepository,
        get_locked_kernel,
        load_kernel,
    )
    from .repos.variants import BuildVariant, VariantAccepted, VariantRejected

#: Where each public name lives, for `__getattr__`.
_SOURCES: dict[str, str] = {
    "Benchmark": ".benchmark",
    "BuildVariantNotFoundError": ".errors",
    "KernelDownloadError": ".errors",
    "KernelHashMismatchError": ".errors",
    "KernelHubUnsupportedError": ".errors",
    "KernelLayerError": ".errors",
    "KernelLoadError": ".errors",
    "KernelLockError": ".errors",
    "KernelMappingError": ".errors",
    "KernelMetadataError": ".errors",
    "KernelOfflineError": ".errors",
    "KernelRepositoryNotFoundError": ".errors",
    "KernelRevisionError": ".errors",
    "KernelsError": ".errors",
    "KernelSignatureError": ".errors",
    "KernelTaggingError": ".errors",
    "KernelVerificationError": ".errors",
    "KernelVersionSpecError": ".errors",
    "NoKernelError": ".errors",
    "UntrustedKernelError": ".errors",
    "use_kernel_forward_from_hub": ".layer.decorators",
    "use_kernel_func_from_hub": ".layer.decorators",
    "use_kernelized_func": ".layer.decorators",
    "explain": ".layer.explain",
    "KernelizeFallback": ".layer.fallback",
    "kernelize": ".layer.kernelize",
    "KernelizedFunc": ".layer.kernelized",
    "KernelizedLayer": ".layer.kernelized",
    "KernelizedLayers": ".layer.kernelized",
    "get_kernelized_layers": ".layer.kernelized",
    "replace_kernel_forward_from_hub": ".layer.tagging",
    "library_mapping": ".library",
    "CUDAProperties": ".mapping.device",
    "Device": ".mapping.device",
    "ROCMProperties": ".mapping.device",
    "Mode": ".mapping.mode",
    "register_kernel_mapping": ".mapping.registry",
    "use_kernel_mapping": ".mapping.registry",
    "get_kernel": ".repos.download",
    "get_kernel_variants": ".repos.download",
    "has_kernel": ".repos.download",
    "install_kernel": ".repos.download",
    "FuncRepository": ".repos.hub",
    "LayerRepository": ".repos.hub",
    "Metadata": ".repos.info",
    "RepoInfo": ".repos.info",
    "get_kernel_dep": ".repos.kernel_deps",
    "LoadedKernel": ".repos.loaded",
    "get_loaded_kernels": ".repos.loaded",
    "LocalFuncRepository": ".repos.local",
    "LocalLayerRepository": ".repos.local",
    "get_local_kernel": ".repos.local",
    "LockedFuncRepository": ".repos.lock",
    "LockedLayerRepository": ".repos.lock",
    "get_locked_kernel": ".repos.lock",
    "load_kernel": ".repos.lock",
    "BuildVariant": ".repos.variants",
    "VariantAccepted": ".repos.variants",
    "VariantRejected": ".repos.variants",
}

# Static, so that type checkers see what is re-exported (a py.typed package's rule).
__all__ = [
    "BuildVariant",
    "Benchmark",
    "BuildVariantNotFoundError",
    "CUDAProperties",
    "Device",
    "KernelDownloadError",
    "KernelHashMismatchError",
    "KernelHubUnsupportedError",
    "KernelLayerError",
    "KernelLoadError",
    "KernelLockError",
    "KernelMappingError",
    "KernelMetadataError",
    "KernelOfflineError",
    "KernelRepositoryNotFoundError",
    "KernelRevisionError",
    "KernelsError",
    "KernelSignatureError",
    "KernelTaggingError",
    "KernelVerificationError",
    "KernelVersionSpecError",
    "KernelizeFallback",
    "KernelizedFunc",
    "KernelizedLayer",
    "KernelizedLayers",
    "FuncRepository",
    "LayerRepository",
    "LoadedKernel",
    "LocalFuncRepository",
    "LocalLayerRepository",
    "LockedFuncRepository",
    "LockedLayerRepository",
    "Metadata",
    "Mode",
    "NoKernelError",
    "ROCMProperties",
    "RepoInfo",
    "UntrustedKernelError",
    "VariantAccepted",
    "VariantRejected",
    "__version__",
    "explain",
    "get_kernel",
    "get_kernel_dep",
    "get_kernel_variants",
    "get_kernelized_layers",
    "get_loaded_kernels",
    "get_local_kernel",
    "get_locked_kernel",
    "has_kernel",
    "install_kernel",
    "kernelize",
    "library_mapping",
    "load_kernel",
    "register_kernel_mapping",
    "replace_kernel_forward_from_hub",
    "use_kernel_forward_from_hub",
    "use_kernel_func_from_hub",
    "use_kernel_mapping",
    "use_kernelized_func",
]


def __getattr__(name: str) -> object:
    module = _SOURCES.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module, __name__), name)
    elif not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        # `import kernels; kernels.layer...` worked while this file imported everything.
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later look-ups find it without calling __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
