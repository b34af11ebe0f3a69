"""Triton cross-entropy kernels: the ``lm_head`` projection fused with cross-entropy, so that a
causal language model's loss and gradients are computed without holding all logits, and the
same kernels on logits that exist.

Kernel layers for ``kernelize`` are in ``layers``.
"""

from .fused_linear_cross_entropy import chunk_rows, cross_entropy, fused_linear_cross_entropy

__all__ = ["chunk_rows", "cross_entropy", "fused_linear_cross_entropy"]
