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
"""

import torch
import torch.nn.functional as F

from ._compile_rule import OP, compile_side, sizes
from ._functions import SILU
from ._library import use_autograd_function
from .gated import _torch_gated_pair, gated_pair_backward, gated_pair_forward, gated_pair_op


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])


def _mlp(x, gate_w, gate_b, up_w, up_b, down_w, down_b, product):
    """(gate, up, output) with ``output = down(product(gate, up))``."""
    gate = F.linear(x, gate_w, gate_b)
    up = F.linear(x, up_w, up_b)
    return gate, up, F.linear(product(gate, up, SILU), down_w, down_b)


class _SwiGLUMLPFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gate_w, gate_b, up_w, up_b, down_w, down_b):
        x2 = _rows(x)
        weights = (gate_w, gate_b, up_w, up_b, down_w, down_b)
        gate, up, out = _mlp(x2, *weights, gated_pair_forward)
        ctx.save_for_backward(x2, gate, up, gate_w, up_w, down_w)
        ctx.x_shape = x.shape
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, d_out):
        x2, gate, up, gate_w, up_w, down_w = ctx.saved_tensors
        need = ctx.needs_input_grad
        d_out2 = _rows(d_out)
        d_act = d_out2 @ down_w
        if need[5]:
            d_gate, d_up, act = gated_pair_backward(d_act, gate, up, SILU, recompute_output=True)
        else:
            (d_gate, d_up), act = gated_pair_backward(d_act, gate, up, SILU), None
        del d_act  # before the weight gradient's matmul: one [tokens, intermediate] fewer alive
        d_down_w = None if act is None else d_out2.t() @ act
        del act
        d_down_b = d_out2.sum(0) if need[6] else None
        d_x = None
        if need[0]:
            # One accumulating matmul rather than two and an add.
            d_x = torch.addmm(d_gate @ gate_w, d_up, up_w).view(ctx.x_shape)
        d_gate_w = d_gate.t() @ x2 if need[1] else None
        d_gate_b = d_gate.sum(0) if need[2] else None
        d_up_w = d_up.t() @ x2 if need[3] else None
        d_up_b = d_up.sum(0) if need[4] else None
        return d_x, d_gate_w, d_gate_b, d_up_w, d_up_b, d_down_w, d_down_b


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
    enabled it saves ``gate`` and ``up`` but not their product, which the backward recomputes
    (see the module docstring). Under ``torch.compile`` the product is the op or its formula in
    PyTorch ops, as the compile rule says (``gated_mlp``), and the matmuls are PyTorch's.
    """
    tensors = (x, gate_weight, gate_bias, up_weight, up_bias, down_weight, down_bias)
    if torch.compiler.is_compiling():
        hidden = gate_weight.shape[0]
        tokens = sizes(x)[1]
        if compile_side("gated_mlp", hidden, tokens, use_autograd_function(*tensors)) == OP:
            return _mlp(*tensors, gated_pair_op)[2]
        return _mlp(*tensors, _torch_gated_pair)[2]
    if use_autograd_function(*tensors):
        return _SwiGLUMLPFunction.apply(*tensors)
    return _mlp(*tensors, gated_pair_forward)[2]
