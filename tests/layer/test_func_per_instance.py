"""Function kernels are per instance (kernels 0.19): each layer decorated with
`use_kernelized_func` holds private copies of its functions, which kernelize swaps, which
copy and pickle with the layer, and which calls of the global function reach while the
layer's forward runs (eagerly and under torch.compile)."""

import copy
import pickle
from types import MethodType

import pytest
import torch
from torch import nn

from kernels import (
    KernelizedFunc,
    KernelizedLayers,
    Mode,
    get_kernelized_layers,
    kernelize,
    use_kernel_forward_from_hub,
    use_kernel_mapping,
    use_kernelized_func,
)
from kernels.layer.swap import kernel_layer_of


@use_kernel_forward_from_hub("offset_fn")
def offset(x: torch.Tensor) -> torch.Tensor:
    return x


@use_kernel_forward_from_hub("scale_fn")
def scale(x: torch.Tensor) -> torch.Tensor:
    return x


@use_kernelized_func(scale)
class Scaler(nn.Module):
    def forward(self, x):
        return scale(x)


@use_kernelized_func(offset)
class Wrapper(nn.Module):
    """Calls `offset`, then each inner `Scaler` (which calls `scale`), then `offset` again:
    the inner layers' routing must give the outer's back."""

    def __init__(self, inner: int = 1):
        super().__init__()
        self.inner = nn.ModuleList(Scaler() for _ in range(inner))

    def forward(self, x):
        x = offset(x)
        for layer in self.inner:
            x = layer(x)
        return offset(x)


class PlusTen(nn.Module):
    can_torch_compile = True

    def forward(self, x):
        return x + 10


class TimesTwo(nn.Module):
    can_torch_compile = True

    def forward(self, x):
        return x * 2


class Repo:
    """A repository whose load() returns a kernel layer defined here."""

    def __init__(self, kernel, layer_name):
        self.kernel, self.layer_name = kernel, layer_name

    def load(self):
        return self.kernel

    def __str__(self):
        return f"test repository of {self.kernel.__name__}"


PLUS_TEN = Repo(PlusTen, "PlusTen")
TIMES_TWO = Repo(TimesTwo, "TimesTwo")
MAPPING = {"offset_fn": {"cpu": PLUS_TEN}, "scale_fn": {"cpu": TIMES_TWO}}
X = torch.arange(3.0)


def _kernelized(model):
    with use_kernel_mapping(MAPPING, inherit_mapping=False):
        return kernelize(model, mode=Mode.INFERENCE, device="cpu")


def test_each_instance_has_its_own_copies():
    a, b = Wrapper(), Wrapper()
    assert set(a._kernel_funcs) == {"offset_fn"}
    assert a._kernel_funcs["offset_fn"] is not b._kernel_funcs["offset_fn"]
    assert a._kernel_funcs["offset_fn"] is not offset
    assert type(a._kernel_funcs["offset_fn"]) is type(offset)


def test_kernelizing_one_model_leaves_another_alone():
    kernelized, other = _kernelized(Wrapper()), Wrapper()
    # offset +10, scale *2, offset +10
    torch.testing.assert_close(kernelized(X), (X + 10) * 2 + 10)
    torch.testing.assert_close(other(X), X)
    torch.testing.assert_close(offset(X), X)  # called outside any layer: the function
    assert kernel_layer_of(offset) is None


def test_nested_layers_route_to_their_own_copies_and_restore_the_outer():
    model = Wrapper(inner=2)
    outer = model._kernel_funcs["offset_fn"]
    outer.forward = MethodType(PlusTen.forward, outer)
    for layer in model.inner:
        copy_ = layer._kernel_funcs["scale_fn"]
        copy_.forward = MethodType(TimesTwo.forward, copy_)
    torch.testing.assert_close(model(X), ((X + 10) * 2 * 2) + 10)


