"""benchmarks/e2e.py's ModuleState: each contender of the interleaved benchmark runs with the
modelling-module state its set-up left (ours and Liger both patch transformers' Llama module)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

modeling = pytest.importorskip("transformers.models.llama.modeling_llama")
e2e = pytest.importorskip("e2e")


@pytest.fixture
def module_state():
    state = e2e.ModuleState()
    yield state
    state.restore()


def test_each_setup_gets_its_module_globals_and_class_attributes_back(module_state):
    original = modeling.apply_rotary_pos_emb

    def rope_a(*args, **kwargs):
        return original(*args, **kwargs)

    def rope_b(*args, **kwargs):
        return original(*args, **kwargs)

    modeling.apply_rotary_pos_emb = rope_a
    modeling.LlamaForCausalLM.patched_by_a = True
    state_a = module_state.capture()
    module_state.restore()
    assert modeling.apply_rotary_pos_emb is original
    assert "patched_by_a" not in vars(modeling.LlamaForCausalLM)

    modeling.apply_rotary_pos_emb = rope_b
    state_b = module_state.capture()
    module_state.restore(state_a)
    assert modeling.apply_rotary_pos_emb is rope_a
    assert modeling.LlamaForCausalLM.patched_by_a is True
    module_state.restore(state_b)
    assert modeling.apply_rotary_pos_emb is rope_b
    assert "patched_by_a" not in vars(modeling.LlamaForCausalLM)


def test_attributes_set_at_run_time_are_left_alone(module_state):
    state = module_state.capture()
    modeling.LlamaModel.set_while_running = 1  # e.g. a lazily filled class cache
    try:
        module_state.restore(state)
        assert modeling.LlamaModel.set_while_running == 1
    finally:
        del modeling.LlamaModel.set_while_running


def test_build_contenders_builds_each_from_a_clean_module_and_keeps_its_state(module_state):
    original = modeling.apply_rotary_pos_emb
    seen = []

    def patching_maker(name):
        def make():
            # Each set-up must start from transformers' own function, not another's patch.
            seen.append(modeling.apply_rotary_pos_emb is original)

            def rope(*args, **kwargs):
                return original(*args, **kwargs)

            rope.contender = name
            modeling.apply_rotary_pos_emb = rope
            return name

        return make

    makers = {"a": patching_maker("a"), "b": patching_maker("b"), "unused": None}
    contenders = e2e.build_contenders(makers, ["a", "b"], module_state)
    assert seen == [True, True]
    assert list(contenders) == ["a", "b"]
    assert modeling.apply_rotary_pos_emb is original
    for name, (model, state) in contenders.items():
        assert model == name
        module_state.restore(state)
        assert modeling.apply_rotary_pos_emb.contender == name
