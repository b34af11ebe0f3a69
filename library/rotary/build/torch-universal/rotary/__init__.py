"""Triton rotary position embedding (rotate-half, transformers' layout) for q and k.

``apply_rotary_pos_emb`` is a function kernel: transformers tags its own function with the name
"rotary_pos_emb", and a kernel mapping finds this one as ``getattr(rotary, "apply_rotary_pos_emb")``.
"""

from .rotary import apply_rotary_pos_emb

__all__ = ["apply_rotary_pos_emb"]
