"""transformers 5.24 models on our kernels, through transformers' own entry points.

transformers 5.x calls `kernelize(model, device=<type>, mode=..., use_fallback=KernelizeFallback.ALL)`
from ``model.use_kernels = True``, ``from_pretrained(..., use_kernels=True)`` and the
``train()`` / ``eval()`` switches, re-registering its default Hub mapping each time. Every test
compares logits (and, training, every gradient) with an untouched copy of the model.
"""

import pytest
import torch
import transformers

from kernels import library_mapping, register_kernel_mapping
from kernels.layer.func import attached_functions
from kernels.layer.swap import kernel_layer_of
from kernels.library import library_path, register_library_kernels
from tests.support.tf5_models import DEVICE, FAMILIES, make_model, tokens


def kernels_of(model) -> dict[str, str | None]:
    """Path -> the kernel layer each tagged module (or attached function) runs, or None."""
    found = {}
    for path, module in model.named_modules():
        if getattr(type(module), "kernel_layer_name", None):
            found[path] = _name(kernel_layer_of(module))
        for name, fn in attached_functions(module):
            found[f"{path}:{name}"] = _name(kernel_layer_of(fn))
    return found


def _name(kernel):
    return None if kernel is None else kernel.__name__


def expected_kernels(family: str, *, mlp: bool = True) -> set[str]:
    """The kernel layers a tiny model of `family` runs with all our kernels; ``mlp``: what
    `register_library_kernels()` has kernelize tag (the gated MLP, and the model's forward
    for the fused loss: every family here has LlamaForCausalLM's forward) is kernelized too."""
    names = {"apply_rotary_pos_emb"}
    names |= {"GeluTanh"} if family == "gemma" else {"SiLU", "RMSNorm"}
    return names | {"SwiGLUMLP", "CausalLMFusedLoss"} if mlp else names


def assert_all_kernelized(model, family: str, *, mlp: bool = True) -> None:
    found = kernels_of(model)
    assert None not in found.values(), found
    assert set(found.values()) == expected_kernels(family, mlp=mlp), found


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_use_kernels_in_eval_matches_the_untouched_model(clean_kernels, family):
    reference = make_model(family).eval()
    with torch.no_grad():
        expected = reference(tokens()).logits
    register_library_kernels(devices=[DEVICE])
    model = make_model(family).eval()
    model.use_kernels = True
    assert_all_kernelized(model, family)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens()).logits, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_use_kernels_in_training_matches_every_gradient(clean_kernels, family):
    reference = make_model(family).train()
    reference(tokens(2), labels=tokens(2)).loss.backward()
    register_library_kernels(devices=[DEVICE])
    model = make_model(family).train()
    model.use_kernels = True  # kernelize(..., mode=Mode.TRAINING)
    assert_all_kernelized(model, family)
    model(tokens(2), labels=tokens(2)).loss.backward()
    for (name, p), q in zip(reference.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_train_and_eval_switch_kernelize_again(clean_kernels, monkeypatch):
    from transformers.integrations import hub_kernels

    from kernels import KernelizeFallback, Mode

    calls = []
    real = hub_kernels._kernels_kernelize

    def spy(model, **kwargs):
        calls.append(kwargs)
        return real(model, **kwargs)

    monkeypatch.setattr(hub_kernels, "_kernels_kernelize", spy)
    register_library_kernels(devices=[DEVICE])
    model = make_model("llama").eval()
    model.use_kernels = True
    for switch, mode in ((model.train, Mode.TRAINING), (model.eval, Mode.INFERENCE)):
        calls.clear()
        switch()
        assert [c["mode"] for c in calls] == [mode]
        assert calls[0]["use_fallback"] is KernelizeFallback.ALL
        assert_all_kernelized(model, "llama")
    model.train()
    model(tokens(2), labels=tokens(2)).loss.backward()  # the TRAINING kernels have a backward


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_from_pretrained_after_register_kernel_mapping(clean_kernels, tmp_path, family):
    """The 4.57 way, unchanged: norms, activations and rotary (which 5.x tags itself)."""
    make_model(family).save_pretrained(tmp_path)
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).to(DEVICE)
    with torch.no_grad():
        expected = plain(tokens()).logits
    register_kernel_mapping(library_mapping(devices=[DEVICE]))
    placement = {} if DEVICE == "cpu" else {"device_map": DEVICE}
    model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, use_kernels=True, **placement
    )
    assert_all_kernelized(model, family, mlp=False)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens()).logits, expected, rtol=1e-4, atol=1e-4)


