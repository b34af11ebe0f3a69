"""benchmarks/llama.py without a GPU: the contenders of issue 38 (built on a tiny config on the
CPU), which ones a call selects and runs without Liger-Kernel, ModuleState and build_contenders
(each contender of the interleaved benchmarks runs with the modelling-module state its set-up
left; ours and Liger both patch transformers' Llama module), and the refusal to time an
unkernelized model as ours."""

import pytest

modeling = pytest.importorskip("transformers.models.llama.modeling_llama")
from benchmarks import llama  # noqa: E402  (after the skip: it builds transformers' Llama)


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
    contenders = llama.build_contenders(makers, ["a", "b"], module_state)
    assert seen == [True, True]
    assert list(contenders) == ["a", "b"]
    assert modeling.apply_rotary_pos_emb is original
    for name, (model, state) in contenders.items():
        assert model == name
        module_state.restore(state)
        assert modeling.apply_rotary_pos_emb.contender == name


# The contenders: issue 38's list, selected by key, Liger's skipped when it is not installed.


def test_the_contenders_are_issue_38s():
    assert [(c.key, c.name, c.ours, c.compiled) for c in llama.CONTENDERS] == [
        ("eager", "eager", False, False),
        ("compile", "torch.compile", False, True),
        ("ours", "ours (kernelized)", True, False),
        ("ours-fce", "ours (kernelized, fused CE)", True, False),
        ("ours-compile", "ours (kernelized + compile, fused CE)", True, True),
        ("ours-attn", "ours (kernelized, fused CE, our attention)", True, False),
        ("ours-attn-compile", "ours (kernelized + compile, fused CE, our attention)", True, True),
        ("liger", "liger (no fused CE)", False, False),
        ("liger-compile", "liger (no fused CE) + compile", False, True),
        ("liger-flce", "liger (fused linear CE)", False, False),
        ("liger-flce-compile", "liger (fused linear CE) + compile", False, True),
    ]
    assert [c.key for c in llama.CONTENDERS if c.liger] == [
        "liger",
        "liger-compile",
        "liger-flce",
        "liger-flce-compile",
    ]
    assert list(llama.contender_makers({})) == [c.name for c in llama.CONTENDERS]


def test_ours_compiled_contender_keeps_the_fused_loss(tiny, module_state):
    """Built as a run builds them (tiny model, CPU): the compiled contenders are compiled,
    ours + compile has our fused loss, so its compiled training step holds no logits (the
    issue's ours + compile was built without it), and the attention contenders run ours."""
    from kernels.layer.swap import kernel_layer_of
    from kernels.library import untag

    state = llama.build().state_dict()
    names = [c.name for c in llama.CONTENDERS if not c.liger]
    contenders = llama.build_contenders(llama.contender_makers(state), names, module_state)
    try:
        fused_loss, attention = {}, {}
        for name, (model, _) in contenders.items():
            assert hasattr(model, "_orig_mod") == llama.BY_NAME[name].compiled, name
            model = getattr(model, "_orig_mod", model)
            fused_loss[name] = kernel_layer_of(model) is not None
            attention[name] = model.config._attn_implementation
        assert fused_loss == {
            "eager": False,
            "torch.compile": False,
            "ours (kernelized)": False,
            "ours (kernelized, fused CE)": True,
            "ours (kernelized + compile, fused CE)": True,
            "ours (kernelized, fused CE, our attention)": True,
            "ours (kernelized + compile, fused CE, our attention)": True,
        }
        ours_attention = {name for name, impl in attention.items() if impl != "sdpa"}
        assert ours_attention == {n for n in names if "our attention" in n}
        assert {attention[n] for n in ours_attention} == {"kernels_attention"}
        torch = pytest.importorskip("torch")
        model, own = contenders["ours (kernelized, fused CE)"]
        module_state.restore(own)
        tokens = torch.randint(0, 64, (2, 8))
        assert model(input_ids=tokens, labels=tokens).logits is None
    finally:
        llama.free(contenders)
        untag()
    assert contenders == {}


def test_select_contenders_by_key_in_the_benchmarks_order():
    chosen = llama.select_contenders("liger-flce,eager, ours-compile")
    assert [c.key for c in chosen] == ["eager", "ours-compile", "liger-flce"]
    assert llama.select_contenders() == list(llama.CONTENDERS)
    skipped = llama.select_contenders(None, ["compile", "liger (no fused CE)"])
    assert [c.key for c in skipped] == [
        "eager", "ours", "ours-fce", "ours-compile", "ours-attn", "ours-attn-compile",
        "liger-compile", "liger-flce", "liger-flce-compile",
    ]  # fmt: skip
    with pytest.raises(
        ValueError, match="unknown contender 'ours-eager': choose from eager, compile"
    ):
        llama.select_contenders("eager,ours-eager")
    with pytest.raises(ValueError, match="cannot skip 'liger fused'"):
        llama.select_contenders(None, ["liger fused"])


def test_without_liger_its_contenders_are_skipped_with_a_note():
    chosen = llama.select_contenders("eager,liger,liger-flce-compile")
    kept, notes = llama.runnable(chosen, liger_installed=False)
    assert [c.key for c in kept] == ["eager"]
    assert len(notes) == 2
    assert notes[0].startswith("liger (no fused CE): skipped, Liger-Kernel is not installed")
    assert "pip install liger-kernel" in notes[1] and notes[1].startswith(
        "liger (fused linear CE) +"
    )
    assert llama.runnable(chosen, liger_installed=True) == (chosen, [])


def test_ours_untouched_by_kernelize_is_refused_not_timed_as_eager(tiny):
    """A model kernelize gave nothing (transformers 5.x without this package installed leaves
    its layers untagged) must not be timed under ours' name."""
    model = llama.build()
    with pytest.raises(RuntimeError, match="kernelize left model.norm, model.layers.0.mlp"):
        llama.check_kernelized(model, fused_ce=False)
    with pytest.raises(RuntimeError, match=r"the causal-LM loss .*pip install -e \."):
        llama.check_kernelized(model, fused_ce=True)
