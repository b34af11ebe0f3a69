"""RMSNorm kernels (library/norm): Llama and Gemma semantics and the fused residual add, against
float64 references; forward, input and weight gradients, through the kernel layers bound to real
modules and through the function API."""

import sys
import types

import pytest
import torch
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from tests.support.library import ON_GPU, FusedAddRMSNorm, assert_close, covering, grads, randn

EPS = 1e-6


def _rms64(x64, eps):
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)


# (rows shape, hidden, layout): odd hidden sizes, several leading dims, zero rows, rows read in
# chunks (wider than 16384; and 8192, a whole multiple of the forward's chunk), non-contiguous
# inputs (a row-strided slice, and a transpose, which has no row-contiguous view); model sizes on
# the GPU. Rows past MAX_ONE_PASS (16384) run one code path whatever their width: 20000 is one
# chunk and a part, 32768 two whole chunks (the chunk loops run more than once, no masked tail;
# half the interpreter's time of 65536, which the GPU runs).
CASES = [
    ((3,), 37, None),
    ((2, 3), 65, None),
    ((5,), 1000, None),
    ((0,), 64, None),
    ((4,), 128, "slice"),
    ((6,), 40, "transpose"),
    # One row of 2049-4096 a block: Gemma loads its weight beside the row there.
    ((3,), 3001, None),
    ((2,), 20000, None),
    ((3,), 8192, "slice"),
    # 75 rows of 520: 16-row steps, so each of the two CPU programs walks several steps and the
    # second ends on a partial one (the persistent backward's row loop and partial sums).
    ((3, 25), 520, None),
    pytest.param((1,), 32768, None, marks=pytest.mark.slow),
    pytest.param((4096,), 5120, None, marks=pytest.mark.gpu),
    pytest.param((2, 1024), 11008, None, marks=pytest.mark.gpu),
    pytest.param((64,), 14336, None, marks=pytest.mark.gpu),
    pytest.param((1000,), 12288, "slice", marks=pytest.mark.gpu),
    pytest.param((8,), 65536, None, marks=pytest.mark.gpu),
    pytest.param((3000,), 4096, "slice", marks=pytest.mark.gpu),
]
# Every case runs in fp32; in fp16 and bf16 too (tests.support.library.covering): an odd width,
# rows read in place with a row stride, and the persistent backward's partial sums; and in bf16
# the rows read in chunks (one and a part), whose chunk loop loads and converts on its own.
EVERY_DTYPE = [((3,), 37, None), ((4,), 128, "slice"), ((3, 25), 520, None)]
CHUNKED = [((2,), 20000, None)]
# The weight in the input's dtype, or in fp32 under fp16 / bf16 inputs (the multiply promotes).
LLAMA = covering(
    CASES,
    options={"w=x": None, "w=fp32": torch.float32},
    every_dtype=EVERY_DTYPE,
    last_dtype_too=CHUNKED,
)
ONE_WEIGHT_DTYPE = covering(CASES, every_dtype=EVERY_DTYPE, last_dtype_too=CHUNKED)


def _input(lead, hidden, layout, dtype):
    if layout == "slice":
        x = randn(*lead, hidden + 8, dtype=dtype, scale=2.0, shift=0.5)[..., 4 : 4 + hidden]
    elif layout == "transpose":
        x = randn(hidden, *lead, dtype=dtype, scale=2.0, shift=0.5).t()
    else:
        x = randn(*lead, hidden, dtype=dtype, scale=2.0, shift=0.5)
    return x.requires_grad_()


def _weight(hidden, dtype, offset=1.0):
    return torch.nn.Parameter(randn(hidden, dtype=dtype, scale=0.2, shift=offset))


@pytest.mark.parametrize("lead,hidden,layout,dtype,weight_dtype", LLAMA)
def test_rms_norm_llama(norm, lead, hidden, layout, dtype, weight_dtype):
    module = LlamaRMSNorm(hidden, eps=EPS)
    module.weight = _weight(hidden, weight_dtype or dtype)
    x = _input(lead, hidden, layout, dtype)
    y = types.MethodType(norm.layers.RMSNorm.forward, module)(x)
    # Same dtype as transformers' module: the weight multiply promotes.
    with torch.no_grad():
        assert y.dtype == module(x[:1] if x.numel() else x).dtype
    x64 = x.detach().double().requires_grad_()
    w64 = module.weight.detach().double().requires_grad_()
    y64 = w64 * _rms64(x64, EPS)
    assert_close(y, y64, dtype, "forward")
    dy = randn(*y.shape, dtype=y.dtype)
    dx, dw = grads(y, (x, module.weight), dy)
    dx64, dw64 = grads(y64, (x64, w64), dy.double())
    assert_close(dx, dx64, dtype, "grad x")
    assert dw.dtype == module.weight.dtype
    assert_close(dw, dw64, dtype, "grad weight")
    assert torch.equal(norm.rms_norm(x.detach(), module.weight.detach(), EPS), y.detach())


