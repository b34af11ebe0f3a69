"""Triton flash attention: forward and backward, variable-length (packed) batches, causal and
sliding-window masks, grouped-query attention, logit soft-capping, attention sinks and a decode
path over a (paged) KV cache, with flash-attn 2's Python API.

transformers 5.x uses these functions when a model is loaded with
``attn_implementation="<org>/attention"`` (this repository on the Hub): it calls
``flash_attn_varlen_func`` for padded and packed batches, ``flash_attn_func`` otherwise, and
``flash_attn_with_kvcache`` for paged decoding.
"""

from .interface import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"]
