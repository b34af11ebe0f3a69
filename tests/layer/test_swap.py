"""kernels.layer.swap: where a kernel's forward is bound; the module comes back as it was."""

from __future__ import annotations

import copy
import functools
import io
import logging
import pickle

import pytest
import torch
import torch.nn as nn

from kernels.layer.own_forward import own_forward
from kernels.layer.swap import kernel_layer_of, use_kernel_forward, use_original_forward


class Doubling(nn.Module):
    def forward(self, x):
        return x * 2


class FallingBack(nn.Module):
    """A kernel that runs the layer's own forward for inputs it does not take (as our loss
    layers do): it must see the layer's forward there, not itself."""

    def forward(self, x):
        if x.dtype == torch.float64:
            return type(self).forward(self, x)
        return x * 3


def renaming(forward):
    """A decorator as our loss layers' (functools.wraps): the fallback is in what it wraps."""

    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        return forward(self, *args, **kwargs)

    return wrapper


class WrappedFallingBack(nn.Module):
    @renaming
    def forward(self, x):
        if x.dtype == torch.float64:
            return type(self).forward(self, x)
        return x * 3


X = torch.tensor([[1.0, -1.0]])


def test_a_kernel_is_bound_on_a_class_of_the_instances_own():
    relu, other = nn.ReLU(), nn.ReLU()
    use_kernel_forward(relu, Doubling, path="relu")
    assert "forward" not in vars(relu)
    assert isinstance(relu, nn.ReLU) and type(relu) is not nn.ReLU
    assert (type(relu).__name__, type(relu).__qualname__, type(relu).__module__) == (
        "ReLU",
        "ReLU",
        nn.ReLU.__module__,
    )
    assert repr(relu) == "ReLU()"
    assert kernel_layer_of(relu) is Doubling and kernel_layer_of(other) is None
    assert torch.equal(relu(X), X * 2) and torch.equal(relu.forward(X), X * 2)
    assert torch.equal(other(X), torch.relu(X))
    assert own_forward(relu) is nn.ReLU.forward
    # One class per (class, kernel): every instance shares it, and so does a compiled guard.
    use_kernel_forward(other, Doubling, path="other")
    assert type(other) is type(relu)

    use_original_forward(relu)
    assert type(relu) is nn.ReLU and vars(relu).keys() == vars(nn.ReLU()).keys()
    assert kernel_layer_of(relu) is None and torch.equal(relu(X), torch.relu(X))


@pytest.mark.parametrize("kernel", [FallingBack, WrappedFallingBack])
def test_a_kernel_that_reaches_for_the_layers_forward_is_bound_on_the_instance(kernel):
    relu = nn.ReLU()
    use_kernel_forward(relu, kernel, path="relu")
    assert type(relu) is nn.ReLU and "forward" in vars(relu)
    assert kernel_layer_of(relu) is kernel
    assert torch.equal(relu(X), X * 3)
    assert torch.equal(relu(X.double()), torch.relu(X.double()))  # the layer's own, no recursion
    use_original_forward(relu)
    assert "forward" not in vars(relu) and type(relu) is nn.ReLU


def test_switching_kernels_moves_between_the_two_bindings():
    relu = nn.ReLU()
    use_kernel_forward(relu, Doubling, path="relu")
    use_kernel_forward(relu, FallingBack, path="relu")
    assert type(relu) is nn.ReLU and kernel_layer_of(relu) is FallingBack
    use_kernel_forward(relu, Doubling, path="relu")
    assert "forward" not in vars(relu) and kernel_layer_of(relu) is Doubling
    assert torch.equal(relu(X), X * 2)


def test_a_forward_someone_set_on_the_instance_is_replaced_on_the_instance(caplog):
    relu = nn.ReLU()
    relu.forward = lambda x: x - 1  # as hook libraries do
    with caplog.at_level(logging.WARNING, logger="kernels"):
        use_kernel_forward(relu, Doubling, path="hooked")
    assert "hooked had a forward set on the instance" in caplog.text
    assert type(relu) is nn.ReLU and kernel_layer_of(relu) is Doubling
    assert torch.equal(relu(X), X * 2)