@pytest.mark.parametrize("lead,hidden,layout,dtype", ONE_WEIGHT_DTYPE)
def test_rms_norm_gemma(norm, lead, hidden, layout, dtype):
    module = GemmaRMSNorm(hidden, eps=EPS)
    module.weight = _weight(hidden, dtype, offset=0.0)
    x = _input(lead, hidden, layout, dtype)
    y = types.MethodType(norm.layers.GemmaRMSNorm.forward, module)(x)
    assert y.dtype == dtype
    x64 = x.detach().double().requires_grad_()
    w64 = module.weight.detach().double().requires_grad_()
    y64 = _rms64(x64, EPS) * (1.0 + w64)
    assert_close(y, y64, dtype, "forward")
    dy = randn(*y.shape, dtype=dtype)
    dx, dw = grads(y, (x, module.weight), dy)
    dx64, dw64 = grads(y64, (x64, w64), dy.double())
    assert_close(dx, dx64, dtype, "grad x")
    assert_close(dw, dw64, dtype, "grad weight")
    assert torch.equal(norm.gemma_rms_norm(x.detach(), module.weight.detach(), EPS), y.detach())


@pytest.mark.parametrize("lead,hidden,layout,dtype", ONE_WEIGHT_DTYPE)
def test_fused_add_rms_norm(norm, lead, hidden, layout, dtype):
    module = FusedAddRMSNorm(hidden, eps=EPS)
    module.weight = _weight(hidden, dtype)
    x = _input(lead, hidden, layout, dtype)
    r = _input(lead, hidden, None, dtype)
    y, s = types.MethodType(norm.layers.FusedAddRMSNorm.forward, module)(x, r)
    with torch.no_grad():
        y_ref, s_ref = module(x, r)
    assert y.dtype == y_ref.dtype and s.dtype == s_ref.dtype
    if ON_GPU or dtype != torch.bfloat16:
        # The sum is rounded to the input dtype exactly as PyTorch rounds it.
        assert torch.equal(s, s_ref)
    else:
        # Triton's interpreter truncates fp32 -> bf16 instead of rounding to nearest (checked
        # with triton 3.9), so on the CPU the sum may be one bf16 ulp off; the GPU test is exact.
        assert_close(s, s_ref.double(), dtype, "sum")
    x64 = x.detach().double().requires_grad_()
    r64 = r.detach().double().requires_grad_()
    w64 = module.weight.detach().double().requires_grad_()
    s64 = x64 + r64
    y64 = w64 * _rms64(s64, EPS)
    assert_close(y, y64, dtype, "forward")
    dy, ds = randn(*y.shape, dtype=dtype), randn(*s.shape, dtype=dtype)
    got = grads((y, s), (x, r, module.weight), (dy, ds))
    want = grads((y64, s64), (x64, r64, w64), (dy.double(), ds.double()))
    for g, g64, what in zip(
        got, want, ("grad hidden_states", "grad residual", "grad weight"), strict=False
    ):
        assert_close(g, g64, dtype, what)


def test_fused_add_with_unused_sum(norm):
    # Only the normalised output feeds the loss: the sum's gradient is None.
    x = randn(3, 48).requires_grad_()
    r = randn(3, 48).requires_grad_()
    w = _weight(48, torch.float32)
    y, _ = norm.fused_add_rms_norm(x, r, w, EPS)
    dx, dr = grads(y.square().sum(), (x, r), torch.ones(()))
    s64 = x.detach().double() + r.detach().double()
    s64.requires_grad_()
    (ds64,) = grads(
        (w.detach().double() * _rms64(s64, EPS)).square().sum(), s64, torch.ones(()).double()
    )
    assert_close(dx, ds64, torch.float32, "grad hidden_states")
    assert_close(dr, ds64, torch.float32, "grad residual")


def test_weight_without_grad(norm):
    x = randn(4, 96).requires_grad_()
    w = randn(96, scale=0.1, shift=1.0)  # a plain tensor: no weight gradient wanted
    dy = randn(4, 96)
    (dx,) = grads(norm.rms_norm(x, w, EPS), x, dy)
    x64 = x.detach().double().requires_grad_()
    (dx64,) = grads(w.double() * _rms64(x64, EPS), x64, dy.double())
    assert_close(dx, dx64, torch.float32, "grad x")


