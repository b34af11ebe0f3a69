import pytest

from kernels import KernelMappingError, Mode
from kernels.mapping.mode import (
    REGISTRABLE_MODES,
    preferred_modes,
    validate_kernelize_mode,
    validate_registered_mode,
)

I, T, C, F = Mode.INFERENCE, Mode.TRAINING, Mode.TORCH_COMPILE, Mode.FALLBACK


def test_modes_combine_with_torch_compile():
    assert C in (I | C) and I in (I | C)
    assert (I | C) == (C | I)
    assert hash(I | C) == hash(C | I)
    assert str(T | C) == "TRAINING | TORCH_COMPILE"


@pytest.mark.parametrize(
    "combine, message",
    [
        (lambda: I | T, "cannot be combined"),
        (lambda: F | I, "FALLBACK cannot be combined"),
        (lambda: T | F, "FALLBACK cannot be combined"),
    ],
)
def test_contradictory_modes_are_refused(combine, message):
    with pytest.raises(KernelMappingError, match=message):
        combine()


def test_preference_chains_follow_the_documentation():
    assert preferred_modes(I) == (I, I | C, T, T | C, F)
    assert preferred_modes(I | C) == (I | C, T | C, F)
    assert preferred_modes(T) == (T, T | C, F)
    assert preferred_modes(T | C) == (T | C, F)


@pytest.mark.parametrize("mode", [F, C, "INFERENCE", None])
def test_kernelize_refuses_modes_without_inference_or_training(mode):
    with pytest.raises(KernelMappingError, match="Mode"):
        validate_kernelize_mode(mode)


def test_registrable_modes():
    for mode in REGISTRABLE_MODES:
        assert validate_registered_mode(mode) is mode
    with pytest.raises(KernelMappingError, match="the modes are"):
        validate_registered_mode(C)
