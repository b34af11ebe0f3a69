"""Activation kernels (library/activation) against float64 references: forward and input gradient,
through the kernel layer bound to a real module and through the function API."""

import math
import types

import pytest
import torch
import torch.nn.functional as F

from tests.support.library import (
    COMPILE_BACKEND,
    DTYPES,
    ON_GPU,
    GeluAndMul,
    GeluTanhAndMul,
    SiluAndMul,
    assert_close,
    covering,
    grads,
    randn,
    transformers_activation,
)


def _new_gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


# layer name -> (function name, transformers' module class name, float64 reference)
ELEMENTWISE = {
    "SiLU": ("silu", "SiLUActivation", F.silu),
    "GeLU": ("gelu", "GELUActivation", F.gelu),
    "GeluTanh": ("gelu_tanh", "GELUTanh", lambda x: F.gelu(x, approximate="tanh")),
    "NewGELU": ("new_gelu", "NewGELUActivation", _new_gelu),
    "FastGELU": (
        "fast_gelu",
        "FastGELUActivation",
        lambda x: 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x))),
    ),
    "QuickGELU": ("quick_gelu", "QuickGELUActivation", lambda x: x * torch.sigmoid(1.702 * x)),
}

GATED = {
    "SiluAndMul": ("silu_and_mul", SiluAndMul, F.silu),
    "GeluAndMul": ("gelu_and_mul", GeluAndMul, F.gelu),
    "GeluTanhAndMul": (
        "gelu_tanh_and_mul",
        GeluTanhAndMul,
        lambda a: F.gelu(a, approximate="tanh"),
    ),
}

