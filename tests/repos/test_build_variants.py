"""Build variant names as today's Hub publishes them, and which one a machine loads.

Machines are described directly (`MachineBuild`), so CUDA, ROCm, macOS and tvm-ffi cases
run anywhere; `tests/repos/hub/test_variants.py` covers describing the running torch.
"""

from __future__ import annotations

import pytest
from packaging.version import Version

from kernels import BuildVariantNotFoundError
from kernels.repos.variants import (
    BuildVariant,
    MachineBuild,
    VariantAccepted,
    VariantRejected,
    choose_variant,
    decide_variants,
)


def machine(torch="2.9", cuda="12.8", *, cpu="x86_64", os="linux", abi="cxx11", tvm_ffi=None):
    return MachineBuild(
        torch=Version(torch),
        cxx_abi=abi,
        backend="cuda" if cuda else "cpu",
        backend_version=Version(cuda) if cuda else None,
        cpu=cpu,
        os=os,
        tvm_ffi=Version(tvm_ffi) if tvm_ffi else None,
    )


H100 = machine()


def accepted(names, on=H100, prefer="compiled"):
    return [
        d.variant.variant_str
        for d in decide_variants(names, machine=on, prefer=prefer)
        if isinstance(d, VariantAccepted)
    ]


def reasons(names, on=H100):
    return {
        d.variant.variant_str: d.reason
        for d in decide_variants(names, machine=on)
        if isinstance(d, VariantRejected)
    }


@pytest.mark.parametrize(
    ("name", "kind", "framework", "abi", "backend", "backend_version", "cpu", "os"),
    [
        ("torch28-cxx11-cu128-x86_64-linux", "torch", "2.8", "cxx11", "cuda", "12.8", "x86_64", "linux"),
        ("torch211-cu130-aarch64-linux", "torch", "2.11", None, "cuda", "13.0", "aarch64", "linux"),
        ("torch27-cxx98-cu118-x86_64-linux", "torch", "2.7", "cxx98", "cuda", "11.8", "x86_64", "linux"),
        ("torch28-cxx11-rocm63-x86_64-linux", "torch", "2.8", "cxx11", "rocm", "6.3", "x86_64", "linux"),
        ("torch28-cxx11-xpu20251-x86_64-linux", "torch", "2.8", "cxx11", "xpu", "2025.1", "x86_64", "linux"),
        ("torch27-metal-aarch64-darwin", "torch", "2.7", None, "metal", None, "aarch64", "darwin"),
        ("torch-stable-abi29-cu128-x86_64-linux", "stable-abi", "2.9", None, "cuda", "12.8", "x86_64", "linux"),
        ("torch-stable-abi210-cpu-x86_64-linux", "stable-abi", "2.10", None, "cpu", None, "x86_64", "linux"),
        ("tvm-ffi01-cu126-x86_64-linux", "tvm-ffi", "0.1", None, "cuda", "12.6", "x86_64", "linux"),
        ("torch-cuda", "backend", None, None, "cuda", None, None, None),
        ("torch-universal", "universal", None, None, None, None, None, None),
    ],
)  # fmt: skip
def test_variant_names_are_read(name, kind, framework, abi, backend, backend_version, cpu, os):
    variant = BuildVariant.parse(name)
    assert variant.kind == kind
    assert variant.framework_version == (Version(framework) if framework else None)
    assert variant.cxx_abi == abi
    assert variant.backend == backend
    assert variant.backend_version == (Version(backend_version) if backend_version else None)
    assert (variant.cpu, variant.os) == (cpu, os)


@pytest.mark.parametrize(
    "name",
    ["torch-2.10-cu128-cpython-3.9-abi3-x86_64-linux", "torch28-cxx14-cu128-x86_64-linux", "torch28-cu128", "tvm-ffi-cu128-x86_64-linux",
     "torch-stable-abi-cu128-x86_64-linux", "torch28-cxx11-cuda-x86_64-linux"],
)  # fmt: skip
def test_malformed_names_are_rejected_with_a_reason_not_ignored(name):
    with pytest.raises(ValueError):
        BuildVariant.parse(name)
    assert name in reasons([name, "torch-universal"])


