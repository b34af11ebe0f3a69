"""benchmarks/e2e.py's parts that run without a GPU: ModuleState and build_contenders (each
contender of the interleaved benchmark runs with the modelling-module state its set-up left;
ours and Liger both patch transformers' Llama module), and the markdown report."""

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


def _row(shape, contender, train, host=None):
    row = {
        "shape": shape, "contender": contender, "device": "GPU", "date": "2026-11-23",
        "torch": "2", "transformers": "4.57", "triton": "3", "liger_kernel": "0.7",
        "config": {}, "train_ms": train, "prefill_ms": train / 3, "train_peak_gib": 1.0,
    }  # fmt: skip
    if host is not None:
        row["train_host_ms"] = host
    return row


def test_report_gives_host_time_beside_wall_time_when_recorded():
    rows = [_row("8x512", "eager", 70.0, 45.5), _row("8x512", "ours (kernelized)", 50.0, 48.25)]
    text = e2e.markdown(rows)
    assert "| eager | 70.0 ms (1.00x) | 23.3 ms (1.00x) | 1.0 |" in text
    assert "| ours (kernelized) | 50.0 ms (1.40x) |" in text
    assert "| contender | host / wall 8x512 |" in text
    assert "| eager | 45.5 / 70.0 ms |" in text
    assert "| ours (kernelized) | 48.2 / 50.0 ms |" in text


def test_report_of_runs_without_host_time_has_no_host_table():
    text = e2e.markdown([_row("1x4096", "eager", 80.0), _row("1x4096", "ours (kernelized)", 60.0)])
    assert "host / wall" not in text
    assert "| ours (kernelized) | 60.0 ms (1.33x) |" in text
