"""The 0.19 variant names (new spelling, Python tags, SDKs, MLX, CANN, TPU) and the choice
among them, through the documented entry point `rank_variants` with described machines."""

from __future__ import annotations

import itertools
import re

import pytest
from packaging.version import Version

from kernels import BuildVariant, KernelMetadataError
from kernels.repos.variant_names import (
    check_python_tag,
    parse_backend,
    parse_python_tag,
    spell_backend,
)
from kernels.repos.variants import (
    MachineBuild,
    VariantAccepted,
    VariantRejected,
    is_variant_name,
    rank_variants,
    variants_in,
)

PY_TAGS = ["cpython-3.9-abi3", "cpython-3.12-abi3", "cpython-3.15-abi3t"]


def machine(backend="cuda", version="12.8", *, torch="2.10", cpu="x86_64", os="linux", **kw):
    kw.setdefault("python", Version("3.15"))
    kw.setdefault("free_threaded", False)
    return MachineBuild(
        Version(torch) if torch else None,
        "cxx11" if torch and os == "linux" else None,
        backend,
        Version(version) if version else None,
        cpu,
        os,
        **kw,
    )


def choice(names, on, **kw):
    decisions = rank_variants(names, on, **kw)
    accepted = [d.variant.variant_str for d in decisions if isinstance(d, VariantAccepted)]
    rejected = {
        d.variant.variant_str: d.reason for d in decisions if isinstance(d, VariantRejected)
    }
    assert set(accepted) | set(rejected) == set(variants_in(names))
    return accepted, rejected


NEW_NAMES = [
    f"torch-{t}{abi}-{b}-{py}-{sys}"
    for t, abi, b, py, sys in itertools.product(
        ["2.5", "2.12"],
        ["", "-cxx11"],
        ["cpu", "cuda-13.0", "rocm-10.0", "xpu-2025.2", "cann-8.1"],
        PY_TAGS,
        ["aarch64-linux", "x86_64-linux"],
    )
] + [
    "tvm-ffi-0.1-metal-cpython-3.12-abi3-aarch64-darwin",
    "torch-stable-abi-2.11-cuda-12.8-cpython-3.15-abi3t-x86_64-linux",
    "torch-2.10-tpu-cpython-3.9-abi3-x86_64-linux",
    "torch-2.10-neuron-cpython-3.9-abi3-x86_64-linux",
]


@pytest.mark.parametrize("name", NEW_NAMES)
def test_new_spelling_is_read(name):
    variant = BuildVariant.parse(name)
    assert not variant.legacy
    assert variant.variant_str == name
    assert f"-cpython-{variant.python_version}-{variant.python_abi}-" in name
    assert is_variant_name(name) and variants_in([name]) == [name]


def test_both_spellings_of_one_build_share_their_identity():
    legacy = BuildVariant.parse("torch210-cxx11-cu128-x86_64-linux")
    new = BuildVariant.parse("torch-2.10-cxx11-cuda-12.8-cpython-3.9-abi3-x86_64-linux")
    assert legacy.legacy and legacy.python_version == Version("3.9") and legacy.python_abi == "abi3"
    assert legacy.identity == new.identity
    cp312 = BuildVariant.parse("torch-2.10-cxx11-cuda-12.8-cpython-3.12-abi3-x86_64-linux")
    assert cp312.identity != new.identity


@pytest.mark.parametrize(
    ("legacy", "new", "backend", "version"),
    [
        ("cu128", "cuda-12.8", "cuda", "12.8"),
        ("rocm71", "rocm-7.1", "rocm", "7.1"),
        ("rocm714", "rocm-7.14", "rocm", "7.14"),
        ("rocm101", "rocm-10.1", "rocm", "10.1"),  # ROCm 10.1, not 1.01
        ("rocm200", "rocm-20.0", "rocm", "20.0"),
        ("xpu20253", "xpu-2025.3", "xpu", "2025.3"),
        ("cann81", "cann-8.1", "cann", "8.1"),
        ("cu1300", "cuda-130.0", "cuda", "130.0"),  # legacy: the last digit is the minor
    ],
)
def test_backends_in_both_spellings(legacy, new, backend, version):
    assert parse_backend([legacy], legacy=True) == (backend, Version(version))
    assert parse_backend(new.split("-"), legacy=False) == (backend, Version(version))
    with pytest.raises(ValueError):
        parse_backend(new.split("-"), legacy=True)
    with pytest.raises(ValueError):
        parse_backend([legacy], legacy=False)
    # spell_backend is parse_backend's inverse, in either spelling.
    assert spell_backend(backend, Version(version), legacy=True) == legacy
    assert spell_backend(backend, Version(version), legacy=False) == new