def test_cuda_builds_run_on_a_newer_minor_of_the_same_major():
    names = [
        f"torch29-cxx11-cu{v}-x86_64-linux" for v in ("118", "124", "126", "128", "129", "130")
    ]
    assert accepted(names) == [
        "torch29-cxx11-cu128-x86_64-linux",
        "torch29-cxx11-cu126-x86_64-linux",
        "torch29-cxx11-cu124-x86_64-linux",
    ]
    rejected = reasons(names)
    assert "CUDA version (12.9)" in rejected["torch29-cxx11-cu129-x86_64-linux"]
    assert "CUDA version (11.8)" in rejected["torch29-cxx11-cu118-x86_64-linux"]
    assert "needs 12.x with x <= 8" in rejected["torch29-cxx11-cu130-x86_64-linux"]


def test_rocm_builds_run_on_a_newer_minor_of_the_same_major():
    # 0.19: ROCm follows CUDA's rule (0.18 wanted the exact release).
    rocm = MachineBuild(Version("2.8"), "cxx11", "rocm", Version("6.4"), "x86_64", "linux")
    names = [f"torch28-cxx11-rocm{v}-x86_64-linux" for v in ("63", "64", "70")]
    assert accepted(names, on=rocm) == [
        "torch28-cxx11-rocm64-x86_64-linux",
        "torch28-cxx11-rocm63-x86_64-linux",
    ]
    assert "ROCm version (7.0)" in reasons(names, on=rocm)["torch28-cxx11-rocm70-x86_64-linux"]


def test_xpu_builds_need_their_exact_version():
    xpu = MachineBuild(Version("2.8"), "cxx11", "xpu", Version("2025.2"), "x86_64", "linux")
    names = ["torch28-xpu20251-x86_64-linux", "torch28-xpu20252-x86_64-linux"]
    assert accepted(names, on=xpu) == ["torch28-xpu20252-x86_64-linux"]
    assert reasons(names, on=xpu)["torch28-xpu20251-x86_64-linux"] == (
        "built for xpu 2025.1; this machine has xpu 2025.2"
    )


def test_the_order_of_preference_is_stable_abi_torch_tvm_ffi_backend_universal():
    names = [
        "torch-universal",
        "torch-cuda",
        "tvm-ffi01-cu128-x86_64-linux",
        "torch29-cxx11-cu128-x86_64-linux",
        "torch29-cu126-x86_64-linux",
        "torch-stable-abi28-cu128-x86_64-linux",
        "torch-stable-abi29-cu124-x86_64-linux",
        "torch-stable-abi29-cu126-x86_64-linux",
    ]
    assert accepted(names, on=machine(tvm_ffi="0.1")) == [
        "torch-stable-abi29-cu126-x86_64-linux",  # newest ABI first, then the newest CUDA
        "torch-stable-abi29-cu124-x86_64-linux",
        "torch-stable-abi28-cu128-x86_64-linux",
        "torch29-cu126-x86_64-linux",  # per-torch builds: without the ABI tag first
        "torch29-cxx11-cu128-x86_64-linux",
        "tvm-ffi01-cu128-x86_64-linux",
        "torch-cuda",
        "torch-universal",
    ]


def test_noarch_preference_puts_pure_python_builds_first():
    names = ["torch-universal", "torch-cuda", "torch29-cxx11-cu128-x86_64-linux"]
    assert accepted(names, prefer="noarch") == [
        "torch-cuda",
        "torch-universal",
        "torch29-cxx11-cu128-x86_64-linux",
    ]


def test_stable_abi_builds_need_at_least_their_torch():
    names = ["torch-stable-abi210-cu128-x86_64-linux", "torch-stable-abi27-cu128-x86_64-linux"]
    assert accepted(names) == ["torch-stable-abi27-cu128-x86_64-linux"]
    assert reasons(names)["torch-stable-abi210-cu128-x86_64-linux"] == (
        "needs torch >= 2.10 (torch's stable ABI); torch here is 2.9"
    )