def test_a_class_made_over_ours_is_kept_when_the_kernel_goes():
    """FSDP2's fully_shard makes a class over the module's (FSDP<Name>): after kernelize, that
    class derives from ours; undoing the kernel keeps it and runs the layer's own forward."""
    relu = nn.ReLU()
    use_kernel_forward(relu, Doubling, path="relu")
    wrapped = type(f"Wrapped{type(relu).__name__}", (type(relu),), {})
    relu.__class__ = wrapped
    assert kernel_layer_of(relu) is Doubling and torch.equal(relu(X), X * 2)
    duplicate = copy.deepcopy(relu)
    assert type(duplicate) is wrapped and torch.equal(duplicate(X), X * 2)
    use_original_forward(relu)
    assert type(relu) is wrapped and kernel_layer_of(relu) is None
    assert torch.equal(relu(X), torch.relu(X))


def test_a_deep_copy_and_a_pickle_in_this_process_run_the_kernel():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    use_kernel_forward(model[1], Doubling, path="1")
    duplicate = copy.deepcopy(model)
    assert type(duplicate[1]) is type(model[1]) and kernel_layer_of(duplicate[1]) is Doubling
    assert duplicate[0] is not model[0] and torch.equal(duplicate[0].weight, model[0].weight)
    assert kernel_layer_of(model[1]) is Doubling  # the original keeps its kernel

    # Pickled as nn.ReLU with a reference to the kernel, which is loaded here (kernels 0.19:
    # a pickled kernelized model still reports, and now also runs, its kernel).
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert isinstance(loaded[1], nn.ReLU) and kernel_layer_of(loaded[1]) is Doubling
    assert torch.equal(loaded[1](X), Doubling.forward(loaded[1], X))
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        again = pickle.loads(pickle.dumps(model, protocol=protocol))
        assert isinstance(again[1], nn.ReLU) and kernel_layer_of(again[1]) is Doubling
        assert torch.equal(again[0].weight, model[0].weight)


def test_a_pickle_whose_kernel_is_not_loaded_runs_the_original_forward(caplog):
    # A kernel from a package this process has not loaded (a Hub kernel, in a fresh process).
    Elsewhere = type("Elsewhere", (nn.Module,), {"forward": Doubling.forward})
    Elsewhere.__module__ = "kernels_test_package_that_is_not_loaded"
    layer = nn.ReLU()
    use_kernel_forward(layer, Elsewhere, path="")
    layer.__dict__["_kernel_repo"] = "some repository"
    with caplog.at_level(logging.INFO, logger="kernels"):
        again = pickle.loads(pickle.dumps(layer))
    assert type(again) is nn.ReLU and kernel_layer_of(again) is None
    assert "_kernel_repo" not in vars(again)  # it does not claim a kernel it does not run
    assert torch.equal(again(X), torch.relu(X))
    assert "runs its own forward until kernelized again" in caplog.text


def _guard_lines(model: nn.Module, caplog) -> str:
    torch._dynamo.reset()
    torch._logging.set_logs(guards=True)
    try:
        with caplog.at_level(logging.DEBUG, logger="torch._dynamo"):
            torch.compile(model, backend="eager", fullgraph=True)(X)
    finally:
        torch._logging.set_logs()
        torch._dynamo.reset()
    return caplog.text


@pytest.mark.parametrize("kernel", [Doubling, FallingBack], ids=["class", "instance"])
def test_compiled_code_guards_an_instance_bound_forward_in_python(kernel, caplog):
    """What binding on a class is for: torch.compile checks an instance's bound forward with
    Python guards of its own at every call; the class's forward, by the class's identity."""
    model = nn.Sequential(nn.ReLU(), nn.ReLU())
    for index, module in enumerate(model):
        use_kernel_forward(module, kernel, path=str(index))
    guards = _guard_lines(model, caplog)
    assert "TYPE_MATCH" in guards or "ID_MATCH" in guards  # the guards were logged
    assert ("forward.__self__" in guards) == (kernel is FallingBack)
