"""Triton activation kernels: SiLU and the GELU family, element-wise and gated (vLLM style
``[..., 2d] -> [..., d]``, and ``act(gate) * up`` on two tensors), and the whole SiLU-gated MLP
of Llama-family models (``swiglu_mlp``), and that MLP at decode sizes (``gated_mlp_decode``).

Functions take and return tensors of float32, float16 or bfloat16, compute in fp32, and have
backward passes; kernel layers for ``kernelize`` are in ``layers``.
"""

from . import layers
from .decode_mlp import gated_mlp_decode, grouped_linear_decode
from .elementwise import fast_gelu, gelu, gelu_tanh, new_gelu, quick_gelu, silu
from .gated import (
    gelu_and_mul,
    gelu_mul,
    gelu_tanh_and_mul,
    gelu_tanh_mul,
    silu_and_mul,
    silu_mul,
)
from .mlp import swiglu_mlp

__all__ = [
    "fast_gelu",
    "gelu",
    "gelu_and_mul",
    "gelu_mul",
    "gelu_tanh",
    "gelu_tanh_and_mul",
    "gelu_tanh_mul",
    "gated_mlp_decode",
    "grouped_linear_decode",
    "layers",
    "new_gelu",
    "quick_gelu",
    "silu",
    "silu_and_mul",
    "silu_mul",
    "swiglu_mlp",
]