def test_from_pretrained_after_register_library_kernels_takes_the_mlps_too(clean_kernels, tmp_path):
    make_model("qwen3").save_pretrained(tmp_path)
    register_library_kernels(devices=[DEVICE])
    placement = {} if DEVICE == "cpu" else {"device_map": DEVICE}
    model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, use_kernels=True, **placement
    )
    assert_all_kernelized(model, "qwen3")


def _kernel_config_mapping() -> dict[str, str]:
    root = library_path()
    return {
        "RMSNorm": f"{root / 'norm'}:RMSNorm",
        "SiLU": f"{root / 'activation'}:SiLU",
        "rotary_pos_emb": f"{root / 'rotary'}:apply_rotary_pos_emb",
    }


@pytest.fixture
def kernel_config_device(monkeypatch):
    """transformers' KernelConfig refuses the cpu device type; on the CPU, where our kernels run
    through the Triton interpreter, let it through for the test."""
    from transformers.utils import kernel_config

    if DEVICE == "cpu":
        monkeypatch.setattr(
            kernel_config,
            "KERNELS_SUPPORTED_DEVICE_TYPES",
            [*kernel_config.KERNELS_SUPPORTED_DEVICE_TYPES, "cpu"],
        )


def test_kernel_config_with_our_local_repositories(clean_kernels, kernel_config_device):
    """``KernelConfig(use_local_kernel=True)`` builds ``LocalLayerRepository(repo_path=,
    layer_name=)`` (no package name) for "path:Name"; rotary_pos_emb names a function."""
    reference = make_model("llama").eval()
    with torch.no_grad():
        expected = reference(tokens()).logits
    model = make_model("llama").eval()
    config = transformers.KernelConfig(_kernel_config_mapping(), use_local_kernel=True)
    model.set_use_kernels(True, config)
    assert_all_kernelized(model, "llama", mlp=False)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens()).logits, expected, rtol=1e-4, atol=1e-4)


def test_kernel_config_sees_function_layer_names_and_loads_our_classes(clean_kernels):
    """`KernelConfig` learns function layer names from ``_kernel_funcs``, and
    `register_kernel_replacements_and_fusions` reads ``__module__`` of what ``load()`` returns."""
    import sys

    from transformers.integrations.hub_kernels import register_kernel_replacements_and_fusions

    model = make_model("llama")
    config = transformers.KernelConfig(_kernel_config_mapping(), use_local_kernel=True)
    config.store_registered_layer_names(model)
    assert "rotary_pos_emb" in config.registered_layer_names.values()
    config.sanitize_kernel_mapping(model)  # raises for a name the model does not have

    register_kernel_replacements_and_fusions(type(model), model.config, config)
    # Stateless kernels (no <Name>Layout class beside them) are left to kernelize.
    assert set(config.kernel_mapping) == {"RMSNorm", "SiLU", "rotary_pos_emb"}
    from kernels import LocalLayerRepository

    layer = LocalLayerRepository(repo_path=library_path() / "norm", layer_name="RMSNorm").load()
    assert layer.__name__ == "RMSNorm" and sys.modules[layer.__module__].RMSNorm is layer


@pytest.mark.xfail(
    raises=(AttributeError, ValueError),
    strict=True,
    reason="transformers 5.24: from_pretrained turns KernelConfig's 'path:Name' strings into "
    "(string, metadata) tuples, which create_compatible_mapping's use_local_kernel branch "
    "cannot split (AttributeError; ValueError first on the cpu device type)",
)
def test_from_pretrained_with_a_local_kernel_config(clean_kernels, tmp_path):
    make_model("llama").save_pretrained(tmp_path)
    config = transformers.KernelConfig(_kernel_config_mapping(), use_local_kernel=True)
    transformers.AutoModelForCausalLM.from_pretrained(tmp_path, kernel_config=config)
