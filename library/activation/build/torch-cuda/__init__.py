"""Triton activation kernels: SiLU and the GELU family, element-wise and gated (vLLM style
``[..., 2d] -> [..., d]``, and ``act(gate) * up`` on two tensors), and the whole SiLU-gated MLP
of Llama-family models (``swiglu_mlp``), and that MLP at decode sizes (``gated_mlp_decode``).

Functions take and return tensors of float32, float16 or bfloat16, compute in fp32, and have
backward passes; kernel layers for ``kernelize`` are in ``layers``.

Below autograd (operator overrides), ``activation_forward`` and ``activation_backward`` launch
the element-wise kernels for an activation constant (``SILU``, ``GELU``, ``GELU_TANH``,
``FAST_GELU``, ``QUICK_GELU``) without recording a backward. The decode kernels' configurations
are public for tuning: ``gemv_config`` (the rule), ``candidate_configs`` (what a sweep times),
``GemvConfig``, and the kernels themselves, ``gemv`` and ``gated_gemv``.
"""

from . import layers
from ._functions import FAST_GELU, GELU, GELU_TANH, QUICK_GELU, SILU
from .decode_mlp import (
    GemvConfig,
    candidate_configs,
    gated_gemv,
    gated_mlp_decode,
    gemv,
    gemv_config,
    grouped_linear_decode,
)
from .elementwise import (
    activation_backward,
    activation_forward,
    fast_gelu,
    gelu,
    gelu_tanh,
    new_gelu,
    quick_gelu,
    silu,
)
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
    "FAST_GELU",
    "GELU",
    "GELU_TANH",
    "QUICK_GELU",
    "SILU",
    "GemvConfig",
    "activation_backward",
    "activation_forward",
    "candidate_configs",
    "fast_gelu",
    "gated_gemv",
    "gated_mlp_decode",
    "gelu",
    "gelu_and_mul",
    "gelu_mul",
    "gelu_tanh",
    "gelu_tanh_and_mul",
    "gelu_tanh_mul",
    "gemv",
    "gemv_config",
    "grouped_linear_decode",
    "layers",
    "new_gelu",
    "quick_gelu",
    "silu",
    "silu_and_mul",
    "silu_mul",
    "swiglu_mlp",
]
