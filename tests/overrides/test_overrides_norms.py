"""The norms' overrides: ``nn.LayerNorm`` / ``F.layer_norm`` through the dispatcher against float64
references (odd sizes, non-contiguous inputs, several normalised dimensions, every affine
variant), gradients, and every guard's fall-through to PyTorch's kernel (bitwise PyTorch's
output). ``_fused_rms_norm`` has no CPU kernel in PyTorch, so on the CPU its overrides are called
directly (with PyTorch's CPU decomposition, or a recording stand-in, as the original kernel);
test_overrides_gpu.py runs them through the dispatcher."""

import inspect

import pytest
import torch
import torch.nn.functional as F

from kernels.overrides import aten_override_calls, norms, use_aten_overrides
from kernels.overrides.loading import norm_kernels
from tests.support.overrides import (
    DEVICE,
    DISPATCH_KEY,
    DTYPES,
    RecordingKernel,
    assert_bitwise,
    assert_close,
    grads,
    paths,
    pytorch_and_override,
    randn,
)

# (leading shape, normalized_shape, layout): odd sizes, one row, several normalised dimensions,
# a row-strided slice and a transpose (no row-contiguous view).
LAYER_NORM_CASES = [
    ((3, 5), (37,), None),
    ((1,), (130,), None),
    ((4,), (3, 9), None),
    ((2, 3), (40,), "slice"),
    ((6,), (24,), "transpose"),
]
AFFINE = {"weight+bias": (True, True), "weight": (True, False), "none": (False, False)}


def _input(lead, normalized_shape, layout, dtype):
    # A mean far from zero next to the spread: the variance must be computed centred.
    if layout == "slice":
        (n,) = normalized_shape
        x = randn(*lead, n + 6, dtype=dtype, scale=2.0, shift=3.0)[..., 3 : 3 + n]
    elif layout == "transpose":
        (n,) = normalized_shape
        x = randn(n, *lead, dtype=dtype, scale=2.0, shift=3.0).t()
    else:
        x = randn(*lead, *normalized_shape, dtype=dtype, scale=2.0, shift=3.0)
    return x.requires_grad_()


@pytest.mark.parametrize("affine", sorted(AFFINE))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lead,normalized_shape,layout", LAYER_NORM_CASES)
def test_layer_norm_against_float64(lead, normalized_shape, layout, dtype, affine):
    has_weight, has_bias = AFFINE[affine]
    module = torch.nn.LayerNorm(normalized_shape, elementwise_affine=has_weight, bias=has_bias)
    module = module.to(device=DEVICE, dtype=dtype)
    with torch.no_grad():
        for p, shift in ((module.weight, 1.0), (module.bias, 0.0)):
            if p is not None:
                p.copy_(randn(*normalized_shape, dtype=dtype, scale=0.2, shift=shift))
    params = [p for p in (module.weight, module.bias) if p is not None]
    x = _input(lead, normalized_shape, layout, dtype)
    dy = randn(*x.shape, dtype=dtype)
    with use_aten_overrides(ops=["layer_norm"]):
        y = module(x)
        got = grads(y, (x, *params), dy)
    assert paths("native_layer_norm") == {"ours": 1}
    assert paths("native_layer_norm_backward") == {"ours": 1}
    assert y.dtype == dtype and y.shape == x.shape

    x64 = x.detach().double().requires_grad_()
    p64 = [p.detach().double().requires_grad_() for p in params]
    w64 = p64[0] if has_weight else None
    b64 = p64[-1] if has_bias else None
    y64 = F.layer_norm(x64, normalized_shape, w64, b64, module.eps)
    want = grads(y64, (x64, *p64), dy.double())
    assert_close(y, y64, dtype, "forward")
    for name, g, w in zip(("input", "weight", "bias"), got, want, strict=False):
        assert_close(g, w, dtype, f"{name} gradient")


