"""The examples of Hugging Face's layer documentation, which we implement, as written, with
local kernel repositories in place of Hub ones. Each kernel adds an offset to its output, so
the assertions can tell which one ran."""

import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels import (
    CUDAProperties,
    Device,
    LocalLayerRepository,
    Mode,
    NoKernelError,
    kernelize,
    register_kernel_mapping,
    replace_kernel_forward_from_hub,
    use_kernel_forward_from_hub,
    use_kernel_mapping,
)
from kernels.layer.swap import kernel_layer_of
from kernels.mapping.capability import use_capability_reader


@use_kernel_forward_from_hub("SiluAndMul")
class SiluAndMul(nn.Module):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        d = input.shape[-1] // 2
        return F.silu(input[..., :d]) * input[..., d:]


class ExternalSiluAndMul(nn.Module):  # "from somelibrary import SiluAndMul"
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        d = input.shape[-1] // 2
        return F.silu(input[..., :d]) * input[..., d:]


def reference(x):
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


@pytest.fixture(autouse=True)
def clean_mapping():
    register_kernel_mapping({}, inherit_mapping=False)
    yield
    register_kernel_mapping({}, inherit_mapping=False)


@pytest.fixture
def repos(kernel_repo):
    """Stand-ins for the Hub repositories the documentation names."""

    def local(name, offset, **flags):
        return LocalLayerRepository(
            repo_path=kernel_repo(name, offset=offset, **flags),
            package_name="activation",
            layer_name="SiluAndMul",
        )

    return {
        "kernels-community/activation": local("activation", 1),
        "kernels-community/activation-inference-optimized": local(
            "inference", 2, can_torch_compile=False
        ),
        "kernels-community/activation-training-optimized": local(
            "training", 3, can_torch_compile=False
        ),
        "kernels-community/activation-hopper": local("hopper", 4),
    }


def offset_of(layer, x):
    return round((layer(x) - reference(x)).mean().item())


def test_decorator_and_external_layers(repos):
    replace_kernel_forward_from_hub(ExternalSiluAndMul, "SiluAndMul")
    x = torch.randn(3, 8)
    layer, external = SiluAndMul(), ExternalSiluAndMul()
    assert offset_of(layer, x) == 0  # the decorator does not change behaviour
    register_kernel_mapping({"SiluAndMul": {"cpu": repos["kernels-community/activation"]}})
    for model in (layer, external):
        kernelize(model, device="cpu", mode=Mode.INFERENCE)
        assert offset_of(model, x) == 1


def test_kernelizing_a_model_for_each_mode(repos):
    kernel_layer_mapping = {
        "SiluAndMul": {
            "cuda": repos["kernels-community/activation"],
            "rocm": repos["kernels-community/activation"],
            "cpu": repos["kernels-community/activation"],
        }
    }
    register_kernel_mapping(kernel_layer_mapping)
    x = torch.randn(2, 4)
    for mode in (
        Mode.INFERENCE,
        Mode.TRAINING,
        Mode.INFERENCE | Mode.TORCH_COMPILE,
        Mode.TRAINING | Mode.TORCH_COMPILE,
    ):
        model = nn.Sequential(nn.Linear(4, 8), SiluAndMul())
        model = kernelize(model, mode=mode)
        assert offset_of(model[1], model[0](x)) == 1


def test_kernel_device_of_a_model_without_parameters(repos):
    register_kernel_mapping({"SiluAndMul": {"cuda": repos["kernels-community/activation"]}})
    model = SiluAndMul()
    model = kernelize(model, device="cuda", mode=Mode.INFERENCE)
    assert kernel_layer_of(model) is not None


def test_fallback_forward_and_use_fallback_false(repos):
    # The inference-optimized kernel does not support torch.compile.
    register_kernel_mapping(
        {"SiluAndMul": {"cpu": repos["kernels-community/activation-inference-optimized"]}}
    )
    model = nn.Sequential(nn.Linear(4, 8), SiluAndMul())
    kernelize(model, mode=Mode.INFERENCE | Mode.TORCH_COMPILE)
    assert kernel_layer_of(model[1]) is None
    with pytest.raises(NoKernelError, match="can_torch_compile"):
        kernelize(model, mode=Mode.INFERENCE | Mode.TORCH_COMPILE, use_fallback=False)


