"""The kernels 0.18 API level that transformers 5.24 uses, without transformers."""

import importlib

import torch
import torch.nn as nn

import kernels
from kernels import LocalLayerRepository, use_kernel_forward_from_hub, use_kernelized_func
from kernels.layer.func import INSTANCE_ATTRIBUTE

# What transformers 5.24 imports from kernels (integrations/hub_kernels.py, modeling_utils.py).
TRANSFORMERS_5_24_IMPORTS = (
    "CUDAProperties",
    "Device",
    "KernelizeFallback",
    "LayerRepository",
    "LocalLayerRepository",
    "Mode",
    "ROCMProperties",
    "register_kernel_mapping",
    "replace_kernel_forward_from_hub",
    "use_kernel_mapping",
    "get_kernel",
    "kernelize",
    "use_kernel_forward_from_hub",
    "use_kernelized_func",
)


def test_every_name_transformers_5_24_imports_exists():
    missing = [name for name in TRANSFORMERS_5_24_IMPORTS if not hasattr(kernels, name)]
    assert not missing
    assert importlib.import_module("kernels.layer.mode").Mode is kernels.Mode


def test_public_names_of_the_api_level():
    for name in ("Benchmark", "Metadata", "RepoInfo", "KernelizeFallback"):
        assert name in kernels.__all__ and hasattr(kernels, name)


@use_kernel_forward_from_hub("rotary_pos_emb")
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    return q, k


@use_kernelized_func([apply_rotary_pos_emb])
class Attention(nn.Module):
    def forward(self, q, k):
        return apply_rotary_pos_emb(q, k, None, None)


def test_kernel_funcs_map_layer_names_to_function_modules():
    """transformers' KernelConfig reads the keys as layer names. Since 0.19 the values are
    each instance's private copies of the function modules (Hugging Face's kernels 0.19)."""
    attention = Attention()
    copies = getattr(attention, INSTANCE_ATTRIBUTE)
    assert INSTANCE_ATTRIBUTE == "_kernel_funcs" and list(copies) == ["rotary_pos_emb"]
    assert type(copies["rotary_pos_emb"]) is type(apply_rotary_pos_emb)
    assert copies["rotary_pos_emb"] is not apply_rotary_pos_emb
    assert (
        getattr(Attention(), INSTANCE_ATTRIBUTE)["rotary_pos_emb"] is not copies["rotary_pos_emb"]
    )
    assert isinstance(apply_rotary_pos_emb, nn.Module)
    q = torch.ones(2)
    assert apply_rotary_pos_emb(q, q, None, None) == (q, q)


def test_local_repository_without_package_name_loads_the_class(kernel_repo):
    path = kernel_repo("activation")
    layer = LocalLayerRepository(repo_path=path, layer_name="SiluAndMul").load()
    assert isinstance(layer, type) and issubclass(layer, nn.Module)
    assert layer.__name__ == "SiluAndMul"
