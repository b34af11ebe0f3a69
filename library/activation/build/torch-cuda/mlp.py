"""The gated MLP of Llama-family models, ``down(silu(gate(x)) * up(x))``, as one autograd
function that keeps one tensor fewer for backward.

Called module by module, autograd keeps three ``[tokens, intermediate]`` tensors of each MLP
for backward: ``gate`` and ``up`` (for the activation's gradient) and the product
``silu(gate) * up`` (for ``down_proj``'s weight gradient). ``swiglu_mlp`` keeps ``gate`` and
``up`` only: the backward kernel that computes ``d_gate`` and ``d_up`` already holds
``silu(gate) * up`` in registers and writes it out (one more write, no more reads) just before
the weight gradient needs it. For a 1.1B Llama (intermediate 8192, 16 layers) that is 256 KiB
less per token in a training step, 1 GiB at 4096 tokens. The matmuls are PyTorch's, so
everything but the saved tensors is what the three ``torch.nn.Linear`` calls would do.

Under ``torch.compile`` the same autograd function is traced by Dynamo, with the pair step on
the side the compile rule gives ``gated_mlp``: the op (``gated_pair_op`` forward, and
``gated_pair_backward_output_op``, the backward kernel that writes the product too) or the
formula in PyTorch ops, whose backward recomputes the product beside ``d_gate`` and ``d_up``
(one fused kernel for inductor). Either way AOTAutograd saves ``x``, ``gate`` and ``up``, as
eagerly: its partitioner, left to itself, saves the product as well, because ``down_proj``'s
weight gradient reads it.
"""

import torch
import torch.nn.functional as F

from ._compile_rule import FORMULA, OP, compile_side, sizes
from ._functions import SILU, torch_activation
from ._library import use_autograd_function
from .gated import (
    _torch_gated_pair,
    gated_pair_backward,
    gated_pair_backward_op,
    gated_pair_backward_output_op,
    gated_pair_forward,
    gated_pair_op,
)

#: The pair step of an eager call: the kernels' launchers (the other sides are the rule's).
_KERNELS = "kernels"


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])


def _mlp(x, gate_w, gate_b, up_w, up_b, down_w, down_b, product):
    """(gate, up, output) with ``output = down(product(gate, up))``."""
    gate = F.linear(x, gate_w, gate_b)
    up = F.linear(x, up_w, up_b)
    return gate, up, F.linear(product(gate, up, SILU), down_w, down_b)


