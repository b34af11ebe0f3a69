"""Overrides of the norms' aten operators: ``native_layer_norm`` and ``_fused_rms_norm``, and their
backward operators.

Each override checks that our kernel takes the call (`kernels.overrides.guards`) and otherwise
calls PyTorch's own kernel (``original``, captured before the override was registered) with the
same arguments. Our kernels run below autograd: PyTorch's derivative formulas record the
backward, and the backward operators are overridden here too.

What PyTorch's CUDA kernels return, and ours in their place (torch 2.11 and 2.13, checked on an
H100 and in the CPU build):

- ``native_layer_norm(input, normalized_shape, weight, bias, eps) -> (out, mean, rstd)``: mean and
  rstd are fp32 for fp32, fp16 and bf16 inputs, shaped as the input's leading dimensions followed
  by a 1 for each normalised one ((B, T, 1) for (B, T, C)). PyTorch's CPU kernel keeps them in the
  input's dtype; the CPU override (Triton's interpreter, for tests) does the same, so that either
  backward can read them.
- ``native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias,
  output_mask) -> (grad_input, grad_weight, grad_bias)``, None where ``output_mask`` is False.
- ``_fused_rms_norm(input, normalized_shape, weight, eps) -> (out, rstd)``: what ``F.rms_norm`` and
  ``nn.RMSNorm`` call on CUDA; rstd fp32, shaped as for layer norm. ``eps=None`` means fp32's
  machine epsilon for every input dtype.
- ``_fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight, output_mask)
  -> (grad_input, grad_weight)``.

Our RMSNorm kernel rounds the normalised input to the input's dtype before it multiplies by the
weight (transformers' ``LlamaRMSNorm``, and PyTorch's own composite ``rms_norm``), where
PyTorch's fused CUDA kernel multiplies in fp32: the same in fp32, within a rounding of the
dtype in fp16 and bf16. Its weight gradient sums ``dy * xhat`` with xhat rounded the same way.
"""

from __future__ import annotations

import math

import torch

from .calls import OURS, record
from .guards import (
    as_fp32_rows,
    companion_reason,
    input_reason,
    normalized_shape_reason,
    parameter_reason,
    stats_reason,
)

# ``_fused_rms_norm(..., eps=None)``: PyTorch's CUDA kernel (and its CPU decomposition) add
# fp32's machine epsilon for fp32, fp16 and bf16 inputs alike, so ours does too.
_DEFAULT_RMS_EPS = torch.finfo(torch.float32).eps


def _stats_shape(x: torch.Tensor, normalized_dims: int) -> tuple[int, ...]:
    return (*x.shape[: x.dim() - normalized_dims], *(1,) * normalized_dims)


def _stats_dtype(x: torch.Tensor) -> torch.dtype:
    # PyTorch's CUDA layer norm keeps its statistics in fp32, its CPU one in the input's dtype.
    return torch.float32 if x.is_cuda else x.dtype


def _rows(x: torch.Tensor, normalized_shape) -> int:
    return x.numel() // max(1, math.prod(normalized_shape))


# ---- layer norm -----------------------------------------------------------------------------


def _layer_norm_reason(x, normalized_shape, weight, bias) -> str | None:
    return (
        input_reason(x)
        or normalized_shape_reason(x, normalized_shape)
        or parameter_reason("weight", weight, x, normalized_shape)
        or parameter_reason("bias", bias, x, normalized_shape)
    )


def native_layer_norm(kernels, original, keyset, input, normalized_shape, weight, bias, eps):
    """``aten::native_layer_norm`` on our LayerNorm kernel (see the module's docstring)."""
    reason = _layer_norm_reason(input, normalized_shape, weight, bias)
    if reason is not None:
        record("native_layer_norm", reason)
        return original.call_boxed(keyset, input, normalized_shape, weight, bias, eps)
    record("native_layer_norm", OURS)
    y, mean, rstd = kernels.layer_norm_forward(input, normalized_shape, weight, bias, eps)
    shape = _stats_shape(input, len(normalized_shape))
    dtype = _stats_dtype(input)
    if dtype != torch.float32:
        mean, rstd = mean.to(dtype), rstd.to(dtype)
    return y, mean.view(shape), rstd.view(shape)


