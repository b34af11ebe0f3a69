"""benchmarks/e2e.py on transformers 5.x: the rotary function module's forward, which kernelize
sets for every model of the process, is part of each contender's module state."""

import pytest

from kernels import Mode, kernelize, library_mapping, use_kernel_mapping
from kernels.layer.swap import kernel_layer_of
from tests.support.tf5_models import DEVICE, make_model

e2e = pytest.importorskip("benchmarks.e2e")


def test_kernelized_rotary_forward_is_put_back_and_restored(clean_kernels):
    from transformers.models.llama import modeling_llama

    rotary = modeling_llama.apply_rotary_pos_emb  # a function module on 5.x
    state = e2e.ModuleState()
    with use_kernel_mapping(library_mapping(devices=[DEVICE])):
        kernelize(make_model("llama"), mode=Mode.TRAINING)
    assert kernel_layer_of(rotary) is not None
    ours = state.capture()
    state.restore()  # the state before: eager contenders run transformers' own rotary
    assert kernel_layer_of(rotary) is None
    state.restore(ours)
    assert kernel_layer_of(rotary) is not None
    state.restore()
