"""Seed 002's `LayerRepository` examples, as written, against repositories on the test server.

The repositories carry the names the documentation uses. Each kernel adds an offset to its
output so the assertions can tell which repository (and which version) ran.
"""

from __future__ import annotations

import copy
import logging
import pickle
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels import (
    CUDAProperties,
    Device,
    KernelizeFallback,
    KernelLoadError,
    LayerRepository,
    Mode,
    kernelize,
    register_kernel_mapping,
    use_kernel_forward_from_hub,
    use_kernel_mapping,
)
from kernels.layer.swap import kernel_layer_of
from kernels.mapping.capability import use_capability_reader
from tests.support.hub import SILU_AND_MUL_LAYERS

pytestmark = pytest.mark.hub


@use_kernel_forward_from_hub("SiluAndMul")
class SiluAndMul(nn.Module):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        d = input.shape[-1] // 2
        return F.silu(input[..., :d]) * input[..., d:]


def reference(x):
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def offset_of(layer, x):
    return round((layer(x) - reference(x)).mean().item())


NO_COMPILE = SILU_AND_MUL_LAYERS.replace("can_torch_compile = True", "can_torch_compile = False")


@pytest.fixture(scope="session")
def seed_repos(hub_server):
    """The repositories the documentation names, published once per session."""
    activation = hub_server.create_repo("kernels-community/activation")
    for patch in (3, 4, 5):  # v0.0.3 .. v0.0.5: offsets 3 .. 5
        activation.release(f"0.0.{patch}", offset=patch)
    activation.release("0.1.0", offset=10)
    activation.write_kernel(version="main", offset=1).commit("work in progress on main")
    for name, offset, layers in (
        ("activation-inference-optimized", 2, NO_COMPILE),
        ("activation-training-optimized", 3, NO_COMPILE),
        ("activation-hopper", 4, None),
    ):
        repo = hub_server.create_repo(f"kernels-community/{name}")
        repo.release("0.1.0", offset=offset, layers_source=layers and layers.format(offset=offset))
        repo.write_kernel(
            version="main", offset=offset, layers_source=layers and layers.format(offset=offset)
        )
        repo.commit()


@pytest.fixture(autouse=True)
def clean_mapping(seed_repos, hub):
    register_kernel_mapping({}, inherit_mapping=False)
    yield
    register_kernel_mapping({}, inherit_mapping=False)


def test_registering_a_hub_kernel_for_a_layer(caplog):
    kernel_layer_mapping = {
        "SiluAndMul": {
            "cuda": LayerRepository(
                repo_id="kernels-community/activation",
                layer_name="SiluAndMul",
                revision="main",  # 0.19: a pin is required (the seed omits it)
            ),
            "rocm": LayerRepository(
                repo_id="kernels-community/activation",
                layer_name="SiluAndMul",
                revision="main",  # 0.19: a pin is required (the seed omits it)
            ),
        }
    }
    register_kernel_mapping(kernel_layer_mapping)
    model, x = SiluAndMul(), torch.randn(2, 8)
    with caplog.at_level(logging.INFO, logger="kernels"):
        kernelize(model, device="cuda", mode=Mode.INFERENCE)
    assert offset_of(model, x) == 1  # main
    messages = [r.getMessage() for r in caplog.records]
    # kernelize's log names the repository, the commit it resolved and the trust decision.
    used = [m for m in messages if "uses kernel layer SiluAndMul" in m]
    assert used and "commit" in used[0] and "kernels-community trusted by default" in used[0]


def test_using_version_bounds():
    kernel_layer_mapping = {
        "SiluAndMul": {
            "cuda": LayerRepository(
                repo_id="kernels-community/activation",
                layer_name="SiluAndMul",
                version=">=0.0.4,<0.1.0",
            ),
            "rocm": LayerRepository(
                repo_id="kernels-community/activation",
                layer_name="SiluAndMul",
                version=">=0.0.4,<0.1.0",
            ),
        }
    }
    register_kernel_mapping(kernel_layer_mapping)
    model = kernelize(SiluAndMul(), device="cuda", mode=Mode.INFERENCE)
    assert offset_of(model, torch.randn(2, 8)) == 5  # the latest v0.0.z, z >= 4


def test_scoped_mapping_on_a_model_with_parameters():
    kernel_layer_mapping = {
        "SiluAndMul": {
            "cpu": LayerRepository(
                "kernels-community/activation", layer_name="SiluAndMul", version=">=0.1"
            )
        }
    }
    model = nn.Sequential(nn.Linear(4, 8), SiluAndMul())
    with use_kernel_mapping(kernel_layer_mapping):
        model = kernelize(model, mode=Mode.TRAINING | Mode.TORCH_COMPILE)
    x = torch.randn(2, 4)
    assert offset_of(model[1], model[0](x)) == 10


def test_registering_kernels_for_specific_modes():
    kernel_layer_mapping = {
        "SiluAndMul": {
            "cuda": {
                Mode.INFERENCE: LayerRepository(
                    repo_id="kernels-community/activation-inference-optimized",
                    layer_name="SiluAndMul",
                    revision="main",  # 0.19: a pin is required (the seed omits it)
                ),
                Mode.TRAINING | Mode.TORCH_COMPILE: LayerRepository(
                    repo_id="kernels-community/activation-training-optimized",
                    layer_name="SiluAndMul",
                    revision="main",  # 0.19: a pin is required (the seed omits it)
                ),
            }
        }
    }
    register_kernel_mapping(kernel_layer_mapping)
    layer, x = SiluAndMul(), torch.randn(2, 8)
    kernelize(layer, device="cuda", mode=Mode.INFERENCE)
    assert offset_of(layer, x) == 2
    # The training-optimized kernel does not support torch.compile: the layer falls back.
    kernelize(layer, device="cuda", mode=Mode.TRAINING | Mode.TORCH_COMPILE)
    assert kernel_layer_of(layer) is None and offset_of(layer, x) == 0


