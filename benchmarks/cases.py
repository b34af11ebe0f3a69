"""The ops ``benchmarks.ops`` times and the code each replaces: reference modules (transformers'
and PyTorch's, as written there), the shapes, and one case per op and shape (inputs, parameters,
each contender's call and the bytes a pass must move). ``load_library`` loads the library's
kernels (`kernels.library.load_library_package`), ``load_liger`` the Liger-Kernel peer where it is
installed. Each op here is named by the kernel it times in the library's registry
(`kernels.library.KERNELS`, ``benchmarks``); tests/library/test_registry.py checks the two agree.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

NORM_SHAPES = [(4096, 4096), (16384, 4096), (8192, 8192), (32768, 8192)]
# Hidden sizes of real models that are not the square shapes above, at 64M+ elements, and the
# widest row the kernels take (65536): "RMSNorm-widths" and "LayerNorm-widths".
WIDTH_SHAPES = [(65536, 1024), (32768, 2048), (16384, 5120), (1024, 65536)]
ROTARY_SHAPES = [(1, 4096), (4, 2048), (8, 4096)]  # (batch, seq); 32 q heads, 8 kv heads of 128
Q_HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
DTYPE = torch.bfloat16
# The norms and their variants: each a layer of library/norm (the variants' names say what
# differs from the layer's plain benchmark: fp32 data, other widths, no bias).
NORM_OPS = (
    "RMSNorm",
    "RMSNorm-fp32",
    "RMSNorm-widths",
    "GemmaRMSNorm",
    "FusedAddRMSNorm",
    "LayerNorm",
    "LayerNorm-fp32",
    "LayerNorm-widths",
    "LayerNorm-nobias",
)
OPS = (*NORM_OPS, "SiluAndMul", "SwiGLU", "GeluTanh", "rotary")

# ---- loading --------------------------------------------------------------------------------


def load_library():
    """The library packages the cases call, by repository name: those of the kernels that the
    library's registry gives ``benchmarks.ops`` cases (`LibraryKernel.benchmarks`)."""
    from kernels.library import KERNELS, load_library_package

    return {k.repo: load_library_package(k.repo) for k in KERNELS if k.benchmarks}


def load_liger():
    try:
        import liger_kernel
        from liger_kernel.ops import (
            LigerFusedAddRMSNormFunction,
            LigerFusedGateUpSiLUMulFunction,
            LigerLayerNormFunction,
            LigerRMSNormFunction,
            LigerRopeFunction,
            LigerSiLUMulFunction,
        )
    except Exception as exc:  # noqa: BLE001  (report and go on without the peer)
        print(f"Liger-Kernel unavailable: {type(exc).__name__}: {exc}")
        return None
    version = getattr(liger_kernel, "__version__", None)
    if version is None:
        from importlib.metadata import version as _v

        version = _v("liger-kernel")
    return types.SimpleNamespace(
        version=version,
        rms_norm=LigerRMSNormFunction,
        fused_add_rms_norm=LigerFusedAddRMSNormFunction,
        layer_norm=LigerLayerNormFunction,
        silu_mul=LigerFusedGateUpSiLUMulFunction,
        swiglu=LigerSiLUMulFunction,
        rope=LigerRopeFunction,
    )


# ---- reference modules (the code the kernels replace) ---------------------------------------


class LlamaRMSNorm(torch.nn.Module):
    """transformers' LlamaRMSNorm, verbatim semantics."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class GemmaRMSNorm(torch.nn.Module):
    """transformers' GemmaRMSNorm, verbatim semantics (``1 + weight``, all in fp32)."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.zeros(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float())
        output = output * (1.0 + self.weight.float())
        return output.type_as(x)


class FusedAddRMSNorm(LlamaRMSNorm):
    """Residual add, then LlamaRMSNorm; returns (normalised, sum), as a decoder layer uses them
    (the reference module of library/norm's README)."""

    def forward(self, hidden_states, residual):
        hidden_states = hidden_states + residual
        return super().forward(hidden_states), hidden_states


class SiluAndMul(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]


class GELUTanh(torch.nn.Module):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.gelu(input, approximate="tanh")


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


# ---- cases ----------------------------------------------------------------------------------


def bound(layer_cls, module):
    return types.MethodType(layer_cls.forward, module)


