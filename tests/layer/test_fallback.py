"""KernelizeFallback: for which causes kernelize keeps a layer's forward instead of raising."""

import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels import (
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


def test_true_and_false_are_all_and_none():
    assert as_fallback(True) is F_.ALL and as_fallback(False) is F_.NONE
    assert F_.ALL == F_.NO_KERNEL | F_.UNSUPPORTED_MODE | F_.LOAD_FAILURE | F_.VERIFICATION_FAILURE
    with pytest.raises(TypeError, match="use_fallback must be True, False or a KernelizeFallback"):
        as_fallback("all")


def _causes(kernel_repo, tmp_path):
    """cause -> (mapping, mode, verify, error it raises when not covered)."""
    limited = kernel_repo("limited", has_backward=False)
    wrong = kernel_repo("wrong", layers_source=WRONG_LAYER)
    return {
        F_.NO_KERNEL: ({}, Mode.INFERENCE, None, NoKernelError),
        F_.UNSUPPORTED_MODE: (
            {"SiluAndMul": {"cpu": LocalLayerRepository(limited, layer_name="SiluAndMul")}},
            Mode.TRAINING,
            None,
            NoKernelError,
        ),
        F_.LOAD_FAILURE: (
            {"SiluAndMul": {"cpu": LocalLayerRepository(tmp_path / "gone", layer_name="X")}},
            Mode.INFERENCE,
            None,
            KernelLoadError,
        ),
        F_.VERIFICATION_FAILURE: (
            {"SiluAndMul": {"cpu": LocalLayerRepository(wrong, layer_name="SiluAndMul")}},
            Mode.INFERENCE,
            torch.randn(2, 8),
            KernelVerificationError,
        ),
    }


@pytest.mark.parametrize(
    "cause", [F_.NO_KERNEL, F_.UNSUPPORTED_MODE, F_.LOAD_FAILURE, F_.VERIFICATION_FAILURE]
)
def test_each_cause_falls_back_only_when_its_member_is_given(kernel_repo, tmp_path, cause):
    mapping, mode, verify, error = _causes(kernel_repo, tmp_path)[cause]
    with use_kernel_mapping(mapping, inherit_mapping=False):
        for covered in (cause, F_.ALL, True):
            layer = SiluAndMul()
            kernelize(layer, mode=mode, device="cpu", use_fallback=covered, verify=verify)
            assert kernel_layer_of(layer) is None
        for uncovered in (F_.ALL & ~cause, F_.NONE, False):
            with pytest.raises(error):
                kernelize(
                    SiluAndMul(), mode=mode, device="cpu", use_fallback=uncovered, verify=verify
                )


def test_transformers_5_passes_all_and_a_load_failure_is_one_warning(tmp_path, caplog):
    layer = SiluAndMul()
    mapping = {"SiluAndMul": {"cpu": LocalLayerRepository(tmp_path / "gone", layer_name="X")}}
    with use_kernel_mapping(mapping), caplog.at_level(logging.INFO, logger="kernels"):
        kernelize(layer, device="cpu", mode=Mode.INFERENCE, use_fallback=KernelizeFallback.ALL)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "keeps its original forward: loading" in warnings[0].getMessage()
