"""The layer API that Hugging Face's kernels 0.19 adds: get_kernelized_layers, conditions on
replace_kernel_forward_from_hub, the kernel_condition attribute, tpu, the deprecation of
use_kernel_func_from_hub."""

import logging
import pickle

import pytest
import torch
from torch import nn

import kernels
from kernels import (
    Device,
    KernelizedLayer,
    KernelizedLayers,
    Mode,
    get_kernelized_layers,
    kernelize,
    replace_kernel_forward_from_hub,
    use_kernel_forward_from_hub,
    use_kernel_func_from_hub,
    use_kernel_mapping,
)
from kernels.layer.swap import kernel_layer_of


class AddOne(nn.Module):
    can_torch_compile = True

    def forward(self, x):
        return x + 1


class Repo:
    layer_name = "AddOne"

    def load(self):
        return AddOne

    def __eq__(self, other):
        return isinstance(other, Repo)

    def __hash__(self):
        return 1


@use_kernel_forward_from_hub("Identity019")
class Identity(nn.Module):
    def forward(self, x):
        return x


MAPPING = {"Identity019": {"cpu": Repo()}}


def test_the_019_names_are_public():
    for name in ("KernelizedFunc", "KernelizedLayer", "KernelizedLayers", "get_kernelized_layers"):
        assert name in kernels.__all__ and getattr(kernels, name).__doc__


def test_get_kernelized_layers_names_each_kernelized_module_and_its_repository():
    model = nn.Sequential(nn.Linear(2, 2), Identity(), nn.Sequential(Identity()))
    with use_kernel_mapping(MAPPING, inherit_mapping=False):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    assert get_kernelized_layers(model) == KernelizedLayers(
        layers={"1": KernelizedLayer(model[1], Repo()), "2.0": KernelizedLayer(model[2][0], Repo())}
    )
    with use_kernel_mapping({}, inherit_mapping=False):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")  # back to their own forwards
    assert get_kernelized_layers(model) == KernelizedLayers()


def test_a_pickled_kernelized_model_still_reports_and_runs_its_kernel():
    model = nn.Sequential(Identity())
    with use_kernel_mapping(MAPPING, inherit_mapping=False):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    restored = pickle.loads(pickle.dumps(model))
    assert get_kernelized_layers(restored) == KernelizedLayers(
        layers={"0": KernelizedLayer(restored[0], Repo())}
    )
    torch.testing.assert_close(restored(torch.zeros(2)), torch.ones(2))


def test_replace_kernel_forward_from_hub_takes_a_condition(caplog):
    class Norm(nn.Module):
        def __init__(self, wide):
            super().__init__()
            self.wide = wide

        def forward(self, x):
            return x

    replace_kernel_forward_from_hub(Norm, "Identity019", condition=lambda module: module.wide)
    narrow, wide = Norm(False), Norm(True)
    with (
        use_kernel_mapping(MAPPING, inherit_mapping=False),
        caplog.at_level(logging.INFO, logger="kernels"),
    ):
        kernelize(nn.Sequential(narrow, wide), mode=Mode.INFERENCE, device="cpu")
    assert kernel_layer_of(narrow) is None and kernel_layer_of(wide) is AddOne
    assert (
        "Skipping kernelization for `Norm` using `Identity019` due to kernel_condition"
        in caplog.text
    )


def test_kernel_condition_defaults_to_one_that_holds():
    layer = Identity()
    assert Identity.kernel_condition(layer) is True
    assert layer.kernel_condition(layer) is True  # a staticmethod: not bound to the instance


def test_tpu_and_neuron_are_device_types():
    for device_type in ("tpu", "neuron"):
        assert Device(type=device_type).type == device_type
        layer = Identity()
        with use_kernel_mapping({"Identity019": {device_type: Repo()}}, inherit_mapping=False):
            kernelize(layer, mode=Mode.INFERENCE, device=device_type)
        assert kernel_layer_of(layer) is AddOne


def test_use_kernel_func_from_hub_logs_its_deprecation(caplog):
    with caplog.at_level(logging.WARNING):

        @use_kernel_func_from_hub("deprecated_019")
        def deprecated(x):
            return x

    assert "use_kernel_func_from_hub is deprecated and will be removed in kernels 0.17" in (
        caplog.text
    )
    assert type(deprecated).kernel_layer_name == "deprecated_019"


def test_their_no_layer_message_with_use_fallback_false():
    with use_kernel_mapping({}, inherit_mapping=False):
        with pytest.raises(ValueError, match="No layer mapping for `Identity019`"):
            kernelize(Identity(), mode=Mode.INFERENCE, device="cpu", use_fallback=False)
