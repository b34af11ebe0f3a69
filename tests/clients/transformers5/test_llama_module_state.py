"""benchmarks/llama.py on transformers 5.x: the module state each contender's set-up leaves, and
the rotary kernel, which kernels 0.19 gives each model's layers rather than the process."""

from benchmarks import llama
from kernels import Mode, kernelize, library_mapping, use_kernel_mapping
from kernels.layer.swap import kernel_layer_of
from tests.support.tf5_models import DEVICE, make_model


def test_a_kernelized_rotary_belongs_to_its_model_not_to_the_module_state(clean_kernels):
    """Since kernels 0.19 kernelize gives each attention layer's own copy of the rotary
    function module its kernel, not the modelling module's global: contenders built as models
    of their own share no rotary state, and putting the module state back leaves them be."""
    from transformers.models.llama import modeling_llama

    rotary = modeling_llama.apply_rotary_pos_emb  # a function module on 5.x
    state = llama.ModuleState()
    model = make_model("llama")
    with use_kernel_mapping(library_mapping(devices=[DEVICE])):
        kernelize(model, mode=Mode.TRAINING)
    copy = model.model.layers[0].self_attn._kernel_funcs["rotary_pos_emb"]
    assert kernel_layer_of(copy) is not None
    assert kernel_layer_of(rotary) is None
    assert (
        kernel_layer_of(
            make_model("llama").model.layers[0].self_attn._kernel_funcs["rotary_pos_emb"]
        )
        is None
    )
    ours = state.capture()
    state.restore()  # the state before: what eager contenders run
    assert kernel_layer_of(rotary) is None
    assert kernel_layer_of(copy) is not None
    state.restore(ours)
    assert kernel_layer_of(copy) is not None
    state.restore()
