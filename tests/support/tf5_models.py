"""Tiny transformers 5.x models for the tests here (hidden 32, one layer, a few tokens): on the
CPU our Triton kernels run through Triton's interpreter (tests/conftest.py sets it), which is slow.
"""

from __future__ import annotations

import torch
import transformers

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
VOCAB = 64

#: family -> (config class, model class, extra config)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    # Gemma-style: GELU-tanh gated MLP, (1 + weight) norm (untagged in 5.24), scaled embeddings.
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {}),
}

TINY = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=32,
)


def make_model(family: str):
    """A tiny random model of `family` on DEVICE, its norm weights perturbed (a kernel that
    ignored them would show), in training mode as transformers builds it."""
    config_name, model_name, extra = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(**TINY, **extra, attn_implementation="sdpa")
    model = getattr(transformers, model_name)(config).to(DEVICE)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def tokens(batch: int = 1, seq: int = 5) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randint(0, VOCAB, (batch, seq), device=DEVICE)


def restore_function_modules() -> None:
    """transformers 5.x's ``apply_rotary_pos_emb`` is one module per modelling module for the
    whole process: give it back its own forward, so the next test starts untouched."""
    import sys

    from torch import nn

    from kernels.layer.swap import use_original_forward

    for name, module in list(sys.modules.items()):
        if name.startswith("transformers.models.") and ".modeling_" in name:
            for value in list(vars(module).values()):
                if isinstance(value, nn.Module) and getattr(type(value), "kernel_layer_name", None):
                    use_original_forward(value)
