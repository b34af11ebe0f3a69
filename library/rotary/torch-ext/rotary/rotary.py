"""Rotary position embedding for q and k, transformers' rotate-half convention.

``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` returns
``(q * c + rotate_half(q) * s, k * c + rotate_half(k) * s)`` with ``c = cos.unsqueeze(unsqueeze_dim)``
(likewise ``s``) and ``rotate_half(x) = cat(-x[..., d/2:], x[..., :d/2])``.

Read top to bottom: the Triton kernel, the launcher, then the autograd wiring
(``torch.autograd.Function`` for eager calls; ``torch.library`` custom ops with fake
implementations and registered autograd, for graphs that hold them as nodes; under
``torch.compile`` the public functions hand inductor the formula in PyTorch ops instead).

One program per (batch, position): it loads that position's cos and sin row once and rotates
every q and k head there, so cos and sin are read once, q and k once, and the outputs written
once. Any strides are accepted for the batch, head and sequence dimensions (transformers' q is a
transposed view of a (batch, seq, heads, head_dim) buffer); head_dim must be contiguous.
The backward is the same kernel with the transposed rotation.
"""

import functools
import os

import torch
import triton
import triton.language as tl

from ._compile_rule import OP, compile_side, sizes
from ._library import launch, next_power_of_2, op_name, use_autograd_function

# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------


@triton.jit
def _load_halves(X, base, h0, n_heads, s_h, cols, col_mask, HALF: tl.constexpr,
                 BLOCK_H: tl.constexpr):  # fmt: skip
    # Heads [h0, h0 + BLOCK_H) at one (batch, position), as two [heads, head_dim / 2] halves.
    heads = h0 + tl.arange(0, BLOCK_H)
    mask = (heads < n_heads)[:, None] & col_mask[None, :]
    ptr = X + base + heads[:, None] * s_h + cols[None, :]
    x1 = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr + HALF, mask=mask, other=0.0).to(tl.float32)
    return x1, x2, mask


@triton.jit
def _load_cos_sin(COS, SIN, c_base, s_base, cols, col_mask, HALF: tl.constexpr):
    # Both halves of cos and sin: transformers duplicates them, but a caller need not.
    c1 = tl.load(COS + c_base + cols, mask=col_mask, other=0.0).to(tl.float32)
    c2 = tl.load(COS + c_base + HALF + cols, mask=col_mask, other=0.0).to(tl.float32)
    s1 = tl.load(SIN + s_base + cols, mask=col_mask, other=0.0).to(tl.float32)
    s2 = tl.load(SIN + s_base + HALF + cols, mask=col_mask, other=0.0).to(tl.float32)
    return c1, c2, s1, s2


