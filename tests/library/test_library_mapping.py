"""library_mapping(): our kernel repositories, loadable and valid for the layers they serve."""

import pytest
import torch.nn as nn

from kernels import (
    Device,
    KernelMappingError,
    LocalFuncRepository,
    LocalLayerRepository,
    Mode,
    library_mapping,
    use_kernel_mapping,
)
from kernels.errors import KernelLoadError
from kernels.layer.decorators import use_kernel_func_from_hub
from kernels.layer.loading import load_kernel_layer
from kernels.layer.validation import validate_kernel_layer
from kernels.library import CUDA_CAPABILITIES, KERNELS, library_path
from kernels.mapping.registry import current_mapping
from kernels.mapping.resolve import resolve

CUDA = Device("cuda", CUDA_CAPABILITIES)


def test_every_kernel_is_registered_for_cuda_in_all_modes(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    mapping = library_mapping()
    assert set(mapping) == {k.layer_name for k in KERNELS}
    for by_device in mapping.values():
        assert set(by_device) == {CUDA}
    assert isinstance(mapping["RMSNorm"][CUDA], LocalLayerRepository)
    assert isinstance(mapping["rotary_pos_emb"][CUDA], LocalFuncRepository)


def test_cpu_is_added_under_the_triton_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert set(library_mapping()["SiLU"]) == {CUDA, "cpu"}
    assert set(library_mapping(devices=["rocm"])["SiLU"]) == {"rocm"}


def test_ours_win_over_kernels_registered_for_all_of_cuda_before_or_after():
    """transformers 5.x registers Hub kernels for a bare "cuda" key at every use_kernels; our
    capability-range key is narrower, so it is chosen on GPUs in the range either way."""
    hub = {"RMSNorm": {"cuda": LocalLayerRepository("/nowhere", layer_name="LigerRMSNorm")}}
    ours = library_mapping(devices=["cuda"], layers=["RMSNorm"])
    for first, second in ((hub, ours), (ours, hub)):
        with use_kernel_mapping(first, inherit_mapping=False), use_kernel_mapping(second):
            for capability, winner in ((90, ours["RMSNorm"][CUDA]), (75, hub["RMSNorm"]["cuda"])):
                resolution = resolve(
                    current_mapping(),
                    "RMSNorm",
                    device_type="cuda",
                    capability=capability,
                    mode=Mode.TRAINING,
                )
                assert resolution.chosen.repository is winner


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
    import transformers
    from packaging.version import Version
    from transformers import activations
    from transformers.loss.loss_utils import ForCausalLMLoss
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3ForCausalLM
    from transformers.models.gemma.modeling_gemma import GemmaMLP, GemmaRMSNorm
    from transformers.models.gemma2.modeling_gemma2 import Gemma2ForCausalLM
    from transformers.models.llama.modeling_llama import (
        LlamaForCausalLM,
        LlamaMLP,
        LlamaRMSNorm,
    )
    from transformers.models.mixtral.modeling_mixtral import MixtralForCausalLM

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):  # transformers 5.x's signature
        return q, k

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
        "GeGLUMLP": GemmaMLP,
        "RMSNorm": LlamaRMSNorm,
        "GemmaRMSNorm": GemmaRMSNorm,
        "RMSNormZeroCentered": GemmaRMSNorm,  # transformers 5.x: Qwen3_5RMSNorm, same forward
        "FusedAddRMSNorm": FusedAddRMSNorm,
        "LayerNorm": nn.LayerNorm,
        "rotary_pos_emb": type(use_kernel_func_from_hub("rotary_pos_emb")(apply_rotary_pos_emb)),
        # transformers 5.x's name for its loss function (as a function module), and the
        # *ForCausalLM forwards tag_causal_lm_losses tags in 4.57.
        "ForCausalLMLoss": type(use_kernel_func_from_hub("ForCausalLMLoss")(ForCausalLMLoss)),
        "CausalLMFusedLoss": LlamaForCausalLM,
        "GemmaCausalLMFusedLoss": Gemma2ForCausalLM,
        "MoeCausalLMFusedLoss": MixtralForCausalLM,
        # transformers 5.24's DeepseekV3ForCausalLM forward; 4.57 has none (DeepseekV3 has
        # Llama's there), and the loss repository no layer under the name for it.
        "MoeRouterCausalLMFusedLoss": (
            DeepseekV3ForCausalLM if Version(transformers.__version__).major >= 5 else None
        ),
    }


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.layer_name)
def test_each_kernel_loads_and_fits_the_layer_it_serves(kernel):
    repository = library_mapping(devices=["cuda"], layers=[kernel.layer_name])[kernel.layer_name][
        CUDA
    ]
    reference = reference_classes()[kernel.layer_name]
    if reference is None:  # a layer name the installed transformers has no forward for
        with pytest.raises(KernelLoadError, match=kernel.layer_name):
            load_kernel_layer(repository)
        return
    layer = load_kernel_layer(repository)
    validate_kernel_layer(
        layer,
        reference,
        kernel_source=str(repository),
        layer_name=kernel.layer_name,
    )
    assert layer.has_backward is True
    assert layer.can_torch_compile is True


def test_on_a_cpu_without_the_interpreter_it_says_once_why_nothing_is_swapped(monkeypatch, caplog):
    # The README's use on a machine without GPU and without TRITON_INTERPRET: kernelize keeps
    # every forward, which used to happen without a word.
    import logging

    import torch

    import kernels.library
    from kernels import kernelize, use_kernel_forward_from_hub

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(kernels.library, "_warned_nothing_runs_here", False, raising=False)

    @use_kernel_forward_from_hub("SiLU")
    class SiLU(nn.Module):
        def forward(self, x):
            return x * torch.sigmoid(x)

    caplog.set_level(logging.WARNING, logger="kernels")
    for _ in range(3):  # once a process, not once a call
        model = nn.Sequential(SiLU())
        with use_kernel_mapping(library_mapping()):
            kernelize(model, mode=Mode.INFERENCE, device="cpu")
    warnings = [r for r in caplog.records if r.name == "kernels.library"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    message = warnings[0].getMessage()
    assert "no CUDA GPU" in message and "TRITON_INTERPRET=1" in message
    # Where the user chose the devices, or a GPU is there, nothing is said.
    monkeypatch.setattr(kernels.library, "_warned_nothing_runs_here", False, raising=False)
    caplog.clear()
    library_mapping(devices=["cuda"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    library_mapping()
    assert not [r for r in caplog.records if r.name == "kernels.library"]
