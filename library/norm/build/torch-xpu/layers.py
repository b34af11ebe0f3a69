"""Kernel layers: each replaces the ``forward`` of a tagged module and keeps its signature.

A kernel layer has no state and no ``__init__``: ``kernelize`` binds ``forward`` to the original
module instance, so ``self`` is e.g. a transformers ``LlamaRMSNorm`` and the layer reads that
module's own weight, bias and epsilon attributes.
"""

import torch
from torch import Tensor

from .layer_norm import layer_norm
from .rms_norm import fused_add_rms_norm, gemma_rms_norm, rms_norm


class RMSNorm(torch.nn.Module):
    """transformers ``LlamaRMSNorm`` (and the many copies of it): reads ``self.weight`` and
    ``self.variance_epsilon``; ``weight * normalize(x.float()).to(x.dtype)``."""

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states):
        return rms_norm(hidden_states, self.weight, self.variance_epsilon)


class GemmaRMSNorm(torch.nn.Module):
    """transformers ``GemmaRMSNorm``: reads ``self.weight`` and ``self.eps``;
    ``(normalize(x.float()) * (1 + weight.float())).type_as(x)``."""

    has_backward = True
    can_torch_compile = True

    def forward(self, x):
        return gemma_rms_norm(x, self.weight, self.eps)


class FusedAddRMSNorm(torch.nn.Module):
    """Residual add fused into RMSNorm (Llama semantics): reads ``self.weight`` and
    ``self.variance_epsilon``; returns ``(rmsnorm(hidden_states + residual), hidden_states + residual)``.
    The reference module is in this repository's README."""

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states, residual):
        return fused_add_rms_norm(hidden_states, residual, self.weight, self.variance_epsilon)


class LayerNorm(torch.nn.Module):
    """``torch.nn.LayerNorm``: reads ``self.normalized_shape``, ``self.weight`` and ``self.bias``
    (either may be None: ``elementwise_affine=False`` or ``bias=False``) and ``self.eps``."""

    has_backward = True
    can_torch_compile = True

    def forward(self, input: Tensor) -> Tensor:
        return layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


# How ``kernels`` runs each layer when tensor parallelism hands it DTensors (its shard rule, an
# attribute of the forward function so the classes keep only the members kernel layers may
# have): on each rank's shard when the normalised dimensions are whole there.
for _layer in (RMSNorm, GemmaRMSNorm, FusedAddRMSNorm, LayerNorm):
    _layer.forward.shard_rule = "norm"
del _layer
