"""Kernel layers for ``kernelize``.

``RotaryPosEmb`` serves transformers 5.x's ``apply_rotary_pos_emb``, which transformers tags
``use_kernel_forward_from_hub("rotary_pos_emb")``: Hugging Face's ``kernels`` client turns the
tagged function into a module and swaps its forward for a layer of this signature (``kernels``
here maps the function kernel ``apply_rotary_pos_emb`` instead; both run the same kernel).
"""

import torch

from .rotary import apply_rotary_pos_emb


class RotaryPosEmb(torch.nn.Module):
    """``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)`` as a kernel layer: returns the
    rotated ``(q, k)``."""

    has_backward = True
    can_torch_compile = True

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        unsqueeze_dim: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)