def test_layer_norm_statistics_have_pytorchs_layout():
    x = randn(2, 3, 4, 8)
    with use_aten_overrides(ops=["layer_norm"]):
        ours = torch.ops.aten.native_layer_norm(x, [4, 8], None, None, 1e-5)
    pytorch = torch.ops.aten.native_layer_norm(x, [4, 8], None, None, 1e-5)
    assert paths("native_layer_norm") == {"ours": 1}
    for o, p in zip(ours, pytorch, strict=True):
        assert (o.shape, o.dtype, o.stride()) == (p.shape, p.dtype, p.stride())
        torch.testing.assert_close(o, p, rtol=1e-5, atol=1e-5)
    assert ours[1].shape == (2, 3, 1, 1)


def test_layer_norm_backward_returns_none_where_not_asked():
    x = randn(5, 16).requires_grad_()
    w = randn(16, shift=1.0)  # frozen weight: no weight gradient
    b = randn(16).requires_grad_()
    with use_aten_overrides(ops=["layer_norm"]):
        y = F.layer_norm(x, (16,), w, b)
        dx, db = torch.autograd.grad(y.square().sum(), (x, b))
    assert paths("native_layer_norm_backward") == {"ours": 1}
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    y64 = F.layer_norm(x64, (16,), w64, b64)
    dx64, db64 = torch.autograd.grad(y64.square().sum(), (x64, b64))
    assert_close(dx, dx64, torch.float32, "input gradient")
    assert_close(db, db64, torch.float32, "bias gradient")


# Each guard of the layer norm overrides: the call runs PyTorch's kernel, bitwise.
LAYER_NORM_FALL_THROUGHS = {
    "dtype float64": lambda: (randn(4, 8, dtype=torch.float64), [8], None, None),
    "empty input": lambda: (randn(0, 8), [8], randn(8), randn(8)),
}


@pytest.mark.parametrize("reason", sorted(LAYER_NORM_FALL_THROUGHS))
def test_layer_norm_falls_through(reason):
    args = LAYER_NORM_FALL_THROUGHS[reason]()

    def call():
        return torch.ops.aten.native_layer_norm(*args, 1e-5)

    reference, overridden = pytorch_and_override(call, ["layer_norm"])
    assert_bitwise(reference, overridden)
    assert paths("native_layer_norm") == {reason: 1}


@pytest.mark.parametrize(
    "reason,weight,bias,match",
    [
        ("weight dtype float16", randn(8, dtype=torch.float16), None, "(?i)type"),
        ("bias dtype float64", randn(8), randn(8, dtype=torch.float64), "(?i)type"),
        ("weight shape", randn(9), None, "(?i)shape|size"),
    ],
)
def test_inputs_pytorch_rejects_get_pytorchs_error(reason, weight, bias, match):
    x = randn(4, 8)
    with use_aten_overrides(ops=["layer_norm"]):
        with pytest.raises(RuntimeError, match=match):
            torch.ops.aten.native_layer_norm(x, [8], weight, bias, 1e-5)
    assert paths("native_layer_norm") == {reason: 1}


def test_layer_norm_backward_falls_through_for_float64_and_stats_of_another_layout():
    x, w, b = randn(4, 8, dtype=torch.float64), randn(8, dtype=torch.float64), None
    dy = randn(4, 8, dtype=torch.float64)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [8], w, b, 1e-5)

    def backward():
        return torch.ops.aten.native_layer_norm_backward(
            dy, x, [8], mean, rstd, w, b, [True, True, False]
        )

    reference, overridden = pytorch_and_override(backward, ["layer_norm"])
    assert_bitwise(reference, overridden)
    assert paths("native_layer_norm_backward") == {"dtype float64": 1}