def test_get_kernelized_layers_lists_the_copies():
    model = _kernelized(nn.Sequential(Wrapper()))
    wrapper = model[0]
    assert get_kernelized_layers(model) == KernelizedLayers(
        funcs={
            ("0", "offset_fn"): KernelizedFunc(wrapper._kernel_funcs["offset_fn"], PLUS_TEN),
            ("0.inner.0", "scale_fn"): KernelizedFunc(
                wrapper.inner[0]._kernel_funcs["scale_fn"], TIMES_TWO
            ),
        }
    )
    with use_kernel_mapping({}, inherit_mapping=False):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    assert get_kernelized_layers(model) == KernelizedLayers()
    assert all("forward" not in vars(fn) for fn in wrapper._kernel_funcs.values())


@pytest.mark.parametrize(
    "restore",
    [copy.copy, copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))],
    ids=["copy", "deepcopy", "pickle"],
)
def test_a_copy_of_a_kernelized_function_is_independent(restore):
    model = _kernelized(Wrapper())
    original = model._kernel_funcs["offset_fn"]
    duplicate = restore(original)
    assert duplicate is not original and duplicate is not offset
    assert kernel_layer_of(duplicate) is PlusTen
    torch.testing.assert_close(duplicate(X), X + 10)
    with use_kernel_mapping({}, inherit_mapping=False):
        kernelize(nn.ModuleList([duplicate]), mode=Mode.INFERENCE, device="cpu")
    torch.testing.assert_close(duplicate(X), X)
    torch.testing.assert_close(original(X), X + 10)


@pytest.mark.parametrize(
    "restore", [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))], ids=["deepcopy", "pickle"]
)
def test_a_kernelized_model_copies_and_pickles_with_its_function_kernels(restore):
    model = _kernelized(Wrapper())
    restored = restore(model)
    assert restored._kernel_funcs["offset_fn"] is not model._kernel_funcs["offset_fn"]
    torch.testing.assert_close(restored(X), (X + 10) * 2 + 10)
    assert set(get_kernelized_layers(restored).funcs) == {
        ("", "offset_fn"),
        ("inner.0", "scale_fn"),
    }
    with use_kernel_mapping({}, inherit_mapping=False):
        kernelize(restored, mode=Mode.INFERENCE, device="cpu")
    torch.testing.assert_close(restored(X), X)
    torch.testing.assert_close(model(X), (X + 10) * 2 + 10)


def test_a_function_bound_by_hand_survives_pickling():
    model = Wrapper()
    fn = model._kernel_funcs["offset_fn"]
    fn.forward = MethodType(PlusTen.forward, fn)
    restored = pickle.loads(pickle.dumps(model))
    restored_fn = restored._kernel_funcs["offset_fn"]
    assert restored_fn.__dict__["forward"].__self__ is restored_fn
    torch.testing.assert_close(restored(X), X + 20)


def test_the_decorated_global_pickles_as_itself():
    assert pickle.loads(pickle.dumps(offset)) is offset


def test_compiled_layers_share_one_graph_per_kernel():
    layers = [Scaler() for _ in range(8)]
    for i, layer in enumerate(layers):
        copy_ = layer._kernel_funcs["scale_fn"]
        kernel = PlusTen if i % 2 else TimesTwo
        copy_.forward = MethodType(kernel.forward, copy_)
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    try:
        compiled = torch.compile(Scaler.forward, backend=backend, fullgraph=True)
        for _ in range(2):
            for i, layer in enumerate(layers):
                expected = X + 10 if i % 2 else X * 2
                torch.testing.assert_close(compiled(layer, X), expected)
    finally:
        torch._dynamo.reset()
    assert len(graphs) == 2


def test_nested_routing_under_torch_compile():
    model = _kernelized(Wrapper(inner=2))
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend="eager", fullgraph=True)
        torch.testing.assert_close(compiled(X), ((X + 10) * 2 * 2) + 10)
    finally:
        torch._dynamo.reset()


def test_falling_back_removes_a_forward_bound_on_a_copy_by_hand():
    model = Wrapper()
    fn = model._kernel_funcs["offset_fn"]
    fn.forward = MethodType(PlusTen.forward, fn)
    with use_kernel_mapping({}, inherit_mapping=False):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    assert "forward" not in vars(fn)
    torch.testing.assert_close(model(X), X)
