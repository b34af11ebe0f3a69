"""The activation functions and their derivatives, as Triton device functions, and the same
functions in PyTorch ops (what inductor gets under ``torch.compile``).

Each takes and returns fp32 values; callers load, convert with ``.to(tl.float32)``, and cast
only when storing. ``ACT`` is a compile-time constant, so each kernel specialises to one function.
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

# Constants are written after the tensor in products (``t * K``, not ``K * t``): the interpreter
# turns ``constexpr * tensor`` into a constexpr that wraps the tensor, which breaks the next op.
# Which function a kernel computes: plain ints for Python callers (the custom ops take an int,
# and torch.compile traces plain ints), constexpr copies for the kernels (globals read inside
# @triton.jit code must be constexpr).
SILU = 0  # x * sigmoid(x)                                         (F.silu)
GELU = 1  # 0.5 x (1 + erf(x / sqrt(2)))                           (F.gelu)
GELU_TANH = 2  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))   (tanh gelu, NewGELU)
FAST_GELU = 3  # 0.5 x (1 + tanh(0.7978845608 x (1 + 0.044715 x^2)))  (FastGELU)
QUICK_GELU = 4  # x * sigmoid(1.702 x)                              (QuickGELU)
_SILU = tl.constexpr(SILU)
_GELU = tl.constexpr(GELU)
_GELU_TANH = tl.constexpr(GELU_TANH)
_FAST_GELU = tl.constexpr(FAST_GELU)

# 2 * sqrt(2 / pi), and 2 * the literal 0.7978845608 that transformers' FastGELUActivation uses.
_TWO_SQRT_2_OVER_PI = tl.constexpr(1.5957691216057308)
_TWO_FAST_GELU_K = tl.constexpr(1.5957691216)
_INV_SQRT_2 = tl.constexpr(0.7071067811865476)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)


# The tanh forms are evaluated through 0.5 * (1 + tanh(u)) = sigmoid(2u) (an identity): it
# avoids the cancellation of 1 + tanh(u) for very negative u, keeping the relative accuracy of
# small outputs, and 1 - tanh(u)^2 = 4 s (1 - s) with s = sigmoid(2u) gives the derivative.


@triton.jit
def activation(x, ACT: tl.constexpr):
    """act(x) for fp32 x."""
    if ACT == _SILU:
        y = x * tl.sigmoid(x)
    elif ACT == _GELU:
        y = 0.5 * x * (1.0 + tl.erf(x * _INV_SQRT_2))
    elif ACT == _GELU_TANH:
        y = x * tl.sigmoid((x + 0.044715 * x * x * x) * _TWO_SQRT_2_OVER_PI)
    elif ACT == _FAST_GELU:
        y = x * tl.sigmoid(x * (1.0 + 0.044715 * x * x) * _TWO_FAST_GELU_K)
    else:
        y = x * tl.sigmoid(1.702 * x)
    return y


@triton.jit
def activation_and_grad(x, ACT: tl.constexpr):
    """(act(x), act'(x)) for fp32 x; the gated backward needs both."""
    if ACT == _SILU:
        s = tl.sigmoid(x)
        y = x * s
        dydx = s * (1.0 + x * (1.0 - s))
    elif ACT == _GELU:
        cdf = 0.5 * (1.0 + tl.erf(x * _INV_SQRT_2))
        y = x * cdf
        dydx = cdf + x * tl.exp(-0.5 * x * x) * _INV_SQRT_2PI
    elif ACT == _GELU_TANH:
        # y = x s, s = sigmoid(2u), u = k (x + 0.044715 x^3): y' = s + x * 2 s (1 - s) * u'.
        s = tl.sigmoid((x + 0.044715 * x * x * x) * _TWO_SQRT_2_OVER_PI)
        y = x * s
        dydx = s + x * s * (1.0 - s) * (1.0 + 3.0 * 0.044715 * x * x) * _TWO_SQRT_2_OVER_PI
    elif ACT == _FAST_GELU:
        s = tl.sigmoid(x * (1.0 + 0.044715 * x * x) * _TWO_FAST_GELU_K)
        y = x * s
        dydx = s + x * s * (1.0 - s) * (1.0 + 3.0 * 0.044715 * x * x) * _TWO_FAST_GELU_K
    else:
        s = tl.sigmoid(1.702 * x)
        y = x * s
        dydx = s + 1.702 * x * s * (1.0 - s)
    return y, dydx


def torch_activation(h: torch.Tensor, act: int) -> torch.Tensor:
    """act(h) in PyTorch ops for fp32 ``h``: the kernels' functions, for inductor to fuse."""
    if act == SILU:
        return F.silu(h)
    if act == GELU:
        return F.gelu(h)
    if act == GELU_TANH:
        return F.gelu(h, approximate="tanh")
    if act == FAST_GELU:
        return 0.5 * h * (1.0 + torch.tanh(0.7978845608 * h * (1.0 + 0.044715 * h * h)))
    return h * torch.sigmoid(1.702 * h)
