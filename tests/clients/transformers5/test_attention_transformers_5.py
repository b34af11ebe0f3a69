"""tests/library/test_attention_transformers.py on transformers 5.x: our attention registered
with transformers, a tiny Llama against SDPA (plain, padded and packed batches, generate() with
a dynamic and a static cache, dropout in training). The module's tests run here as they are."""

from tests.library.test_attention_transformers import *  # noqa: F403