@pytest.mark.parametrize("backend", ["cpu", "metal", "neuron", "tpu"])
def test_unversioned_backends_are_spelled_by_name(backend):
    for legacy in (True, False):
        assert spell_backend(backend, None, legacy=legacy) == backend
        assert parse_backend([backend], legacy=legacy) == (backend, None)


@pytest.mark.parametrize(
    ("tag", "expected"),
    [
        ("cpython-3.9-abi3", (Version("3.9"), "abi3")),
        ("cpython-3.10-abi3", (Version("3.10"), "abi3")),  # 3.10, not 3.1
        ("cpython-3.16-abi3t", (Version("3.16"), "abi3t")),
    ],
)
def test_python_tags_are_read(tag, expected):
    assert parse_python_tag(tag.split("-")) == expected


@pytest.mark.parametrize(
    ("tag", "why"),
    [
        ("cpython-3.12", "is not cpython-<X.Y>-<abi3|abi3t>"),
        ("cpython-3.12-abi3-x", "is not cpython-<X.Y>-<abi3|abi3t>"),
        ("cp-3.12-abi3", "is not cpython-<X.Y>-<abi3|abi3t>"),
        ("cpython-3.9.1-abi3", "not <major>.<minor>"),
        ("cpython-3.9-abi4", "unknown Python ABI 'abi4'"),
        ("cpython-3.14-abi3t", "abi3t needs Python 3.15 or later, not 3.14"),
    ],
)
def test_malformed_python_tags_say_why(tag, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        parse_python_tag(tag.split("-"))


def test_check_python_tag():
    check_python_tag(Version("3.9"), "abi3")
    check_python_tag(Version("3.15"), "abi3t")
    with pytest.raises(ValueError, match="abi3t needs Python 3.15"):
        check_python_tag(Version("3.12"), "abi3t")
    with pytest.raises(ValueError, match="unknown Python ABI 'abi3.abi3t'"):
        check_python_tag(Version("3.15"), "abi3.abi3t")


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("torch-2.10-cu128-cpython-3.9-abi3-x86_64-linux", "unknown backend 'cu128'"),
        ("torch210-cuda-12.8-x86_64-linux", "legacy names spell it in one part"),
        ("torch210-cu128-cpython-3.9-abi3-x86_64-linux", "carry no cpython"),
        ("torch-2.10-cuda-12.8-x86_64-linux", "Missing Python version and ABI"),
        ("torch-2.10-cuda-12.8-cpython-3.9-abi4-x86_64-linux", "unknown Python ABI 'abi4'"),
        ("torch-2.10-cuda-12.8-cpython-3.14-abi3t-x86_64-linux", "abi3t needs Python 3.15"),
        ("torch-2.10-cuda-12.8-cpython-39-abi3-x86_64-linux", "not <major>.<minor>"),
        ("torch-2.10-cpython-3.9-abi3-cuda-12.8-x86_64-linux", "is not cpython-<X.Y>"),
        ("torch-2.10.1-cpu-cpython-3.9-abi3-x86_64-linux", "not <major>.<minor>"),
        ("torch-2.10-cpu-12.8-cpython-3.9-abi3-x86_64-linux", "has no version"),
        ("torch-2.10-cuda-cpython-3.9-abi3-x86_64-linux", "needs one version"),
        ("torch-2.10-cpython-3.9-abi3-x86_64-linux", "Missing backend"),
        ("torch210-cxx11-x86_64-linux", "Missing backend"),
        ("tvm-ffi01-x86_64-linux", "Missing backend"),
        ("mlx-0.32-metal-cpython-3.12-abi3-aarch64-darwin", "compiled MLX builds"),
        ("sdk-cu128-cpython-3.9-abi3-x86_64-linux", "unknown backend"),
        ("sdk-cuda-12.8", "sdk or sdk-<backend>"),
        ("sdk-cpython-3.12-abi3-x86_64", "is not cpython-<X.Y>"),
        ("sdk-cpython-3.12-abi3-cuda-12.8-x86_64-linux", "is not cpython-<X.Y>"),
        ("torch-", "is not a backend name"),
    ],
)
def test_malformed_new_names_say_why(name, why):
    with pytest.raises(KernelMetadataError, match="is not a build variant name") as info:
        BuildVariant.parse(name)
    assert why in str(info.value)
    # In a listing they are rejected with the same reason, never skipped.
    _, rejected = choice([name, "torch-universal"], machine())
    assert why in rejected[name]