# (shape, how to make it non-contiguous or not); the interpreter takes small odd shapes, the
# GPU also runs model-sized ones.
SHAPES = [
    ((3, 37), None),
    ((2, 3, 65), None),
    ((0, 16), None),
    ((1000,), None),
    ((37, 6), "transpose"),
    ((4, 50), "slice"),
    pytest.param((4096, 5120), None, marks=pytest.mark.gpu),
    pytest.param((2, 1024, 11008), None, marks=pytest.mark.gpu),
    pytest.param((1, 2**31 // 8192 + 1, 8192), None, marks=pytest.mark.gpu),
]


def _input(shape, layout, dtype, scale=3.0):
    if layout == "transpose":
        x = randn(*reversed(shape), dtype=dtype, scale=scale).t()
        assert not x.is_contiguous()
    elif layout == "slice":
        x = randn(shape[0], shape[1] + 6, dtype=dtype, scale=scale)[:, 3 : 3 + shape[1]]
        assert not x.is_contiguous()
    else:
        x = randn(*shape, dtype=dtype, scale=scale)
    return x.requires_grad_()


# Every shape in fp32 (tests.support.library.covering); every activation in every dtype over
# an odd shape and rows read in place with a row stride, and in fp32 over the longest row. The
# activations share one kernel, their formula a parameter of it.
ELEMENTWISE_CASES = covering(
    SHAPES,
    options={name: name for name in sorted(ELEMENTWISE)},
    every_dtype=[((3, 37), None), ((4, 50), "slice")],
    every_option=[((1000,), None), ((37, 6), "transpose")],
)


@pytest.mark.parametrize("shape,layout,dtype,name", ELEMENTWISE_CASES)
def test_elementwise(activation, name, dtype, shape, layout):
    fn_name, module_name, ref_fn = ELEMENTWISE[name]
    module_cls = transformers_activation(module_name, ref_fn)
    if math.prod(shape) > 2**30 and (dtype != torch.bfloat16 or name != "SiLU"):
        pytest.skip("the 2**31-element case runs once, SiLU in bf16 (8.6 GB of GPU memory)")
    x = _input(shape, layout, dtype)
    module = module_cls()
    kernel_forward = types.MethodType(getattr(activation.layers, name).forward, module)
    if x.numel() > 2**30:
        # Past 2**31 elements: the int64 indexing is what this tests; check the first and last
        # rows (the float64 reference of the whole tensor would not fit beside it).
        with torch.no_grad():
            y = kernel_forward(x)
            for rows in (slice(0, 1), slice(-1, None)):
                ref = ref_fn(x[:, rows].double())
                assert_close(y[:, rows], ref, dtype, f"{name} forward rows {rows}")
        return
    y = kernel_forward(x)
    assert y.dtype == dtype and y.shape == x.shape
    x64 = x.detach().double().requires_grad_()
    y64 = ref_fn(x64)
    floor = x.detach().abs().max().item() if x.numel() else 0.0
    assert_close(y, y64, dtype, f"{name} forward", floor)
    dy = randn(*shape, dtype=dtype)
    (dx,) = grads(y, x, dy)
    (dx64,) = grads(y64, x64, dy.double())
    assert_close(dx, dx64, dtype, f"{name} grad", floor)
    # The function API computes the same thing.
    y_fn = getattr(activation, fn_name)(x.detach())
    assert torch.equal(y_fn, y.detach())


@pytest.mark.parametrize("name", sorted(GATED))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape,layout",
    [
        ((3, 74), None),
        ((2, 3, 130), None),
        ((0, 8), None),
        ((1, 2), None),
        ((5, 2000), None),
        ((4, 50), "slice"),
        ((38, 6), "transpose"),
        pytest.param((4096, 2 * 5120), None, marks=pytest.mark.gpu),
        pytest.param((3, 1000, 2 * 14336), None, marks=pytest.mark.gpu),
    ],
)
def test_gated(activation, name, dtype, shape, layout):
    fn_name, module_cls, act = GATED[name]
    x = _input(shape, layout, dtype)
    d = shape[-1] // 2
    kernel_forward = types.MethodType(getattr(activation.layers, name).forward, module_cls())
    y = kernel_forward(x)
    assert y.dtype == dtype and y.shape == (*x.shape[:-1], d)
    x64 = x.detach().double().requires_grad_()
    y64 = act(x64[..., :d]) * x64[..., d:]
    floor = x.detach().abs().max().item() ** 2 if x.numel() else 0.0  # act(a) * b
    assert_close(y, y64, dtype, f"{name} forward", floor)
    dy = randn(*y.shape, dtype=dtype)
    (dx,) = grads(y, x, dy)
    (dx64,) = grads(y64, x64, dy.double())
    assert_close(dx, dx64, dtype, f"{name} grad", floor)
    assert torch.equal(getattr(activation, fn_name)(x.detach()), y.detach())


# function name -> float64 reference of the activation, for act(gate) * up on two tensors
GATED_PAIR = {
    "silu_mul": F.silu,
    "gelu_mul": F.gelu,
    "gelu_tanh_mul": lambda a: F.gelu(a, approximate="tanh"),
}


def _pair_inputs(shape, layout, dtype, scale=3.0):
    """(leaves, split): the tensors gradients are taken for, and how gate and up come out of
    them. "halves": gate and up are the two halves of one tensor's last dimension (a fused
    gate-up projection), so their gradients meet in that tensor's."""
    if layout == "halves":
        base = randn(*shape[:-1], 2 * shape[-1], dtype=dtype, scale=scale).requires_grad_()
        d = shape[-1]
        return [base], lambda b: (b[..., :d], b[..., d:])
    if shape == ():
        gate, up = (randn(1, dtype=dtype, scale=scale).reshape(()).requires_grad_() for _ in "gu")
    elif layout == "mixed":
        gate, up = _input(shape, None, dtype, scale), _input(shape, "transpose", dtype, scale)
    else:
        gate, up = _input(shape, layout, dtype, scale), _input(shape, layout, dtype, scale)
    return [gate, up], lambda g, u: (g, u)


@pytest.mark.parametrize("fn_name", sorted(GATED_PAIR))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape,layout",
    [
        ((3, 37), None),
        ((2, 3, 65), None),
        ((0, 16), None),
        ((1000,), None),
        ((), None),
        ((4, 50), "halves"),
        ((2, 3, 24), "halves"),
        ((37, 6), "transpose"),
        ((6, 37), "mixed"),
        pytest.param((4096, 14336), "halves", marks=pytest.mark.gpu),
        pytest.param((2, 1000, 11008), None, marks=pytest.mark.gpu),
    ],
)
def test_gated_pair(activation, fn_name, dtype, shape, layout):
    act = GATED_PAIR[fn_name]
    leaves, split = _pair_inputs(shape, layout, dtype)
    gate, up = split(*leaves)
    y = getattr(activation, fn_name)(gate, up)
    assert y.dtype == dtype and y.shape == gate.shape
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    gate64, up64 = split(*leaves64)
    y64 = act(gate64) * up64
    floor = max((t.detach().abs().max().item() ** 2 for t in leaves if t.numel()), default=0.0)
    assert_close(y, y64, dtype, f"{fn_name} forward", floor)
    dy = randn(y.numel(), dtype=dtype).reshape(y.shape)
    got = grads(y, leaves, dy)
    want = grads(y64, leaves64, dy.double())
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_close(g, w, dtype, f"{fn_name} grad {i}", floor)
    with torch.no_grad():  # the launcher alone, without autograd, computes the same
        assert torch.equal(getattr(activation, fn_name)(gate, up), y.detach())