def _layer_norm_backward_reason(
    grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask
) -> str | None:
    reason = _layer_norm_reason(x, normalized_shape, weight, bias) or companion_reason(
        "grad", grad_out, x
    )
    if reason is not None:
        return reason
    if grad_out.shape != x.shape:
        return "grad shape"
    if (output_mask[1] and weight is None) or (output_mask[2] and bias is None):
        # A gradient asked for a parameter that is not there: PyTorch's kernel raises.
        return "output_mask"
    rows = _rows(x, normalized_shape)
    return stats_reason("mean", mean, x, rows) or stats_reason("rstd", rstd, x, rows)


def native_layer_norm_backward(
    kernels, original, keyset, grad_out, input, normalized_shape, mean, rstd, weight, bias,
    output_mask,
):  # fmt: skip
    """``aten::native_layer_norm_backward`` on our LayerNorm backward kernel."""
    args = (grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask)
    reason = _layer_norm_backward_reason(*args)
    if reason is not None:
        record("native_layer_norm_backward", reason)
        return original.call_boxed(keyset, *args)
    record("native_layer_norm_backward", OURS)
    dx, dw, db = kernels.layer_norm_backward(
        grad_out, input, normalized_shape, weight, as_fp32_rows(mean), as_fp32_rows(rstd),
        bool(output_mask[1]), bool(output_mask[2]), input.dtype if bias is None else bias.dtype,
    )  # fmt: skip
    # The kernel writes the input gradient in the same pass as the parameter gradients' partial
    # sums, so it is computed whether or not it was asked for; what was not asked for is None,
    # as PyTorch's kernel returns it.
    return (
        dx if output_mask[0] else None,
        dw if output_mask[1] else None,
        db if output_mask[2] else None,
    )


# ---- RMSNorm --------------------------------------------------------------------------------


def _rms_norm_reason(x, normalized_shape, weight) -> str | None:
    reason = input_reason(x) or normalized_shape_reason(x, normalized_shape)
    if reason is not None:
        return reason
    if len(normalized_shape) != 1:
        # Our kernel normalises the last dimension, with a weight of that length.
        return "normalized over several dimensions"
    if weight is None:
        # Our kernel always multiplies by a weight (nn.RMSNorm(elementwise_affine=False)).
        return "no weight"
    return parameter_reason("weight", weight, x, normalized_shape)


def fused_rms_norm(kernels, original, keyset, input, normalized_shape, weight, eps=None):
    """``aten::_fused_rms_norm`` (``F.rms_norm``, ``nn.RMSNorm`` on CUDA) on our RMSNorm kernel."""
    reason = _rms_norm_reason(input, normalized_shape, weight)
    if reason is not None:
        record("_fused_rms_norm", reason)
        return original.call_boxed(keyset, input, normalized_shape, weight, eps)
    record("_fused_rms_norm", OURS)
    eps = _DEFAULT_RMS_EPS if eps is None else float(eps)
    y, _, rstd = kernels.rms_norm_forward(input, None, weight, eps, kernels.llama)
    return y, rstd.view(_stats_shape(input, 1))


def _rms_norm_backward_reason(grad_out, x, normalized_shape, rstd, weight) -> str | None:
    reason = _rms_norm_reason(x, normalized_shape, weight) or companion_reason("grad", grad_out, x)
    if reason is not None:
        return reason
    if grad_out.shape != x.shape:
        return "grad shape"
    return stats_reason("rstd", rstd, x, _rows(x, normalized_shape))


def fused_rms_norm_backward(
    kernels, original, keyset, grad_out, input, normalized_shape, rstd, weight, output_mask
):
    """``aten::_fused_rms_norm_backward`` on our RMSNorm backward kernel."""
    args = (grad_out, input, normalized_shape, rstd, weight, output_mask)
    reason = _rms_norm_backward_reason(grad_out, input, normalized_shape, rstd, weight)
    if reason is not None:
        record("_fused_rms_norm_backward", reason)
        return original.call_boxed(keyset, *args)
    record("_fused_rms_norm_backward", OURS)
    dx, dw = kernels.rms_norm_backward(
        grad_out, None, input, weight, as_fp32_rows(rstd), kernels.llama, bool(output_mask[1])
    )
    return dx if output_mask[0] else None, dw if output_mask[1] else None