def norm_case(kind, lib, liger, rows, cols):
    """(inputs, params, {impl: fn(*inputs)}, fwd bytes, bwd bytes) for a norm of NORM_OPS."""
    dtype = torch.float32 if kind.endswith("-fp32") else DTYPE
    e = dtype.itemsize
    x = torch.randn(rows, cols, device="cuda", dtype=dtype)
    inputs = [x]
    layers = lib["norm"].layers
    if kind in ("RMSNorm", "RMSNorm-fp32", "RMSNorm-widths"):
        module, layer = LlamaRMSNorm(cols), layers.RMSNorm
        peer = liger and (
            lambda t: liger.rms_norm.apply(t, module.weight, 1e-6, 0.0, "llama", True)
        )
    elif kind == "GemmaRMSNorm":
        module, layer = GemmaRMSNorm(cols), layers.GemmaRMSNorm
        peer = liger and (
            lambda t: liger.rms_norm.apply(t, module.weight, 1e-6, 1.0, "gemma", True)
        )
    elif kind == "FusedAddRMSNorm":
        module, layer = FusedAddRMSNorm(cols), layers.FusedAddRMSNorm
        inputs.append(torch.randn_like(x))
        peer = liger and (
            lambda t, r: liger.fused_add_rms_norm.apply(
                t, r, module.weight, 1e-6, 0.0, "llama", False
            )
        )
    else:  # LayerNorm, -fp32, -widths, -nobias (Liger's takes a bias only)
        has_bias = kind != "LayerNorm-nobias"
        module, layer = torch.nn.LayerNorm(cols, bias=has_bias), layers.LayerNorm
        peer = (
            liger
            and has_bias
            and (lambda t: liger.layer_norm.apply(t, module.weight, module.bias, 1e-5))
        )
    module = module.to("cuda", dtype)
    params = [p for p in (module.weight, getattr(module, "bias", None)) if p is not None]
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn_like(p) * 0.1)
    fns = {
        "eager": module,
        "compile": torch.compile(module, dynamic=False),
        "ours": bound(layer, module),
    }
    if peer:
        fns["liger"] = peer
    n = rows * cols * e
    p_bytes = len(params) * cols * e
    if kind == "FusedAddRMSNorm":
        # Forward reads x and the residual, writes y and the sum. Backward reads dy, the sum's
        # gradient and the saved sum, writes one gradient (the same for x and the residual).
        return inputs, params, fns, 4 * n + p_bytes, 4 * n + 2 * p_bytes
    return inputs, params, fns, 2 * n + p_bytes, 3 * n + 2 * p_bytes


def silu_mul_case(lib, liger, rows, cols):
    e = 2
    x = torch.randn(rows, 2 * cols, device="cuda", dtype=DTYPE)
    module = SiluAndMul()
    fns = {
        "eager": module,
        "compile": torch.compile(module, dynamic=False),
        "ours": bound(lib["activation"].layers.SiluAndMul, module),
    }
    if liger:
        fns["liger"] = lambda t: liger.silu_mul.apply(t, False)
    n = rows * cols * e
    return [x], [], fns, 3 * n, 5 * n


def silu_times(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``act_fn(gate_proj(x)) * up_proj(x)`` of transformers' LlamaMLP, with SiLU."""
    return F.silu(gate) * up


def swiglu_case(lib, liger, rows, cols):
    e = 2
    gate = torch.randn(rows, cols, device="cuda", dtype=DTYPE)
    up = torch.randn(rows, cols, device="cuda", dtype=DTYPE)
    fns = {
        "eager": silu_times,
        "compile": torch.compile(silu_times, dynamic=False),
        "ours": lib["activation"].silu_mul,
    }
    if liger:
        # Liger's backward writes d_gate and d_up into the tensors it saved, here gate and up
        # themselves: their values change while it is timed, the bytes it moves do not.
        fns["liger"] = lambda g, u: liger.swiglu.apply(g, u)
    n = rows * cols * e
    return [gate, up], [], fns, 3 * n, 5 * n


def gelu_tanh_case(lib, liger, rows, cols):
    e = 2
    x = torch.randn(rows, cols, device="cuda", dtype=DTYPE)
    module = GELUTanh()
    fns = {
        "eager": module,
        "compile": torch.compile(module, dynamic=False),
        "ours": bound(lib["activation"].layers.GeluTanh, module),
    }
    n = rows * cols * e
    return [x], [], fns, 2 * n, 3 * n


def rotary_tables(batch, seq):
    """cos and sin (batch, seq, head_dim) as transformers' LlamaRotaryEmbedding makes them."""
    inv = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2, device="cuda").float() / HEAD_DIM))
    freqs = torch.arange(seq, device="cuda").float()[None, :, None] * inv
    emb = torch.cat((freqs, freqs), -1).expand(batch, seq, HEAD_DIM)
    return emb.cos().to(DTYPE).contiguous(), emb.sin().to(DTYPE).contiguous()


def rotary_case(lib, liger, batch, seq):
    e = 2
    # transformers' layout: the projections' (b, s, h, d) outputs viewed as (b, h, s, d).
    q = torch.randn(batch, seq, Q_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE).transpose(1, 2)
    k = torch.randn(batch, seq, KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE).transpose(1, 2)
    cos, sin = rotary_tables(batch, seq)
    ours = lib["rotary"].apply_rotary_pos_emb
    fns = {
        "eager": lambda q, k: apply_rotary_pos_emb(q, k, cos, sin),
        "compile": torch.compile(lambda q, k: apply_rotary_pos_emb(q, k, cos, sin), dynamic=False),
        "ours": lambda q, k: ours(q, k, cos, sin),
    }
    if liger:
        fns["liger"] = lambda q, k: liger.rope.apply(q, k, cos, sin, None, 1)
    qk = (q.numel() + k.numel()) * e
    cs = 2 * cos.numel() * e
    return [q, k], [], fns, 2 * qk + cs, 2 * qk + cs


def make_case(op, lib, liger, shape):
    """(inputs, params, {impl: fn(*inputs)}, fwd bytes, bwd bytes) of ``op`` at ``shape``."""
    if op in NORM_OPS:
        return norm_case(op, lib, liger, *shape)
    if op == "SiluAndMul":
        return silu_mul_case(lib, liger, *shape)
    if op == "SwiGLU":
        return swiglu_case(lib, liger, *shape)
    if op == "GeluTanh":
        return gelu_tanh_case(lib, liger, *shape)
    return rotary_case(lib, liger, *shape)
