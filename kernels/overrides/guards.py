"""The checks shared by the overrides: which inputs our kernels take.

Each check returns None when our kernel takes the input, else the reason PyTorch's kernel runs
instead (a short phrase, the ``path`` counted by `kernels.overrides.calls`). An input PyTorch
would reject (a weight of another dtype or shape, a tensor on another device) is handed to
PyTorch's kernel too, so that the user sees PyTorch's own error.
"""

from __future__ import annotations

import torch

#: The dtypes our kernels load and store (they compute in fp32).
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def input_reason(x: torch.Tensor) -> str | None:
    """Why our kernels do not take ``x`` as the main input (dtype, or no elements), or None."""
    if x.dtype not in SUPPORTED_DTYPES:
        return f"dtype {dtype_name(x.dtype)}"
    if x.numel() == 0:
        # Nothing to compute; PyTorch's kernel gives an empty result its own shapes and strides.
        return "empty input"
    return None


def companion_reason(what: str, t: torch.Tensor | None, x: torch.Tensor) -> str | None:
    """Why a second tensor of a call (weight, bias, gradient) does not go with ``x``: another
    dtype or device. None when it does, or when it is absent."""
    if t is None:
        return None
    if t.dtype != x.dtype:
        # Our kernels store in the input's dtype; PyTorch's CUDA norms reject mixed dtypes and
        # its element-wise backward promotes: either way, its kernel decides.
        return f"{what} dtype {dtype_name(t.dtype)}"
    if t.device != x.device:
        return f"{what} device"
    return None


# The checks run on every call, in Python, beside a kernel of a few microseconds on the GPU:
# they compare sizes as tuples (a torch.Size is one) rather than building lists.


def normalized_shape_reason(x: torch.Tensor, normalized_shape) -> str | None:
    """Whether ``normalized_shape`` is x's trailing dimensions (else PyTorch raises its error)."""
    n = len(normalized_shape)
    if n == 0 or n > x.dim() or x.shape[x.dim() - n :] != tuple(normalized_shape):
        return "normalized_shape mismatch"
    return None


def parameter_reason(what: str, p: torch.Tensor | None, x: torch.Tensor, shape) -> str | None:
    """A weight or bias: of x's dtype and device, and shaped ``normalized_shape``."""
    reason = companion_reason(what, p, x)
    if reason is None and p is not None and p.shape != tuple(shape):
        return f"{what} shape"
    return reason


def stats_reason(what: str, stats: torch.Tensor, x: torch.Tensor, rows: int) -> str | None:
    """A per-row statistic handed to a norm's backward (mean, rstd): one value a row, fp32 or
    x's dtype (PyTorch's CPU kernels keep them in the input's dtype), on x's device."""
    if stats.dtype not in (torch.float32, x.dtype) or stats.device != x.device:
        return f"{what} layout"
    if stats.numel() != rows:
        return f"{what} layout"
    return None


def as_fp32_rows(stats: torch.Tensor) -> torch.Tensor:
    """A per-row statistic as the contiguous fp32 vector the kernels read (no copy when it is
    one already, as PyTorch's CUDA kernels and ours make them)."""
    if stats.dtype == torch.float32 and stats.is_contiguous():
        return stats
    return stats.float().contiguous()
