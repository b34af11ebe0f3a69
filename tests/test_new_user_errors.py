"""What a new user trips over first: each surprise gives a message that names the fix."""

import logging

import pytest
import torch.nn as nn

from kernels import KernelMappingError, Mode, kernelize, register_kernel_mapping
from kernels.layer.kernelize import plan


@pytest.fixture(autouse=True)
def empty_global_mapping():
    register_kernel_mapping({}, inherit_mapping=False)
    yield
    register_kernel_mapping({}, inherit_mapping=False)


class Untagged(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x)


@pytest.mark.parametrize("use_fallback", [True, False])
def test_a_model_without_tagged_layers_warns_once_and_points_to_the_docs(caplog, use_fallback):
    model = Untagged()
    with caplog.at_level(logging.DEBUG, logger="kernels"):
        assert kernelize(model, mode=Mode.INFERENCE, use_fallback=use_fallback) is model
    (warning,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    message = warning.getMessage()
    assert warning.levelno == logging.WARNING
    assert "Untagged" in message and "no tagged layer" in message
    assert "use_kernel_forward_from_hub" in message and "docs/untagged.md" in message


@pytest.mark.parametrize("entry", [kernelize, plan])
def test_a_module_class_instead_of_an_instance_is_refused_by_name(entry):
    with pytest.raises(KernelMappingError, match=r"torch\.nn\.modules\.linear\.Linear") as info:
        entry(nn.Linear, mode=Mode.INFERENCE)
    assert "Linear(...)" in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("entry", [kernelize, plan])
def test_a_non_module_is_refused_by_type(entry):
    with pytest.raises(KernelMappingError, match=r"torch\.nn\.Module instance, got dict"):
        entry({"weight": 1}, mode=Mode.INFERENCE)
