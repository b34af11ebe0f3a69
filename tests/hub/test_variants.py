"""Which build variant a machine loads: names as Hugging Face's kernel-builder publishes them.

The torch module is described by a stand-in with the attributes `describe_machine` reads
(``__version__``, ``version.cuda/hip/xpu``, ``backends.mps``, ``compiled_with_cxx11_abi``),
so the CUDA, ROCm, XPU, Metal, CPU and Windows cases run on any machine.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kernels.repos.variants import choose_variant, describe_machine, machine_build


def fake_torch(version="2.8.0", *, cuda=None, hip=None, xpu=None, mps=False, cxx11=True):
    return SimpleNamespace(
        __version__=version,
        version=SimpleNamespace(cuda=cuda, hip=hip, xpu=xpu),
        backends=SimpleNamespace(mps=SimpleNamespace(is_available=lambda: mps)),
        compiled_with_cxx11_abi=lambda: cxx11,
    )


@pytest.mark.parametrize(
    ("torch", "system", "machine", "compiled", "noarch"),
    [
        (fake_torch("2.8.0+cu128", cuda="12.8"), "Linux", "x86_64",
         "torch28-cxx11-cu128-x86_64-linux", "torch-cuda"),
        (fake_torch("2.6.0", cuda="12.4", cxx11=False), "Linux", "x86_64",
         "torch26-cxx98-cu124-x86_64-linux", "torch-cuda"),
        (fake_torch("2.9.0", cuda="12.9"), "Linux", "aarch64",
         "torch29-cxx11-cu129-aarch64-linux", "torch-cuda"),
        (fake_torch("2.8.0+rocm6.3", hip="6.3.42131-fa1d09cbd"), "Linux", "x86_64",
         "torch28-cxx11-rocm63-x86_64-linux", "torch-rocm"),
        (fake_torch("2.8.0+xpu", xpu="20250101"), "Linux", "x86_64",
         "torch28-cxx11-xpu20251-x86_64-linux", "torch-xpu"),
        (fake_torch("2.9.0+xpu", xpu="20250200"), "Linux", "x86_64",
         "torch29-cxx11-xpu20252-x86_64-linux", "torch-xpu"),
        (fake_torch("2.8.0", mps=True), "Darwin", "arm64",
         "torch28-metal-aarch64-darwin", "torch-metal"),
        (fake_torch("2.8.0", mps=False), "Darwin", "arm64",
         "torch28-cpu-aarch64-darwin", "torch-cpu"),
        (fake_torch("2.8.0+cpu"), "Linux", "aarch64",
         "torch28-cxx11-cpu-aarch64-linux", "torch-cpu"),
        (fake_torch("2.8.0+cu128", cuda="12.8"), "Windows", "AMD64",
         "torch28-cu128-x86_64-windows", "torch-cuda"),
        (fake_torch("2.10.0.dev20251001", cuda="13.0"), "Linux", "x86_64",
         "torch210-cxx11-cu130-x86_64-linux", "torch-cuda"),
    ],
)  # fmt: skip
def test_machine_names_the_variants_kernel_builder_publishes(
    torch, system, machine, compiled, noarch
):
    described = describe_machine(torch, system=system, machine=machine)
    assert described.compiled_variant == compiled
    assert described.acceptable_variants() == (compiled, noarch, "torch-universal")
    offered = ["torch-universal", noarch, compiled, "torch27-cxx11-cu126-x86_64-linux"]
    assert choose_variant(offered, where="r", machine=described) == compiled


def test_this_machine_is_described_by_the_running_torch():
    import platform

    import torch

    assert machine_build() == describe_machine(
        torch, system=platform.system(), machine=platform.machine()
    )
