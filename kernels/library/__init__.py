"""Our own Triton kernels, shipped as kernel repositories, and the mapping that uses them.

The kernels are listed once, in `kernels.library.registry` (`KERNELS`, `REPOSITORIES`);
`load_library_package` imports a repository's package for every user inside the project.

Example:
    ```python
    from kernels import Mode, kernelize, library_mapping, use_kernel_mapping

    with use_kernel_mapping(library_mapping()):
        kernelize(model, mode=Mode.TRAINING | Mode.TORCH_COMPILE)
    ```
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable

from ..errors import KernelMappingError
from ..mapping.device import CUDAProperties, Device, validate_device_type
from ..mapping.registry import register_kernel_mapping
from ..repos.base import LayerRepositoryProtocol
from ..repos.local import LocalFuncRepository, LocalLayerRepository
from .attention import ATTENTION_IMPLEMENTATION, ATTENTION_REPO, register_attention
from .loading import load_library_package
from .paths import library_path, library_source
from .registry import KERNELS, REPOSITORIES, LibraryKernel, LibraryRepository

# Tagging what transformers leaves untagged, re-exported where users look first.
from .transformers_tags import (
    CAUSAL_LM_LAYER_NAMES,
    GATED_MLP_LAYER_NAME,
    ROTARY_FUNCTION_NAME,
    tag_causal_lm_losses,
    tag_gated_mlps,
    tag_on_kernelize,
    tag_rotary_embeddings,
    tag_transformers_layers,
    untag,
)

logger = logging.getLogger(__name__)

#: The Hub organisation our kernel repositories are published under.
HUB_ORGANISATION = "kernels-triton"

#: Device types our Triton kernels are tested on and registered for by default.
TESTED_DEVICE_TYPES = ("cuda",)

#: The CUDA GPUs our kernels are registered for: compute capability 8.0 and newer (Ampere on),
#: where current Triton releases run and bf16 is native; tested on 9.0 (Hopper). Registering
#: for a range rather than all of ``cuda`` also means a narrower key, so our kernels win over
#: kernels registered for ``"cuda"`` without a range (transformers 5.x re-registers its Hub
#: defaults that way at every ``use_kernels``; docs/transformers.md).
CUDA_CAPABILITIES = CUDAProperties(min_capability=80, max_capability=sys.maxsize)


class LibraryFunction(LocalFuncRepository):
    """A function kernel of our library: a `LocalFuncRepository` without the deprecation
    WARNING its public use gets (Hugging Face's client deprecated it in 0.17)."""


def library_mapping(
    devices: Iterable[str] | None = None,
    *,
    layers: Iterable[str] | None = None,
) -> dict:
    """The kernel mapping from layer names to our Triton kernel repositories.

    Every kernel supports backward and torch.compile, so each is registered for all modes.
    On ``cuda`` the key is ``Device("cuda", CUDA_CAPABILITIES)`` (capability 8.0 and newer):
    a capability range is narrower than a bare ``"cuda"`` key, so our kernels win over Hub
    kernels registered for ``"cuda"`` before or after them, as transformers 5.x's defaults are.

    Args:
        devices: device types to register the kernels for. By default ``cuda`` (where they
            are tested), plus ``cpu`` when ``TRITON_INTERPRET=1`` is set, so that they run
            through Triton's interpreter (slow: for checking numerics, not for speed).
        layers: restrict the mapping to these layer names (default: all of them).

    Example:
        ```python
        from kernels import register_kernel_mapping, library_mapping

        register_kernel_mapping(library_mapping())
        ```
    """
    if devices is None:
        devices = list(TESTED_DEVICE_TYPES)
        if os.environ.get("TRITON_INTERPRET") == "1":
            devices.append("cpu")
        else:
            _warn_if_nothing_runs_here()
    devices = [validate_device_type(d) for d in devices]
    wanted = None if layers is None else set(layers)
    known = {k.layer_name for k in KERNELS}
    if wanted is not None and not wanted <= known:
        raise KernelMappingError(
            f"The kernel library has no kernels for {', '.join(sorted(wanted - known))}; it has: "
            f"{', '.join(sorted(known))}."
        )
    root = library_path()
    mapping = {}
    for kernel in KERNELS:
        if wanted is not None and kernel.layer_name not in wanted:
            continue
        repository: LayerRepositoryProtocol
        if kernel.is_function:
            repository = LibraryFunction(
                root / kernel.repo, package_name=kernel.repo, func_name=kernel.attribute
            )
        else:
            repository = LocalLayerRepository(
                root / kernel.repo, package_name=kernel.repo, layer_name=kernel.attribute
            )
        mapping[kernel.layer_name] = {_device_key(device): repository for device in devices}
    return mapping


def register_library_kernels(devices: Iterable[str] | None = None) -> None:
    """Our kernels for every model kernelized from now on, in one step.

    Registers `library_mapping(devices)` process-wide and has `kernelize` tag what
    transformers leaves untagged (`tag_on_kernelize`: the gated MLPs, on 4.57 the rotary
    embeddings, and the ``*ForCausalLM`` forward for the fused loss) in each model before
    planning it. Call it before loading: transformers' ``from_pretrained(...,
    use_kernels=True)``, ``model.use_kernels = True`` and the ``train()`` / ``eval()``
    switches then give every RMSNorm, activation, gated MLP and rotary call our kernels, and
    a training forward with labels the fused ``lm_head`` + cross-entropy (it returns
    ``logits=None``; ``tag_on_kernelize(losses=False)`` afterwards keeps the logits), on
    transformers 4.57 and 5.x alike. Our ``cuda`` keys carry a
    capability range, so the Hub kernels transformers 5.x re-registers for ``"cuda"`` at
    every ``use_kernels`` do not replace them. `untag` stops the tagging; the mapping stays
    registered, as with `register_kernel_mapping`.

    It also registers our flash attention with transformers' attention registries as
    ``attn_implementation="kernels_attention"`` (`ATTENTION_IMPLEMENTATION`;
    `kernels.library.attention`), for ``from_pretrained`` and ``model.set_attn_implementation``.

    Args:
        devices: as for `library_mapping`.

    Example:
        ```python
        from transformers import AutoModelForCausalLM
        from kernels.library import register_library_kernels

        register_library_kernels()
        model = AutoModelForCausalLM.from_pretrained(path, use_kernels=True)
        ```
    """
    register_kernel_mapping(library_mapping(devices))
    tag_on_kernelize()
    register_attention()


_warned_nothing_runs_here = False


def _warn_if_nothing_runs_here() -> None:
    """Say once per process why kernelize will swap nothing on this machine: the default
    mapping is for CUDA GPUs, there is none, and the CPU is left out without the interpreter."""
    global _warned_nothing_runs_here
    if _warned_nothing_runs_here:
        return
    import torch

    if torch.cuda.is_available():
        return
    _warned_nothing_runs_here = True
    logger.warning(
        "library_mapping(): this machine has no CUDA GPU and TRITON_INTERPRET is not set, so our "
        "kernels are registered for cuda only and kernelize keeps every layer's own forward "
        "here. Run on a GPU, or set TRITON_INTERPRET=1 (before triton is imported) to run them on "
        "the CPU through Triton's interpreter (slow: for checking numerics)."
    )


def _device_key(device_type: str) -> str | Device:
    return Device("cuda", CUDA_CAPABILITIES) if device_type == "cuda" else device_type


__all__ = [
    "ATTENTION_IMPLEMENTATION",
    "ATTENTION_REPO",
    "CAUSAL_LM_LAYER_NAMES",
    "CUDA_CAPABILITIES",
    "GATED_MLP_LAYER_NAME",
    "HUB_ORGANISATION",
    "KERNELS",
    "REPOSITORIES",
    "ROTARY_FUNCTION_NAME",
    "TESTED_DEVICE_TYPES",
    "LibraryKernel",
    "LibraryRepository",
    "library_mapping",
    "library_path",
    "library_source",
    "load_library_package",
    "register_attention",
    "register_library_kernels",
    "tag_causal_lm_losses",
    "tag_gated_mlps",
    "tag_on_kernelize",
    "tag_rotary_embeddings",
    "tag_transformers_layers",
    "untag",
]
