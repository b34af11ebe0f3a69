"""The fused lm_head + cross-entropy on transformers 5.24 and 5.25's DeepSeek-V3-style MoE models.

5.24's ``DeepseekV3ForCausalLM.forward``, shared word for word by 20 other classes (and by
``HYV3ForCausalLM`` but for an explicit ``aux_loss=None``), is Llama's forward over an MoE base
model: it returns ``MoeCausalLMOutputWithPast`` with the router logits and adds no loss of
them. `tag_causal_lm_losses` tags it ``"MoeRouterCausalLMFusedLoss"``. Every test compares
with an untouched copy of the model: loss, every returned field, every parameter's gradient.
On the CPU the kernels run through Triton's interpreter.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from kernels.cli import main
from kernels.layer.swap import kernel_layer_of
from kernels.library import register_library_kernels, tag_causal_lm_losses
from tests.clients.transformers5.test_causal_lm_loss import (
    ALL_KERNELS,
    TINY,
    assert_same_step,
    batch,
    build,
    classes_tagged,
    kernelized,
    step,
)
from tests.clients.transformers5.test_moe_causal_lm_loss import LAYER as MOE_LAYER
from tests.clients.transformers5.test_moe_causal_lm_loss import MIXTRAL_FORWARD_CLASSES
from tests.support.tf5_models import DEVICE

LAYER = "MoeRouterCausalLMFusedLoss"
#: Tolerances for outputs of a model whose other layers run our kernels too.
_KERNEL_TOL = dict(rtol=1e-4, atol=1e-4)

#: family -> (config class, model class, extra config). DeepSeek-V3 (latent attention, grouped
#: routing with a bias), and HunYuan V3, whose forward spells out ``aux_loss=None``: the two
#: forwards the tagger knows under this name.
ROUTER_FAMILIES = {
    "deepseek_v3": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        # latent attention: as many key-value heads as heads, head sizes of its own (its
        # head_dim is the rotary part's)
        dict(
            num_key_value_heads=4,
            kv_lora_rank=16,
            q_lora_rank=16,
            head_dim=4,
            qk_rope_head_dim=4,
            qk_nope_head_dim=4,
            v_head_dim=8,
            n_routed_experts=4,
            n_shared_experts=1,
            n_group=1,
            topk_group=1,
        ),
    ),
    "hy_v3": (
        "HYV3Config",
        "HYV3ForCausalLM",
        dict(num_experts=4, num_shared_experts=1),
    ),
}

# test_causal_lm_loss's sizes; two layers: one dense, one MoE
TINY = dict(TINY, moe_intermediate_size=24, num_experts_per_tok=2, attn_implementation="sdpa")


def tiny(family: str, **config):
    config_name, model_name, extra = ROUTER_FAMILIES[family]
    return build(config_name, model_name, {**TINY, **extra, **config})


# 5.25's *ForCausalLM classes with DeepSeek-V3's forward, word for word (HYV3: aux_loss=None;
# 5.25 added Kolibri1_1 and MiniCPM5Moe to 5.24's 22).
ROUTER_FORWARD_CLASSES = {
    "AXK1ForCausalLM",
    "AXK2ForCausalLM",
    "AriaTextForCausalLM",
    "BailingHybridForCausalLM",
    "DeepseekV2ForCausalLM",
    "DeepseekV32ForCausalLM",
    "DeepseekV3ForCausalLM",
    "Dots1ForCausalLM",
    "Dots3NoteForCausalLM",
    "ExaoneMoeForCausalLM",
    "Glm4MoeForCausalLM",
    "Glm4MoeLiteForCausalLM",
    "GlmMoeDsaForCausalLM",
    "HYV3ForCausalLM",
    "HunYuanMoEV1ForCausalLM",
    "KimiLinearForCausalLM",
    "Kolibri1ForCausalLM",
    "Kolibri1_1ForCausalLM",
    "Lfm2MoeForCausalLM",
    "LongcatFlashForCausalLM",
    "MiMoV2FlashForCausalLM",
    "MiniCPM5MoeForCausalLM",
    "Mistral4ForCausalLM",
    "SolarOpenForCausalLM",
}


def test_the_classes_tagged():
    """Every class of transformers' modelling modules: exactly the 24 with DeepSeek-V3's
    forward are recognised as ``"MoeRouterCausalLMFusedLoss"``, and exactly the 20 with
    Mixtral's as ``"MoeCausalLMFusedLoss"`` (test_moe_causal_lm_loss.py's list). One test for
    both: reading the classes imports every modelling module that could define such a forward
    (`classes_tagged` says which), once a process, and pytest-xdist would otherwise give the
    two checks to two processes."""
    tagged = classes_tagged(LAYER, MOE_LAYER)
    assert tagged[LAYER] == ROUTER_FORWARD_CLASSES
    assert len(ROUTER_FORWARD_CLASSES) == 24
    assert tagged[MOE_LAYER] == MIXTRAL_FORWARD_CLASSES
    assert len(MIXTRAL_FORWARD_CLASSES) == 20


def test_a_forward_is_tagged_with_one_name(monkeypatch):
    """The DeepSeek-V3 template is Llama's with another output: were the replacement that
    derives it to stop matching, the two would be the same forward under two names."""
    from kernels.library import transformers_tags as tags

    twice = (*tags._CAUSAL_LM_FORWARDS, (LAYER, tags._LLAMA_FORWARD_5_24))
    monkeypatch.setattr(tags, "_CAUSAL_LM_FORWARDS", twice)
    tags._causal_lm_templates.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="'CausalLMFusedLoss' and 'MoeRouterCausalLMFused"):
            tags._causal_lm_templates()
    finally:
        monkeypatch.undo()
        tags._causal_lm_templates.cache_clear()


def assert_same_fields(out, expected) -> None:
    """``out`` has ``expected``'s class and fields but the logits, the same values in them
    (the loss is `assert_same_step`'s to compare)."""
    assert type(out) is type(expected)
    assert out.logits is None and expected.logits is not None
    assert list(out.keys()) == [k for k in expected if k != "logits"]
    for name in out:
        if name == "cache":
            assert type(out.cache) is type(expected.cache)
            assert out.cache.get_seq_length() == expected.cache.get_seq_length() > 0
        elif name != "loss":
            torch.testing.assert_close(out[name], expected[name], msg=name)


@pytest.mark.parametrize("router_logits", [True, False])
@pytest.mark.parametrize("family", sorted(ROUTER_FAMILIES))
def test_fused_loss_matches_the_untouched_model(clean_kernels, family, router_logits):
    model = tiny(family)
    reference = copy.deepcopy(model)
    tokens, labels, mask = batch()
    items = torch.tensor(11, device=DEVICE)
    kwargs = dict(
        attention_mask=mask,
        labels=labels,
        num_items_in_batch=items,
        output_router_logits=router_logits,  # read by the base model, from **kwargs
        output_hidden_states=True,
    )
    want = step(reference, tokens, **kwargs)

    assert tag_causal_lm_losses(model) == [type(model).__name__]
    assert tag_causal_lm_losses(model) == []  # already tagged
    kernelized(model, layers=[LAYER])  # the rest runs transformers' code: the layer's step
    assert kernel_layer_of(model).__name__ == LAYER

    got = step(model, tokens, **kwargs)
    out, expected = got[0], want[0]
    assert out.aux_loss is None and expected.aux_loss is None  # no loss of the router logits
    assert (expected.router_logits is not None) == router_logits
    assert_same_fields(out, expected)
    assert_same_step(got, want)

    # the config's default decides where the argument is not given
    model.config.output_router_logits = reference.config.output_router_logits = router_logits
    plain = step(reference, tokens, labels=labels)
    fused = step(model, tokens, labels=labels)
    assert_same_fields(fused[0], plain[0])
    assert_same_step(fused, plain)
    as_tuple = model(tokens, labels=labels, return_dict=False)
    assert len(as_tuple) == len(plain[0].to_tuple()) - 1  # all but the logits
    torch.testing.assert_close(as_tuple[0], plain[0].loss, rtol=1e-5, atol=1e-6)

    # The model's own forward where the logits are asked for: no labels, or evaluation.
    with torch.no_grad():
        free = model(tokens, output_router_logits=True)
        expected = reference(tokens, output_router_logits=True)
        assert free.loss is None and free.logits is not None
        torch.testing.assert_close(free.logits, expected.logits)
        torch.testing.assert_close(free.router_logits, expected.router_logits)
        model.eval()
        reference.eval()
        evaluated, expected = model(tokens, labels=labels), reference(tokens, labels=labels)
    assert evaluated.logits is not None
    torch.testing.assert_close(evaluated.logits, expected.logits)
    torch.testing.assert_close(evaluated.loss, expected.loss)


def test_use_kernels_after_register_library_kernels(clean_kernels):
    """``model.use_kernels = True`` kernelizes with the tagger `register_library_kernels`
    installs: the forward is tagged, the loss fused in training; logits in evaluation."""
    reference = tiny("deepseek_v3")
    model = copy.deepcopy(reference)
    tokens, labels, _ = batch()
    want = step(reference, tokens, labels=labels, output_router_logits=True)
    register_library_kernels(devices=[DEVICE])
    model.use_kernels = True
    assert type(model).kernel_layer_name == LAYER
    assert kernel_layer_of(model).__name__ == LAYER
    got = step(model, tokens, labels=labels, output_router_logits=True)
    assert got[0].logits is None
    torch.testing.assert_close(got[0].router_logits, want[0].router_logits, **_KERNEL_TOL)
    assert_same_step(got, want, **ALL_KERNELS)  # the norms and MLPs run our kernels too
    model.eval()
    reference.eval()
    with torch.no_grad():
        evaluated, expected = model(tokens, labels=labels), reference(tokens, labels=labels)
    torch.testing.assert_close(evaluated.logits, expected.logits, **_KERNEL_TOL)


def test_explain_shows_the_layer(capsys):
    assert main(["explain", "deepseek_v3", "--device", "cuda", "--capability", "90", "--json"]) == 0
    layers = {layer["layer_name"]: layer for layer in json.loads(capsys.readouterr().out)["layers"]}
    assert layers[LAYER]["outcome"] == "kernel", layers[LAYER]
    assert "CausalLMFusedLoss" not in layers  # the MoE forward's own name, not Llama's
