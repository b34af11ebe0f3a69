"""LayerNorm kernel (library/norm) against a float64 reference: with weight and bias, without
bias, without either; forward, input, weight and bias gradients, through the kernel layer bound to
a real ``torch.nn.LayerNorm`` and through the function API."""

import sys
import types

import pytest
import torch
import torch.nn.functional as F

from tests.support.library import assert_close, covering, grads, randn

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
# Every case runs in fp32 with weight and bias (tests.support.library.covering). Every dtype and
# every affine form: an odd width, rows read in place with a row stride, rows of 4096 (chunked
# in fp32, in registers in fp16 / bf16) and the persistent backward's partial sums. Every affine
# form in fp32: rows past MAX_ONE_PASS and a normalising pass that loops (the chunk loops load
# the weight and bias on their own). And bf16 rows of three chunks.
LAYER_NORM = covering(
    CASES,
    options={name: name for name in AFFINE},
    every_dtype=[
        ((3,), 37, None),
        ((4,), 128, "slice"),
        ((3,), 4096, "slice"),
        ((3, 25), 520, None),
    ],
    every_option=[((2,), 32768, "slice"), ((3,), 9216, None)],
    last_dtype_too=[((2,), 12288, None)],
)


def _input(lead, hidden, layout, dtype):
    # A mean far from zero next to the spread: the variance must be computed centred.
    if layout == "slice":
        x = randn(*lead, hidden + 8, dtype=dtype, scale=2.0, shift=4.0)[..., 4 : 4 + hidden]
    elif layout == "transpose":
        x = randn(hidden, *lead, dtype=dtype, scale=2.0, shift=4.0).t()
    else:
        x = randn(*lead, hidden, dtype=dtype, scale=2.0, shift=4.0)
    return x.requires_grad_()


@pytest.mark.parametrize("lead,hidden,layout,dtype,affine", LAYER_NORM)
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
    # stores, whose instructions may round otherwise (the compiler contracts other multiplies
    # and adds into FMAs): on an H100, 1 element of 4096x5120 in fp32 differed by 2.6 ulps
    # (2026-12-08), hence 4.
    y_fn = norm.layer_norm(x.detach(), (hidden,), module.weight, module.bias, 1e-5)
    ulp = torch.finfo(dtype).eps
    torch.testing.assert_close(y_fn, y.detach(), rtol=4 * ulp, atol=4 * ulp)


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


# ---- launch plans ---------------------------------------------------------------------------
#
# The launchers keep a plan (checks passed, launch configuration) per key: the shapes, dtypes
# and contiguity of their arguments, the parameters present, the device. The tests below call
# one shape of input again and again with one of those properties changed: a plan kept for the
# wrong key would give wrong values, dtypes or errors.


def _plans(norm):
    module = sys.modules[norm.layer_norm.__module__]
    return module._FWD_PLANS, module._BWD_PLANS


def _param(n, dtype, layout, wanted, shift=0.0):
    if dtype is None:
        return None
    if layout == "strided":  # every other element of a longer vector: taken as a copy
        return randn(2 * n, dtype=dtype, scale=0.2, shift=shift)[::2].requires_grad_(wanted)
    return torch.nn.Parameter(randn(n, dtype=dtype, scale=0.2, shift=shift), requires_grad=wanted)


