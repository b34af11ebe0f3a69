"""KernelRegistry: registering, the errors users hit, and what the registry reports."""

import pytest
import torch

from kernels import KernelsError
from kernels.compile import (
    PATTERNS,
    KernelRegistrationError,
    KernelRegistry,
    Policy,
    UnknownPatternError,
)
from tests.support.compile import triton_relu


def test_decorator_registers_and_returns_the_function():
    registry = KernelRegistry()

    @registry.register("relu")
    def my_relu(x):
        return x.clamp_min(0)

    assert my_relu(torch.tensor([-1.0, 2.0])).tolist() == [0.0, 2.0]  # still a plain function
    entry = registry.entry("relu")
    assert (entry.kernel, entry.label, entry.source, entry.policy) == (
        my_relu, "my_relu", "user", Policy.ALWAYS,
    )  # fmt: skip
    assert "relu" in registry and len(registry) == 1


def test_a_users_kernel_replaces_the_librarys_and_goes_first(library):
    library.register("silu", lambda x: x * torch.sigmoid(x))
    assert library.entry("silu").source == "user"
    order = [e.pattern.name for e in library.entries()]
    assert order[0] == "silu"
    assert order[1:] == [p for p in PATTERNS if p in library and p != "silu"]


def test_library_subset():
    registry = KernelRegistry.library(["rms_norm", "silu_mul"])
    assert [e.pattern.name for e in registry.entries()] == ["rms_norm", "silu_mul"]
    assert registry.entry("rms_norm").label == "library norm.rms_norm"


def test_library_has_no_relu():
    with pytest.raises(KernelRegistrationError, match="no kernel for relu.*registry.register"):
        KernelRegistry.library(["relu"])


def test_unknown_pattern_names_the_known_ones():
    registry = KernelRegistry()
    with pytest.raises(
        UnknownPatternError, match="Unknown pattern 'rmsnorm'. Did you mean 'rms_norm'"
    ):
        registry.register("rmsnorm", triton_relu)
    with pytest.raises(UnknownPatternError, match="Known patterns: rms_norm, layer_norm"):
        registry.register(3, triton_relu)
    # Also a ValueError and a KernelsError, for callers that catch those.
    with pytest.raises(ValueError):
        registry.register("swish", triton_relu)
    with pytest.raises(KernelsError):
        registry.register("swish", triton_relu)


def test_registering_a_non_callable():
    registry = KernelRegistry()
    with pytest.raises(KernelRegistrationError, match="must be callable; got str 'relu_kernel'"):
        registry.register("relu", "relu_kernel")
    with pytest.raises(TypeError, match="must be callable; got int"):
        registry.register("relu")(3)
    with pytest.raises(KernelRegistrationError, match="backward registered for 'relu' must be"):
        registry.register("relu", triton_relu, backward=1.0)
    assert "relu" not in registry


def test_decorator_without_the_pattern_name():
    registry = KernelRegistry()
    with pytest.raises(
        KernelRegistrationError, match=r"write @registry.register\('relu'\) above my_relu"
    ):

        @registry.register
        def my_relu(x):
            return x


def test_bad_devices_and_dtypes():
    registry = KernelRegistry()
    with pytest.raises(KernelRegistrationError, match="Unknown device type 'gpu'"):
        registry.register("relu", triton_relu, device_types=["gpu"])
    with pytest.raises(KernelRegistrationError, match="dtypes must be torch dtypes"):
        registry.register("relu", triton_relu, dtypes=["float16"])
    registry.register("relu", triton_relu, device_types="cuda", dtypes=torch.float16)
    entry = registry.entry("relu")
    assert (entry.device_types, entry.dtypes) == (("cuda",), (torch.float16,))


def test_changing_what_is_not_registered():
    registry = KernelRegistry()
    with pytest.raises(KeyError, match="No kernel is registered for 'relu'; registered: none"):
        registry.set_policy("relu", "always")
    with pytest.raises(KeyError):
        registry.remove("relu")
    with pytest.raises(UnknownPatternError):
        registry.entry("tanh")


def test_describe_and_repr(library):
    library.register("relu", triton_relu, policy="eager_only", device_types=("cuda",))
    lines = library.describe().splitlines()
    assert lines[0] == "relu: triton_relu (policy eager_only; cuda)"
    assert "rms_norm: library norm.rms_norm (policy eager_only; default devices)" in lines
    assert repr(library).startswith(
        "KernelRegistry(relu=triton_relu, rms_norm=library norm.rms_norm"
    )


def test_patterns_document_their_signatures():
    assert PATTERNS["relu"].signature == "(Tensor x) -> Tensor"
    assert PATTERNS["silu_mul"].signature == "(Tensor gate, Tensor up) -> Tensor"
    assert PATTERNS["rms_norm"].signature == "(Tensor x, Tensor? weight, float eps) -> Tensor"
    assert [p for p, v in PATTERNS.items() if v.elementwise] == [
        "relu",
        "silu",
        "gelu",
        "gelu_tanh",
    ]
