"""transformers 4.57 as a client of this package, unchanged, with our Triton kernels.

transformers tags its norms "RMSNorm" and its activation modules "SiLU", "GeLU", ...; it
calls `kernelize(model, device=Device(type=...), mode=...)` from `model.kernelize()`,
`model.use_kernels = True`, `model.train()/.eval()` and `from_pretrained(..., use_kernels=True)`.
On the CPU our kernels run through the Triton interpreter (tests/conftest.py sets it).
"""

import pytest
import torch
import transformers

from kernels import Mode, kernelize, library_mapping, register_kernel_mapping, use_kernel_mapping
from kernels.layer.swap import kernel_layer_of
from tests.support.children import run_python
from tests.support.paths import subprocess_env

pytestmark = pytest.mark.skipif(
    not transformers.__version__.startswith("4.57."),
    reason="pinned to the tested transformers 4.57 line",
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

SMALL = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    max_position_embeddings=64,
)


def make_model(family: str):
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    config_class, model_class = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),
    }[family]
    torch.manual_seed(0)
    config = config_class(**SMALL, attn_implementation="sdpa")
    model = model_class(config).to(DEVICE)
    # Norm weights start at one; perturb them so a kernel that ignored them would show.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def tagged(model):
    return {
        name: m for name, m in model.named_modules() if getattr(type(m), "kernel_layer_name", None)
    }


@pytest.fixture
def clean_mapping():
    # transformers registers its own default mapping at import; keep it, restore after.
    from kernels.mapping import registry

    saved = registry._global_mapping
    yield
    registry._global_mapping = saved


@pytest.fixture
def our_kernels(clean_mapping):
    register_kernel_mapping(library_mapping(devices=[DEVICE]))


def test_transformers_sees_our_package():
    from transformers.integrations import hub_kernels
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    assert hub_kernels._kernels_available
    assert LlamaRMSNorm.kernel_layer_name == "RMSNorm"


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
def test_model_kernelize_inference_matches(our_kernels, family):
    model = make_model(family).eval()
    tokens = torch.randint(0, 128, (2, 9), device=DEVICE)
    with torch.no_grad():
        expected = model(tokens).logits
    model.kernelize()
    swapped = {name: kernel_layer_of(m) for name, m in tagged(model).items()}
    assert swapped and all(k is not None for k in swapped.values()), swapped
    with torch.no_grad():
        got = model(tokens).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_training_gradients_match(our_kernels, family):
    reference = make_model(family).train()
    model = make_model(family).train()
    tokens = torch.randint(0, 128, (2, 9), device=DEVICE)
    model.use_kernels = (
        True  # transformers calls kernelize(..., mode=Mode.TRAINING) as the model trains
    )
    assert all(kernel_layer_of(m) is not None for m in tagged(model).values())
    for m in (reference, model):
        m(tokens, labels=tokens).loss.backward()
    for (name, p), q in zip(reference.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_eval_and_train_rekernelize(our_kernels):
    model = make_model("llama")
    model.use_kernels = True
    norm = model.model.norm
    assert kernel_layer_of(norm) is not None
    model.eval()  # transformers re-kernelizes for INFERENCE
    assert kernel_layer_of(norm) is not None
    model.use_kernels = False  # documented by transformers as a no-op with a warning
    assert kernel_layer_of(norm) is not None


def test_from_pretrained_with_use_kernels(our_kernels, tmp_path):
    make_model("qwen2").save_pretrained(tmp_path)
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(tmp_path).to(DEVICE)
    # transformers kernelizes for the device the weights are loaded on.
    placement = {} if DEVICE == "cpu" else {"device_map": DEVICE}
    model = AutoModelForCausalLM.from_pretrained(tmp_path, use_kernels=True, **placement)
    assert all(kernel_layer_of(m) is not None for m in tagged(model).values())
    tokens = torch.randint(0, 128, (1, 7), device=DEVICE)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens).logits, plain(tokens).logits, rtol=1e-4, atol=1e-4)


