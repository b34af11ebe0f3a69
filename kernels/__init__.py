"""kernels: swap the forward of tagged PyTorch layers for fast kernels.

Tag layers with `use_kernel_forward_from_hub`, register where their kernels come from with
`register_kernel_mapping` or `use_kernel_mapping`, and call `kernelize(model, mode=...)`.
See docs/layers.md.
"""

from __future__ import annotations

from ._version import __version__
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
