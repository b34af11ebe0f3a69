"""Triton normalisation kernels: RMSNorm (Llama and Gemma semantics), fused residual-add + RMSNorm,
and LayerNorm, each with a backward that also returns the weight (and bias) gradients.

Kernel layers for ``kernelize`` are in ``layers``. The launchers ``layer_norm_forward``,
``layer_norm_backward``, ``rms_norm_forward`` and ``rms_norm_backward`` (with the RMSNorm modes
``LLAMA`` and ``GEMMA``) run the kernels without recording a backward, for callers below
autograd such as operator overrides.
"""

from . import layers
from .layer_norm import layer_norm, layer_norm_backward, layer_norm_forward
from .rms_norm import (
    GEMMA,
    LLAMA,
    fused_add_rms_norm,
    gemma_rms_norm,
    rms_norm,
    rms_norm_backward,
    rms_norm_forward,
)

__all__ = [
    "GEMMA",
    "LLAMA",
    "fused_add_rms_norm",
    "gemma_rms_norm",
    "layer_norm",
    "layer_norm_backward",
    "layer_norm_forward",
    "layers",
    "rms_norm",
    "rms_norm_backward",
    "rms_norm_forward",
]