def test_tagged_gated_mlps_are_kernelized_by_model_kernelize(our_kernels):
    """transformers tags no MLP; after `tag_gated_mlps` its own `model.kernelize()` swaps them."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP

    from kernels.library import tag_gated_mlps

    model = make_model("qwen3").eval()
    tokens = torch.randint(0, 128, (2, 9), device=DEVICE)
    with torch.no_grad():
        expected = model(tokens).logits
    try:
        assert tag_gated_mlps(model) == ["Qwen3MLP"]
        model.kernelize()
        mlps = [m for m in model.modules() if isinstance(m, Qwen3MLP)]
        assert mlps and all(kernel_layer_of(m).__name__ == "SwiGLUMLP" for m in mlps)
        with torch.no_grad():
            got = model(tokens).logits
    finally:
        if "kernel_layer_name" in vars(Qwen3MLP):  # tags are process-wide
            del Qwen3MLP.kernel_layer_name
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_register_library_kernels_is_one_step_for_4_57_too(clean_mapping, tmp_path):
    """from_pretrained(..., use_kernels=True) kernelizes while loading; kernelize tags the gated
    MLPs and the rotary embeddings first, so they are kernelized too, and stay so on train()."""
    from transformers import AutoModelForCausalLM

    from kernels.layer.func import attached_functions
    from kernels.library import register_library_kernels, untag

    make_model("llama").save_pretrained(tmp_path)
    placement = {} if DEVICE == "cpu" else {"device_map": DEVICE}
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, **placement)
    tokens = torch.randint(0, 128, (1, 7), device=DEVICE)
    with torch.no_grad():
        expected = plain(tokens).logits
    try:
        register_library_kernels(devices=[DEVICE])
        model = AutoModelForCausalLM.from_pretrained(tmp_path, use_kernels=True, **placement)
        layer = model.model.layers[0]
        assert kernel_layer_of(layer.mlp).__name__ == "SwiGLUMLP"
        [(_, rotary)] = attached_functions(layer.self_attn)
        assert kernel_layer_of(rotary) is not None
        assert all(kernel_layer_of(m) is not None for m in tagged(model).values())
        with torch.no_grad():
            got = model(tokens).logits
        model.train()
        assert kernel_layer_of(layer.mlp).__name__ == "SwiGLUMLP"
    finally:
        untag()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_scoped_mapping_with_transformers(clean_mapping):
    model = make_model("mistral")
    with use_kernel_mapping(library_mapping(devices=[DEVICE])):
        model.kernelize()
    assert kernel_layer_of(model.model.norm) is not None
    kernelize(model, mode=Mode.INFERENCE)  # outside the scope: transformers' own mapping only
    if DEVICE == "cpu":
        assert kernel_layer_of(model.model.norm) is None


def test_transformers_default_mapping_falls_back_when_the_hub_is_unreachable(tmp_path):
    """transformers registers Hub repositories for cuda; with no Hub, each layer keeps its
    forward with a WARNING (one a reason), and the model still loads and runs. In a subprocess, so the Hub
    endpoint and cache are this test's own."""

    script = """
import logging, torch
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
from transformers import LlamaForCausalLM
from kernels import Device, Mode, kernelize
from kernels.layer.swap import kernel_layer_of
from tests.support.models import llama_config
config = llama_config(intermediate_size=48, num_attention_heads=2, num_key_value_heads=1)
model = LlamaForCausalLM(config)
kernelize(model, device=Device(type="cuda"), mode=Mode.INFERENCE)   # what model.kernelize() does on a GPU
assert all(kernel_layer_of(m) is None for m in model.modules())
model(torch.randint(0, 64, (1, 5)))
print("MODEL RAN")
"""
    for extra in ({"HF_ENDPOINT": "http://127.0.0.1:9"}, {"HF_HUB_OFFLINE": "1"}):
        env = subprocess_env(HF_HUB_CACHE=str(tmp_path / "cache"), **extra)
        env.pop("TRITON_INTERPRET", None)
        result = run_python("-c", script, env=env, timeout=300)
        assert result.returncode == 0, result.stderr
        assert "MODEL RAN" in result.stdout
        warnings = [
            line
            for line in result.stderr.splitlines()
            if line.startswith("WARNING kernels.layer.kernelize")
        ]
        # transformers 4.57 passes no use_fallback: its default mapping's repositories fall
        # back as before kernels 0.19. One line per reason: the 3 RMSNorms of a one-layer
        # Llama share one, the SiLU has its own.
        assert len(warnings) == 2, result.stderr
        assert any(
            "3 layers keep their original forward (model.layers.0.input_layernorm (LlamaRMSNorm, "
            "'RMSNorm'), "
            in w
            and "Kernel for layer `RMSNorm` on cuda could not be loaded (loading "
            "kernels-community/liger_kernels"
            in w
            for w in warnings
        ), warnings


def test_its_unpinned_default_mapping_imports_and_follows_main():
    """transformers 4.57 builds its default mapping at import from repositories without a
    version and catches only ImportError: the 0.19 rule (no pin: ValueError) would break the
    import of every model module. Those repositories follow main, as before 0.19; anyone
    else's unpinned repository is still refused."""
    code = (
        "from transformers.integrations import hub_kernels\n"
        "repos = [r for devices in hub_kernels._KERNEL_MAPPING.values() for r in devices.values()]\n"
        "repos = [r for r in repos if not isinstance(r, dict)] + [\n"
        "    r for d in hub_kernels._KERNEL_MAPPING.values() for m in d.values()\n"
        "    if isinstance(m, dict) for r in m.values()]\n"
        "unpinned = [r for r in repos if r.version is None]\n"
        "assert unpinned and all(r.revision == 'main' for r in unpinned)\n"
        "print(len(unpinned), 'unpinned repositories')\n"
    )
    result = run_python("-c", code, env=subprocess_env())
    assert result.returncode == 0, result.stderr
    assert "repositories" in result.stdout
    from kernels import LayerRepository

    with pytest.raises(ValueError, match="Either a revision or a version must be specified"):
        LayerRepository("kernels-community/activation", layer_name="SiluAndMul")
