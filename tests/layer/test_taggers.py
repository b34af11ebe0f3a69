"""Taggers: functions kernelize (and explain) call with each model before planning it."""

import torch
import torch.nn as nn

from kernels import LocalLayerRepository, Mode, explain, kernelize, use_kernel_mapping
from kernels.layer.swap import kernel_layer_of
from kernels.layer.taggers import add_tagger
from kernels.layer.tagging import TAG_ATTRIBUTE, replace_kernel_forward_from_hub


class Gate(nn.Module):  # untagged by its own code
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        d = input.shape[-1] // 2
        return torch.nn.functional.silu(input[..., :d]) * input[..., d:]


def tag_gates(model):
    for module in model.modules():
        if type(module) is Gate:
            replace_kernel_forward_from_hub(Gate, "SiluAndMul")


def test_a_tagger_runs_before_kernelize_plans(kernel_repo):
    mapping = {"SiluAndMul": {"cpu": LocalLayerRepository(kernel_repo(), layer_name="SiluAndMul")}}
    model = nn.Sequential(nn.Linear(4, 8), Gate())
    remove = add_tagger(tag_gates)
    try:
        assert add_tagger(tag_gates)  # adding it again changes nothing
        with use_kernel_mapping(mapping):
            assert [layer.layer_name for layer in explain(model, mode=Mode.INFERENCE).layers] == [
                "SiluAndMul"
            ]
            kernelize(model, mode=Mode.INFERENCE)
        assert kernel_layer_of(model[1]).__name__ == "SiluAndMul"
    finally:
        remove()
        if TAG_ATTRIBUTE in vars(Gate):
            delattr(Gate, TAG_ATTRIBUTE)
    # Removed: a new model's Gate is not tagged by kernelize any more.
    other = nn.Sequential(Gate())
    with use_kernel_mapping(mapping):
        kernelize(other, mode=Mode.INFERENCE, device="cpu")
    assert kernel_layer_of(other[0]) is None
