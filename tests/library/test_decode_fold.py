"""A decoder layer's RMSNorms and residual adds folded into the decode kernels (library/activation
``decode_mlp``): ``norm_weight=`` (Llama's RMSNorm of x computed in the projection's prologue) in
``gemv``, ``gated_gemv`` and ``grouped_linear_decode``, and ``residual=`` (added in ``gemv``'s
epilogue, or its split-K reduction), against a float64 reference with a bound of the roundings
each stored value went through, against the unfused composition (our norm library's kernel, then
the projection; the residual added in PyTorch) bit for bit where the two must agree, strided
inputs, and the argument errors."""

import sys

import pytest
import torch
import torch.nn.functional as F

from tests.support.library import DEVICE, ON_GPU, alternating, randn

H = 67  # odd: every block of K and of the outputs is ragged
NS = (45, 13, 7)  # q, k and v of different widths, over blocks of 16
N, I = 45, 131  # a plain projection's outputs; gate and up's
# An eps of a quarter of x's mean square (x is scaled by 2), so that a kernel that left it out
# (or added it elsewhere) misses the bound by far; the composition tests use a model's.
EPS = 1.0
MODEL_EPS = 1e-6
# One rounding moves a value by less than an ulp, at most 2^-7 (bf16) or 2^-10 (fp16) of it.
ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}
HALF = (torch.bfloat16, torch.float16)
BIAS = {"nobias": False, "bias": True}
ACTS = {0: F.silu, 2: lambda t: F.gelu(t, approximate="tanh")}  # SILU, GELU_TANH
ACT_SLOPE = 1.13  # the largest |act'| of silu (1.10) and gelu_tanh (1.13)
# A normalised element of the kernel and the reference's are each within two roundings (the
# normalised row, then its product with the weight) of x * rstd * w: they differ by at most 4
# of them (the reference rounds to nearest; Triton's interpreter, 3.9, truncates to bf16; and
# the kernel's fp32 rstd can tip a rounding either way).
NORM_SLACK = 4.0


@pytest.fixture(scope="module")
def decode(activation):
    return sys.modules[f"{activation.__name__}.decode_mlp"]


def _config(decode, case):
    """An explicit configuration, or None for the rule's. Blocks of K of 32 with H = 67 make
    three tiles (the norm's pre-pass loops over them all), so split_k 2 and 3 both leave ragged
    splits; the FMA configurations at 3 and 8 rows keep padding rows past M."""
    return {
        "rule": None,
        "fma": decode.GemvConfig(16, 32, 1, 4, 2, False),
        "dot": decode.GemvConfig(32, 64, 1, 4, 3, True),
        "split-dot": decode.GemvConfig(16, 32, 3, 4, 2, True),
        "split-fma": decode.GemvConfig(16, 32, 2, 4, 1, False),
    }[case]


CONFIGS = ["rule", "fma", "dot", "split-dot", "split-fma"]