def test_gated_pair_rejects_mismatched_inputs(activation):
    with pytest.raises(ValueError, match="same shape"):
        activation.silu_mul(randn(3, 8), randn(1, 8))
    with pytest.raises(TypeError, match="one dtype"):
        activation.silu_mul(randn(3, 8), randn(3, 8, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="float64"):
        activation.silu_mul(randn(3, 8, dtype=torch.float64), randn(3, 8, dtype=torch.float64))


def test_gated_rejects_odd_width(activation):
    with pytest.raises(ValueError, match="even"):
        activation.silu_and_mul(randn(3, 7))


def test_unsupported_dtype_is_a_clear_error(activation):
    with pytest.raises(TypeError, match="float64"):
        activation.silu(randn(3, 8, dtype=torch.float64))


def test_no_grad_path_matches_autograd_path(activation):
    x = randn(5, 33, dtype=torch.bfloat16, scale=2.0)
    with torch.no_grad():
        y0 = activation.gelu_tanh(x)
    y1 = activation.gelu_tanh(x.clone().requires_grad_())
    assert torch.equal(y0, y1.detach())


@pytest.mark.skipif(not ON_GPU, reason="shape of a real model; too slow for the interpreter")
def test_large_gated_row_strided_view(activation):
    # The gate and up projections often come out of one matmul as a strided view.
    base = randn(2048, 2 * 4096 + 128, dtype=torch.bfloat16)
    x = base[:, : 2 * 4096]
    y = activation.silu_and_mul(x)
    ref = F.silu(x[..., :4096].double()) * x[..., 4096:].double()
    assert_close(y, ref, torch.bfloat16, "strided view")


def test_elementwise_under_compile_matches_the_reference(activation):
    """Under torch.compile the element-wise activations hand inductor the kernel's formula (so it
    can fuse them): forward and gradient still match the float64 reference, with no graph break.
    Every activation in one compiled function, on an input of its own: one compilation a dtype
    rather than one an activation and dtype, which were most of this test's time."""
    names = sorted(ELEMENTWISE)
    fns = [getattr(activation, ELEMENTWISE[name][0]) for name in names]
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda *xs: [fn(x) * 2.0 for fn, x in zip(fns, xs, strict=True)],
        backend=COMPILE_BACKEND,
        fullgraph=True,
    )
    for dtype in (torch.float32, torch.bfloat16):
        xs = [_input((3, 37), "slice" if dtype == torch.float32 else None, dtype) for _ in names]
        ys = compiled(*xs)
        dys = [randn(*y.shape, dtype=dtype) for y in ys]
        got = grads(ys, xs, dys)
        for name, x, y, dy, g in zip(names, xs, ys, dys, got, strict=True):
            x64 = x.detach().double().requires_grad_()
            y_ref = ELEMENTWISE[name][2](x64) * 2.0
            assert y.dtype == dtype
            assert_close(y, y_ref, dtype, f"{name} compiled forward")
            (want,) = grads(y_ref, (x64,), dy.double())
            assert_close(g, want, dtype, f"{name} compiled gradient")


def test_gated_under_compile_matches_the_reference(activation):
    """Under torch.compile the gated activations hand inductor the kernel's formula (fp32,
    rounded once) rather than the custom op: forward and gradients still match the float64
    reference, with no graph break, and their input checks still raise. Every gated function in
    one compiled function, as for the element-wise ones."""
    fn_names = sorted(GATED_PAIR) + [GATED[n][0] for n in sorted(GATED)]
    fns = [getattr(activation, fn_name) for fn_name in fn_names]
    paired = [fn_name in GATED_PAIR for fn_name in fn_names]
    arity = [2 if p else 1 for p in paired]

    def every(*leaves):
        outs, at = [], 0
        for fn, n in zip(fns, arity, strict=True):
            outs.append(fn(*leaves[at : at + n]) * 2.0)
            at += n
        return outs

    torch._dynamo.reset()
    compiled = torch.compile(every, backend=COMPILE_BACKEND, fullgraph=True)
    for dtype in (torch.float32, torch.bfloat16):
        cases = [
            _pair_inputs((3, 37), "mixed", dtype)
            if p
            else ([_input((4, 50), "slice", dtype)], lambda x: (x[..., :25], x[..., 25:]))
            for p in paired
        ]
        every_leaf = [t for leaves, _ in cases for t in leaves]
        ys = compiled(*every_leaf)
        dys = [randn(*y.shape, dtype=dtype) for y in ys]
        every_grad = list(grads(ys, every_leaf, dys))  # one backward of the compiled graph
        for fn_name, p, (leaves, split), y, dy in zip(
            fn_names, paired, cases, ys, dys, strict=True
        ):
            act = GATED_PAIR.get(fn_name) or next(a for f, _, a in GATED.values() if f == fn_name)
            assert y.dtype == dtype and y.shape == ((3, 37) if p else (4, 25))
            leaves64 = [t.detach().double().requires_grad_() for t in leaves]
            gate64, up64 = split(*leaves64)
            y64 = act(gate64) * up64 * 2.0
            floor = 2.0 * max(t.detach().abs().max().item() ** 2 for t in leaves)
            assert_close(y, y64, dtype, f"{fn_name} compiled forward", floor)
            got = [every_grad.pop(0) for _ in leaves]
            want = grads(y64, leaves64, dy.double())
            for i, (g, w) in enumerate(zip(got, want, strict=True)):
                assert_close(g, w, dtype, f"{fn_name} compiled grad {i}", floor)
    # The input checks raise while Dynamo traces, before anything is compiled.
    for fn, paired_fn in zip(fns, paired, strict=True):
        compiled = torch.compile(lambda *t, fn=fn: fn(*t) * 2.0, fullgraph=True)
        with pytest.raises(Exception, match="same shape" if paired_fn else "even"):
            compiled(randn(3, 8), randn(1, 8)) if paired_fn else compiled(randn(3, 7))
