"""check_arch: a build's declared GPU architectures against the device (described, so that
every case runs without a GPU)."""

from __future__ import annotations

import pytest

from kernels.errors import KernelArchError, KernelLoadError
from kernels.repos.archs import Device, arch_rejection, check_arch, supports_cuda_capability


@pytest.mark.parametrize(
    ("archs", "capability", "runs"),
    [
        (["8.0"], (8, 6), True),  # same major, newer minor
        (["8.6"], (8, 0), False),
        (["8.0"], (9, 0), False),  # a plain build does not run on the next major
        (["8.0", "9.0"], (9, 0), True),
        (["9.0a"], (9, 0), True),
        (["9.0a"], (9, 1), False),  # architecture-specific: that capability only
        (["10.0f"], (10, 3), True),  # family-specific: same major
        (["10.0f"], (12, 0), False),
        (["9.0+PTX"], (12, 1), True),  # PTX is JIT-compiled on newer GPUs
        (["9.0+PTX"], (8, 6), False),
        (["9.0a+PTX"], (10, 0), False),  # a and f keep their meaning with +PTX
        (["10.0f+PTX"], (12, 0), False),
        (["sm_90", "8.0"], (9, 0), False),  # an unreadable entry matches nothing...
        (["sm_90"], (9, 0), True),  # ...but a list of only such entries cannot be judged
    ],
)
def test_cuda_capabilities(archs, capability, runs):
    assert supports_cuda_capability(archs, capability) is runs


CUDA_90A = {"type": "cuda", "archs": ["9.0a"]}


def test_a_build_for_another_gpu_is_refused_with_the_way_out():
    with pytest.raises(KernelArchError) as info:
        check_arch(CUDA_90A, kernel="relu", variant="torch-cuda", device=Device("cuda", (8, 0)))
    message = str(info.value)
    assert "does not support the current device" in message
    assert "CUDA capability 8.0 of the current device is not supported" in message
    assert "9.0a" in message and "check_arch=False" in message
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, KernelLoadError)


def test_check_false_and_builds_without_archs_load():
    check_arch(CUDA_90A, kernel="relu", variant="v", check=False, device=Device("cuda", (8, 0)))
    check_arch({"type": "cuda"}, kernel="relu", variant="v", device=Device("cuda", (8, 0)))
    check_arch(CUDA_90A, kernel="relu", variant="v", device=Device("cuda", (9, 0)))
    # No GPU, or a GPU of another backend: nothing to compare.
    assert arch_rejection(CUDA_90A, None) is None
    assert arch_rejection(CUDA_90A, Device("rocm", "gfx942")) is None


def test_rocm_targets_must_match_exactly():
    rocm = {"type": "rocm", "archs": ["gfx90a", "gfx942"]}
    assert arch_rejection(rocm, Device("rocm", "gfx942")) is None
    reason = arch_rejection(rocm, Device("rocm", "gfx1100"))
    assert reason is not None and "ROCm arch gfx1100" in reason


@pytest.mark.parametrize(
    "backend", [None, {"type": "cpu", "archs": ["x"]}, {"type": "cuda", "archs": "9.0"}, []]
)
def test_malformed_or_foreign_backend_info_is_not_judged(backend):
    assert arch_rejection(backend, Device("cuda", (8, 0))) is None