def _torch_silu_pair_backward(
    d_act: torch.Tensor, gate: torch.Tensor, up: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(d_gate, d_up, silu(gate) * up)`` in PyTorch ops, as the backward kernel computes
    them: fp32 inside, each rounded once to the inputs' dtype; inductor fuses them into one
    kernel."""
    g, u, dy = gate.float(), up.float(), d_act.float()
    s = torch.sigmoid(g)
    silu = torch_activation(g, SILU)
    d_gate = dy * u * (s * (1.0 + g * (1.0 - s)))
    # ``u * silu``, not ``silu * u``: the forward's product spelled backwards (the same bits,
    # a product commutes), so that AOTAutograd's common-subexpression pass does not merge the
    # two. Merged, the product would be one node that a matmul of the backward reads, which
    # inductor's partitioner then saves rather than recomputes: the tensor this file avoids.
    product = u * silu
    return d_gate.to(gate.dtype), (dy * silu).to(up.dtype), product.to(gate.dtype)


def _pair_backward(
    side: str, d_act: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, with_product: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(d_gate, d_up, silu(gate) * up or None)`` on ``side``: the kernels (eager), the op, or
    the formula."""
    if side == _KERNELS:
        if with_product:
            return gated_pair_backward(d_act, gate, up, SILU, recompute_output=True)
        return (*gated_pair_backward(d_act, gate, up, SILU), None)
    if side == OP:
        if with_product:
            return gated_pair_backward_output_op(d_act, gate, up, SILU)
        return (*gated_pair_backward_op(d_act, gate, up, SILU), None)
    d_gate, d_up, product = _torch_silu_pair_backward(d_act, gate, up)
    return d_gate, d_up, product if with_product else None


_PAIR_FORWARD = {_KERNELS: gated_pair_forward, OP: gated_pair_op, FORMULA: _torch_gated_pair}


class _SwiGLUMLPFunction(torch.autograd.Function):
    """The MLP saving ``x``, ``gate`` and ``up``; ``side`` says how the pair step runs (the
    kernels eagerly; under ``torch.compile``, which Dynamo traces this through, the rule's side)."""

    @staticmethod
    def forward(ctx, x, gate_w, gate_b, up_w, up_b, down_w, down_b, side):
        x2 = _rows(x)
        weights = (gate_w, gate_b, up_w, up_b, down_w, down_b)
        gate, up, out = _mlp(x2, *weights, _PAIR_FORWARD[side])
        ctx.save_for_backward(x2, gate, up, gate_w, up_w, down_w)
        ctx.x_shape = x.shape
        ctx.side = side
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, d_out):
        x2, gate, up, gate_w, up_w, down_w = ctx.saved_tensors
        need = ctx.needs_input_grad
        d_out2 = _rows(d_out)
        d_act = d_out2 @ down_w
        d_gate, d_up, act = _pair_backward(ctx.side, d_act, gate, up, need[5])
        del d_act  # before the weight gradient's matmul: one [tokens, intermediate] fewer alive
        d_down_w = None if act is None else d_out2.t() @ act
        del act
        d_down_b = d_out2.sum(0) if need[6] else None
        d_x = None
        if need[0]:
            # Two matmuls and an in-place add rather than addmm: the same time eagerly, and
            # under torch.compile the add is a node inductor can fuse (benchmarks/results/
            # h100/NOTES.md, e2e).
            d_x = (d_gate @ gate_w).add_(d_up @ up_w).view(ctx.x_shape)
        d_gate_w = d_gate.t() @ x2 if need[1] else None
        d_gate_b = d_gate.sum(0) if need[2] else None
        d_up_w = d_up.t() @ x2 if need[3] else None
        d_up_b = d_up.sum(0) if need[4] else None
        return d_x, d_gate_w, d_gate_b, d_up_w, d_up_b, d_down_w, d_down_b, None


def swiglu_mlp(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    gate_bias: torch.Tensor | None,
    up_weight: torch.Tensor,
    up_bias: torch.Tensor | None,
    down_weight: torch.Tensor,
    down_bias: torch.Tensor | None,
) -> torch.Tensor:
    """``F.linear(silu(F.linear(x, gate_weight, gate_bias)) * F.linear(x, up_weight, up_bias),
    down_weight, down_bias)``, with ``silu(gate) * up`` computed in fp32 and rounded once.

    All tensors share one dtype (float32, float16 or bfloat16) and device. With gradients
    enabled it saves ``x``, ``gate`` and ``up`` but not their product, which the backward
    recomputes (see the module docstring), eagerly and under ``torch.compile`` alike. Under
    ``torch.compile`` the pair step is the op or its formula in PyTorch ops, as the compile rule
    says (``gated_mlp``), and the matmuls are PyTorch's.
    """
    tensors = (x, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias)
    training = use_autograd_function(*tensors)
    if torch.compiler.is_compiling():
        hidden = gate_weight.shape[0]
        tokens = sizes(x)[1]
        side = compile_side("gated_mlp", hidden, tokens, training)
        if training:
            return _SwiGLUMLPFunction.apply(*tensors, side)
        return _mlp(*tensors, _PAIR_FORWARD[side])[2]
    if training:
        return _SwiGLUMLPFunction.apply(*tensors, _KERNELS)
    return _mlp(*tensors, gated_pair_forward)[2]
