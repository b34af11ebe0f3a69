"""Triton cross-entropy kernels: the ``lm_head`` projection fused with cross-entropy, so that a
causal language model's loss and gradients are computed without holding all logits, and the
same kernels on logits that exist.

Functions take float32, float16 or bfloat16 inputs, reduce in fp32 and return an fp32 loss;
kernel layers for ``kernelize`` are in ``layers``.
"""

from . import layers
from .causal_lm import (
    causal_lm_cross_entropy,
    causal_lm_loss,
    for_causal_lm_loss,
    lm_head_and_loss,
    shift_labels,
)
from .fused_linear_cross_entropy import (
    chunk_plan,
    chunk_rows,
    cross_entropy,
    fused_linear_cross_entropy,
    resident_rows,
)

__all__ = [
    "causal_lm_cross_entropy",
    "causal_lm_loss",
    "chunk_plan",
    "chunk_rows",
    "cross_entropy",
    "for_causal_lm_loss",
    "fused_linear_cross_entropy",
    "layers",
    "lm_head_and_loss",
    "resident_rows",
    "shift_labels",
]