@pytest.mark.parametrize(
    "reason,change",
    [
        ("mean layout", lambda a: {**a, "mean": a["mean"][:2]}),  # two values for four rows
        ("rstd layout", lambda a: {**a, "rstd": a["rstd"].double()}),
        ("output_mask", lambda a: {**a, "mask": [True, True, True]}),  # a bias gradient, no bias
        ("grad shape", lambda a: {**a, "dy": a["dy"][:1]}),
        ("grad dtype bfloat16", lambda a: {**a, "dy": a["dy"].bfloat16()}),
    ],
)
def test_layer_norm_backward_hands_what_it_does_not_take_to_pytorch(reason, change):
    # Statistics PyTorch's kernels did not make, or a gradient asked for that it cannot give:
    # handed on untouched (PyTorch's kernel validates them, or not: its business).
    x = randn(4, 8)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [8], randn(8), None, 1e-5)
    a = change({"dy": randn(4, 8), "mean": mean, "rstd": rstd, "mask": [True, True, False]})
    original = RecordingKernel()
    args = (a["dy"], x, [8], a["mean"], a["rstd"], randn(8), None, a["mask"])
    got = norms.native_layer_norm_backward(norm_kernels(), original, KEYSET, *args)
    assert got == "pytorch"
    assert all(c is g for c, g in zip(original.calls[0][0], args, strict=True))
    assert paths("native_layer_norm_backward") == {reason: 1}


def test_layer_norm_fall_through_keeps_gradients_flowing():
    # float64 through the whole of nn.LayerNorm, forward and backward: PyTorch's kernels, bitwise.
    module = torch.nn.LayerNorm(12).to(DEVICE, torch.float64)
    x = randn(3, 12, dtype=torch.float64).requires_grad_()

    def step():
        y = module(x)
        return (y, *torch.autograd.grad(y.sum(), (x, module.weight, module.bias)))

    reference, overridden = pytorch_and_override(step, ["layer_norm"])
    assert_bitwise(reference, overridden)
    assert aten_override_calls() == {
        ("native_layer_norm", "dtype float64"): 1,
        ("native_layer_norm_backward", "dtype float64"): 1,
    }


# ---- RMSNorm: the override functions, called directly on the CPU -----------------------------

KEYSET = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, DISPATCH_KEY))
EPS = 1e-6


def _rms64(x64, w64, eps):
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w64


def _rms_original():
    # PyTorch's kernel for this device: its CUDA kernel, or its decomposition on the CPU.
    return torch.library.get_kernel("aten::_fused_rms_norm", DISPATCH_KEY)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lead,hidden,layout", [((3, 5), 37, None), ((4,), 130, "slice")])
def test_rms_norm_override_functions_against_float64(lead, hidden, layout, dtype):
    kernels = norm_kernels()
    x = randn(*lead, hidden + 4, dtype=dtype, scale=2.0, shift=0.5)
    x = x[..., 2 : 2 + hidden] if layout == "slice" else x[..., :hidden].contiguous()
    w = randn(hidden, dtype=dtype, scale=0.2, shift=1.0)
    y, rstd = norms.fused_rms_norm(kernels, _rms_original(), KEYSET, x, [hidden], w, EPS)
    assert (y.dtype, rstd.dtype, rstd.shape) == (dtype, torch.float32, (*lead, 1))
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    y64 = _rms64(x64, w64, EPS)
    assert_close(y, y64, dtype, "forward")
    assert_close(rstd, torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS), torch.float32, "rstd")

    dy = randn(*x.shape, dtype=dtype)
    dx, dw = norms.fused_rms_norm_backward(
        kernels, RecordingKernel(), KEYSET, dy, x, [hidden], rstd, w, [True, True]
    )
    dx64, dw64 = torch.autograd.grad(y64, (x64, w64), dy.double())
    assert_close(dx, dx64, dtype, "input gradient")
    assert_close(dw, dw64, dtype, "weight gradient")
    dx_only = norms.fused_rms_norm_backward(
        kernels, RecordingKernel(), KEYSET, dy, x, [hidden], rstd, w, [True, False]
    )
    assert dx_only[1] is None and torch.equal(dx_only[0], dx)
    assert paths("_fused_rms_norm") == {"ours": 1}
    assert paths("_fused_rms_norm_backward") == {"ours": 2}