@triton.jit
def _rotate_store(XO, base, h0, s_h, x1, x2, mask, c1, c2, s1, s2, cols, HALF: tl.constexpr,
                  BLOCK_H: tl.constexpr, BACKWARD: tl.constexpr):  # fmt: skip
    if BACKWARD:
        # Transpose of the forward map: dx1 = g1 c1 + g2 s2, dx2 = g2 c2 - g1 s1.
        o1 = x1 * c1[None, :] + x2 * s2[None, :]
        o2 = x2 * c2[None, :] - x1 * s1[None, :]
    else:
        # out1 = x1 c1 - x2 s1, out2 = x2 c2 + x1 s2 (rotate_half(x) = [-x2, x1]).
        o1 = x1 * c1[None, :] - x2 * s1[None, :]
        o2 = x2 * c2[None, :] + x1 * s2[None, :]
    heads = h0 + tl.arange(0, BLOCK_H)
    ptr = XO + base + heads[:, None] * s_h + cols[None, :]
    tl.store(ptr, o1.to(XO.dtype.element_ty), mask=mask)
    tl.store(ptr + HALF, o2.to(XO.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    Q,
    K,
    COS,
    SIN,
    QO,
    KO,
    seq_len,
    n_q_heads,
    n_k_heads,
    sq_b,
    sq_h,
    sq_s,
    sk_b,
    sk_h,
    sk_s,
    sqo_b,
    sqo_h,
    sqo_s,
    sko_b,
    sko_h,
    sko_s,
    sc_b,
    sc_s,
    ss_b,
    ss_s,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    ONE_BLOCK: tl.constexpr,
    BACKWARD: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    b = pid // seq_len
    s = pid % seq_len
    cols = tl.arange(0, BLOCK_HALF)
    col_mask = cols < HALF
    q_base = b * sq_b + s * sq_s
    qo_base = b * sqo_b + s * sqo_s
    k_base = b * sk_b + s * sk_s
    ko_base = b * sko_b + s * sko_s
    c_base = b * sc_b + s * sc_s
    s_base = b * ss_b + s * ss_s
    if ONE_BLOCK:
        # Every head in one block (the usual case). All loads are issued before the first store:
        # the compiler cannot move a load past a store that may alias it, and with q stored
        # before k is loaded the two round trips to memory would not overlap.
        q1, q2, q_mask = _load_halves(Q, q_base, 0, n_q_heads, sq_h, cols, col_mask, HALF, BLOCK_HQ)
        k1, k2, k_mask = _load_halves(K, k_base, 0, n_k_heads, sk_h, cols, col_mask, HALF, BLOCK_HK)
        c1, c2, s1, s2 = _load_cos_sin(COS, SIN, c_base, s_base, cols, col_mask, HALF)
        _rotate_store(QO, qo_base, 0, sqo_h, q1, q2, q_mask, c1, c2, s1, s2, cols, HALF,
                      BLOCK_HQ, BACKWARD)  # fmt: skip
        _rotate_store(KO, ko_base, 0, sko_h, k1, k2, k_mask, c1, c2, s1, s2, cols, HALF,
                      BLOCK_HK, BACKWARD)  # fmt: skip
    else:
        c1, c2, s1, s2 = _load_cos_sin(COS, SIN, c_base, s_base, cols, col_mask, HALF)
        for h0 in range(0, n_q_heads, BLOCK_HQ):
            x1, x2, mask = _load_halves(Q, q_base, h0, n_q_heads, sq_h, cols, col_mask, HALF,
                                        BLOCK_HQ)  # fmt: skip
            _rotate_store(QO, qo_base, h0, sqo_h, x1, x2, mask, c1, c2, s1, s2, cols, HALF,
                          BLOCK_HQ, BACKWARD)  # fmt: skip
        for h0 in range(0, n_k_heads, BLOCK_HK):
            x1, x2, mask = _load_halves(K, k_base, h0, n_k_heads, sk_h, cols, col_mask, HALF,
                                        BLOCK_HK)  # fmt: skip
            _rotate_store(KO, ko_base, h0, sko_h, x1, x2, mask, c1, c2, s1, s2, cols, HALF,
                          BLOCK_HK, BACKWARD)  # fmt: skip


# --------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------


# Triton runs CPU tensors only through its interpreter. One kernelized rotary function can serve
# models on several devices (it stands for a module global), so CPU tensors take the PyTorch
# formula unless the interpreter is on.
_CPU_RUNS_KERNELS = os.environ.get("TRITON_INTERPRET") == "1"


def _head_axis(q, k, cos, sin, unsqueeze_dim) -> int | None:
    """The heads axis (1 or 2) when the kernel covers this call, else None (PyTorch fallback)."""
    if q.device.type == "cpu" and not _CPU_RUNS_KERNELS:
        return None
    if q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or sin.dim() != 3:
        return None
    if not -4 <= unsqueeze_dim <= 3:
        return None
    axis = unsqueeze_dim % 4
    if axis not in (1, 2):
        return None
    other = 3 - axis  # the sequence axis of q and k
    d = q.shape[-1]
    if d % 2 or k.shape[-1] != d or cos.shape[-1] != d or sin.shape[-1] != d:
        return None
    if q.shape[0] != k.shape[0] or q.shape[other] != k.shape[other]:
        return None
    for t in (cos, sin):
        if t.shape[0] not in (1, q.shape[0]) or t.shape[1] not in (1, q.shape[other]):
            return None
    if any(t.dtype not in (torch.float32, torch.float16, torch.bfloat16) for t in (q, k, cos, sin)):
        return None
    return axis


def _bhsd(x: torch.Tensor, axis: int) -> torch.Tensor:
    """A (batch, heads, seq, head_dim) view of x whose head_dim is contiguous."""
    v = x if axis == 1 else x.transpose(1, 2)
    return v if v.stride(-1) == 1 else v.contiguous()


def _bsd(t: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """cos/sin as ``(t, batch stride, seq stride)`` over (batch, seq, head_dim), head_dim
    contiguous, a broadcast (size 1) dimension with stride 0. The strides, not an expanded
    view: a view op costs more host time than the launch's other arithmetic, on every call."""
    t = t if t.stride(-1) == 1 else t.contiguous()
    size_b, size_s, _ = t.shape
    stride_b, stride_s, _ = t.stride()
    return t, stride_b if size_b != 1 else 0, stride_s if size_s != 1 else 0


@functools.lru_cache(maxsize=256)
def _launch_config(n_q_heads: int, n_k_heads: int, d: int):
    """(block_half, block_hq, block_hk, one_block, num_warps)."""
    block_half = next_power_of_2(d // 2)
    # Heads per block: a [heads, head_dim/2] tile of up to 2048 elements per half, so one
    # program covers all 32 heads of 128 at once (8 KB of bf16 per half-tile pair), 16 values a
    # thread with 8 warps. More heads than that loop over blocks.
    max_heads = max(1, 2048 // block_half)
    block_hq = min(next_power_of_2(n_q_heads), max_heads)
    block_hk = min(next_power_of_2(max(n_k_heads, 1)), max_heads)
    one_block = n_q_heads <= block_hq and n_k_heads <= block_hk
    num_warps = max(1, min(8, block_hq * block_half // 256))
    return block_half, block_hq, block_hk, one_block, num_warps


def _launch(q, k, cos, sin, qo, ko, axis, backward):
    # The kernel's arguments, each named as its parameter (``_library``'s "by name"): q, k, qo
    # and ko as (batch, heads, seq, head_dim) views.
    device = q.device
    q, k = _bhsd(q, axis), _bhsd(k, axis)
    if axis != 1:
        qo, ko = qo.transpose(1, 2), ko.transpose(1, 2)
    batch, n_q_heads, seq_len, d = q.shape
    n_k_heads = k.shape[1]
    if batch * seq_len == 0 or d == 0:
        return
    cos, sc_b, sc_s = _bsd(cos)
    sin, ss_b, ss_s = _bsd(sin)
    sq_b, sq_h, sq_s, _ = q.stride()
    sk_b, sk_h, sk_s, _ = k.stride()
    sqo_b, sqo_h, sqo_s, _ = qo.stride()
    sko_b, sko_h, sko_s, _ = ko.stride()
    HALF = d // 2
    block_half, block_hq, block_hk, one_block, num_warps = _launch_config(n_q_heads, n_k_heads, d)
    args = (
        q, k, cos, sin, qo, ko, seq_len, n_q_heads, n_k_heads,
        sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sqo_b, sqo_h, sqo_s, sko_b, sko_h, sko_s,
        sc_b, sc_s, ss_b, ss_s,
        HALF, block_half, block_hq, block_hk, one_block, backward,
    )  # fmt: skip
    launch(_rotary_kernel, (batch * seq_len,), args, num_warps, device)


def _out_dtype(x, cos, sin) -> torch.dtype:
    return torch.promote_types(torch.promote_types(x.dtype, cos.dtype), sin.dtype)


def _new_like(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # Same layout as x where x is dense (transformers' transposed q stays (b, s, h, d) in memory,
    # so the kernel reads and writes the same pattern); contiguous otherwise.
    return torch.empty_like(x, dtype=dtype)


def rotary_forward(q, k, cos, sin, unsqueeze_dim):
    axis = _head_axis(q, k, cos, sin, unsqueeze_dim)
    if axis is None:
        raise ValueError(
            "apply_rotary_pos_emb: the kernel takes 4-D q and k, 3-D cos and sin and "
            f"unsqueeze_dim 1 or 2; got q {tuple(q.shape)}, k {tuple(k.shape)}, cos "
            f"{tuple(cos.shape)}, unsqueeze_dim {unsqueeze_dim}"
        )
    return _forward(q, k, cos, sin, axis)


def _forward(q, k, cos, sin, axis):
    qo = _new_like(q, _out_dtype(q, cos, sin))
    ko = _new_like(k, _out_dtype(k, cos, sin))
    _launch(q, k, cos, sin, qo, ko, axis, False)
    return qo, ko


def rotary_backward(gq, gk, cos, sin, unsqueeze_dim, q_dtype, k_dtype):
    axis = unsqueeze_dim % 4
    dq = _new_like(gq, q_dtype)
    dk = _new_like(gk, k_dtype)
    _launch(gq, gk, cos, sin, dq, dk, axis, True)
    return dq, dk


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def reference(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' formula in PyTorch: the fallback for layouts the kernel does not take."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _torch_rotary(q, k, cos, sin, unsqueeze_dim):
    """The kernel's formula in PyTorch ops, for inductor to fuse: fp32, rounded once to the
    kernel's output dtypes."""
    qo, ko = reference(q.float(), k.float(), cos.float(), sin.float(), unsqueeze_dim)
    return qo.to(_out_dtype(q, cos, sin)), ko.to(_out_dtype(k, cos, sin))


def _cos_sin_grads(gq, gk, q, k, cos, sin, unsqueeze_dim, needs_cos, needs_sin):
    # Only when cos or sin require grad (they do not in transformers, where they come from a
    # buffer): plain PyTorch, dcos = sum over heads of gq*q + gk*k, dsin likewise with
    # rotate_half(q), rotate_half(k), summed down to cos's (broadcast) shape.
    shape = cos.unsqueeze(unsqueeze_dim).shape
    gq, gk = gq.float(), gk.float()
    q, k = q.float(), k.float()
    dcos = dsin = None
    if needs_cos:
        dcos = (gq * q).sum_to_size(shape) + (gk * k).sum_to_size(shape)
        dcos = dcos.squeeze(unsqueeze_dim).to(cos.dtype)
    if needs_sin:
        dsin = (gq * _rotate_half(q)).sum_to_size(shape) + (gk * _rotate_half(k)).sum_to_size(shape)
        dsin = dsin.squeeze(unsqueeze_dim).to(sin.dtype)
    return dcos, dsin


# --------------------------------------------------------------------------------------------
# Autograd: eager path
# --------------------------------------------------------------------------------------------


class _RotaryFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin, unsqueeze_dim, axis):
        qo, ko = _forward(q, k, cos, sin, axis)
        # q and k are kept only when cos or sin need a gradient.
        keep = cos.requires_grad or sin.requires_grad
        ctx.save_for_backward(cos, sin, *((q, k) if keep else ()))
        ctx.unsqueeze_dim = unsqueeze_dim
        ctx.dtypes = (q.dtype, k.dtype)
        return qo, ko

    @staticmethod
    def backward(ctx, gq, gk):
        cos, sin, *qk = ctx.saved_tensors
        dq, dk = rotary_backward(gq, gk, cos, sin, ctx.unsqueeze_dim, *ctx.dtypes)
        dcos = dsin = None
        if ctx.needs_input_grad[2] or ctx.needs_input_grad[3]:
            dcos, dsin = _cos_sin_grads(gq, gk, *qk, cos, sin, ctx.unsqueeze_dim,
                                        ctx.needs_input_grad[2], ctx.needs_input_grad[3])  # fmt: skip
        return dq, dk, dcos, dsin, None, None


# --------------------------------------------------------------------------------------------
# Autograd: torch.library ops (graph nodes, opcheck'd)
# --------------------------------------------------------------------------------------------


@torch.library.custom_op(op_name("rotary"), mutates_args=())
def rotary_op(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    return rotary_forward(q, k, cos, sin, unsqueeze_dim)


@rotary_op.register_fake
def _(q, k, cos, sin, unsqueeze_dim):
    return _new_like(q, _out_dtype(q, cos, sin)), _new_like(k, _out_dtype(k, cos, sin))


@torch.library.custom_op(op_name("rotary_backward"), mutates_args=())
def rotary_backward_op(
    gq: torch.Tensor,
    gk: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    unsqueeze_dim: int,
    q_dtype: torch.dtype,
    k_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    return rotary_backward(gq, gk, cos, sin, unsqueeze_dim, q_dtype, k_dtype)


@rotary_backward_op.register_fake
def _(gq, gk, cos, sin, unsqueeze_dim, q_dtype, k_dtype):
    return _new_like(gq, q_dtype), _new_like(gk, k_dtype)


def _setup_context(ctx, inputs, output):
    q, k, cos, sin, unsqueeze_dim = inputs
    keep = cos.requires_grad or sin.requires_grad
    ctx.save_for_backward(cos, sin, *((q, k) if keep else ()))
    ctx.unsqueeze_dim = unsqueeze_dim
    ctx.dtypes = (q.dtype, k.dtype)


def _backward(ctx, gq, gk):
    cos, sin, *qk = ctx.saved_tensors
    dq, dk = rotary_backward_op(gq, gk, cos, sin, ctx.unsqueeze_dim, *ctx.dtypes)
    dcos = dsin = None
    if ctx.needs_input_grad[2] or ctx.needs_input_grad[3]:
        dcos, dsin = _cos_sin_grads(gq, gk, *qk, cos, sin, ctx.unsqueeze_dim,
                                    ctx.needs_input_grad[2], ctx.needs_input_grad[3])  # fmt: skip
    return dq, dk, dcos, dsin, None


rotary_op.register_autograd(_backward, setup_context=_setup_context)


# --------------------------------------------------------------------------------------------
# Public function
# --------------------------------------------------------------------------------------------


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' ``apply_rotary_pos_emb`` (5.x signature): rotate-half RoPE of ``q`` and ``k``.

    ``q`` (batch, q_heads, seq, head_dim) and ``k`` (batch, k_heads, seq, head_dim) with
    ``unsqueeze_dim=1``, or (batch, seq, heads, head_dim) with ``unsqueeze_dim=2``; ``cos`` and
    ``sin`` (batch or 1, seq, head_dim). transformers 4.57's function also had an unused
    ``position_ids`` before ``unsqueeze_dim``; ``kernels.library.tag_rotary_embeddings`` gives
    4.57 models this signature (see the repository's README).
    Gradients flow to q and k through the kernel, and to cos and sin (in PyTorch) if they
    require grad. Other layouts fall back to the PyTorch formula.
    """
    axis = _head_axis(q, k, cos, sin, unsqueeze_dim)
    if axis is None:
        return reference(q, k, cos, sin, unsqueeze_dim)
    # Under torch.compile the rule (_compile_rule.py) picks the op or the formula. The formula
    # lets inductor fuse the rotation with the projections' views and the attention's layout
    # changes, forward and backward, which an opaque op prevents (in a compiled 1.1B Llama's
    # training step the op cost more than compile's own code). The size class is q's: its heads times
    # head_dim, and the other dimensions' product.
    if torch.compiler.is_compiling():
        training = use_autograd_function(q, k, cos, sin)
        hidden, rows = sizes(q)
        heads = q.shape[axis]
        if compile_side("rotary", hidden * heads, rows // heads, training) == OP:
            return rotary_op(q, k, cos, sin, unsqueeze_dim)
        return _torch_rotary(q, k, cos, sin, unsqueeze_dim)
    if use_autograd_function(q, k, cos, sin):
        return _RotaryFunction.apply(q, k, cos, sin, unsqueeze_dim, axis)
    return _forward(q, k, cos, sin, axis)


# Function kernels declare what they support as attributes (layers do it as class members).
apply_rotary_pos_emb.has_backward = True
apply_rotary_pos_emb.can_torch_compile = True
# Under tensor parallelism ``kernels`` runs it on each rank's shard of q, k, cos and sin when
# head_dim is whole (q and k sharded by heads, batch or sequence).
apply_rotary_pos_emb.shard_rule = "rotary"