def test_registering_and_scoping_a_mapping(repos):
    kernel_layer_mapping = {"SiluAndMul": {"cpu": repos["kernels-community/activation"]}}
    model = nn.Sequential(nn.Linear(4, 8), SiluAndMul())
    with use_kernel_mapping(kernel_layer_mapping):
        model = kernelize(model, mode=Mode.TRAINING | Mode.TORCH_COMPILE)
    assert kernel_layer_of(model[1]) is not None
    # Outside the scope the mapping is gone.
    kernelize(model, mode=Mode.TRAINING | Mode.TORCH_COMPILE)
    assert kernel_layer_of(model[1]) is None


def test_registering_kernels_for_specific_modes(repos):
    kernel_layer_mapping = {
        "SiluAndMul": {
            "cpu": {
                Mode.INFERENCE: repos["kernels-community/activation-inference-optimized"],
                Mode.TRAINING | Mode.TORCH_COMPILE: repos["kernels-community/activation"],
            }
        }
    }
    register_kernel_mapping(kernel_layer_mapping)
    layer, x = SiluAndMul(), torch.randn(2, 8)
    expected = {
        Mode.INFERENCE: 2,
        Mode.INFERENCE | Mode.TORCH_COMPILE: 1,
        Mode.TRAINING: 1,
        Mode.TRAINING | Mode.TORCH_COMPILE: 1,
    }
    for mode, offset in expected.items():
        kernelize(layer, device="cpu", mode=mode)
        assert offset_of(layer, x) == offset, mode


def test_fallback_mode_serves_the_compile_modes(repos):
    kernel_layer_mapping = {
        "SiluAndMul": {
            "cpu": {
                Mode.FALLBACK: repos["kernels-community/activation"],
                Mode.INFERENCE: repos["kernels-community/activation-inference-optimized"],
                Mode.TRAINING: repos["kernels-community/activation-training-optimized"],
            }
        }
    }
    register_kernel_mapping(kernel_layer_mapping)
    layer, x = SiluAndMul(), torch.randn(2, 8)
    expected = {
        Mode.INFERENCE: 2,
        Mode.TRAINING: 3,
        Mode.INFERENCE | Mode.TORCH_COMPILE: 1,
        Mode.TRAINING | Mode.TORCH_COMPILE: 1,
    }
    for mode, offset in expected.items():
        kernelize(layer, device="cpu", mode=mode)
        assert offset_of(layer, x) == offset, mode


@pytest.mark.parametrize(
    "capability, offset", [(75, 1), (86, 1), (89, 1), (90, 4), (100, 4), (70, 0)]
)
def test_registering_kernels_for_cuda_capabilities(repos, capability, offset):
    kernel_layer_mapping = {
        "SiluAndMul": {
            Device(
                type="cuda",
                properties=CUDAProperties(min_capability=75, max_capability=89),
            ): repos["kernels-community/activation"],
            Device(
                type="cuda",
                properties=CUDAProperties(min_capability=90, max_capability=sys.maxsize),
            ): repos["kernels-community/activation-hopper"],
        }
    }
    register_kernel_mapping(kernel_layer_mapping)
    layer = SiluAndMul()
    with use_capability_reader(lambda device_type, index: capability):
        kernelize(layer, device="cuda", mode=Mode.INFERENCE)
    assert offset_of(layer, torch.randn(2, 8)) == offset


def test_loading_from_a_local_repository_for_testing(kernel_repo):
    linear = nn.Sequential(nn.Linear(4, 8), SiluAndMul())
    with use_kernel_mapping(
        {
            "SiluAndMul": {
                "cuda": LocalLayerRepository(
                    repo_path=kernel_repo("activation", offset=7),
                    package_name="activation",
                    layer_name="SiluAndMul",
                )
            }
        },
        inherit_mapping=False,
    ):
        kernelize(linear, device="cuda", mode=Mode.INFERENCE)
    assert offset_of(linear[1], torch.randn(2, 8)) == 7