def test_rms_norm_default_eps_is_fp32_machine_epsilon():
    # PyTorch's kernels add fp32's epsilon for eps=None, whatever the input's dtype (torch 2.11,
    # H100; and its CPU decomposition): tiny inputs make the difference visible.
    x = randn(4, 64, dtype=torch.bfloat16, scale=1e-3)
    w = torch.ones(64, dtype=torch.bfloat16, device=DEVICE)
    _, rstd = norms.fused_rms_norm(norm_kernels(), _rms_original(), KEYSET, x, [64], w, None)
    _, pytorch_rstd = torch.ops.aten._fused_rms_norm(x, [64], w, None)
    torch.testing.assert_close(rstd, pytorch_rstd, rtol=1e-5, atol=0)


RMS_FALL_THROUGHS = {
    "dtype float64": lambda: (randn(4, 8, dtype=torch.float64), [8], randn(8, dtype=torch.float64)),
    "empty input": lambda: (randn(0, 8), [8], randn(8)),
    "normalized over several dimensions": lambda: (randn(4, 2, 8), [2, 8], randn(2, 8)),
    "no weight": lambda: (randn(4, 8), [8], None),
}


@pytest.mark.parametrize("reason", sorted(RMS_FALL_THROUGHS))
def test_rms_norm_falls_through(reason):
    x, normalized_shape, w = RMS_FALL_THROUGHS[reason]()
    original = _rms_original()
    got = norms.fused_rms_norm(norm_kernels(), original, KEYSET, x, normalized_shape, w, EPS)
    assert_bitwise(original.call_boxed(KEYSET, x, normalized_shape, w, EPS), got)
    assert paths("_fused_rms_norm") == {reason: 1}


@pytest.mark.parametrize(
    "reason,change",
    [
        ("dtype float64", lambda a: {**a, "x": a["x"].double(), "dy": a["dy"].double()}),
        ("grad dtype float16", lambda a: {**a, "dy": a["dy"].half()}),
        ("grad shape", lambda a: {**a, "dy": a["dy"][:1]}),
        ("rstd layout", lambda a: {**a, "rstd": a["rstd"][:2]}),
        ("no weight", lambda a: {**a, "w": None}),
        ("weight dtype float16", lambda a: {**a, "w": a["w"].half()}),
    ],
)
def test_rms_norm_backward_falls_through(reason, change):
    x = randn(4, 8)
    args = change({"x": x, "dy": randn(4, 8), "rstd": randn(4, 1), "w": randn(8)})
    original = RecordingKernel()
    got = norms.fused_rms_norm_backward(
        norm_kernels(), original, KEYSET, args["dy"], args["x"], [8], args["rstd"], args["w"],
        [True, True],
    )  # fmt: skip
    assert got == "pytorch" and len(original.calls) == 1
    # PyTorch's kernel gets the call's arguments, untouched.
    called = original.calls[0][0]
    assert called[0] is args["dy"] and called[1] is args["x"] and called[3] is args["rstd"]
    assert paths("_fused_rms_norm_backward") == {reason: 1}


def test_the_library_launchers_keep_the_signatures_the_overrides_call():
    # The overrides pass these arguments by position (kernels/overrides/loading.py); later ones
    # must have defaults.
    kernels = norm_kernels()
    expected = {
        kernels.layer_norm_forward: ["x", "normalized_shape", "weight", "bias", "eps"],
        kernels.layer_norm_backward: [
            "dy", "x", "normalized_shape", "weight", "mean", "rstd", "compute_dw", "compute_db",
            "db_dtype",
        ],
        kernels.rms_norm_forward: ["x", "residual", "weight", "eps", "mode"],
        kernels.rms_norm_backward: ["dy", "dsum", "x", "weight", "rstd", "mode", "compute_dw"],
    }  # fmt: skip
    for fn, names in expected.items():
        parameters = list(inspect.signature(fn).parameters.values())
        assert [p.name for p in parameters[: len(names)]] == names, fn
        assert all(p.default is not inspect.Parameter.empty for p in parameters[len(names) :]), fn
