"""The overrides under ``torch.compile``: inductor generates its own kernels for these operators
(it decomposes and lowers ``native_layer_norm``, ``silu`` and ``gelu`` itself), so compiled code
does not call ours; backends that run the traced aten graph eagerly (``aot_eager``) call them.
docs/overrides.md says so."""

import pytest
import torch
import torch.nn.functional as F

from kernels.overrides import aten_override_calls, reset_aten_override_calls, use_aten_overrides
from tests.support.overrides import DEVICE, paths, randn

# Inductor's own imports warn that torch.jit.script_method is deprecated (torch 2.13).
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")


def _layer_norm_silu(x, w, b):
    return F.silu(F.layer_norm(x, (x.shape[-1],), w, b))


def _inputs():
    return randn(4, 48).requires_grad_(), randn(48, shift=1.0), randn(48)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_inductor_generates_its_own_kernels_and_bypasses_the_overrides():
    x, w, b = _inputs()
    reference = _layer_norm_silu(x, w, b)
    compiled = torch.compile(_layer_norm_silu, backend="inductor", fullgraph=True)
    with use_aten_overrides(ops=["layer_norm", "silu"]):
        y = compiled(x, w, b)
        y.square().sum().backward()
    assert aten_override_calls() == {}  # no call reached the dispatcher's CUDA/CPU kernels
    torch.testing.assert_close(y, reference, rtol=1e-5, atol=1e-5)


def test_aot_eager_runs_the_traced_graph_through_the_overrides():
    x, w, b = _inputs()
    reference = _layer_norm_silu(x, w, b)
    compiled = torch.compile(_layer_norm_silu, backend="aot_eager", fullgraph=True)
    compiled(x, w, b)  # traced with PyTorch's kernels: the graph holds aten operators, not kernels
    reset_aten_override_calls()
    with use_aten_overrides(ops=["layer_norm", "silu"]):
        y = compiled(x, w, b)
        y.square().sum().backward()
    for op in ("native_layer_norm", "native_layer_norm_backward", "silu", "silu_backward"):
        assert paths(op) == {"ours": 1}, op
    torch.testing.assert_close(y, reference, rtol=1e-5, atol=1e-5)
    assert DEVICE in str(y.device)
