"""Guards: a pattern found on inputs a kernel does not take keeps its ops, computes what it
computed before, and the report says why."""

import torch
import torch.nn.functional as F

from kernels.compile import KernelRegistry, kernels_backend
from tests.support.compile import DEVICE, LlamaBlock, on_device, randn


def test_float64_is_not_replaced_and_stays_exact(library):
    block = on_device(LlamaBlock()).double()
    backend = kernels_backend(library, downstream="eager")
    x = randn(2, 5, 32, dtype=torch.float64)
    out = torch.compile(block, backend=backend)(x)
    torch.testing.assert_close(out, block(x), rtol=0, atol=0)
    assert backend.count() == 0
    kept = {r.pattern: r.reason for r in backend.reports[0].kept}
    assert set(kept) == {"rms_norm", "silu_mul", "silu"}  # the SiLU, once the product is left
    assert kept["rms_norm"] == (
        "dtype float64 is not one the kernel takes (float32, float16, bfloat16)"
    )


def test_cpu_tensors_without_the_interpreter_keep_their_ops(library, monkeypatch):
    if DEVICE != "cpu":
        return  # on a GPU machine the inputs are on cuda, where the kernels run
    monkeypatch.delenv("TRITON_INTERPRET")
    backend = kernels_backend(library, downstream="eager")
    x = randn(3, 8)
    torch.testing.assert_close(torch.compile(lambda t: F.silu(t), backend=backend)(x), F.silu(x))
    assert backend.count() == 0
    assert "its inputs are on cpu; the kernel runs on cuda (set TRITON_INTERPRET=1" in (
        backend.report()
    )


def test_a_kernel_limited_to_other_devices_is_not_used(library):
    other = "cpu" if DEVICE == "cuda" else "cuda"
    registry = KernelRegistry()
    registry.register("relu", lambda x: x.clamp_min(0), device_types=(other,))
    backend = kernels_backend(registry, downstream="eager")
    torch.compile(F.relu, backend=backend)(randn(4))
    assert backend.count() == 0
    assert f"the kernel runs on {other}" in backend.report()


def test_a_kernel_limited_to_some_dtypes_is_used_for_those_only():
    registry = KernelRegistry()
    registry.register("relu", lambda x: x.clamp_min(0), dtypes=(torch.bfloat16,))
    backend = kernels_backend(registry, downstream="eager")
    fn = torch.compile(lambda x: F.relu(x), backend=backend)
    fn(randn(4, dtype=torch.bfloat16))
    fn(randn(4))
    assert [r.count("relu") for r in backend.reports] == [1, 0]
    assert "dtype float32 is not one the kernel takes (bfloat16)" in backend.report()
