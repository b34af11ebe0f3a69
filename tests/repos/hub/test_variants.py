"""Which build variant a machine loads: names as Hugging Face's kernel-builder publishes them.

The torch module is described by a stand-in with the attributes `describe_machine` reads
(``__version__``, ``version.cuda/hip/xpu``, ``backends.mps``, ``compiled_with_cxx11_abi``),
so the CUDA, ROCm, XPU, Metal, CPU and Windows cases run on any machine.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from packaging.version import Version

from kernels.repos.variants import (
    VariantAccepted,
    choose_variant,
    decide_variants,
    describe_machine,
    machine_build,
)


def fake_torch(version="2.8.0", *, cuda=None, hip=None, rocm=None, xpu=None, mps=False, cxx11=True):
    return SimpleNamespace(
        __version__=version,
        version=SimpleNamespace(cuda=cuda, hip=hip, rocm=rocm, xpu=xpu),
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
        # ROCm 10.0 ships HIP 7.15: torch.version.rocm (torch >= 2.10) names the release.
        (fake_torch("2.15.0+rocm10.0", hip="7.15.1-abc", rocm="10.0.0"), "Linux", "x86_64",
         "torch215-cxx11-rocm100-x86_64-linux", "torch-rocm"),
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
    # Compiled Metal builds need macOS 26 (the release is ignored on other systems).
    described = describe_machine(torch, system=system, machine=machine, macos=Version("26.0"))
    assert described.compiled_variant == compiled
    offered = ["torch-universal", noarch, compiled, "torch27-cxx11-cu126-x86_64-linux"]
    decisions = decide_variants(offered, machine=described)
    accepted = [d.variant.variant_str for d in decisions if isinstance(d, VariantAccepted)]
    assert accepted == [compiled, noarch, "torch-universal"]
    assert choose_variant(offered, where="r", machine=described) == compiled


def test_this_machine_is_described_by_the_running_torch():
    import platform

    import torch

    assert machine_build() == describe_machine(
        torch, system=platform.system(), machine=platform.machine()
    )


HERE = machine_build()
STABLE_ABI_HERE = (
    f"torch-stable-abi{HERE.torch.major}{HERE.torch.minor}-{HERE.runtime}-{HERE.cpu}-{HERE.os}"
)
NEWER_TORCH = f"torch{HERE.torch.major}{HERE.torch.minor + 1}-{HERE.runtime}-{HERE.cpu}-{HERE.os}"
TVM_FFI = f"tvm-ffi01-{HERE.runtime}-{HERE.cpu}-{HERE.os}"


@pytest.mark.hub
def test_a_kernel_shipping_only_a_stable_abi_build_loads_it(released):
    import kernels

    repo = released("0.1.0", variants=(STABLE_ABI_HERE, NEWER_TORCH))
    module = kernels.get_kernel(repo.repo_id, version=">=0.1")
    assert module.VARIANT == STABLE_ABI_HERE


@pytest.mark.hub
def test_get_kernel_variants_says_which_run_here_and_why_not(released, python):
    import kernels
    from kernels import VariantAccepted, VariantRejected

    repo = released("0.1.0", variants=("torch-universal", STABLE_ABI_HERE, NEWER_TORCH, TVM_FFI))
    decisions = kernels.get_kernel_variants(repo.repo_id, version=">=0.1")
    accepted = [
        (d.variant.variant_str, d.rank) for d in decisions if isinstance(d, VariantAccepted)
    ]
    assert accepted == [(STABLE_ABI_HERE, 0), ("torch-universal", 1)]
    rejected = {
        d.variant.variant_str: d.reason for d in decisions if isinstance(d, VariantRejected)
    }
    assert rejected[NEWER_TORCH].startswith(f"built for torch {HERE.torch.major}.")
    assert rejected[TVM_FFI] == "built for tvm-ffi 0.1, which is not installed"
    # Nothing was downloaded to decide.
    assert not kernels.repos.hubclient.cached_commits(repo.repo_id)

    # Offline, the cached variants answer (only the one downloaded).
    kernels.get_kernel(repo.repo_id, version=">=0.1")
    result = python(
        f"""
        import kernels
        for d in kernels.get_kernel_variants({repo.repo_id!r}, version=">=0.1"):
            print(d.variant.variant_str, getattr(d, "rank", None))
        """,
        env={"HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [STABLE_ABI_HERE, "0"]


@pytest.mark.hub
def test_no_variant_for_this_machine_lists_every_reason(released):
    import kernels
    from kernels import BuildVariantNotFoundError

    repo = released("0.1.0", variants=(NEWER_TORCH, TVM_FFI))
    with pytest.raises(BuildVariantNotFoundError) as info:
        kernels.get_kernel(repo.repo_id, version=">=0.1")
    message = str(info.value)
    assert f"{NEWER_TORCH}: rejected (built for torch" in message
    assert f"{TVM_FFI}: rejected (built for tvm-ffi 0.1, which is not installed)" in message
    assert kernels.has_kernel(repo.repo_id, version=">=0.1") is False
