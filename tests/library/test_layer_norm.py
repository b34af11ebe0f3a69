"""LayerNorm kernel (library/norm) against a float64 reference: with weight and bias, without
bias, without either; forward, input, weight and bias gradients, through the kernel layer bound to
a real ``torch.nn.LayerNorm`` and through the function API."""

import types

import pytest
import torch
import torch.nn.functional as F
from library_helpers import DTYPES, assert_close, grads, randn

CASES = [
    ((3,), 37, None),
    ((2, 3), 65, None),
    ((5,), 1000, None),
    ((0,), 64, None),
    ((4,), 128, "slice"),
    ((6,), 40, "transpose"),
    ((2,), 20000, None),
    # Rows read in chunks, two passes (the forward's per-position moments): fp32 rows of 4096 and
    # 12288 (2 and 3 chunks), half-precision rows of 12288 (3), rows past MAX_ONE_PASS of two
    # whole chunks and (20000, above) of one and a part; half-precision rows of 4096 stay in
    # registers at so few rows.
    ((3,), 4096, "slice"),
    ((2,), 12288, None),
    ((2,), 32768, "slice"),
    # fp32 rows past 4096 walk their backward steps without the look-ahead: five rows, so each of
    # the two CPU programs walks several.
    ((5,), 8192, None),
    # Nine chunks of 1024: more than the normalising pass unrolls, so it loops.
    ((3,), 9216, None),
    # 75 rows of 520: 16-row steps, so each of the two CPU programs walks several steps and the
    # second ends on a partial one (the persistent backward's row loop and partial sums).
    ((3, 25), 520, None),
    pytest.param((4096,), 5120, None, marks=pytest.mark.gpu),
    pytest.param((16384,), 4096, "slice", marks=pytest.mark.gpu),  # enough rows for chunks
    pytest.param((2, 1024), 11008, None, marks=pytest.mark.gpu),
    pytest.param((64,), 14336, None, marks=pytest.mark.gpu),
    pytest.param((8,), 65536, None, marks=pytest.mark.gpu),
]

AFFINE = {"weight+bias": (True, True), "weight": (True, False), "none": (False, False)}


def _input(lead, hidden, layout, dtype):
    # A mean far from zero next to the spread: the variance must be computed centred.
    if layout == "slice":
        x = randn(*lead, hidden + 8, dtype=dtype, scale=2.0, shift=4.0)[..., 4 : 4 + hidden]
    elif layout == "transpose":
        x = randn(hidden, *lead, dtype=dtype, scale=2.0, shift=4.0).t()
    else:
        x = randn(*lead, hidden, dtype=dtype, scale=2.0, shift=4.0)
    return x.requires_grad_()


@pytest.mark.parametrize("affine", sorted(AFFINE))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lead,hidden,layout", CASES)
def test_layer_norm(norm, lead, hidden, layout, dtype, affine):
    has_weight, has_bias = AFFINE[affine]
    module = torch.nn.LayerNorm(hidden, eps=1e-5, elementwise_affine=has_weight, bias=has_bias)
    module = module.to(device=randn(1).device, dtype=dtype)
    with torch.no_grad():
        if module.weight is not None:
            module.weight.copy_(randn(hidden, scale=0.2, shift=1.0))
        if module.bias is not None:
            module.bias.copy_(randn(hidden, scale=0.2))
    x = _input(lead, hidden, layout, dtype)
    y = types.MethodType(norm.layers.LayerNorm.forward, module)(x)
    assert y.dtype == dtype
    params = [p for p in (module.weight, module.bias) if p is not None]
    x64 = x.detach().double().requires_grad_()
    p64 = [p.detach().double().requires_grad_() for p in params]
    w64 = p64[0] if has_weight else None
    b64 = p64[1] if has_bias else None
    y64 = F.layer_norm(x64, (hidden,), w64, b64, 1e-5)
    assert_close(y, y64, dtype, "forward")
    dy = randn(*y.shape, dtype=dtype)
    got = grads(y, (x, *params), dy)
    want = grads(y64, (x64, *p64), dy.double())
    for g, g64, what in zip(got, want, ("grad x", "grad weight", "grad bias"), strict=False):
        assert g is None or g.dtype == dtype
        assert_close(g, g64, dtype, what)
    # Without a backward to feed, the forward runs a variant compiled without the mean and rstd
    # stores, whose instructions may round the last bit otherwise.
    y_fn = norm.layer_norm(x.detach(), (hidden,), module.weight, module.bias, 1e-5)
    ulp = torch.finfo(dtype).eps
    torch.testing.assert_close(y_fn, y.detach(), rtol=2 * ulp, atol=2 * ulp)


