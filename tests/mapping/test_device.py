import sys

import pytest

from kernels import CUDAProperties, Device, KernelMappingError, ROCMProperties
from kernels.mapping.device import as_device, validate_device_type


@pytest.mark.parametrize("device_type", ["cuda", "rocm", "xpu", "mps", "npu", "cpu"])
def test_supported_device_types(device_type):
    assert Device(device_type).type == device_type


def test_other_types_torch_knows_are_accepted():
    assert validate_device_type("hpu") == "hpu"


def test_meta_is_refused_with_the_fix():
    # torch knows "meta", but no kernel runs there: a meta model is kernelized for the device
    # it will run on.
    with pytest.raises(KernelMappingError, match="'meta' is not a device kernels run on.*cuda"):
        Device("meta")


@pytest.mark.parametrize(
    "device_type, hint",
    [("metal", "mps"), ("gpu", "cuda"), ("cdua", "cuda"), ("hip", "rocm")],
)
def test_unknown_device_types_suggest_the_fix(device_type, hint):
    with pytest.raises(KernelMappingError, match=f"Unknown device type '{device_type}'.*'{hint}'"):
        Device(device_type)


def test_device_with_index_is_not_a_type():
    with pytest.raises(KernelMappingError, match="Unknown device type 'cuda:0'"):
        validate_device_type("cuda:0")


def test_capability_ranges_are_inclusive():
    props = CUDAProperties(min_capability=80, max_capability=89)
    assert 80 in props and 89 in props and 86 in props
    assert 79 not in props and 90 not in props
    assert props.width == 9


def test_devices_hash_and_compare_by_value():
    a = Device("cuda", CUDAProperties(75, 89))
    assert a == Device(type="cuda", properties=CUDAProperties(75, 89))
    assert len({a, Device("cuda", CUDAProperties(75, 89)), Device("cuda")}) == 2
    assert CUDAProperties(75, 89) != ROCMProperties(75, 89)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: CUDAProperties(90, 80), "above max_capability"),
        (lambda: CUDAProperties(-1, 80), "non-negative int"),
        (lambda: CUDAProperties(8.0, 90), "non-negative int"),
        (lambda: Device("cuda", ROCMProperties(90, 94)), "takes CUDAProperties"),
        (lambda: Device("rocm", CUDAProperties(90, 94)), "takes ROCMProperties"),
        (lambda: Device("cpu", CUDAProperties(90, 94)), "has no capability ranges"),
    ],
)
def test_bad_properties_are_refused(make, message):
    with pytest.raises(KernelMappingError, match=message):
        make()


def test_open_ended_range_prints_max():
    assert str(Device("cuda", CUDAProperties(90, sys.maxsize))) == "cuda (capability 90..max)"


def test_as_device():
    assert as_device("cuda") == Device("cuda")
    with pytest.raises(KernelMappingError, match="device-type string"):
        as_device(3)
