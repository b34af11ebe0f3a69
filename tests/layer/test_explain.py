"""explain(): the kernelize plan with reasons, without touching the model."""

import sys

import pytest
import torch.nn as nn

from kernels import (
    CUDAProperties,
    Device,
    LocalLayerRepository,
    Mode,
    explain,
    register_kernel_mapping,
    use_kernel_forward_from_hub,
    use_kernel_mapping,
)
from kernels.layer.swap import kernel_layer_of
from kernels.mapping.capability import use_capability_reader


@use_kernel_forward_from_hub("SiluAndMul")
class SiluAndMul(nn.Module):
    def forward(self, input):
        return input


@use_kernel_forward_from_hub("Broken")
class Broken(nn.Module):
    def forward(self, hidden_states):  # the kernel's forward takes `input`
        return hidden_states


@use_kernel_forward_from_hub("Unmapped")
class Unmapped(nn.Module):
    def forward(self, input):
        return input


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(2, 2)
        self.acts = nn.ModuleList([SiluAndMul() for _ in range(3)])
        self.broken = Broken()
        self.unmapped = Unmapped()


@pytest.fixture(autouse=True)
def clean_mapping():
    register_kernel_mapping({}, inherit_mapping=False)
    yield
    register_kernel_mapping({}, inherit_mapping=False)


def test_explain_reports_every_outcome_and_changes_nothing(kernel_repo):
    hopper = LocalLayerRepository(kernel_repo("hopper", offset=1), layer_name="SiluAndMul")
    ampere = LocalLayerRepository(
        kernel_repo("ampere", offset=2, can_torch_compile=False), layer_name="SiluAndMul"
    )
    broken = LocalLayerRepository(kernel_repo("broken"), layer_name="SiluAndMul")
    mapping = {
        "SiluAndMul": {
            Device("cuda", CUDAProperties(90, sys.maxsize)): hopper,
            Device("cuda", CUDAProperties(80, 89)): ampere,
        },
        "Broken": {"cuda": broken},
    }
    model = Model()
    with use_kernel_mapping(mapping), use_capability_reader(lambda t, i: 86):
        report = explain(model, mode=Mode.INFERENCE | Mode.TORCH_COMPILE, device="cuda")
    assert all(kernel_layer_of(m) is None for m in model.modules())

    by_name = {layer.layer_name: layer for layer in report.layers}
    acts = by_name["SiluAndMul"]
    assert acts.paths == ("acts.0", "acts.1", "acts.2")
    assert acts.outcome == "fallback" and "does not declare can_torch_compile" in acts.reason
    assert acts.candidates[0][1] == "chosen" and "ampere" in acts.candidates[0][0]
    assert "needs capability 90..max; this device has capability 86" in acts.candidates[1][1]

    assert by_name["Broken"].outcome == "invalid"
    assert "has a forward signature that does not match" in by_name["Broken"].reason
    assert by_name["Unmapped"].reason == "no kernel is registered for layer name 'Unmapped'"

    text = str(report)
    assert text.startswith(
        "kernelize plan for mode INFERENCE | TORCH_COMPILE on cuda, capability 86:"
    )
    assert "- SiluAndMul (SiluAndMul) at acts.0 and 2 more" in text
    assert "INVALID kernel, kernelize would raise" in text


def test_explain_a_winning_kernel(kernel_repo):
    repo = LocalLayerRepository(kernel_repo("a"), layer_name="SiluAndMul")
    model = nn.Sequential(nn.Linear(2, 4), SiluAndMul())
    with use_kernel_mapping({"SiluAndMul": {"cpu": repo}}):
        report = explain(model, mode=Mode.TRAINING)
    (layer,) = report.layers
    assert layer.outcome == "kernel" and layer.paths == ("1",)
    assert layer.kernel.startswith("kernel layer SiluAndMul from local repository")
    assert "uses kernel layer SiluAndMul" in str(report)
    assert kernel_layer_of(model[1]) is None


def test_explain_a_model_without_tagged_layers():
    report = explain(nn.Linear(2, 2), mode=Mode.INFERENCE)
    assert report.layers == () and "no tagged layers" in str(report)
    assert report.device_type == "cpu" and report.capability is None


def test_explain_uses_the_same_errors_as_kernelize():
    with pytest.raises(ValueError, match="can only be used to register"):
        explain(nn.Linear(2, 2), mode=Mode.FALLBACK)
    with pytest.raises(ValueError, match="no parameters or buffers"):
        explain(SiluAndMul(), mode=Mode.INFERENCE)
