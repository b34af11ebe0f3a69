"""Our kernels for the overrides: the launchers of the library's norm and activation repositories.

The repositories are imported the way `kernels.library` imports them
(``get_local_kernel(library_path() / "norm", "norm")``), once per process, when an override is
first enabled: importing them imports Triton, which must come after ``TRITON_INTERPRET`` is set
where it is used, and an import error then surfaces at ``enable``, not inside a model's forward.

An override runs below autograd: the dispatcher has already recorded the backward (PyTorch's
derivative formula, which calls the backward operator, which is overridden separately). So it
calls the launchers themselves, the functions the library's own eager paths run under their
``autograd.Function``s: not the public functions (which would record a second backward) nor
the custom ops (a second dispatcher round trip, which costs more than the kernel at small sizes).
``tests/overrides`` pins the signatures used here.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from ..library import library_path
from ..repos.local import get_local_kernel


@dataclass(frozen=True)
class NormKernels:
    """The norm repository's launchers.

    Attributes:
        layer_norm_forward: ``(x, normalized_shape, weight, bias, eps) -> (y, mean, rstd)``;
            mean and rstd fp32, shaped as x's leading dimensions.
        layer_norm_backward: ``(dy, x, normalized_shape, weight, mean, rstd, compute_dw,
            compute_db, db_dtype) -> (dx, dw, db)``.
        rms_norm_forward: ``(x, residual, weight, eps, mode) -> (y, sum, rstd)``.
        rms_norm_backward: ``(dy, dsum, x, weight, rstd, mode, compute_dw) -> (dx, dw)``.
        llama: the mode of ``weight * normalize(x)`` (the other is Gemma's ``1 + weight``).
    """

    layer_norm_forward: Callable
    layer_norm_backward: Callable
    rms_norm_forward: Callable
    rms_norm_backward: Callable
    llama: int


@dataclass(frozen=True)
class ActivationKernels:
    """The activation repository's element-wise launchers.

    Attributes:
        forward: ``(x, act) -> y`` for a contiguous x.
        backward: ``(dy, x, act) -> dx`` for contiguous dy and x of one shape.
        silu, gelu, gelu_tanh: the ``act`` of ``x * sigmoid(x)``, ``F.gelu`` and
            ``F.gelu(approximate="tanh")``.
    """

    forward: Callable
    backward: Callable
    silu: int
    gelu: int
    gelu_tanh: int


def _repository(name: str) -> ModuleType:
    return get_local_kernel(library_path() / name, name)


def _submodule(package: ModuleType, name: str) -> ModuleType:
    # The package's __init__ re-exports functions under its modules' names (``norm.layer_norm``
    # is the function), so the modules are reached through the import system.
    return importlib.import_module(f"{package.__name__}.{name}")


@functools.cache
def norm_kernels() -> NormKernels:
    """The norm repository's launchers, imported on first use."""
    package = _repository("norm")
    layer_norm = _submodule(package, "layer_norm")
    rms_norm = _submodule(package, "rms_norm")
    return NormKernels(
        layer_norm_forward=layer_norm._forward,
        layer_norm_backward=layer_norm._backward,
        rms_norm_forward=rms_norm._forward,
        rms_norm_backward=rms_norm._backward,
        llama=rms_norm.LLAMA,
    )


@functools.cache
def activation_kernels() -> ActivationKernels:
    """The activation repository's element-wise launchers, imported on first use."""
    elementwise = _submodule(_repository("activation"), "elementwise")
    return ActivationKernels(
        forward=elementwise.activation_forward,
        backward=elementwise.activation_backward,
        silu=elementwise.SILU,
        gelu=elementwise.GELU,
        gelu_tanh=elementwise.GELU_TANH,
    )
