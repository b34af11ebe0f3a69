"""Triton normalisation kernels: RMSNorm (Llama and Gemma semantics), fused residual-add + RMSNorm,
and LayerNorm, each with a backward that also returns the weight (and bias) gradients.

Kernel layers for ``kernelize`` are in ``layers``.
"""

from . import layers
from .layer_norm import layer_norm
from .rms_norm import fused_add_rms_norm, gemma_rms_norm, rms_norm

__all__ = ["fused_add_rms_norm", "gemma_rms_norm", "layer_norm", "layers", "rms_norm"]
