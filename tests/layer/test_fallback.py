"""KernelizeFallback: for which causes kernelize keeps a layer's forward instead of raising."""

import logging
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels import (
    CUDAProperties,
    Device,
    KernelizeFallback,
    KernelLoadError,
    KernelVerificationError,
    LocalLayerRepository,
    Mode,
    NoKernelError,
    kernelize,
    use_kernel_forward_from_hub,
    use_kernel_mapping,
)
from kernels.layer.fallback import as_fallback
from kernels.layer.swap import kernel_layer_of
from kernels.mapping.capability import use_capability_reader

F_ = KernelizeFallback

WRONG_LAYER = """
import torch


class SiluAndMul(torch.nn.Module):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return input[..., : input.shape[-1] // 2]  # not what the layer computes
"""


@use_kernel_forward_from_hub("SiluAndMul")
class SiluAndMul(nn.Module):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        d = input.shape[-1] // 2
        return F.silu(input[..., :d]) * input[..., d:]


def test_true_is_default_and_false_is_none():
    assert as_fallback(True) is F_.DEFAULT and as_fallback(False) is F_.NONE
    assert F_.DEFAULT == (
        F_.NO_LAYER | F_.NO_DEVICE | F_.NO_COMPATIBLE_PROPERTIES | F_.NO_COMPATIBLE_MODE
    )
    assert F_.ALL == F_.DEFAULT | F_.CANNOT_LOAD | F_.VERIFICATION_FAILURE
    assert F_.CANNOT_LOAD not in F_.DEFAULT and F_.VERIFICATION_FAILURE not in F_.DEFAULT
    with pytest.raises(TypeError, match="use_fallback must be True, False or a KernelizeFallback"):
        as_fallback("all")


def test_the_018_names_are_aliases():
    assert F_.NO_KERNEL is F_.DEFAULT
    assert F_.UNSUPPORTED_MODE is F_.NO_COMPATIBLE_MODE
    assert F_.LOAD_FAILURE is F_.CANNOT_LOAD
    # Hugging Face's members, in their order, then ours; aliases are not listed.
    assert [m.name for m in F_] == [
        "NO_LAYER",
        "NO_DEVICE",
        "NO_COMPATIBLE_PROPERTIES",
        "NO_COMPATIBLE_MODE",
        "CANNOT_LOAD",
        "VERIFICATION_FAILURE",
    ]


def _causes(kernel_repo, tmp_path):
    """cause -> (mapping, mode, verify, error it raises when not covered, message)."""
    good = LocalLayerRepository(kernel_repo("good"), layer_name="SiluAndMul")
    limited = kernel_repo("limited", has_backward=False)
    wrong = kernel_repo("wrong", layers_source=WRONG_LAYER)
    narrow = Device("cuda", CUDAProperties(min_capability=90, max_capability=90))
    return {
        "no layer": (
            F_.NO_LAYER,
            {},
            Mode.INFERENCE,
            None,
            NoKernelError,
            "No layer mapping for `SiluAndMul`: <model>",
        ),
        "no device": (
            F_.NO_DEVICE,
            {"SiluAndMul": {"cuda": good}},
            Mode.INFERENCE,
            None,
            NoKernelError,
            "No layer mapping for `SiluAndMul` with device type `cpu`",
        ),
        "no properties": (
            F_.NO_COMPATIBLE_PROPERTIES,
            {"SiluAndMul": {narrow: good}},
            Mode.INFERENCE,
            "cuda",
            NoKernelError,
            "No layer mapping for `SiluAndMul` device `cuda` with the right properties",
        ),
        "no mode": (
            F_.NO_COMPATIBLE_MODE,
            {"SiluAndMul": {"cpu": {Mode.TRAINING: good}}},
            Mode.INFERENCE | Mode.TORCH_COMPILE,
            None,
            NoKernelError,
            "No repository for `SiluAndMul` for configuration mode=INFERENCE | TORCH_COMPILE",
        ),
        "kernel lacks the mode": (
            F_.NO_COMPATIBLE_MODE,
            {"SiluAndMul": {"cpu": LocalLayerRepository(limited, layer_name="SiluAndMul")}},
            Mode.TRAINING,
            None,
            NoKernelError,
            "does not support backward, needed for mode `TRAINING`",
        ),
        "cannot load": (
            F_.CANNOT_LOAD,
            {"SiluAndMul": {"cpu": LocalLayerRepository(tmp_path / "gone", layer_name="X")}},
            Mode.INFERENCE,
            None,
            KernelLoadError,
            "does not exist",
        ),
        "verification": (
            F_.VERIFICATION_FAILURE,
            {"SiluAndMul": {"cpu": LocalLayerRepository(wrong, layer_name="SiluAndMul")}},
            Mode.INFERENCE,
            torch.randn(2, 8),
            KernelVerificationError,
            "failed verification",
        ),
    }


CAUSES = [
    "no layer",
    "no device",
    "no properties",
    "no mode",
    "kernel lacks the mode",
    "cannot load",
    "verification",
]


@pytest.mark.parametrize("case", CAUSES)
def test_each_cause_falls_back_only_when_its_member_is_given(kernel_repo, tmp_path, case):
    cause, mapping, mode, extra, error, message = _causes(kernel_repo, tmp_path)[case]
    # The capability case kernelizes for cuda (on any machine: the capability is read as 80).
    device = "cuda" if extra == "cuda" else "cpu"
    verify = None if extra == "cuda" else extra
    with (
        use_kernel_mapping(mapping, inherit_mapping=False),
        use_capability_reader(lambda device_type, index: 80),
    ):
        default_covers = cause in F_.DEFAULT
        for covered in (cause, F_.ALL, *([True] if default_covers else [])):
            layer = SiluAndMul()
            kernelize(layer, mode=mode, device=device, use_fallback=covered, verify=verify)
            assert kernel_layer_of(layer) is None
        uncovered_by = (F_.ALL & ~cause, F_.NONE, False, *([] if default_covers else [True]))
        for uncovered in uncovered_by:
            with pytest.raises(error, match=re.escape(message)):
                kernelize(
                    SiluAndMul(), mode=mode, device=device, use_fallback=uncovered, verify=verify
                )


def test_transformers_5_passes_all_and_a_load_failure_is_one_warning(tmp_path, caplog):
    layer = SiluAndMul()
    mapping = {"SiluAndMul": {"cpu": LocalLayerRepository(tmp_path / "gone", layer_name="X")}}
    with use_kernel_mapping(mapping), caplog.at_level(logging.INFO, logger="kernels"):
        kernelize(layer, device="cpu", mode=Mode.INFERENCE, use_fallback=KernelizeFallback.ALL)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "Kernel for layer `SiluAndMul` on cpu could not be loaded" in warnings[0].getMessage()
