"""Which kernels a kernelized model runs, and from which repositories: `get_kernelized_layers`.

`kernelize` notes the repository on each module it gives a kernel (``_kernel_repo`` in the
module's ``__dict__``, Hugging Face's attribute, so that it is copied and pickled with the
module) and removes it where a module gets its own forward back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .func import INSTANCE_ATTRIBUTE
from .swap import kernel_layer_of

if TYPE_CHECKING:
    from torch import nn

    from ..repos.base import LayerRepositoryProtocol

#: The instance attribute holding the repository of a module's kernel (Hugging Face's name).
REPOSITORY_ATTRIBUTE = "_kernel_repo"


def remember_repository(module: nn.Module, repository: LayerRepositoryProtocol) -> None:
    """Note that `module` runs a kernel from `repository`."""
    module.__dict__[REPOSITORY_ATTRIBUTE] = repository


def forget_repository(module: nn.Module) -> None:
    """Note that `module` runs its own forward."""
    module.__dict__.pop(REPOSITORY_ATTRIBUTE, None)


def repository_of(module: nn.Module) -> LayerRepositoryProtocol | None:
    """The repository of the kernel `module` runs, or None when it runs its own forward."""
    repository = module.__dict__.get(REPOSITORY_ATTRIBUTE)
    if repository is None or kernel_layer_of(module) is None:
        return None
    return repository


@dataclass(frozen=True)
class KernelizedLayer:
    """A kernelized layer and the repository its kernel was loaded from.

    Attributes:
        module: the kernelized layer (a module of the model).
        repo: the repository its kernel came from (`LayerRepository`, ...).
    """

    module: nn.Module
    repo: LayerRepositoryProtocol


@dataclass(frozen=True)
class KernelizedFunc:
    """A kernelized function and the repository its kernel was loaded from.

    Attributes:
        module: the layer's private copy of the function module (see `use_kernelized_func`)
            that runs the kernel.
        repo: the repository its kernel came from.
    """

    module: nn.Module
    repo: LayerRepositoryProtocol


@dataclass(frozen=True)
class KernelizedLayers:
    """The kernels a kernelized model runs, as `get_kernelized_layers` returns them.

    Attributes:
        layers: module name (as ``model.named_modules()`` gives it; ``""`` for the model
            itself) -> `KernelizedLayer`.
        funcs: (name of the module the function is attached to, layer name of the function)
            -> `KernelizedFunc`, for functions attached with `use_kernelized_func`.
    """

    layers: dict[str, KernelizedLayer] = field(default_factory=dict)
    funcs: dict[tuple[str, str], KernelizedFunc] = field(default_factory=dict)


def get_kernelized_layers(model: nn.Module) -> KernelizedLayers:
    """The layers and functions of `model` that run a kernel, with the repository of each.

    A module that `kernelize` left with (or gave back) its own forward is not listed: a
    layer without a kernel for the device, one skipped by its condition, one that fell back.

    Example:
        ```python
        from kernels import Mode, get_kernelized_layers, kernelize

        model = kernelize(model, mode=Mode.INFERENCE)
        for name, layer in get_kernelized_layers(model).layers.items():
            print(name, layer.repo)
        ```
    """
    found = KernelizedLayers()
    for name, module in model.named_modules():
        repository = repository_of(module)
        if repository is not None:
            found.layers[name] = KernelizedLayer(module, repository)
        # Read, not made: a module whose copies were never made has no kernelized function.
        copies = module.__dict__.get(INSTANCE_ATTRIBUTE)
        for func_name, copy in (copies or {}).items():
            repository = repository_of(copy)
            if repository is not None:
                found.funcs[(name, func_name)] = KernelizedFunc(copy, repository)
    return found
