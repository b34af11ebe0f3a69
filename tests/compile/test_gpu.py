"""On a CUDA GPU: inductor downstream in bfloat16, training through our kernels' backward, the
Triton ReLU under inductor, and the layer norm."""

import pytest
import torch
from torch import nn

from kernels.compile import KernelRegistry, kernels_backend
from tests.support.compile import LlamaBlock, check_against_float64, randn, triton_relu

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("norm", ["module", "formula"])
def test_llama_block_bf16_under_inductor(norm):
    block = LlamaBlock(hidden=256, heads=2, intermediate=512, norm=norm).cuda().bfloat16()
    backend = kernels_backend(KernelRegistry.library(policy="always"))
    compiled = torch.compile(block, backend=backend, fullgraph=True)
    check_against_float64(block, compiled, randn(4, 64, 256, dtype=torch.bfloat16),
                          dtype=torch.bfloat16, what=norm)  # fmt: skip
    assert (backend.count("rms_norm"), backend.count("silu_mul")) == (2, 1), backend.report()


def test_layer_norm_and_gelu_mlp_bf16_under_inductor():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.up, self.down = (
                nn.LayerNorm(256),
                nn.Linear(256, 1024),
                nn.Linear(1024, 256),
            )

        def forward(self, x):
            return x + self.down(nn.functional.gelu(self.up(self.norm(x)), approximate="tanh"))

    block = Block().cuda().bfloat16()
    registry = KernelRegistry.library()
    registry.set_policy("layer_norm", "always")
    backend = kernels_backend(registry)
    check_against_float64(block, torch.compile(block, backend=backend),
                          randn(8, 256, dtype=torch.bfloat16), dtype=torch.bfloat16)  # fmt: skip
    assert backend.count("layer_norm") == 1
    assert backend.count("gelu_tanh") == 0  # eager_only: inductor fuses it into the bias add


def test_triton_relu_under_inductor_trains():
    registry = KernelRegistry()
    registry.register("relu", triton_relu)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(inplace=True), nn.Linear(128, 8)).cuda()
    backend = kernels_backend(registry)
    check_against_float64(model, torch.compile(model, backend=backend), randn(16, 64))
    assert backend.count("relu") == 1


@pytest.mark.parametrize("downstream", ["inductor", "eager", "aot_eager"])
def test_llama_block_trains_from_cuda_graphs(downstream):
    """cuda_graphs=True: every graph (forward and backward) is captured, none skipped, and
    replays give the float64 reference's output and gradients, step after step."""
    from torch._dynamo.utils import counters
    from torch._inductor import cudagraph_trees

    torch._dynamo.reset()
    counters.clear()
    container = cudagraph_trees.get_container(torch.cuda.current_device())
    before = set(container.tree_manager.id_to_mode) if container.tree_manager else set()
    block = LlamaBlock(hidden=256, heads=2, intermediate=512).cuda().bfloat16()
    backend = kernels_backend(downstream=downstream, cuda_graphs=True)
    compiled = torch.compile(block, backend=backend)
    for seed in range(3):  # the first steps record, the later ones replay
        check_against_float64(block, compiled, randn(4, 64, 256, dtype=torch.bfloat16, seed=seed),
                              dtype=torch.bfloat16, what=f"{downstream} step {seed}")  # fmt: skip
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    # The step's forward and backward were recorded as CUDA graphs by PyTorch's graph trees.
    manager = container.tree_manager
    assert manager is not None, "no CUDA graph was recorded"
    modes = {manager.id_to_mode[f].name for f in set(manager.id_to_mode) - before}
    assert {"FORWARD", "BACKWARD"} <= modes, modes
    assert any(manager.roots.get(f) for f in set(manager.id_to_mode) - before)
    assert backend.count("rms_norm") == (0 if downstream == "inductor" else 2), backend.report()
