"""library_mapping(): our kernel repositories, loadable and valid for the layers they serve."""

import pytest
import torch.nn as nn

from kernels import KernelMappingError, LocalFuncRepository, LocalLayerRepository, library_mapping
from kernels.layer.func import use_kernel_func_from_hub
from kernels.layer.loading import load_kernel_layer
from kernels.layer.validation import validate_kernel_layer
from kernels.library import KERNELS, library_path


def test_every_kernel_is_registered_for_cuda_in_all_modes(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    mapping = library_mapping()
    assert set(mapping) == {k.layer_name for k in KERNELS}
    for by_device in mapping.values():
        assert set(by_device) == {"cuda"}
    assert isinstance(mapping["RMSNorm"]["cuda"], LocalLayerRepository)
    assert isinstance(mapping["rotary_pos_emb"]["cuda"], LocalFuncRepository)


def test_cpu_is_added_under_the_triton_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert set(library_mapping()["SiLU"]) == {"cuda", "cpu"}
    assert set(library_mapping(devices=["rocm"])["SiLU"]) == {"rocm"}


def test_selecting_layers():
    assert set(library_mapping(layers=["RMSNorm", "SiLU"])) == {"RMSNorm", "SiLU"}
    with pytest.raises(KernelMappingError, match="has no kernels for Nope; it has: "):
        library_mapping(layers=["Nope"])
    with pytest.raises(KernelMappingError, match="Unknown device type 'metal'"):
        library_mapping(devices=["metal"])


def test_library_folder_holds_one_repository_per_kernel_repo():
    root = library_path()
    for kernel in KERNELS:
        assert (
            root / kernel.repo / "build" / "torch-universal" / kernel.repo / "__init__.py"
        ).is_file()
        assert (root / kernel.repo / "README.md").is_file(), f"{kernel.repo} needs a model card"


def reference_classes():
    """The layer classes model code tags with each name (transformers 4.57 where it has one)."""
    from transformers import activations
    from transformers.loss.loss_utils import ForCausalLMLoss
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.gemma2.modeling_gemma2 import Gemma2ForCausalLM
    from transformers.models.llama.modeling_llama import (
        LlamaForCausalLM,
        LlamaMLP,
        LlamaRMSNorm,
        apply_rotary_pos_emb,
    )

    class SiluAndMul(nn.Module):
        def forward(self, x):
            return x

    class FusedAddRMSNorm(nn.Module):
        def forward(self, hidden_states, residual):
            return hidden_states, residual

    return {
        "SiLU": activations.SiLUActivation,
        "GeLU": activations.GELUActivation,
        "GeluTanh": activations.GELUTanh,
        "NewGELU": activations.NewGELUActivation,
        "FastGELU": activations.FastGELUActivation,
        "QuickGELU": activations.QuickGELUActivation,
        "SiluAndMul": SiluAndMul,
        "GeluAndMul": SiluAndMul,
        "GeluTanhAndMul": SiluAndMul,
        "SwiGLUMLP": LlamaMLP,
        "RMSNorm": LlamaRMSNorm,
        "GemmaRMSNorm": GemmaRMSNorm,
        "FusedAddRMSNorm": FusedAddRMSNorm,
        "LayerNorm": nn.LayerNorm,
        "rotary_pos_emb": type(use_kernel_func_from_hub("rotary_pos_emb")(apply_rotary_pos_emb)),
        # transformers 5.x's name for its loss function (as a function module), and the
        # *ForCausalLM forwards tag_causal_lm_losses tags in 4.57.
        "ForCausalLMLoss": type(use_kernel_func_from_hub("ForCausalLMLoss")(ForCausalLMLoss)),
        "CausalLMFusedLoss": LlamaForCausalLM,
        "GemmaCausalLMFusedLoss": Gemma2ForCausalLM,
    }


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.layer_name)
def test_each_kernel_loads_and_fits_the_layer_it_serves(kernel):
    repository = library_mapping(devices=["cuda"], layers=[kernel.layer_name])[kernel.layer_name][
        "cuda"
    ]
    layer = load_kernel_layer(repository)
    validate_kernel_layer(
        layer,
        reference_classes()[kernel.layer_name],
        kernel_source=str(repository),
        layer_name=kernel.layer_name,
    )
    assert layer.has_backward is True
    assert layer.can_torch_compile is True