def test_per_torch_builds_need_their_torch_and_abi():
    names = [
        "torch28-cxx11-cu128-x86_64-linux",
        "torch29-cxx98-cu128-x86_64-linux",
        "torch29-cu128-x86_64-linux",
    ]
    assert accepted(names) == ["torch29-cu128-x86_64-linux"]
    rejected = reasons(names)
    assert rejected["torch28-cxx11-cu128-x86_64-linux"] == "built for torch 2.8; torch here is 2.9"
    assert "C++ ABI cxx98" in rejected["torch29-cxx98-cu128-x86_64-linux"]
    # A name without the ABI tag is accepted whatever the ABI (Hugging Face's rule); a torch
    # with the old ABI prefers the build tagged for it.
    old_abi = machine(abi="cxx98")
    assert accepted(names, on=old_abi) == [
        "torch29-cxx98-cu128-x86_64-linux",
        "torch29-cu128-x86_64-linux",
    ]


@pytest.mark.parametrize("abi", ["cxx11", "cxx98", None])
def test_untagged_per_torch_builds_skip_the_abi_check(abi):
    untagged = "torch213-cu130-x86_64-linux"
    on = machine(torch="2.13", cuda="13.0", abi=abi)
    assert accepted([untagged], on=on) == [untagged]
    assert BuildVariant.parse(untagged).cxx_abi is None


def test_tagged_per_torch_builds_keep_the_abi_check():
    names = ["torch213-cxx11-cu130-x86_64-linux", "torch213-cxx98-cu130-x86_64-linux"]
    on = machine(torch="2.13", cuda="13.0", abi="cxx11")
    assert accepted(names, on=on) == ["torch213-cxx11-cu130-x86_64-linux"]
    assert "C++ ABI cxx98" in reasons(names, on=on)["torch213-cxx98-cu130-x86_64-linux"]
    # Where torch names no ABI (macOS, Windows), a tagged Linux-style name is rejected.
    no_abi = machine(torch="2.13", cuda="13.0", abi=None)
    assert accepted(names, on=no_abi) == []


def test_tvm_ffi_builds_need_that_tvm_ffi_installed():
    names = ["tvm-ffi01-cu128-x86_64-linux"]
    assert reasons(names)[names[0]] == "built for tvm-ffi 0.1, which is not installed"
    assert accepted(names, on=machine(tvm_ffi="0.1")) == names
    assert "tvm-ffi here is 0.2" in reasons(names, on=machine(tvm_ffi="0.2"))[names[0]]


def test_cpu_os_and_backend_must_match():
    names = [
        "torch29-cxx11-cu128-aarch64-linux",
        "torch29-cu128-x86_64-windows",
        "torch29-cxx11-rocm63-x86_64-linux",
        "torch-rocm",
    ]
    rejected = reasons(names)
    assert rejected["torch29-cxx11-cu128-aarch64-linux"] == (
        "built for CPU aarch64, which does not match system CPU (x86_64)"
    )
    assert "OS windows" in rejected["torch29-cu128-x86_64-windows"]
    assert "backend rocm" in rejected["torch29-cxx11-rocm63-x86_64-linux"]
    assert "pure-Python build for rocm" in rejected["torch-rocm"]


def test_no_fitting_variant_lists_every_variant_with_its_reason():
    names = ["torch28-cxx11-cu128-x86_64-linux", "tvm-ffi01-cu128-x86_64-linux", "docs"]
    with pytest.raises(BuildVariantNotFoundError) as info:
        choose_variant(names, where="org/kernel (tag v1.0.0)", machine=H100)
    message = str(info.value)
    assert message.startswith("org/kernel (tag v1.0.0) has no build variant for this machine.")
    assert "torch28-cxx11-cu128-x86_64-linux: rejected (built for torch 2.8;" in message
    assert "tvm-ffi01-cu128-x86_64-linux: rejected (built for tvm-ffi 0.1" in message
    assert "docs" not in message  # not shaped like a variant: not a build at all
    assert "torch 2.9, cu128, x86_64-linux" in message