def test_layer_norm_over_two_trailing_dims(norm):
    module = torch.nn.LayerNorm((3, 5)).to(randn(1).device)
    with torch.no_grad():
        module.weight.copy_(randn(3, 5, shift=1.0))
        module.bias.copy_(randn(3, 5))
    x = randn(4, 3, 5, shift=2.0).requires_grad_()
    y = types.MethodType(norm.layers.LayerNorm.forward, module)(x)
    x64 = x.detach().double().requires_grad_()
    w64 = module.weight.detach().double().requires_grad_()
    b64 = module.bias.detach().double().requires_grad_()
    y64 = F.layer_norm(x64, (3, 5), w64, b64, module.eps)
    assert_close(y, y64, torch.float32, "forward")
    dy = randn(4, 3, 5)
    got = grads(y, (x, module.weight, module.bias), dy)
    want = grads(y64, (x64, w64, b64), dy.double())
    for g, g64 in zip(got, want, strict=False):
        assert_close(g, g64, torch.float32, "grad")


def test_layer_norm_mixed_dtypes(norm):
    # bf16 activations with fp32 parameters (autocast-style): output in the input dtype, the
    # parameter gradients in the parameters' dtype.
    x = randn(7, 96, dtype=torch.bfloat16, shift=1.0).requires_grad_()
    w = torch.nn.Parameter(randn(96, shift=1.0))
    b = torch.nn.Parameter(randn(96))
    y = norm.layer_norm(x, (96,), w, b, 1e-5)
    assert y.dtype == torch.bfloat16
    dy = randn(7, 96, dtype=torch.bfloat16)
    dx, dw, db = grads(y, (x, w, b), dy)
    assert (dx.dtype, dw.dtype, db.dtype) == (torch.bfloat16, torch.float32, torch.float32)
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_()
    y64 = F.layer_norm(x64, (96,), w64, b64, 1e-5)
    assert_close(y, y64, torch.bfloat16, "forward")
    for g, g64 in zip((dx, dw, db), grads(y64, (x64, w64, b64), dy.double()), strict=False):
        assert_close(g, g64, torch.bfloat16, "grad")


@pytest.mark.parametrize(
    "wanted", [("w", "b"), ("w",), ("b",)], ids=["weight+bias", "weight", "bias"]
)
@pytest.mark.parametrize(
    "param_dtypes",
    [(torch.float32, torch.float32), (torch.bfloat16, torch.float32)],
    ids=["same", "differ"],
)
def test_parameter_gradients_alone_together_and_of_differing_dtypes(norm, wanted, param_dtypes):
    # The weight's and the bias's partial sums share one buffer (summed in one launch where
    # their dtypes agree); each gradient asked for alone, both, and of differing dtypes.
    w_dtype, b_dtype = param_dtypes
    x = randn(9, 80, shift=0.5).requires_grad_()
    w = torch.nn.Parameter(randn(80, shift=1.0).to(w_dtype), requires_grad="w" in wanted)
    b = torch.nn.Parameter(randn(80).to(b_dtype), requires_grad="b" in wanted)
    y = norm.layer_norm(x, (80,), w, b, 1e-5)
    dy = randn(9, 80)
    inputs = [x] + [p for p, name in ((w, "w"), (b, "b")) if name in wanted]
    got = grads(y, inputs, dy)
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_()
    y64 = F.layer_norm(x64, (80,), w64, b64, 1e-5)
    want = grads(
        y64, [x64] + [p for p, name in ((w64, "w"), (b64, "b")) if name in wanted], dy.double()
    )
    for g, g64, t in zip(got, want, inputs, strict=True):
        assert g.dtype == t.dtype
        assert_close(g, g64, t.dtype, "grad")


def test_mismatched_normalized_shape_is_a_clear_error(norm):
    with pytest.raises(ValueError, match="normalized_shape"):
        norm.layer_norm(randn(3, 8), (9,))
