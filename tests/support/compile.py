"""Helpers for the backend's tests: small modules written the ways models write them, a
float64 reference, tolerances, and the Triton ReLU of OpenDeepKernel's README."""

import copy

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import nn


def LlamaRMSNorm(hidden_size: int, eps: float = 1e-6) -> nn.Module:
    """transformers' RMSNorm as its models write it out (4.57: hidden_states.to(torch.float32),
    pow(2).mean(-1, keepdim=True), * torch.rsqrt(variance + eps), weight * h.to(input_dtype)).

    Imported when called, not when this module is: the tests that use no transformers model
    do not pay for importing transformers."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm as _LlamaRMSNorm

    return _LlamaRMSNorm(hidden_size, eps=eps)


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_GPU = DEVICE == "cuda"

# Relative L2 error against a float64 reference, per dtype of the run: fp32 kernels land near
# 1e-7, fp16 and bf16 within a few roundings (2^-11, 2^-8).
REL_L2 = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.2e-2}


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def assert_close(out, ref, dtype=torch.float32, what=""):
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    assert torch.isfinite(out).all(), f"{what}: non-finite values"
    err = rel_l2(out, ref)
    assert err <= REL_L2[dtype], f"{what}: relative L2 error {err:.3g} > {REL_L2[dtype]:.3g}"


def randn(*shape, dtype=torch.float32, requires_grad=False, seed=0):
    generator = torch.Generator().manual_seed(seed)
    t = torch.randn(*shape, generator=generator).to(device=DEVICE, dtype=dtype)
    return t.requires_grad_(requires_grad)


def run(model, *inputs, grad=True):
    """(output, gradients of the inputs and parameters) of ``model`` on ``inputs``: the loss
    is a fixed random projection of the output, so every output element matters."""
    inputs = [x.detach().clone().requires_grad_(grad and x.is_floating_point()) for x in inputs]
    out = model(*inputs)
    if not grad:
        return out.detach(), []
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device)
    (out.double() * weights.double()).sum().backward()
    tensors = [*inputs, *(p for p in model.parameters() if p.requires_grad)]
    grads = [t.grad.detach().clone() if t.grad is not None else None for t in tensors]
    model.zero_grad(set_to_none=True)
    return out.detach(), grads


def check_against_float64(model, compiled, *inputs, dtype=torch.float32, grad=True, what=""):
    """The compiled model's output and gradients against the same model run in float64 (the
    model is moved to the inputs' device first: tests build modules on the CPU)."""
    model.to(inputs[0].device)
    out, grads = run(compiled, *inputs, grad=grad)
    reference = copy.deepcopy(model).double()
    ref_out, ref_grads = run(reference, *(x.double() for x in inputs), grad=grad)
    assert_close(out, ref_out, dtype, f"{what} output")
    for i, (g, r) in enumerate(zip(grads, ref_grads, strict=True)):
        assert (g is None) == (r is None), f"{what}: gradient {i} missing on one side"
        if g is not None:
            assert_close(g, r, dtype, f"{what} gradient {i}")


# ---- OpenDeepKernel's ReLU, as its README registers it ----------------------------------------


@triton.jit
def relu_kernel(x_ptr, y_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(y_ptr + offsets, tl.maximum(x, 0.0), mask=mask)


def triton_relu(x):
    y = torch.empty_like(x)
    n = x.numel()
    relu_kernel[(triton.cdiv(n, 64),)](x, y, n, BLOCK_SIZE=64)
    return y


# ---- modules written the ways models write them ----------------------------------------------


class Attention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).unbind(2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, s, h))


class GatedMLP(nn.Module):
    def __init__(self, hidden, intermediate):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def on_device(module: nn.Module) -> nn.Module:
    return module.to(DEVICE)


class LlamaBlock(nn.Module):
    """A hand-written Llama decoder block that nobody tagged: RMSNorm (``nn.RMSNorm`` or the
    transformers formula), causal SDPA attention, and the gated MLP ``F.silu(gate) * up``."""

    def __init__(self, hidden=32, heads=2, intermediate=64, norm="module"):
        super().__init__()

        def make_norm():
            return nn.RMSNorm(hidden, eps=1e-6) if norm == "module" else LlamaRMSNorm(hidden)

        self.input_norm = make_norm()
        self.attn = Attention(hidden, heads)
        self.post_norm = make_norm()
        self.mlp = GatedMLP(hidden, intermediate)
        # Norm weights away from 1, so that a kernel ignoring them would be caught.
        with torch.no_grad():
            for n in (self.input_norm, self.post_norm):
                n.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(3))

    def forward(self, x):
        x = x + self.attn(self.input_norm(x))
        return x + self.mlp(self.post_norm(x))
