"""The activations' overrides: ``F.silu`` and ``F.gelu`` (exact and tanh) through the dispatcher
against float64 references, gradients, and each guard's fall-through to PyTorch's kernel
(bitwise PyTorch's output, strides included)."""

import inspect

import pytest
import torch
import torch.nn.functional as F

from kernels.overrides import aten_override_calls, use_aten_overrides
from kernels.overrides.loading import activation_kernels
from tests.support.overrides import (
    DEVICE,
    DTYPES,
    assert_bitwise,
    assert_close,
    grads,
    paths,
    pytorch_and_override,
    randn,
)

ACTIVATIONS = {
    "silu": (F.silu, "silu"),
    "gelu": (F.gelu, "gelu"),
    "gelu_tanh": (lambda t: F.gelu(t, approximate="tanh"), "gelu"),
}
SHAPES = [(37,), (3, 5, 29), (2, 1025)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_against_float64(name, shape, dtype):
    fn, op = ACTIVATIONS[name]
    x = randn(*shape, dtype=dtype, scale=2.0).requires_grad_()
    dy = randn(*shape, dtype=dtype)
    with use_aten_overrides(ops=[op]):
        y = fn(x)
        (dx,) = grads(y, (x,), dy)
    assert paths(op) == {"ours": 1} and paths(f"{op}_backward") == {"ours": 1}
    x64 = x.detach().double().requires_grad_()
    y64 = fn(x64)
    (dx64,) = grads(y64, (x64,), dy.double())
    assert y.dtype == dtype and y.is_contiguous()
    # Terms of size |x| make up the output: its error is judged against the input's magnitude.
    floor = x.detach().abs().max().item()
    assert_close(y, y64, dtype, f"{name} forward", floor=floor)
    assert_close(dx, dx64, dtype, f"{name} gradient", floor=floor)


def test_nn_modules_reach_the_overrides():
    x = randn(4, 33).requires_grad_()
    with use_aten_overrides(ops=["silu", "gelu"]):
        y = torch.nn.SiLU()(x) + torch.nn.GELU()(x) + torch.nn.GELU(approximate="tanh")(x)
        y.square().sum().backward()
    assert paths("silu") == {"ours": 1} and paths("gelu") == {"ours": 2}
    assert paths("silu_backward") == {"ours": 1} and paths("gelu_backward") == {"ours": 2}


FORWARD_FALL_THROUGHS = {
    "dtype float64": lambda: randn(5, 7, dtype=torch.float64),
    "dtype int32": lambda: torch.arange(-4, 4, device=DEVICE, dtype=torch.int32),
    # A transpose: PyTorch's output keeps the input's strides, ours would be contiguous.
    "non-contiguous input": lambda: randn(7, 5).t(),
}


@pytest.mark.parametrize("reason", sorted(FORWARD_FALL_THROUGHS))
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_forward_falls_through(name, reason):
    fn, op = ACTIVATIONS[name]
    x = FORWARD_FALL_THROUGHS[reason]()
    if x.dtype == torch.int32:
        with pytest.raises(RuntimeError):  # PyTorch's own error
            fn(x)
        with use_aten_overrides(ops=[op]), pytest.raises(RuntimeError):
            fn(x)
    else:
        assert_bitwise(*pytorch_and_override(lambda: fn(x), [op]))
    assert paths(op) == {reason: 1}


def test_an_approximate_pytorch_rejects_gets_pytorchs_error():
    x = randn(6)
    with use_aten_overrides(ops="gelu"), pytest.raises(RuntimeError, match="approximate"):
        torch.ops.aten.gelu(x, approximate="sigmoid")
    with use_aten_overrides(ops="gelu"), pytest.raises(RuntimeError, match="approximate"):
        torch.ops.aten.gelu_backward(x, x, approximate="sigmoid")
    assert aten_override_calls() == {
        ("gelu", "approximate='sigmoid'"): 1,
        ("gelu_backward", "approximate='sigmoid'"): 1,
    }


BACKWARD_FALL_THROUGHS = {
    "dtype float64": lambda x, dy: (x.double(), dy.double()),
    "grad dtype bfloat16": lambda x, dy: (x, dy.bfloat16()),
    "grad shape": lambda x, dy: (x, dy[:1]),  # PyTorch broadcasts it
    "non-contiguous grad": lambda x, dy: (x, dy.t().contiguous().t()),
    "non-contiguous input": lambda x, dy: (x.t().contiguous().t(), dy),
}


@pytest.mark.parametrize("reason", sorted(BACKWARD_FALL_THROUGHS))
@pytest.mark.parametrize(
    "op,call",
    [
        ("silu_backward", lambda dy, x: torch.ops.aten.silu_backward(dy, x)),
        ("gelu_backward", lambda dy, x: torch.ops.aten.gelu_backward(dy, x, approximate="tanh")),
    ],
)
def test_backward_falls_through(op, call, reason):
    x, dy = BACKWARD_FALL_THROUGHS[reason](randn(6, 5), randn(6, 5))
    reference, overridden = pytorch_and_override(
        lambda: call(dy, x), [op.removesuffix("_backward")]
    )
    assert_bitwise(reference, overridden)
    assert paths(op) == {reason: 1}


def test_an_expanded_gradient_falls_through():
    # y.sum().backward() seeds an expanded (stride 0) gradient: PyTorch's kernel takes it.
    x = randn(4, 6).requires_grad_()
    with use_aten_overrides(ops="silu"):
        F.silu(x).sum().backward()
    assert paths("silu_backward") == {"non-contiguous grad": 1}
    torch.testing.assert_close(x.grad, torch.ops.aten.silu_backward(torch.ones_like(x), x.detach()))


def test_in_place_and_out_variants_are_left_to_pytorch():
    x = randn(3, 8)
    reference = F.silu(x.clone(), inplace=True)
    with use_aten_overrides(ops="silu"):
        y = x.clone()
        F.silu(y, inplace=True)
        out = torch.empty_like(x)
        torch.ops.aten.silu.out(x, out=out)
    assert torch.equal(y, reference) and torch.equal(out, reference)
    assert aten_override_calls() == {}


def test_the_library_launchers_keep_the_signatures_the_overrides_call():
    kernels = activation_kernels()
    assert list(inspect.signature(kernels.forward).parameters)[:2] == ["x", "act"]
    assert list(inspect.signature(kernels.backward).parameters)[:3] == ["dy", "x", "act"]
    assert len({kernels.silu, kernels.gelu, kernels.gelu_tanh}) == 3
