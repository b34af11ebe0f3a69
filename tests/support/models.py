"""The tiny Llama configuration the tests build their models and layers from.

One builder for both transformers lines (4.57 and 5.x take the same fields here); a test
passes only what it changes, so a reader sees at the call what its model differs in.
transformers is imported when the builder is called, not when this module is: importing it
imports huggingface_hub, which must first read the Hub test session's settings
(tests/support/hub.py).
"""

from __future__ import annotations

#: The defaults: one layer, hidden 32, four query heads on two key/value heads (head_dim 8,
#: even, as transformers 5.x's rotary check wants), a 64-token vocabulary.
TINY_LLAMA = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=64,
)


def llama_config(**overrides):
    """A `transformers.LlamaConfig` of `TINY_LLAMA` with `overrides` (any LlamaConfig field,
    e.g. ``attn_implementation="sdpa"``, ``mlp_bias=True``) applied on top."""
    from transformers import LlamaConfig

    return LlamaConfig(**{**TINY_LLAMA, **overrides})