def test_mismatched_weight_is_a_clear_error(norm):
    with pytest.raises(ValueError, match="does not match the last dimension"):
        norm.rms_norm(randn(3, 8), randn(9), EPS)


def test_unsupported_residual_dtype_is_a_clear_error(norm):
    # A float64 residual would otherwise be summed in fp32 and come back as float64.
    x = randn(3, 8)
    with pytest.raises(TypeError, match="fused_add_rms_norm residual: dtype torch.float64"):
        norm.fused_add_rms_norm(x, x.double(), randn(8), EPS)


# ---- launch plans ---------------------------------------------------------------------------
#
# The launchers keep a plan (checks passed, launch configuration) per key: the shapes, dtypes
# and contiguity of their arguments, the mode, the device. The tests below call one shape of
# input again and again with one of those properties changed: a plan kept for the wrong key
# would give wrong values, dtypes or errors.


def _plans(norm):
    module = sys.modules[norm.rms_norm.__module__]
    return module._FWD_PLANS, module._BWD_PLANS


def _noncontiguous_weight(hidden, dtype):
    # Every other element of a longer vector: a strided weight, which the kernels take as a copy.
    return randn(2 * hidden, dtype=dtype, scale=0.2, shift=1.0)[::2].requires_grad_()


# (x dtype, weight dtype, x layout, dy layout, weight layout, weight gradient wanted), in turn
PLAN_VARIANTS = [
    (torch.float32, torch.float32, None, None, None, True),
    (torch.bfloat16, torch.bfloat16, None, None, None, True),  # another dtype
    (torch.bfloat16, torch.float32, None, None, None, True),  # another weight dtype
    (torch.bfloat16, torch.bfloat16, "slice", None, None, True),  # rows viewed in place
    (torch.bfloat16, torch.bfloat16, "transpose", None, None, True),  # rows copied
    (torch.bfloat16, torch.bfloat16, None, "transpose", None, True),  # dy not contiguous
    (torch.bfloat16, torch.bfloat16, None, None, "strided", True),  # weight not contiguous
    (torch.bfloat16, torch.bfloat16, None, None, None, False),  # no weight gradient
    (torch.float32, torch.float32, None, None, None, True),  # the first again: kept plans
]


@pytest.mark.parametrize("mode", ["llama", "gemma"])
def test_plans_follow_dtype_layout_and_weight(norm, mode):
    lead, hidden = (6,), 40
    fn = norm.rms_norm if mode == "llama" else norm.gemma_rms_norm
    for dtype, w_dtype, layout, dy_layout, w_layout, w_grad in PLAN_VARIANTS:
        what = f"{dtype} x ({layout}), {w_dtype} weight ({w_layout}), dy {dy_layout}"
        x = _input(lead, hidden, layout, dtype)
        if w_layout == "strided":
            w = _noncontiguous_weight(hidden, w_dtype)
        else:
            w = _weight(hidden, w_dtype, offset=1.0 if mode == "llama" else 0.0)
        w.requires_grad_(w_grad)
        # First without a backward to feed (no rstd kept: another key), then with one.
        y_fn = fn(x.detach(), w.detach(), EPS)
        y = fn(x, w, EPS)
        x64 = x.detach().double().requires_grad_()
        w64 = w.detach().double().requires_grad_()
        if mode == "llama":
            assert y.dtype == torch.promote_types(dtype, w_dtype), what
            y64 = w64 * _rms64(x64, EPS)
        else:
            assert y.dtype == dtype, what
            y64 = _rms64(x64, EPS) * (1.0 + w64)
        assert_close(y, y64, dtype, f"forward, {what}")
        dy = (
            randn(hidden, *lead, dtype=y.dtype).t() if dy_layout else randn(*y.shape, dtype=y.dtype)
        )
        got = grads(y, (x, w) if w_grad else (x,), dy)
        want = grads(y64, (x64, w64) if w_grad else (x64,), dy.double())
        for g, g64, t in zip(got, want, (x, w), strict=False):
            assert g.dtype == t.dtype, what
            assert_close(g, g64, dtype, f"gradient, {what}")
        assert torch.equal(y_fn, y.detach()), what