def test_fallback_mode():
    kernel_layer_mapping = {
        "SiluAndMul": {
            "cuda": {
                Mode.FALLBACK: LayerRepository(
                    repo_id="kernels-community/activation",
                    layer_name="SiluAndMul",
                    revision="main",  # 0.19: a pin is required (the seed omits it)
                ),
                Mode.INFERENCE: LayerRepository(
                    repo_id="kernels-community/activation-inference-optimized",
                    layer_name="SiluAndMul",
                    revision="main",  # 0.19: a pin is required (the seed omits it)
                ),
                Mode.TRAINING: LayerRepository(
                    repo_id="kernels-community/activation-training-optimized",
                    layer_name="SiluAndMul",
                    revision="main",  # 0.19: a pin is required (the seed omits it)
                ),
            }
        }
    }
    register_kernel_mapping(kernel_layer_mapping)
    layer, x = SiluAndMul(), torch.randn(2, 8)
    expected = {
        Mode.INFERENCE: 2,
        Mode.TRAINING: 3,
        Mode.INFERENCE | Mode.TORCH_COMPILE: 1,
        Mode.TRAINING | Mode.TORCH_COMPILE: 1,
    }
    for mode, offset in expected.items():
        kernelize(layer, device="cuda", mode=mode)
        assert offset_of(layer, x) == offset, mode


@pytest.mark.parametrize(("capability", "offset"), [(86, 1), (90, 4), (70, 0)])
def test_registering_kernels_for_specific_cuda_capabilities(capability, offset):
    kernel_layer_mapping = {
        "SiluAndMul": {
            Device(
                type="cuda",
                properties=CUDAProperties(min_capability=75, max_capability=89),
            ): LayerRepository(
                repo_id="kernels-community/activation",
                layer_name="SiluAndMul",
                revision="main",  # 0.19: a pin is required (the seed omits it)
            ),
            Device(
                type="cuda",
                properties=CUDAProperties(min_capability=90, max_capability=sys.maxsize),
            ): LayerRepository(
                repo_id="kernels-community/activation-hopper",
                layer_name="SiluAndMul",
                revision="main",  # 0.19: a pin is required (the seed omits it)
            ),
        }
    }
    register_kernel_mapping(kernel_layer_mapping)
    layer = SiluAndMul()
    with use_capability_reader(lambda device_type, index: capability):
        kernelize(layer, device="cuda", mode=Mode.INFERENCE)
    assert offset_of(layer, torch.randn(2, 8)) == offset


def test_missing_hub_kernel_falls_back_with_a_warning_or_raises(caplog):
    mapping = {
        "SiluAndMul": {
            "cpu": LayerRepository(
                "kernels-community/not-published", layer_name="SiluAndMul", version=">=1"
            )
        }
    }
    register_kernel_mapping(mapping)
    layer = SiluAndMul()
    # kernels 0.19: a kernel that cannot load falls back only with CANNOT_LOAD (ALL).
    with caplog.at_level(logging.WARNING, logger="kernels"):
        kernelize(layer, device="cpu", mode=Mode.INFERENCE, use_fallback=KernelizeFallback.ALL)
    assert kernel_layer_of(layer) is None
    assert any(
        "not-published" in r.getMessage() and "not found" in r.getMessage() for r in caplog.records
    )
    for use_fallback in (True, False):
        with pytest.raises(KernelLoadError, match="not found"):
            kernelize(layer, device="cpu", mode=Mode.INFERENCE, use_fallback=use_fallback)


def test_layer_repository_is_a_hashable_value_whose_str_never_touches_the_network(hub):
    repo = LayerRepository(
        "kernels-community/activation",
        layer_name="SiluAndMul",
        version=">=0.0.4,<0.1.0",
        trust_remote_code=["someone"],
    )
    same = LayerRepository(
        "kernels-community/activation",
        layer_name="SiluAndMul",
        version=">=0.0.4,<0.1.0",
        trust_remote_code=["someone"],
    )
    assert repo == same and hash(repo) == hash(same) and {repo: 1}[same] == 1
    assert repo.trust_remote_code == ("someone",)
    hub.proxy.stop()
    try:
        assert (
            str(repo) == "kernels-community/activation (version >=0.0.4,<0.1.0), layer SiluAndMul"
        )
    finally:
        hub.proxy.start()
    module = repo.load()
    assert repo.load() is module  # resolved once per instance
    assert repo.commit is not None
    assert f"commit {repo.commit[:12]}" in str(repo)
    assert repo == same  # loading does not change identity
    assert copy.deepcopy(repo) is repo
    clone = pickle.loads(pickle.dumps(repo))
    assert clone == repo and clone.commit is None


def test_transformers_style_construction():
    """transformers builds LayerRepository with keyword arguments only."""
    repo = LayerRepository(
        repo_id="kernels-community/activation",
        layer_name="SiluAndMul",
        version=">=0.0.4,<0.1.0",
        revision=None,
    )
    layer = repo.load()  # the layer class, as transformers 5.x reads it (__module__, __name__)
    assert layer.__name__ == "SiluAndMul" and layer.__module__.endswith(".layers")
    assert repo.load_package().VERSION == "0.0.5"
