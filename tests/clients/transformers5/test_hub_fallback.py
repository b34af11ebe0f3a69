"""transformers 5.x's default Hub kernels when the Hub cannot be used, and ours winning over them.

transformers re-registers its default mapping (Hub repositories for cuda, xpu, ...) at every
``use_kernels``. With the Hub unreachable or offline, loading and kernelize never fail: each
layer whose kernel cannot be loaded keeps its forward, with one WARNING on the ``kernels``
logger saying why. Where our kernels are registered (capability range on cuda), they are
chosen instead, so the Hub is not asked at all.
"""

import pytest
import torch

from kernels import Mode, explain
from kernels.library import library_path, register_library_kernels
from kernels.mapping.capability import use_capability_reader
from tests.support.children import run_python
from tests.support.paths import subprocess_env
from tests.support.tf5_models import make_model

SCRIPT = """
import logging, sys, torch
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
from transformers import AutoModelForCausalLM, LlamaForCausalLM
from kernels import KernelizeFallback, LayerRepository, Mode, kernelize, register_kernel_mapping
from kernels.layer.swap import kernel_layer_of
from tests.support.models import llama_config

config = llama_config(intermediate_size=48, num_attention_heads=2, num_key_value_heads=1)
LlamaForCausalLM(config).save_pretrained(sys.argv[1])
# transformers' defaults name no Hub kernel for these layers on the cpu; name one, as they do for cuda.
register_kernel_mapping({"RMSNorm": {"cpu": LayerRepository(
    "kernels-community/liger-kernels", layer_name="LigerRMSNorm", version=3)}})
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], use_kernels=True)   # 3 RMSNorm
model.train()                                                                 # 3 RMSNorm again
# What transformers' kernelize does on a GPU machine, with its default mapping for cuda:
kernelize(model, device="cuda", mode=Mode.INFERENCE, use_fallback=KernelizeFallback.ALL)  # 5
assert all(kernel_layer_of(m) is None for m in model.modules())
model(torch.randint(0, 64, (1, 5)), labels=torch.randint(0, 64, (1, 5))).loss.backward()
print("MODEL RAN")
"""


@pytest.mark.parametrize(
    "environment",
    [{"HF_HUB_OFFLINE": "1"}, {"HF_ENDPOINT": "http://127.0.0.1:9"}],
    ids=["offline", "unreachable"],
)
def test_unusable_hub_keeps_each_layers_forward_with_one_warning(tmp_path, environment):
    env = subprocess_env(HF_HUB_CACHE=str(tmp_path / "cache"), **environment)
    env.pop("TRITON_INTERPRET", None)
    result = run_python("-c", SCRIPT, str(tmp_path / "model"), env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "MODEL RAN" in result.stdout
    warnings = [
        line
        for line in result.stderr.splitlines()
        if line.startswith("WARNING kernels.layer.kernelize")
    ]
    # One line per reason per kernelize: the 3 RMSNorms on cpu, twice; on cuda the 3
    # RMSNorms, the SiLU and the rotary function.
    assert len(warnings) == 5, result.stderr
    assert all(
        "original forward" in w and "could not be loaded (loading kernels-community/" in w
        for w in warnings
    )
    assert sum(w.startswith("WARNING kernels.layer.kernelize 3 layers keep") for w in warnings) == 3
    why = "HF_HUB_OFFLINE is set" if "HF_HUB_OFFLINE" in environment else "cannot be reached"
    assert all(why in w for w in warnings), warnings[0]
    assert any(
        "model.layers.0.self_attn:apply_rotary_pos_emb (apply_rotary_pos_emb, 'rotary_pos_emb')"
        in w
        for w in warnings
    )


@pytest.mark.parametrize("mode", [Mode.INFERENCE, Mode.TRAINING | Mode.TORCH_COMPILE])
def test_ours_win_over_the_defaults_transformers_registers_at_use_kernels(clean_kernels, mode):
    """On a GPU of capability 9.0: what kernelize would choose on cuda after
    `register_library_kernels()` and then transformers' own re-registration."""
    from transformers.integrations.hub_kernels import (
        get_kernel_mapping_transformers,
        register_kernel_mapping_transformers,
    )

    register_library_kernels(devices=["cuda"])
    register_kernel_mapping_transformers()  # what every set_use_kernels(True) does first
    model = make_model("qwen3")
    with use_capability_reader(lambda device_type, index: 90):
        explanation = explain(model, mode=mode, device="cuda")
    assert {layer.layer_name for layer in explanation.layers} == {
        "RMSNorm",
        "SiLU",
        "SwiGLUMLP",
        "rotary_pos_emb",
        "CausalLMFusedLoss",  # the model's forward, tagged for the fused loss
    }
    # The layers transformers maps a Hub kernel to for cuda (5.25 dropped SwiGLUMLP's): passed over.
    hub_mapped = {
        name for name, devices in get_kernel_mapping_transformers().items() if "cuda" in devices
    }
    assert {"RMSNorm", "SiLU", "rotary_pos_emb"} <= hub_mapped
    for layer in explanation.layers:
        assert layer.outcome == "kernel", layer
        assert str(library_path()) in layer.kernel, layer
        passed_over = any("kernels-community/" in c for c, _ in layer.candidates)
        assert passed_over == (layer.layer_name in hub_mapped), layer


@pytest.mark.gpu
def test_on_a_gpu_one_step_gives_every_layer_our_kernel(clean_kernels, tmp_path):
    """The documented step on a real GPU: transformers re-registers its Hub defaults for cuda
    while loading; our kernels are used anyway, and the Hub is never asked."""
    import transformers

    from tests.clients.transformers5.test_models import assert_all_kernelized
    from tests.support.tf5_models import tokens

    make_model("llama").save_pretrained(tmp_path)
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, device_map="cuda")
    with torch.no_grad():
        expected = plain(tokens()).logits
    register_library_kernels()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, use_kernels=True, device_map="cuda"
    )
    assert_all_kernelized(model, "llama")
    with torch.no_grad():
        torch.testing.assert_close(model(tokens()).logits, expected, rtol=1e-4, atol=1e-4)
    model.train()
    assert_all_kernelized(model, "llama")
