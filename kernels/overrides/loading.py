"""Our kernels for the overrides: the launchers of the library's norm and activation repositories.

The repositories are imported by `kernels.library.load_library_package` (as kernelize imports
them), once per process, when an override is first enabled: importing them imports Triton,
which must come after ``TRITON_INTERPRET`` is set where it is used, and an import error then
surfaces at ``enable``, not inside a model's forward.

An override runs below autograd: the dispatcher has already recorded the backward (PyTorch's
derivative formula, which calls the backward operator, which is overridden separately). So it
calls the launchers themselves, the functions the library's own eager paths run under their
``autograd.Function``s: not the autograd-recording functions (which would record a second
backward) nor the custom ops (a second dispatcher round trip, which costs more than the kernel at
small sizes). Each repository exports its launchers for this (``norm.layer_norm_forward``,
``activation.activation_forward``, ...); ``tests/overrides`` pins the signatures used here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from ..library import load_library_package


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


@functools.cache
def norm_kernels() -> NormKernels:
    """The norm repository's launchers, imported on first use."""
    norm = load_library_package("norm")
    return NormKernels(
        layer_norm_forward=norm.layer_norm_forward,
        layer_norm_backward=norm.layer_norm_backward,
        rms_norm_forward=norm.rms_norm_forward,
        rms_norm_backward=norm.rms_norm_backward,
        llama=norm.LLAMA,
    )


@functools.cache
def activation_kernels() -> ActivationKernels:
    """The activation repository's element-wise launchers, imported on first use."""
    activation = load_library_package("activation")
    return ActivationKernels(
        forward=activation.activation_forward,
        backward=activation.activation_backward,
        silu=activation.SILU,
        gelu=activation.GELU,
        gelu_tanh=activation.GELU_TANH,
    )
