"""The activation functions and their derivatives, as Triton device functions.

Each takes and returns fp32 values; callers load, convert with ``.to(tl.float32)``, and cast
only when storing. ``ACT`` is a compile-time constant, so each kernel specialises to one function.
"""

import triton
import triton.language as tl

# Constants are written after the tensor in products (``t * K``, not ``K * t``): the interpreter
# turns ``constexpr * tensor`` into a constexpr that wraps the tensor, which breaks the next op.
# Which function a kernel computes. Globals read inside @triton.jit code must be constexpr;
# Python callers pass int(CODE) (the custom ops take a plain int).
SILU = tl.constexpr(0)  # x * sigmoid(x)                                       (F.silu)
GELU = tl.constexpr(1)  # 0.5 x (1 + erf(x / sqrt(2)))                         (F.gelu)
GELU_TANH = tl.constexpr(2)  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))  (tanh gelu, NewGELU)
FAST_GELU = tl.constexpr(3)  # 0.5 x (1 + tanh(0.7978845608 x (1 + 0.044715 x^2)))  (FastGELU)
QUICK_GELU = tl.constexpr(4)  # x * sigmoid(1.702 x)                               (QuickGELU)

_SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)  # math.sqrt(2 / math.pi)
_FAST_GELU_K = tl.constexpr(0.7978845608)  # the literal transformers' FastGELUActivation uses
_INV_SQRT_2 = tl.constexpr(0.7071067811865476)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)


@triton.jit
def _tanh(u):
    # tanh(u) = 1 - 2 / (exp(2u) + 1): exact at both tails (exp overflows to inf -> 1, underflows
    # to 0 -> -1) and needs only exp, which the interpreter and every backend have.
    return 1.0 - 2.0 / (tl.exp(2.0 * u) + 1.0)


@triton.jit
def activation(x, ACT: tl.constexpr):
    """act(x) for fp32 x."""
    if ACT == SILU:
        y = x * tl.sigmoid(x)
    elif ACT == GELU:
        y = 0.5 * x * (1.0 + tl.erf(x * _INV_SQRT_2))
    elif ACT == GELU_TANH:
        y = 0.5 * x * (1.0 + _tanh((x + 0.044715 * x * x * x) * _SQRT_2_OVER_PI))
    elif ACT == FAST_GELU:
        y = 0.5 * x * (1.0 + _tanh(x * _FAST_GELU_K * (1.0 + 0.044715 * x * x)))
    else:
        y = x * tl.sigmoid(1.702 * x)
    return y


@triton.jit
def activation_and_grad(x, ACT: tl.constexpr):
    """(act(x), act'(x)) for fp32 x; the gated backward needs both."""
    if ACT == SILU:
        s = tl.sigmoid(x)
        y = x * s
        dydx = s * (1.0 + x * (1.0 - s))
    elif ACT == GELU:
        cdf = 0.5 * (1.0 + tl.erf(x * _INV_SQRT_2))
        y = x * cdf
        dydx = cdf + x * _INV_SQRT_2PI * tl.exp(-0.5 * x * x)
    elif ACT == GELU_TANH:
        t = _tanh((x + 0.044715 * x * x * x) * _SQRT_2_OVER_PI)
        y = 0.5 * x * (1.0 + t)
        dydx = (
            0.5 * (1.0 + t)
            + 0.5 * x * (1.0 - t * t) * (1.0 + 3.0 * 0.044715 * x * x) * _SQRT_2_OVER_PI
        )
    elif ACT == FAST_GELU:
        t = _tanh(x * _FAST_GELU_K * (1.0 + 0.044715 * x * x))
        y = 0.5 * x * (1.0 + t)
        dydx = (
            0.5 * (1.0 + t)
            + 0.5 * x * (1.0 - t * t) * (1.0 + 3.0 * 0.044715 * x * x) * _FAST_GELU_K
        )
    else:
        s = tl.sigmoid(1.702 * x)
        y = x * s
        dydx = s + 1.702 * x * s * (1.0 - s)
    return y, dydx