def _check_layer_norm(norm, x, normalized_shape, w, b, dy, what):
    """``norm.layer_norm`` against float64: output and the gradients asked for; and the forward
    without a backward to feed (no mean and rstd kept: another key), called first."""
    y_fn = norm.layer_norm(x.detach(), normalized_shape, w, b, 1e-5)
    y = norm.layer_norm(x, normalized_shape, w, b, 1e-5)
    assert y.dtype == x.dtype, what
    x64 = x.detach().double().requires_grad_()
    w64 = None if w is None else w.detach().double().requires_grad_()
    b64 = None if b is None else b.detach().double().requires_grad_()
    y64 = F.layer_norm(x64, normalized_shape, w64, b64, 1e-5)
    assert_close(y, y64, x.dtype, f"forward, {what}")
    pairs = [(t, t64) for t, t64 in ((x, x64), (w, w64), (b, b64)) if t is not None]
    pairs = [(t, t64) for t, t64 in pairs if t.requires_grad]
    got = grads(y, [t for t, _ in pairs], dy)
    want = grads(y64, [t64 for _, t64 in pairs], dy.double())
    for g, g64, (t, _) in zip(got, want, pairs, strict=True):
        assert g.dtype == t.dtype and g.shape == t.shape, what
        assert_close(g, g64, x.dtype, f"gradient, {what}")
    ulp = torch.finfo(x.dtype).eps
    torch.testing.assert_close(y_fn, y.detach(), rtol=2 * ulp, atol=2 * ulp)
    return y


# (x dtype, weight dtype, bias dtype (None: no parameter), x layout, dy layout, weight layout,
# gradients wanted of (weight, bias)), in turn
PLAN_VARIANTS = [
    (torch.float32, torch.float32, torch.float32, None, None, None, (True, True)),
    (torch.bfloat16, torch.bfloat16, torch.bfloat16, None, None, None, (True, True)),
    (torch.bfloat16, torch.float32, torch.float32, None, None, None, (True, True)),
    (torch.bfloat16, torch.bfloat16, torch.float32, None, None, None, (True, True)),
    (torch.bfloat16, torch.bfloat16, None, None, None, None, (True, False)),
    (torch.bfloat16, None, None, None, None, None, (False, False)),
    (torch.bfloat16, None, torch.bfloat16, None, None, None, (False, True)),
    (torch.bfloat16, torch.bfloat16, torch.bfloat16, "slice", None, None, (True, True)),
    (torch.bfloat16, torch.bfloat16, torch.bfloat16, "transpose", None, None, (True, True)),
    (torch.bfloat16, torch.bfloat16, torch.bfloat16, None, "transpose", None, (True, True)),
    (torch.bfloat16, torch.bfloat16, torch.bfloat16, None, None, "strided", (True, True)),
    (torch.bfloat16, torch.bfloat16, torch.bfloat16, None, None, None, (False, True)),
    (torch.bfloat16, torch.bfloat16, torch.bfloat16, None, None, None, (True, False)),
    (torch.float32, torch.float32, torch.float32, None, None, None, (True, True)),
]


def test_plans_follow_dtype_layout_and_parameters(norm):
    lead, hidden = (6,), 40
    for dtype, w_dtype, b_dtype, layout, dy_layout, w_layout, wanted in PLAN_VARIANTS:
        what = (
            f"{dtype} x ({layout}), weight {w_dtype} ({w_layout}), bias {b_dtype}, dy {dy_layout}"
        )
        x = _input(lead, hidden, layout, dtype)
        w = _param(hidden, w_dtype, w_layout, wanted[0], shift=1.0)
        b = _param(hidden, b_dtype, None, wanted[1])
        dy = (
            randn(hidden, *lead, dtype=dtype).t()
            if dy_layout
            else randn(*lead, hidden, dtype=dtype)
        )
        _check_layer_norm(norm, x, [hidden], w, b, dy, what)


@pytest.mark.parametrize("affine", [True, False], ids=["weight+bias", "none"])
def test_plans_follow_normalized_shape(norm, affine):
    # One input shape normalised over its last dimension, then its last two, then the last again.
    x = randn(4, 6, 8, shift=2.0).requires_grad_()
    dy = randn(4, 6, 8)
    for normalized_shape in ([8], [6, 8], [8]):
        w = torch.nn.Parameter(randn(*normalized_shape, shift=1.0)) if affine else None
        b = torch.nn.Parameter(randn(*normalized_shape)) if affine else None
        _check_layer_norm(norm, x, normalized_shape, w, b, dy, f"over {normalized_shape}")


