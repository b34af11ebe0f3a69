"""Overrides of the element-wise activations' aten operators: ``silu``, ``gelu`` (exact and tanh)
and their backward operators.

Our kernels read and write flat contiguous buffers, so they take contiguous inputs only:
PyTorch's kernels give a strided input's output the input's strides, which code after them may
rely on (a ``.view``), and a copy to contiguous memory would cost what the kernel saves. Other
layouts, dtypes and ``approximate`` values run PyTorch's kernel. The in-place and ``out=``
variants (``silu_``, ``silu.out``, ...) are separate operators and are not overridden: model
code that calls them runs PyTorch's kernels, as before.
"""

from __future__ import annotations

from .calls import OURS, record
from .guards import SUPPORTED_DTYPES, companion_reason, dtype_name

# What ``approximate`` asks for, and which of our functions computes it.
_GELU_KINDS = {"none": "gelu", "tanh": "gelu_tanh"}


def _unary_reason(x) -> str | None:
    if x.dtype not in SUPPORTED_DTYPES:
        return f"dtype {dtype_name(x.dtype)}"
    if not x.is_contiguous():
        return "non-contiguous input"
    return None


def _binary_reason(grad, x) -> str | None:
    reason = _unary_reason(x) or companion_reason("grad", grad, x)
    if reason is not None:
        return reason
    if grad.shape != x.shape:
        # PyTorch's backward broadcasts; ours reads both tensors element by element.
        return "grad shape"
    if not grad.is_contiguous():
        return "non-contiguous grad"
    return None


def silu(kernels, original, keyset, self):
    """``aten::silu`` (``F.silu``, ``nn.SiLU``) on our element-wise kernel."""
    reason = _unary_reason(self)
    if reason is not None:
        record("silu", reason)
        return original.call_boxed(keyset, self)
    record("silu", OURS)
    return kernels.forward(self, kernels.silu)


def silu_backward(kernels, original, keyset, grad_output, self):
    """``aten::silu_backward`` on our element-wise backward kernel."""
    reason = _binary_reason(grad_output, self)
    if reason is not None:
        record("silu_backward", reason)
        return original.call_boxed(keyset, grad_output, self)
    record("silu_backward", OURS)
    return kernels.backward(grad_output, self, kernels.silu)


def gelu(kernels, original, keyset, self, approximate="none"):
    """``aten::gelu`` (``F.gelu``, exact and ``approximate="tanh"``) on our element-wise kernel."""
    kind = _GELU_KINDS.get(approximate)
    reason = _unary_reason(self) or (None if kind else f"approximate={approximate!r}")
    if reason is not None:
        record("gelu", reason)
        return original.call_boxed(keyset, self, approximate=approximate)
    assert kind is not None  # else `reason` names the approximation
    record("gelu", OURS)
    return kernels.forward(self, getattr(kernels, kind))


def gelu_backward(kernels, original, keyset, grad_output, self, approximate="none"):
    """``aten::gelu_backward`` on our element-wise backward kernel."""
    kind = _GELU_KINDS.get(approximate)
    reason = _binary_reason(grad_output, self) or (None if kind else f"approximate={approximate!r}")
    if reason is not None:
        record("gelu_backward", reason)
        return original.call_boxed(keyset, grad_output, self, approximate=approximate)
    assert kind is not None  # else `reason` names the approximation
    record("gelu_backward", OURS)
    return kernels.backward(grad_output, self, getattr(kernels, kind))