def test_fused_add_plans_follow_the_residual(norm):
    lead, hidden = (6,), 40
    x = _input(lead, hidden, None, torch.bfloat16)
    w = _weight(hidden, torch.bfloat16)
    # (residual dtype, residual layout), in turn: of x's dtype, of another, not contiguous.
    for r_dtype, layout in [
        (torch.bfloat16, None),
        (torch.float32, None),
        (torch.bfloat16, "slice"),
        (torch.float32, "transpose"),
        (torch.bfloat16, None),
    ]:
        what = f"{r_dtype} residual ({layout})"
        r = _input(lead, hidden, layout, r_dtype)
        with torch.no_grad():  # first without a backward to feed (no rstd kept: another key)
            y_fn, s_fn = norm.fused_add_rms_norm(x, r, w, EPS)
        y, s = norm.fused_add_rms_norm(x, r, w, EPS)
        assert s.dtype == torch.promote_types(x.dtype, r_dtype), what
        assert y.dtype == torch.promote_types(w.dtype, s.dtype), what
        x64 = x.detach().double().requires_grad_()
        r64 = r.detach().double().requires_grad_()
        w64 = w.detach().double().requires_grad_()
        s64 = x64 + r64
        y64 = w64 * _rms64(s64, EPS)
        assert_close(s, s64, s.dtype, f"sum, {what}")
        assert_close(y, y64, s.dtype, f"forward, {what}")
        dy, ds = randn(*y.shape, dtype=y.dtype), randn(*s.shape, dtype=s.dtype)
        got = grads((y, s), (x, r, w), (dy, ds))
        want = grads((y64, s64), (x64, r64, w64), (dy.double(), ds.double()))
        for g, g64, t in zip(got, want, (x, r, w), strict=True):
            assert g.dtype == t.dtype, what
            assert_close(g, g64, torch.bfloat16, f"gradient, {what}")
        assert torch.equal(y_fn, y.detach()) and torch.equal(s_fn, s.detach()), what
    # A residual of an unsupported dtype, or of another shape, after the kept plans: the checks'
    # errors, every time (a failed call keeps no plan).
    for _ in range(2):
        with pytest.raises(TypeError, match="fused_add_rms_norm residual: dtype torch.float64"):
            norm.fused_add_rms_norm(x, x.detach().double(), w, EPS)
        with pytest.raises(ValueError, match="must have the same shape"):
            norm.fused_add_rms_norm(x, randn(7, hidden, dtype=torch.bfloat16), w, EPS)


def test_errors_after_a_kept_plan(norm):
    x, w = randn(3, 8), randn(8)
    norm.rms_norm(x, w, EPS)
    for _ in range(2):
        with pytest.raises(ValueError, match="does not match the last dimension"):
            norm.rms_norm(x, randn(9), EPS)
        with pytest.raises(ValueError, match="does not match the last dimension"):
            norm.rms_norm(x, randn(1, 8), EPS)
        with pytest.raises(TypeError, match="rms_norm weight: dtype torch.float64"):
            norm.rms_norm(x, w.double(), EPS)
        with pytest.raises(TypeError, match="rms_norm: dtype torch.float64"):
            norm.gemma_rms_norm(x.double(), w, EPS)


@pytest.mark.parametrize("layout", [None, "slice"])
def test_kept_plans_give_identical_results(norm, layout):
    # The first call of a key makes its plans, the second reuses them: bit for bit the same.
    fwd, bwd = _plans(norm)
    # 40 rows: each of the two CPU programs of the persistent backward ends on a partial step.
    x = _input((2, 20), 520, layout, torch.bfloat16)
    r = _input((2, 20), 520, None, torch.float32)
    w = _weight(520, torch.bfloat16)
    dy, ds = randn(2, 20, 520), randn(2, 20, 520)

    def run():
        y = norm.gemma_rms_norm(x, w, EPS)
        fused = norm.fused_add_rms_norm(x, r, w, EPS)
        return (y, *grads(y, (x, w), dy.to(y.dtype)), *fused, *grads(fused, (x, r, w), (dy, ds)))

    fwd.clear()
    bwd.clear()
    made = run()
    counts = len(fwd), len(bwd)
    assert counts == (2, 2)
    kept = run()
    assert (len(fwd), len(bwd)) == counts  # no plan made: every call found its own
    for a, b in zip(made, kept, strict=True):
        assert torch.equal(a, b)


def test_plans_are_bounded(norm, monkeypatch):
    fwd, _ = _plans(norm)
    monkeypatch.setattr(fwd, "maxsize", 3)
    w = _weight(16, torch.float32)
    with torch.no_grad():
        for rows in range(1, 7):
            x = randn(rows, 16)
            y = norm.rms_norm(x, w, EPS)
            assert_close(y, w.double() * _rms64(x.double(), EPS), torch.float32, f"{rows} rows")
            assert len(fwd) <= 3
        kept = list(fwd)
        norm.rms_norm(x, w, EPS)  # the latest plans are the ones kept
        assert list(fwd) == kept
