"""The fused lm_head + cross-entropy on transformers 5.24's MoE ``*ForCausalLM`` models.

5.24's ``MixtralForCausalLM.forward``, shared word for word by 19 other MoE classes, adds
``router_aux_loss_coef`` times the router's load-balancing loss to the cross-entropy and
returns ``aux_loss`` and ``router_logits``; `tag_causal_lm_losses` tags it
``"MoeCausalLMFusedLoss"``. Every test compares with an untouched copy of the model: loss,
aux loss, every parameter's gradient. On the CPU the kernels run through Triton's interpreter.
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

from kernels.layer.swap import kernel_layer_of
from kernels.library import tag_causal_lm_losses
from kernels.library.transformers_tags import _causal_lm_layer
from tests.clients.transformers5.test_causal_lm_loss import (
    IGNORE,
    TINY,
    assert_same_step,
    batch,
    build,
    kernelized,
    step,
)
from tests.support.tf5_models import DEVICE

LAYER = "MoeCausalLMFusedLoss"

#: family -> (config class, model class, extra config)
MOE_FAMILIES = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4}),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {"num_experts": 4, "moe_intermediate_size": 24, "decoder_sparse_step": 1},
    ),
}

# test_causal_lm_loss's sizes
TINY = dict(
    TINY,
    num_experts_per_tok=2,
    router_aux_loss_coef=0.5,  # large enough that the aux loss shows in the loss
    attn_implementation="sdpa",
)


def tiny(family: str, **config):
    config_name, model_name, extra = MOE_FAMILIES[family]
    return build(config_name, model_name, {**TINY, **extra, **config})


# 5.24's MoE *ForCausalLM classes whose forward is MixtralForCausalLM's, word for word.
MIXTRAL_FORWARD_CLASSES = {
    "DeepseekV4ForCausalLM",
    "Ernie4_5_MoeForCausalLM",
    "FlexOlmoForCausalLM",
    "FlintForCausalLM",
    "GptOssForCausalLM",
    "JambaForCausalLM",
    "LagunaForCausalLM",
    "LaraMiniForCausalLM",
    "MellumForCausalLM",
    "MiniMaxForCausalLM",
    "MiniMaxM2ForCausalLM",
    "MiniMaxM3VLForCausalLM",
    "MixtralForCausalLM",
    "OlmoeForCausalLM",
    "PhimoeForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM",
    "Qwen3NextForCausalLM",
    "Qwen3_5MoeForCausalLM",
    "Qwen4ExpForCausalLM",
}


@pytest.mark.parametrize(
    "name,layer",
    [
        ("MixtralForCausalLM", LAYER),
        ("Qwen3MoeForCausalLM", LAYER),
        ("Qwen2MoeForCausalLM", LAYER),
        ("OlmoeForCausalLM", LAYER),
        # the router logits output without an aux loss: a layer of its own
        ("DeepseekV3ForCausalLM", "MoeRouterCausalLMFusedLoss"),
        # left alone: another aux-loss formula (GraniteMoe, Dbrx, JetMoe)
        ("GraniteMoeForCausalLM", None),
        ("DbrxForCausalLM", None),
        ("JetMoeForCausalLM", None),
    ],
)
def test_recognised_forwards(name, layer):
    assert _causal_lm_layer(getattr(transformers, name)) == layer


@pytest.mark.parametrize("router_logits", [True, False])
@pytest.mark.parametrize("family", sorted(MOE_FAMILIES))
def test_fused_loss_matches_the_untouched_model(clean_kernels, family, router_logits):
    model = tiny(family)
    reference = copy.deepcopy(model)
    tokens, labels, mask = batch()
    items = torch.tensor(11, device=DEVICE)
    kwargs = dict(
        attention_mask=mask,
        labels=labels,
        num_items_in_batch=items,
        output_router_logits=router_logits,
    )
    want = step(reference, tokens, **kwargs)

    assert tag_causal_lm_losses(model) == [type(model).__name__]
    # Every kernel together in one case (the experts' norms, MLPs and rotary too); the loss
    # layer alone in the others, which the interpreter's launches would otherwise dominate.
    kernelized(model, layers=None if (family, router_logits) == ("mixtral", True) else [LAYER])
    assert kernel_layer_of(model).__name__ == LAYER

    got = step(model, tokens, **kwargs)
    out, expected = got[0], want[0]
    assert out.logits is None
    assert type(out.cache) is type(expected.cache)
    if router_logits:
        assert expected.aux_loss is not None
        torch.testing.assert_close(out.aux_loss, expected.aux_loss)
        assert len(out.router_logits) == len(expected.router_logits)
        for a, b in zip(out.router_logits, expected.router_logits, strict=True):
            torch.testing.assert_close(a, b)
        # the aux loss is in the loss: without it the loss is smaller by coef * aux
        ce = out.loss - model.router_aux_loss_coef * out.aux_loss
        assert not torch.allclose(ce, out.loss)
    else:
        assert out.aux_loss is None and expected.aux_loss is None
        assert out.router_logits is None and expected.router_logits is None
    assert_same_step(got, want)

    # the config's default decides where the argument is not given
    model.config.output_router_logits = reference.config.output_router_logits = router_logits
    plain = step(reference, tokens, labels=labels)
    fused = step(model, tokens, labels=labels)
    assert fused[0].logits is None
    assert (fused[0].aux_loss is None) == (not router_logits)
    assert_same_step(fused, plain)
    as_tuple = model(tokens, labels=labels, return_dict=False)
    torch.testing.assert_close(as_tuple[0], plain[0].loss, rtol=1e-5, atol=1e-6)

    # The model's own forward where the logits are asked for: no labels, or evaluation.
    with torch.no_grad():
        torch.testing.assert_close(model(tokens).logits, reference(tokens).logits)
        model.eval()
        reference.eval()
        evaluated = model(tokens, labels=labels, output_router_logits=True)
        expected = reference(tokens, labels=labels, output_router_logits=True)
    assert evaluated.logits is not None
    torch.testing.assert_close(evaluated.logits, expected.logits)
    torch.testing.assert_close(evaluated.loss, expected.loss)
    torch.testing.assert_close(evaluated.aux_loss, expected.aux_loss)


def test_the_model_s_own_forward_where_the_fused_loss_does_not_apply(clean_kernels):
    model = tiny("mixtral")
    reference = copy.deepcopy(model)
    kernelized(model, layers=[LAYER])
    tokens, labels, _ = batch()
    with torch.no_grad():
        out = model(tokens, output_router_logits=True)  # labels=None: generation, inference
        expected = reference(tokens, output_router_logits=True)
        assert out.logits is not None and out.loss is None
        torch.testing.assert_close(out.logits, expected.logits)
        torch.testing.assert_close(out.aux_loss, expected.aux_loss)
        kept = model(tokens, labels=labels, logits_to_keep=torch.arange(tokens.shape[1]))
        assert kept.logits is not None
    # an lm_head with a hook: the model's own forward
    handle = model.lm_head.register_forward_hook(lambda *args: None)
    assert model(tokens, labels=labels).logits is not None
    handle.remove()
    assert model(tokens, labels=labels).logits is None


def test_shift_labels_and_ignore_index_kwargs(clean_kernels):
    model = tiny("qwen3_moe")
    reference = copy.deepcopy(model)
    kernelized(model, layers=[LAYER])
    tokens, labels, mask = batch()
    shifted = torch.roll(labels, -1, dims=1)
    shifted[:, -1] = IGNORE
    for kwargs in (
        dict(labels=labels, shift_labels=shifted),
        dict(labels=torch.where(labels == IGNORE, -1, labels), ignore_index=-1),
    ):
        kwargs.update(attention_mask=mask, output_router_logits=True)
        got, want = step(model, tokens, **kwargs), step(reference, tokens, **kwargs)
        assert got[0].logits is None, kwargs
        assert_same_step(got, want)