@pytest.mark.parametrize(
    ("python", "free_threaded", "expected"),
    [
        ("3.11", False, ["3.9-abi3"]),
        ("3.12", False, ["3.12-abi3", "3.9-abi3"]),
        ("3.15", False, ["3.12-abi3", "3.9-abi3", "3.15-abi3t"]),
        ("3.16", False, ["3.12-abi3", "3.9-abi3", "3.16-abi3t", "3.15-abi3t"]),
        ("3.14", True, []),
        ("3.16", True, ["3.16-abi3t", "3.15-abi3t"]),
    ],
)
def test_python_tags(python, free_threaded, expected):
    tags = ["3.9-abi3", "3.12-abi3", "3.15-abi3t", "3.16-abi3t"]
    names = [f"torch-2.10-cuda-12.8-cpython-{t}-x86_64-linux" for t in tags]
    on = machine(python=Version(python), free_threaded=free_threaded)
    accepted, rejected = choice(names, on)
    assert accepted == [f"torch-2.10-cuda-12.8-cpython-{t}-x86_64-linux" for t in expected]
    if free_threaded:
        assert "abi3 is not supported on free-threaded Python" in rejected[names[0]]
    elif python == "3.11":
        assert (
            "Python 3.12 or later is required, system Python version is 3.11" in rejected[names[1]]
        )


def test_legacy_names_are_abi3_and_refused_by_free_threaded_python():
    names = ["torch210-cu128-x86_64-linux", "torch-cuda"]
    assert choice(names, machine(python=Version("3.9")))[0] == names
    accepted, rejected = choice(names, machine(free_threaded=True))
    assert accepted == ["torch-cuda"]
    assert "abi3t is required" in rejected[names[0]]


def test_python_tag_orders_only_otherwise_equal_builds():
    names = [
        "torch-2.10-cuda-12.6-cpython-3.12-abi3-x86_64-linux",
        "torch-2.10-cuda-12.8-cpython-3.15-abi3t-x86_64-linux",
        "torch-2.10-cuda-12.8-cpython-3.9-abi3-x86_64-linux",
    ]
    assert choice(names, machine())[0] == [names[2], names[1], names[0]]


def test_the_full_order_of_kinds():
    expected = [
        "torch-stable-abi-2.10-cuda-12.8-cpython-3.9-abi3-x86_64-linux",
        "torch-2.10-cuda-12.8-cpython-3.9-abi3-x86_64-linux",
        "tvm-ffi-0.1-cuda-12.8-cpython-3.9-abi3-x86_64-linux",
        "sdk-cuda-12.8-cpython-3.9-abi3-x86_64-linux",
        "sdk-cpython-3.9-abi3-x86_64-linux",
        "torch-cuda",
        "torch-universal",
        "sdk-cuda",
        "sdk",
    ]
    on = machine(tvm_ffi=Version("0.1"))
    assert choice(list(reversed(expected)), on)[0] == expected
    # A repository preferring pure-Python builds puts torch-<backend> and universal first.
    noarch_first = choice(expected, on, prefer="noarch")[0]
    assert noarch_first[:2] == ["torch-cuda", "torch-universal"]


