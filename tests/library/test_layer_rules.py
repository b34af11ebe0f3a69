"""Every kernel layer obeys the kernel-layer rules: a torch.nn.Module subclass with no __init__
and no members besides forward, has_backward and can_torch_compile; has_backward and
can_torch_compile are True; forward has the parameters of the layer it replaces."""

import inspect

import pytest
import torch
from transformers.loss.loss_utils import ForCausalLMLoss
from transformers.models.gemma.modeling_gemma import GemmaMLP, GemmaRMSNorm
from transformers.models.gemma2.modeling_gemma2 import Gemma2ForCausalLM
from transformers.models.llama.modeling_llama import LlamaForCausalLM, LlamaMLP, LlamaRMSNorm
from transformers.models.mixtral.modeling_mixtral import MixtralForCausalLM

from kernels.layer.decorators import use_kernel_func_from_hub
from kernels.layer.validation import validate_kernel_layer
from tests.support.library import (
    FusedAddRMSNorm,
    GeluAndMul,
    GeluTanhAndMul,
    SiluAndMul,
    transformers_activation,
)


def _rotary_5x(q, k, cos, sin, unsqueeze_dim=1):
    """transformers 5.x's apply_rotary_pos_emb signature (4.57's has position_ids too)."""
    return q, k


# (repo, layer name) -> the module class whose forward the layer replaces
REPLACES = {
    ("activation", "SiLU"): transformers_activation("SiLUActivation", torch.relu),
    ("activation", "GeLU"): transformers_activation("GELUActivation", torch.relu),
    ("activation", "GeluTanh"): transformers_activation("GELUTanh", torch.relu),
    ("activation", "NewGELU"): transformers_activation("NewGELUActivation", torch.relu),
    ("activation", "FastGELU"): transformers_activation("FastGELUActivation", torch.relu),
    ("activation", "QuickGELU"): transformers_activation("QuickGELUActivation", torch.relu),
    ("activation", "SiluAndMul"): SiluAndMul,
    ("activation", "GeluAndMul"): GeluAndMul,
    ("activation", "GeluTanhAndMul"): GeluTanhAndMul,
    ("activation", "SwiGLUMLP"): LlamaMLP,
    ("activation", "GeGLUMLP"): GemmaMLP,
    ("norm", "RMSNorm"): LlamaRMSNorm,
    ("norm", "GemmaRMSNorm"): GemmaRMSNorm,
    ("norm", "FusedAddRMSNorm"): FusedAddRMSNorm,
    ("norm", "LayerNorm"): torch.nn.LayerNorm,
    ("loss", "ForCausalLMLoss"): type(use_kernel_func_from_hub("ForCausalLMLoss")(ForCausalLMLoss)),
    ("loss", "CausalLMFusedLoss"): LlamaForCausalLM,
    ("loss", "GemmaCausalLMFusedLoss"): Gemma2ForCausalLM,
    ("loss", "MoeCausalLMFusedLoss"): MixtralForCausalLM,
    ("rotary", "RotaryPosEmb"): type(use_kernel_func_from_hub("rotary_pos_emb")(_rotary_5x)),
}

ALLOWED = {"forward", "has_backward", "can_torch_compile"}


def _params(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("repo,name", sorted(REPLACES), ids=lambda v: str(v))
def test_layer_rules(request, repo, name):
    package = request.getfixturevalue(repo)
    layer = getattr(package.layers, name)
    original = REPLACES[(repo, name)]
    assert issubclass(layer, torch.nn.Module)
    assert "__init__" not in vars(layer)
    members = {m for m in vars(layer) if not (m.startswith("__") and m.endswith("__"))}
    assert members <= ALLOWED, f"{name} has extra members {members - ALLOWED}"
    assert layer.has_backward is True and layer.can_torch_compile is True
    assert _params(layer.forward) == _params(original.forward)
    # The core's own check, as kernelize runs it.
    validate_kernel_layer(layer, original, kernel_source=f"library/{repo}", layer_name=name)


@pytest.mark.parametrize("repo", ["activation", "norm", "rotary"])
def test_every_layer_is_covered(request, repo):
    package = request.getfixturevalue(repo)
    layers = {
        n
        for n, v in vars(package.layers).items()
        if isinstance(v, type)
        and issubclass(v, torch.nn.Module)
        and v.__module__ == package.layers.__name__
    }
    assert layers == {name for r, name in REPLACES if r == repo}
