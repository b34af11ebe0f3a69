"""Getting the kernel layer class a repository provides."""

from __future__ import annotations

import inspect

from ..errors import KernelLoadError
from ..repos.base import LayerRepositoryProtocol


def load_kernel_layer(repository: LayerRepositoryProtocol) -> type:
    """Load `repository` and return its kernel layer class (not yet validated).

    Raises:
        KernelLoadError: the repository could not be loaded, or it has no such layer.
            Whatever a third-party repository raises while loading is wrapped in it.
    """
    try:
        loaded = repository.load()
    except KernelLoadError:
        raise
    except Exception as exc:
        raise KernelLoadError(f"{type(exc).__name__}: {exc}") from exc

    # Function repositories hand over the layer class itself.
    if inspect.isclass(loaded):
        return loaded
    layers = getattr(loaded, "layers", None)
    if layers is None:
        raise KernelLoadError(
            f"{repository} has no `layers` module, so it provides no kernel layers (package "
            f"{getattr(loaded, '__name__', loaded)})."
        )
    layer = getattr(layers, repository.layer_name, None)
    if layer is None:
        available = sorted(
            name
            for name, value in vars(layers).items()
            if inspect.isclass(value) and value.__module__ == layers.__name__
        )
        raise KernelLoadError(
            f"{repository} has no layer '{repository.layer_name}'. Layers it provides: "
            f"{', '.join(available) or 'none'}."
        )
    return layer
