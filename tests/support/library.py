"""Helpers for the kernel library tests: loading, tolerances, and reference modules.

The repositories are loaded the way users load them, through ``kernels.get_local_kernel``.
"""

import os

import torch
import torch.nn.functional as F
from torch import nn

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_GPU = DEVICE == "cuda"

LIBRARY = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "library"))

DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# Tolerances against a float64 reference, per dtype: relative L2 error of the whole tensor,
# and an element-wise bound scaled by the reference's largest magnitude. fp32 kernels land
# near 1e-7; fp16 and bf16 within a few roundings of their unit roundoff (2^-11, 2^-8).
REL_L2 = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.2e-2}
ELEMENT = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def load(repo: str):
    import kernels

    return kernels.get_local_kernel(os.path.join(LIBRARY, repo), repo)


def assert_close(
    out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str = "", floor: float = 0.0
) -> None:
    """``out`` (computed with ``dtype`` inputs) against a float64 reference ``ref``.

    ``floor``: a magnitude under which errors are judged absolutely rather than relatively.
    An activation like 0.5 x (1 + erf(x / sqrt 2)) is computed from terms of size |x| whatever
    its value, so its fp32 error is a few ulp of |x| even where the output is 1e-7: the tests
    pass the input's largest magnitude there.
    """
    assert out is not None, f"{what}: no gradient"
    assert tuple(out.shape) == tuple(ref.shape), (
        f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    )
    out = out.detach().double().cpu()
    ref = ref.detach().double().cpu()
    assert torch.isfinite(out).all(), f"{what}: non-finite values"
    if ref.numel() == 0:
        return
    # Magnitudes under the dtype's smallest normal number are not resolved by the dtype at all.
    tiny = max(torch.finfo(dtype).tiny, floor)
    scale = max(ref.abs().max().item(), tiny)
    rel = ((out - ref).norm() / max(ref.norm().item(), tiny)).item()
    assert rel <= REL_L2[dtype], f"{what}: relative L2 error {rel:.3g} > {REL_L2[dtype]:.3g}"
    err = (out - ref).abs().max().item()
    bound = ELEMENT[dtype] * scale
    assert err <= bound, f"{what}: max abs error {err:.3g} > {bound:.3g} (max |ref| {scale:.3g})"


def randn(*shape, dtype=torch.float32, scale=1.0, shift=0.0, device=DEVICE):
    return (torch.randn(*shape, device=device) * scale + shift).to(dtype)


def grads(outputs, inputs, seed_grads):
    """d(outputs)/d(inputs) against ``seed_grads``; None for inputs that got no gradient."""
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    seed_grads = seed_grads if isinstance(seed_grads, (tuple, list)) else (seed_grads,)
    return torch.autograd.grad(outputs, inputs, seed_grads, allow_unused=True)


# ---- reference modules for layers that transformers does not define -------------------------


class SiluAndMul(nn.Module):
    """vLLM's SiluAndMul: ``[..., 2d] -> [..., d]``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]


class GeluAndMul(nn.Module):
    """vLLM's GeluAndMul with approximate="none"."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.gelu(x[..., :d]) * x[..., d:]


class GeluTanhAndMul(nn.Module):
    """vLLM's GeluAndMul with approximate="tanh"."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.gelu(x[..., :d], approximate="tanh") * x[..., d:]


class FusedAddRMSNorm(nn.Module):
    """The reference module of the "FusedAddRMSNorm" layer (documented in library/norm/README.md):
    a residual add followed by LlamaRMSNorm, returning the normalised sum and the sum."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states, residual):
        hidden_states = hidden_states + residual
        residual = hidden_states
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype), residual


def transformers_activation(name: str, forward):
    """transformers' activation module class ``name``; where the installed transformers lacks it
    (the GPU machine has a later major version), a stand-in with the same ``forward(self, input)``."""
    from transformers import activations

    cls = getattr(activations, name, None)
    if cls is not None:
        return cls

    def fallback_forward(self, input: torch.Tensor) -> torch.Tensor:
        return forward(input)

    return type(name, (nn.Module,), {"forward": fallback_forward})
