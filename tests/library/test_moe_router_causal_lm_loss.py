"""The DeepSeek-V3-style MoE ``*ForCausalLM`` models on transformers 4.57.

On 5.24 their forward returns the router logits (``MoeCausalLMOutputWithPast``) and is tagged
``"MoeRouterCausalLMFusedLoss"`` (tests/clients/transformers5/test_moe_router_causal_lm_loss.py). On
4.57 the same classes have Llama's forward word for word and return ``CausalLMOutputWithPast``:
they are ``"CausalLMFusedLoss"``, and the loss repository has no ``MoeRouterCausalLMFusedLoss``
layer for that line. A tiny DeepSeek-V3 checks that the fused loss over its MoE base model
equals the untouched model's (loss and every parameter's gradient).
"""

import copy

import pytest
import torch
from packaging.version import Version

from kernels import Mode, kernelize, library_mapping, use_kernel_mapping
from kernels.errors import KernelLoadError
from kernels.layer.loading import load_kernel_layer
from kernels.layer.swap import kernel_layer_of
from kernels.library import tag_causal_lm_losses, untag
from kernels.library.transformers_tags import _causal_lm_layer

transformers = pytest.importorskip("transformers")
if Version(transformers.__version__).major >= 5:
    pytest.skip(
        "transformers 4.57's forwards; 5.x's are tests/clients/transformers5/",
        allow_module_level=True,
    )

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LAYER = "MoeRouterCausalLMFusedLoss"

#: The 4.57 classes whose 5.24 forward is DeepSeek-V3's (the others of 5.24's 22 are newer).
ROUTER_FORWARD_ON_5_24 = (
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "Dots1ForCausalLM",
    "Glm4MoeForCausalLM",
    "HunYuanMoEV1ForCausalLM",
    "LongcatFlashForCausalLM",
)


@pytest.mark.parametrize("name", ROUTER_FORWARD_ON_5_24)
def test_llama_s_forward_on_4_57(name):
    assert _causal_lm_layer(getattr(transformers, name)) == "CausalLMFusedLoss"


def test_the_loss_repository_has_no_layer_for_this_line(loss):
    with pytest.raises(AttributeError, match=r"no layer 'MoeRouterCausalLMFusedLoss'.*5\.24"):
        getattr(loss.layers, LAYER)
    assert loss.layers.CausalLMFusedLoss.__name__ == "CausalLMFusedLoss"  # the others resolve
    repository = library_mapping(devices=["cuda"], layers=[LAYER])[LAYER]
    with pytest.raises(KernelLoadError, match=LAYER):
        load_kernel_layer(next(iter(repository.values())))


def tiny_deepseek_v3():
    torch.manual_seed(0)
    config = transformers.DeepseekV3Config(
        vocab_size=101, hidden_size=32, intermediate_size=40, moe_intermediate_size=24,
        num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=4,
        num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
        n_group=1, topk_group=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=4,
        qk_nope_head_dim=4, v_head_dim=8, attn_implementation="sdpa",
    )  # fmt: skip
    model = transformers.DeepseekV3ForCausalLM(config).to(DEVICE)
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)  # a loss far from log(vocab)
    return model.train()


def _step(model, tokens, labels, **kwargs):
    model.zero_grad(set_to_none=True)
    out = model(tokens, labels=labels, **kwargs)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_deepseek_v3_fused_loss_matches_the_untouched_model(loss):
    model = tiny_deepseek_v3()
    reference = copy.deepcopy(model)
    tokens = torch.randint(0, 101, (2, 9), device=DEVICE)
    labels = tokens.clone()
    labels[0, :4] = -100
    items = torch.tensor(13)
    expected, expected_grads = _step(reference, tokens, labels, num_items_in_batch=items)
    try:
        assert tag_causal_lm_losses(model) == ["DeepseekV3ForCausalLM"]
        with use_kernel_mapping(library_mapping(devices=[DEVICE], layers=["CausalLMFusedLoss"])):
            kernelize(model, mode=Mode.TRAINING, device=DEVICE)
        assert kernel_layer_of(model).__name__ == "CausalLMFusedLoss"
        out, grads = _step(model, tokens, labels, num_items_in_batch=items)
    finally:
        untag()
    assert type(out) is type(expected)  # CausalLMOutputWithPast: 4.57's forward
    assert out.logits is None
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == expected_grads.keys()
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    with torch.no_grad():
        evaluated = model.eval()(tokens, labels=labels)
        torch.testing.assert_close(evaluated.logits, reference.eval()(tokens).logits)
