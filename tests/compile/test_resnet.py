"""OpenDeepKernel's example: torchvision's ResNet-18 compiled with a Triton ReLU of one's own
(registered with the decorator), every ReLU replaced, in place ones included."""

import pytest
import torch

from kernels.compile import KernelRegistry, kernels_backend
from tests.support.compile import DEVICE, randn, triton_relu

torchvision = pytest.importorskip("torchvision")


def test_resnet18_with_a_triton_relu():
    registry = KernelRegistry.library()
    registry.register("relu", triton_relu)
    model = torchvision.models.resnet18(num_classes=10).to(DEVICE).eval()
    backend = kernels_backend(registry, downstream="eager")
    compiled = torch.compile(model, backend=backend)
    x = randn(1, 3, 32, 32)
    # Against the same model eagerly, not float64: on a GPU its float32 convolutions run in
    # TF32 (cuDNN's default), 1e-3 away from float64; a ReLU is exact either way.
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    # The stem's ReLU and two in each of the eight basic blocks, all nn.ReLU(inplace=True).
    assert backend.count("relu") == 17, backend.report()
    assert {r.form for r in backend.reports[0].replaced} == {"F.relu (in place)"}