def test_backward_plans_follow_the_dtype(norm, monkeypatch):
    # fp32 rows of 4096 walk their backward steps a row at a time, half-precision rows two at a
    # time (``_bwd_config``). Either gives right values: what shows a plan kept for the wrong
    # dtype is the configuration launched.
    module = sys.modules[norm.layer_norm.__module__]
    launched = []
    launch = module.launch

    def recording_launch(kernel, grid, args, num_warps, device):
        if kernel is module._layer_norm_bwd_kernel:
            launched.append((args[-3], args[-1], num_warps))  # ROWS, LOOKAHEAD
        launch(kernel, grid, args, num_warps, device)

    monkeypatch.setattr(module, "launch", recording_launch)
    for dtype in (torch.float32, torch.bfloat16, torch.float32):
        x = randn(2, 4096, dtype=dtype, shift=1.0).requires_grad_()
        grads(norm.layer_norm(x, (4096,)), x, randn(2, 4096, dtype=dtype))
        _, _, rows, num_warps, _, lookahead = module._bwd_config(4096, x.element_size())
        assert launched[-1] == (rows, lookahead, num_warps), dtype


def test_errors_after_a_kept_plan(norm):
    x, w, b = randn(3, 8), randn(8), randn(8)
    norm.layer_norm(x, (8,), w, b)
    for _ in range(2):  # a failed call keeps no plan: the second fails alike
        with pytest.raises(ValueError, match="normalized_shape"):
            norm.layer_norm(x, (9,), w, b)
        with pytest.raises(ValueError, match="layer_norm: weight of shape"):
            norm.layer_norm(x, (8,), randn(9), b)
        with pytest.raises(ValueError, match="layer_norm: bias of shape"):
            norm.layer_norm(x, (8,), w, randn(9))
        with pytest.raises(TypeError, match="layer_norm weight: dtype torch.float64"):
            norm.layer_norm(x, (8,), w.double(), b)
        with pytest.raises(TypeError, match="layer_norm bias: dtype torch.float64"):
            norm.layer_norm(x, (8,), w, b.double())
        with pytest.raises(TypeError, match="layer_norm: dtype torch.float64"):
            norm.layer_norm(x.double(), (8,), w, b)


@pytest.mark.parametrize("layout", [None, "slice"])
def test_kept_plans_give_identical_results(norm, layout):
    # The first call of a key makes its plans, the second reuses them: bit for bit the same.
    fwd, bwd = _plans(norm)
    # 40 rows: each of the two CPU programs of the persistent backward ends on a partial step.
    x = _input((2, 20), 520, layout, torch.bfloat16)
    w = torch.nn.Parameter(randn(520, dtype=torch.bfloat16, shift=1.0))
    b = torch.nn.Parameter(randn(520))
    dy = randn(2, 20, 520, dtype=torch.bfloat16)

    def run():
        y = norm.layer_norm(x, (520,), w, b)
        return (y, *grads(y, (x, w, b), dy))

    fwd.clear()
    bwd.clear()
    made = run()
    assert (len(fwd), len(bwd)) == (1, 1)
    kept = run()
    assert (len(fwd), len(bwd)) == (1, 1)  # no plan made: each call found its own
    for a, c in zip(made, kept, strict=True):
        assert torch.equal(a, c)


def test_plans_are_bounded(norm, monkeypatch):
    fwd, _ = _plans(norm)
    monkeypatch.setattr(fwd, "maxsize", 3)
    with torch.no_grad():
        for rows in range(1, 7):
            x = randn(rows, 16, shift=1.0)
            y = norm.layer_norm(x, (16,))
            assert_close(y, F.layer_norm(x.double(), (16,)), torch.float32, f"{rows} rows")
            assert len(fwd) <= 3
        kept = list(fwd)
        norm.layer_norm(x, (16,))  # the latest plans are the ones kept
        assert list(fwd) == kept
