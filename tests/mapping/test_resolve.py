"""Resolution: layer name -> device type -> capability -> mode, with the reasons behind it."""

import sys

import pytest

from kernels import CUDAProperties, Device, LocalLayerRepository, Mode, ROCMProperties
from kernels.mapping.registry import KernelMapping
from kernels.mapping.resolve import resolve

I, T, C, F = Mode.INFERENCE, Mode.TRAINING, Mode.TORCH_COMPILE, Mode.FALLBACK


def repo(name: str) -> LocalLayerRepository:
    return LocalLayerRepository(f"/repos/{name}", layer_name="SiluAndMul")


def chosen(spec, *, mode=I, device_type="cuda", capability=None, layer="SiluAndMul"):
    """The name of the repository chosen for `spec`, or None."""
    resolution = resolve(
        KernelMapping().registered(spec),
        layer,
        device_type=device_type,
        capability=capability,
        mode=mode,
    )
    return None if resolution.chosen is None else resolution.chosen.repository.repo_path.name


def cuda(lo, hi):
    return Device("cuda", CUDAProperties(lo, hi))


def test_the_documented_example_kernel_a_beats_kernel_b():
    spec = {"SiluAndMul": {cuda(80, 89): repo("A"), cuda(75, 89): repo("B")}}
    assert chosen(spec, capability=86) == "A"
    assert chosen(spec, capability=75) == "B"
    assert chosen(spec, capability=90) is None


def test_ranges_are_inclusive_at_both_ends():
    spec = {"SiluAndMul": {cuda(75, 89): repo("old"), cuda(90, sys.maxsize): repo("hopper")}}
    assert chosen(spec, capability=89) == "old"
    assert chosen(spec, capability=90) == "hopper"
    assert chosen(spec, capability=120) == "hopper"


def test_device_without_properties_covers_all_capabilities_but_loses_to_ranges():
    spec = {"SiluAndMul": {"cuda": repo("any"), cuda(90, 90): repo("h100")}}
    assert chosen(spec, capability=90) == "h100"
    assert chosen(spec, capability=80) == "any"
    assert chosen(spec, capability=None) == "any"


def test_equally_narrow_ranges_later_registration_wins():
    spec = {"SiluAndMul": {cuda(80, 85): repo("first"), cuda(85, 90): repo("second")}}
    assert chosen(spec, capability=85) == "second"


def test_rocm_ranges_are_separate_from_cuda():
    spec = {
        "SiluAndMul": {
            Device("rocm", ROCMProperties(90, 94)): repo("mi300"),
            cuda(90, 94): repo("hopper"),
        }
    }
    assert chosen(spec, device_type="rocm", capability=94) == "mi300"
    assert chosen(spec, device_type="cuda", capability=90) == "hopper"


def test_unknown_capability_matches_only_keys_without_range():
    spec = {"SiluAndMul": {cuda(80, 89): repo("A")}}
    resolution = resolve(
        KernelMapping().registered(spec), "SiluAndMul", device_type="cuda", capability=None, mode=I
    )
    assert resolution.chosen is None
    assert "covers capability unknown" in resolution.reason
    ((candidate, why),) = resolution.passed_over
    assert "capability of this cuda device is unknown" in why


@pytest.mark.parametrize(
    "registered, expected",
    [
        # For each kernelize mode, the documented order of registered modes.
        (
            {I: "i", I | C: "ic", T: "t", T | C: "tc", F: "f"},
            {I: "i", I | C: "ic", T: "t", T | C: "tc"},
        ),
        ({I | C: "ic", T: "t", T | C: "tc", F: "f"}, {I: "ic", I | C: "ic", T: "t", T | C: "tc"}),
        ({T: "t", T | C: "tc", F: "f"}, {I: "t", I | C: "tc", T: "t", T | C: "tc"}),
        ({T | C: "tc", F: "f"}, {I: "tc", I | C: "tc", T: "tc", T | C: "tc"}),
        ({F: "f"}, {I: "f", I | C: "f", T: "f", T | C: "f"}),
        ({I: "i"}, {I: "i", I | C: None, T: None, T | C: None}),
        ({I | C: "ic"}, {I: "ic", I | C: "ic", T: None, T | C: None}),
        ({T: "t"}, {I: "t", I | C: None, T: "t", T | C: None}),
    ],
)
def test_mode_preference(registered, expected):
    spec = {"SiluAndMul": {"cuda": {mode: repo(name) for mode, name in registered.items()}}}
    for mode, name in expected.items():
        assert chosen(spec, mode=mode) == name, f"kernelize mode {mode}"


def test_documented_fallback_example():
    # INFERENCE and TRAINING kernels do not support torch.compile, so compile modes use FALLBACK.
    spec = {
        "SiluAndMul": {"cuda": {F: repo("fallback"), I: repo("inference"), T: repo("training")}}
    }
    assert chosen(spec, mode=I | C) == "fallback"
    assert chosen(spec, mode=T | C) == "fallback"
    assert chosen(spec, mode=I) == "inference"
    assert chosen(spec, mode=T) == "training"


def test_narrowest_range_without_a_fitting_mode_falls_through_to_wider():
    spec = {"SiluAndMul": {cuda(80, 89): {I: repo("narrow")}, "cuda": {T: repo("wide")}}}
    assert chosen(spec, mode=I, capability=86) == "narrow"
    assert chosen(spec, mode=T, capability=86) == "wide"


def test_capability_beats_mode():
    # The narrower range wins even though the wider one has an exact mode match.
    spec = {"SiluAndMul": {cuda(80, 89): {T: repo("narrow")}, "cuda": {I: repo("wide")}}}
    assert chosen(spec, mode=I, capability=86) == "narrow"


def test_reasons_name_what_is_missing():
    mapping = KernelMapping().registered({"SiluAndMul": {"rocm": repo("r"), "cpu": repo("c")}})
    missing_layer = resolve(mapping, "RMSNorm", device_type="cuda", capability=None, mode=I)
    assert missing_layer.reason == "no kernel is registered for layer name 'RMSNorm'"
    missing_device = resolve(mapping, "SiluAndMul", device_type="cuda", capability=90, mode=I)
    assert "has kernels for device types rocm, cpu, not for cuda" in missing_device.reason
    wrong_mode = resolve(
        KernelMapping().registered({"SiluAndMul": {"cuda": {I: repo("i")}}}),
        "SiluAndMul",
        device_type="cuda",
        capability=90,
        mode=T | C,
    )
    assert (
        "registered for modes INFERENCE, none of which serves TRAINING | TORCH_COMPILE"
        in wrong_mode.reason
    )


def test_passed_over_candidates_explain_why():
    spec = {
        "SiluAndMul": {
            cuda(90, 99): repo("hopper"),
            cuda(80, 89): {I: repo("ampere"), T: repo("t")},
        }
    }
    resolution = resolve(
        KernelMapping().registered(spec), "SiluAndMul", device_type="cuda", capability=86, mode=I
    )
    assert resolution.chosen.repository.repo_path.name == "ampere"
    reasons = {c.repository.repo_path.name: why for c, why in resolution.passed_over}
    assert reasons["hopper"] == "needs capability 90..99; this device has capability 86"
    assert "was preferred" in reasons["t"]
