"""Triton rotary position embedding (rotate-half, transformers' layout) for q and k.

``apply_rotary_pos_emb`` is a function kernel: transformers tags its own function with the name
"rotary_pos_emb", and a kernel mapping finds this one as ``getattr(rotary, "apply_rotary_pos_emb")``.

``layers.RotaryPosEmb`` is the same kernel as a kernel layer, the form Hugging Face's ``kernels``
client maps transformers 5.x's tagged function to.

``write_kv_cache`` writes a decode step's rotated keys (and its values) into a static KV cache in
one launch, as transformers' ``StaticLayer.update`` does in several.
"""

from . import layers
from .kv_cache import takes_kv_write, write_kv_cache
from .rotary import apply_rotary_pos_emb

__all__ = ["apply_rotary_pos_emb", "layers", "takes_kv_write", "write_kv_cache"]