def _stored(t32: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 ``t32`` in ``dtype`` as the kernels convert it: to nearest on a GPU and for fp16
    (PyTorch's rounding); Triton's interpreter (3.9) truncates fp32 to bf16."""
    if dtype == torch.bfloat16 and not ON_GPU:
        return (t32.view(torch.int32) & -65536).view(torch.float32).to(dtype)
    return t32.to(dtype)


def _norm_weight(dtype, k=H):
    return randn(k, dtype=dtype, scale=0.5, shift=1.0)  # around 1, as a trained norm's


def _norm64(x, nw, eps):
    """Llama's RMSNorm of x in float64 at its rounding points: rstd from x in float64, the
    normalised row rounded to x's dtype, times the weight, rounded again."""
    x64 = x.double()
    rstd = torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    xhat = (x64 * rstd).to(x.dtype).double()
    return (xhat * nw.double()).to(x.dtype).double()


def _f64(t):
    return None if t is None else t.double()


def _assert_within(got, want, dtype, slack, what):
    """|got - want| <= u |want| + u * slack (+ fp32's share): one rounding of the stored value
    (``u`` = ``ULP``) plus, through ``slack``, what the values it was made from may carry."""
    u = ULP[dtype]
    err = (got.double() - want).abs()
    bound = u * (want.abs() + slack) + 1e-5 * (want.abs().max() + 1)
    worst = (err - bound).max().item()
    assert worst <= 0, f"{what}: error {err.max().item():.3g} past the bound (by {worst:.3g})"


def _projection_slack(y64, w):
    """``NORM_SLACK`` roundings of each normalised element, through the projection ``w``."""
    return NORM_SLACK * (y64.abs() @ w.double().abs().t())


# ---- the norm folded into each kernel ----------------------------------------------------------


@pytest.mark.parametrize("dtype,bias,rows,case", alternating(HALF, BIAS, [1, 3, 8], CONFIGS))
def test_norm_in_gemv_matches_float64(decode, dtype, bias, rows, case):
    torch.manual_seed(rows)
    w = randn(N, H, dtype=dtype, scale=H**-0.5)
    b = randn(N, dtype=dtype) if bias else None
    x = randn(rows, H, dtype=dtype, scale=2.0)  # the residual stream: not of unit scale
    nw = _norm_weight(dtype)
    out = decode.gemv(x, w, b, _config(decode, case), norm_weight=nw, eps=EPS)
    y64 = _norm64(x, nw, EPS)
    assert out.shape == (rows, N) and out.dtype == dtype
    want = F.linear(y64, w.double(), _f64(b))
    _assert_within(out, want, dtype, _projection_slack(y64, w), f"gemv norm {case}")


@pytest.mark.parametrize(
    "dtype,bias,rows,case", alternating(HALF, BIAS, [1, 3, 8], ["rule", "fma", "dot", "split-dot"])
)
def test_norm_in_gated_gemv_matches_float64(decode, dtype, bias, rows, case):
    torch.manual_seed(rows)
    act = 0 if rows != 3 else 2
    gate_w, up_w = (randn(I, H, dtype=dtype, scale=H**-0.5) for _ in range(2))
    gate_b, up_b = (randn(I, dtype=dtype) if bias else None for _ in range(2))
    x = randn(rows, H, dtype=dtype, scale=2.0)
    nw = _norm_weight(dtype)
    config = _config(decode, case)
    h = decode.gated_gemv(x, gate_w, gate_b, up_w, up_b, act, config, norm_weight=nw, eps=EPS)
    y64 = _norm64(x, nw, EPS)
    gate, up = (
        F.linear(y64, gate_w.double(), _f64(gate_b)),
        F.linear(y64, up_w.double(), _f64(up_b)),
    )
    want = ACTS[act](gate) * up
    # d(act(g) u) = act'(g) u dg + act(g) du.
    slack = ACT_SLOPE * up.abs() * _projection_slack(y64, gate_w)
    slack += ACTS[act](gate).abs() * _projection_slack(y64, up_w)
    assert h.shape == (rows, I) and h.dtype == dtype
    _assert_within(h, want, dtype, slack, f"gated norm {case}")


@pytest.mark.parametrize(
    "dtype,bias,rows,case", alternating(HALF, BIAS, [1, 3, 8], ["rule", "fma", "dot"])
)
def test_norm_in_grouped_linear_matches_float64(decode, dtype, bias, rows, case):
    """q, k and v of the input norm's output: each program of the three weights normalises x."""
    torch.manual_seed(rows)
    weights = [randn(n, H, dtype=dtype, scale=H**-0.5) for n in NS]
    biases = [randn(n, dtype=dtype) for n in NS] if bias else None
    x = randn(rows, H, dtype=dtype, scale=2.0)
    nw = _norm_weight(dtype)
    outs = decode.grouped_linear_decode(
        x, weights, biases, _config(decode, case), norm_weight=nw, eps=EPS
    )
    y64 = _norm64(x, nw, EPS)
    for i, (out, w) in enumerate(zip(outs, weights, strict=True)):
        want = F.linear(y64, w.double(), None if biases is None else biases[i].double())
        assert out.shape == (rows, w.shape[0]) and out.dtype == dtype
        _assert_within(out, want, dtype, _projection_slack(y64, w), f"projection {i} {case}")


# ---- the residual folded into gemv -------------------------------------------------------------


@pytest.mark.parametrize("dtype,bias,rows,case", alternating(HALF, BIAS, [1, 3, 8], CONFIGS))
def test_residual_in_gemv(decode, dtype, bias, rows, case):
    """``residual + F.linear(x, w, b)`` unfused in x's dtype rounds the projection, then the sum
    (computed in fp32): the fused epilogue (split-K: the reduction kernel's) stores the same
    bits as the kernel's own projection plus the residual in PyTorch, and is within those two
    roundings of float64."""
    torch.manual_seed(rows)
    w = randn(N, H, dtype=dtype, scale=H**-0.5)
    b = randn(N, dtype=dtype) if bias else None
    x = randn(rows, H, dtype=dtype)
    r = randn(rows, N + 3, dtype=dtype, scale=4.0)[:, 3:]  # rows read at their stride
    config = _config(decode, case)
    out = decode.gemv(x, w, b, config, residual=r)
    plain = decode.gemv(x, w, b, config)
    assert out.shape == r.shape and out.dtype == dtype
    assert torch.equal(out, _stored(plain.float() + r.float(), dtype))
    if ON_GPU or dtype == torch.float16:  # where the kernels round as PyTorch does
        assert torch.equal(out, r + plain)
    y64 = F.linear(x.double(), w.double(), _f64(b))
    _assert_within(out, r.double() + y64, dtype, y64.abs(), f"residual {case}")


@pytest.mark.parametrize("dtype,rows,case", alternating(HALF, [1, 8], ["rule", "split-dot"]))
def test_norm_and_residual_together(decode, dtype, rows, case):
    """Both folds in one call (not a Llama layer's, but the kernel takes them together)."""
    torch.manual_seed(rows)
    w, b = randn(N, H, dtype=dtype, scale=H**-0.5), randn(N, dtype=dtype)
    x, r, nw = randn(rows, H, dtype=dtype), randn(rows, N, dtype=dtype), _norm_weight(dtype)
    config = _config(decode, case)
    out = decode.gemv(x, w, b, config, residual=r, norm_weight=nw, eps=EPS)
    normed_only = decode.gemv(x, w, b, config, norm_weight=nw, eps=EPS)
    assert torch.equal(out, _stored(normed_only.float() + r.float(), dtype))


# ---- strided inputs ----------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["row-slice", "batch-seq"])
@pytest.mark.parametrize("case", ["rule", "split-dot", "split-fma"])
def test_strided_x_residual_and_norm_weight(decode, layout, case):
    """Rows read in place at their stride (row-slice), or copied where no single stride exists
    (batch-seq): the same bits as from contiguous copies; the residual is left as it was."""
    dtype = torch.bfloat16
    torch.manual_seed(0)
    w, b = randn(N, H, dtype=dtype, scale=H**-0.5), randn(N, dtype=dtype)
    if layout == "row-slice":
        x = randn(4, 2 * H + 3, dtype=dtype)[:, 3 : H + 3]  # rows 137 apart
        r = randn(4, N + 5, dtype=dtype)[:, 2 : N + 2]  # rows 50 apart
    else:
        x = randn(3, 2, H, dtype=dtype).transpose(0, 1)  # [batch, seq, hidden] from [seq, ...]
        r = randn(3, 2, N, dtype=dtype).transpose(0, 1)
    nw = _norm_weight(dtype, 2 * H)[::2]  # a strided [K] weight: copied
    r_before = r.clone()
    config = _config(decode, case)
    out = decode.gemv(x, w, b, config, residual=r, norm_weight=nw, eps=EPS)
    assert out.shape == (*x.shape[:-1], N) and out.is_contiguous()
    assert torch.equal(r, r_before)
    contiguous = decode.gemv(
        x.contiguous(), w, b, config, residual=r.contiguous(), norm_weight=nw.contiguous(), eps=EPS
    )
    assert torch.equal(out, contiguous)
    y64 = F.linear(_norm64(x, nw, EPS), w.double(), b.double())
    slack = y64.abs() + _projection_slack(_norm64(x, nw, EPS), w)
    _assert_within(out, r.double() + y64, dtype, slack, layout)
    # Strided x in the other kernels too.
    h = decode.gated_gemv(x, w, b, w, b, 0, config, norm_weight=nw, eps=EPS)
    assert torch.equal(
        h, decode.gated_gemv(x.contiguous(), w, b, w, b, 0, config, norm_weight=nw, eps=EPS)
    )
    qkv = decode.grouped_linear_decode(x, (w, w[:13], w[:7]), None, norm_weight=nw, eps=EPS)
    assert torch.equal(qkv[1], decode.gemv(x.contiguous(), w[:13], None, norm_weight=nw, eps=EPS))


# ---- against the unfused composition -----------------------------------------------------------


def _exactly_summable(rows, k, dtype):
    """x whose squares sum exactly in fp32 in any order (multiples of 1/8 up to 2): the fused
    pre-pass and the norm kernel then compute the same rstd, and so the same normalised rows."""
    return (torch.randint(-16, 17, (rows, k)).to(dtype) / 8).to(DEVICE)


def _unfused(decode, norm, kind, x, nw, weights, config):
    """Our norm library's Llama RMSNorm kernel, then the kernel without the fold."""
    normed = norm.rms_norm(x, nw, MODEL_EPS)
    if kind == "grouped":
        return decode.grouped_linear_decode(normed, weights[:3], None, config)
    if kind == "gated":
        return (decode.gated_gemv(normed, *weights[3:7], 0, config),)
    return (decode.gemv(normed, weights[7], weights[8], config),)


def _fused(decode, kind, x, nw, weights, config):
    fold = {"norm_weight": nw, "eps": MODEL_EPS}
    if kind == "grouped":
        return decode.grouped_linear_decode(x, weights[:3], None, config, **fold)
    if kind == "gated":
        return (decode.gated_gemv(x, *weights[3:7], 0, config, **fold),)
    return (decode.gemv(x, weights[7], weights[8], config, **fold),)


def _layer_weights(dtype):
    """q, k, v (NS), gate and up (I) with biases, down-like (N) with a bias."""
    qkv = [randn(n, H, dtype=dtype, scale=H**-0.5) for n in NS]
    gated = [
        t for _ in "gu" for t in (randn(I, H, dtype=dtype, scale=H**-0.5), randn(I, dtype=dtype))
    ]
    return [*qkv, *gated, randn(N, H, dtype=dtype, scale=H**-0.5), randn(N, dtype=dtype)]


@pytest.mark.parametrize(
    "dtype,kind,rows,case",
    alternating(HALF, ["grouped", "gated", "gemv"], [1, 3, 8], ["rule", "dot", "split-fma"]),
)
def test_fused_matches_the_unfused_composition(decode, norm, dtype, kind, rows, case):
    """Fused against norm kernel + unfused kernel with the same configuration: bit for bit
    where x's squares sum exactly (both then store the same normalised rows, and the projection
    sums them in the same order); for any x within a rounding of the stored value, the two
    rstd's sums in different orders tipping a normalised element's rounding at most."""
    if kind == "grouped" and case == "split-fma":
        case = "fma"  # grouped_linear_decode does not split K
    torch.manual_seed(rows)
    weights, nw = _layer_weights(dtype), _norm_weight(dtype)
    config = _config(decode, case)
    x = _exactly_summable(rows, H, dtype)
    for fused, unfused in zip(
        _fused(decode, kind, x, nw, weights, config),
        _unfused(decode, norm, kind, x, nw, weights, config),
        strict=True,
    ):
        assert torch.equal(fused, unfused), f"{kind} {case}: not the unfused bits"
    x = randn(rows, H, dtype=dtype, scale=2.0)
    fused = _fused(decode, kind, x, nw, weights, config)
    unfused = _unfused(decode, norm, kind, x, nw, weights, config)
    slacks = _tipped_slacks(kind, norm.rms_norm(x, nw, MODEL_EPS).double(), weights)
    for i, (got, want, slack) in enumerate(zip(fused, unfused, slacks, strict=True)):
        _assert_within(got, want.double(), dtype, slack, f"{kind} {case} output {i}")


def _tipped_slacks(kind, y, weights):
    """Each output's slack for normalised elements ``y`` whose roundings the fused and unfused
    rstd tip apart: two roundings each (the normalised row's, then the weight product's)."""
    w64 = [w.double() for w in weights]
    if kind == "grouped":
        return [2 * (y.abs() @ w.abs().t()) for w in w64[:3]]
    if kind == "gemv":
        return [2 * (y.abs() @ w64[7].abs().t())]
    gate, up = F.linear(y, w64[3], w64[4]), F.linear(y, w64[5], w64[6])
    slack = ACT_SLOPE * up.abs() * 2 * (y.abs() @ w64[3].abs().t())
    return [slack + ACTS[0](gate).abs() * 2 * (y.abs() @ w64[5].abs().t())]


# ---- argument errors ---------------------------------------------------------------------------


def _calls(decode, dtype=torch.bfloat16):
    """{name: call(x, **folds)} of the three kernels, weights of K = H."""
    w = randn(N, H, dtype=dtype)
    return {
        "gemv": lambda x, **kw: decode.gemv(x, w, None, **kw),
        "gated_gemv": lambda x, **kw: decode.gated_gemv(x, w, None, w, None, 0, **kw),
        "grouped_linear_decode": lambda x, **kw: decode.grouped_linear_decode(
            x, (w, w, w), None, **kw
        ),
    }


@pytest.mark.parametrize("name", ["gemv", "gated_gemv", "grouped_linear_decode"])
def test_norm_weight_errors(decode, name):
    call = _calls(decode)[name]
    x = randn(2, H, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=rf"{name}: norm_weight has shape \(68,\).*\(67,\)"):
        call(x, norm_weight=randn(H + 1, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"norm_weight has shape \(1, 67\)"):
        call(x, norm_weight=randn(1, H, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match=rf"{name}: norm_weight is torch.float32.*norm_weight.to"):
        call(x, norm_weight=randn(H))
    with pytest.raises(TypeError, match="norm_weight is torch.bfloat16 on meta"):
        call(x, norm_weight=torch.empty(H, dtype=torch.bfloat16, device="meta"))


def test_residual_errors(decode):
    call = _calls(decode)["gemv"]
    x = randn(2, H, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"gemv: residual has shape \(2, 44\).*\(2, 45\)"):
        call(x, residual=randn(2, N - 1, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"residual has shape \(1, 2, 45\)"):
        call(x, residual=randn(1, 2, N, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match=r"gemv: residual is torch.float16.*residual.to\(x\)"):
        call(x, residual=randn(2, N, dtype=torch.float16))
    # An empty call is checked as well.
    with pytest.raises(ValueError, match="residual has shape"):
        call(randn(0, H, dtype=torch.bfloat16), residual=randn(1, N, dtype=torch.bfloat16))
    assert call(
        randn(0, H, dtype=torch.bfloat16), residual=randn(0, N, dtype=torch.bfloat16)
    ).shape == (0, N)