def test_sdks_need_no_framework():
    names = [
        "sdk",
        "sdk-cuda",
        "sdk-cpu",
        "sdk-cuda-12.8-cpython-3.9-abi3-x86_64-linux",
        "sdk-cuda-13.0-cpython-3.9-abi3-x86_64-linux",
        "sdk-rocm-6.3-cpython-3.9-abi3-x86_64-linux",
        "sdk-cpython-3.9-abi3-aarch64-linux",
        "torch-2.10-cuda-12.8-cpython-3.9-abi3-x86_64-linux",
    ]
    accepted, rejected = choice(names, machine(torch=None))
    assert accepted == ["sdk-cuda-12.8-cpython-3.9-abi3-x86_64-linux", "sdk-cuda", "sdk"]
    assert "torch is not installed" in rejected[names[-1]]
    assert "does not match system backend" in rejected["sdk-cpu"]
    assert "CUDA version (13.0)" in rejected["sdk-cuda-13.0-cpython-3.9-abi3-x86_64-linux"]
    assert (
        "does not match selected backend" in rejected["sdk-rocm-6.3-cpython-3.9-abi3-x86_64-linux"]
    )
    assert "does not match system CPU" in rejected["sdk-cpython-3.9-abi3-aarch64-linux"]


@pytest.mark.parametrize(
    ("rocm", "expected"),
    [("10.1", ["rocm101", "rocm100"]), ("10.0", ["rocm100"]), ("7.2", ["rocm72"])],
)
def test_rocm_minor_rule(rocm, expected):
    names = [
        f"torch215-cxx11-{r}-x86_64-linux" for r in ("rocm72", "rocm100", "rocm101", "rocm102")
    ]
    accepted, _ = choice(names, machine("rocm", rocm, torch="2.15"))
    assert accepted == [f"torch215-cxx11-{r}-x86_64-linux" for r in expected]


@pytest.mark.parametrize(("macos", "ok"), [(None, False), ("15.7", False), ("26.0", True)])
def test_compiled_metal_builds_need_macos_26(macos, ok):
    names = [
        "torch210-metal-aarch64-darwin",
        "sdk-metal-cpython-3.9-abi3-aarch64-darwin",
        "torch-metal",
    ]
    on = machine("metal", None, cpu="aarch64", os="darwin", macos=Version(macos) if macos else None)
    accepted, rejected = choice(names, on)
    if ok:
        assert accepted == names
    else:
        assert accepted == ["torch-metal"]
        reason = rejected[names[0]]
        assert "require macOS 26.0 or later" in reason
        assert f"system macOS version is {macos or 'unknown'}" in reason


def test_mlx_builds_need_mlx():
    names = ["mlx-metal", "mlx-cuda", "mlx-metal-4.0"]
    on = machine("metal", None, torch=None, cpu="aarch64", os="darwin", macos=Version("26.0"))
    accepted, rejected = choice(names, MachineBuild(**{**on.__dict__, "mlx": True}))
    assert accepted == ["mlx-metal"]
    assert set(rejected) == {"mlx-cuda", "mlx-metal-4.0"}
    accepted, rejected = choice(names, on)
    assert accepted == [] and "MLX is not installed" in rejected["mlx-metal"]


def test_ascend_pure_python_builds_are_named_after_cann():
    accepted, rejected = choice(["torch-cann", "torch-npu"], machine("cann", "8.1", cpu="aarch64"))
    assert accepted == ["torch-cann"]
    assert "named torch-cann" in rejected["torch-npu"]


@pytest.mark.parametrize(
    ("backend", "version"), [("tpu", None), ("neuron", None), ("xpu", "2025.3")]
)
def test_other_backends(backend, version):
    spelled = f"{backend}-{version}" if version else backend
    names = [
        f"torch-2.10-{spelled}-cpython-3.9-abi3-x86_64-linux",
        f"torch-{backend}",
        "torch-cuda",
    ]
    accepted, rejected = choice(names, machine(backend, version))
    assert accepted == names[:2]
    assert "does not match system backend" in rejected["torch-cuda"]


def test_backend_override_selects_cpu_builds():
    names = ["torch210-cu128-x86_64-linux", "torch210-cpu-x86_64-linux", "torch-cpu", "torch-cuda"]
    assert choice(names, machine(), backend="cpu")[0] == names[1:3]
    with pytest.raises(ValueError, match="backend must be None, 'cpu' or 'cuda'"):
        rank_variants(names, machine(), backend="rocm")
