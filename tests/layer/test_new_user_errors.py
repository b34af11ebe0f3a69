"""What a new user trips over first: each surprise gives a message that names the fix."""

import logging
import os

import pytest
import torch
import torch.nn as nn

from kernels import (
    KernelLoadError,
    KernelMappingError,
    LocalLayerRepository,
    Mode,
    NoKernelError,
    kernelize,
    register_kernel_mapping,
    use_kernel_forward_from_hub,
    use_kernel_func_from_hub,
    use_kernel_mapping,
)
from kernels.errors import KernelTaggingError
from kernels.layer.kernelize import plan
from kernels.library import library_path
from kernels.mapping.registry import KernelMapping
from kernels.mapping.resolve import resolve
from tests.support.children import run_python


@pytest.fixture(autouse=True)
def empty_global_mapping():
    register_kernel_mapping({}, inherit_mapping=False)
    yield
    register_kernel_mapping({}, inherit_mapping=False)


class Untagged(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x)


@pytest.mark.parametrize("use_fallback", [True, False])
def test_a_model_without_tagged_layers_warns_once_and_points_to_the_docs(caplog, use_fallback):
    model = Untagged()
    with caplog.at_level(logging.DEBUG, logger="kernels"):
        assert kernelize(model, mode=Mode.INFERENCE, use_fallback=use_fallback) is model
    (warning,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    message = warning.getMessage()
    assert warning.levelno == logging.WARNING
    assert "Untagged" in message and "no tagged layer" in message
    assert "use_kernel_forward_from_hub" in message and "docs/untagged.md" in message


@pytest.mark.parametrize("entry", [kernelize, plan])
def test_a_module_class_instead_of_an_instance_is_refused_by_name(entry):
    with pytest.raises(KernelMappingError, match=r"torch\.nn\.modules\.linear\.Linear") as info:
        entry(nn.Linear, mode=Mode.INFERENCE)
    assert "Linear(...)" in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("entry", [kernelize, plan])
def test_a_non_module_is_refused_by_type(entry):
    with pytest.raises(KernelMappingError, match=r"torch\.nn\.Module instance, got dict"):
        entry({"weight": 1}, mode=Mode.INFERENCE)


def _reason(keys, layer_name):
    repository = LocalLayerRepository("/nowhere", layer_name="Anything")
    mapping = KernelMapping().registered({key: {"cpu": repository} for key in keys})
    return resolve(mapping, layer_name, device_type="cpu", capability=None, mode=Mode.INFERENCE)


@pytest.mark.parametrize(
    ("keys", "layer_name", "shown"),
    [
        (["RMSnorm"], "RMSNorm", "'RMSnorm'"),  # case only
        (["RMSNrom", "SiluAndMul"], "RMSNorm", "'RMSNrom'"),  # two letters swapped
        (["GELU"], "gelu", "'GELU'"),  # short names: case only
    ],
)
def test_a_mapping_key_with_a_typo_is_named_with_the_likely_fix(keys, layer_name, shown):
    reason = _reason(keys, layer_name).reason
    assert reason == (
        f"no kernel is registered for layer name '{layer_name}'; "
        f"the mapping has {shown}: did you mean '{layer_name}'?"
    )


@pytest.mark.parametrize(
    ("key", "layer_name"),
    [("GeluAndMul", "SiluAndMul"), ("GeGLU", "GELU"), ("LlamaRMSNorm", "RMSNorm")],
)
def test_a_different_layer_of_the_same_family_is_not_called_a_typo(key, layer_name):
    assert _reason([key], layer_name).reason == (
        f"no kernel is registered for layer name '{layer_name}'"
    )


@use_kernel_forward_from_hub("RMSNorm")
class RMSNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return x * self.weight


def test_the_typo_hint_reaches_the_log_line_and_no_kernel_error(caplog):
    typo = {"RMSnorm": {"cpu": LocalLayerRepository("/nowhere", layer_name="RMSNorm")}}
    with use_kernel_mapping(typo), caplog.at_level(logging.INFO, logger="kernels"):
        kernelize(RMSNorm(), mode=Mode.INFERENCE)
        with pytest.raises(NoKernelError) as info:
            kernelize(RMSNorm(), mode=Mode.INFERENCE, use_fallback=False)
    assert "the mapping has 'RMSnorm': did you mean 'RMSNorm'?" in caplog.text
    assert str(info.value).endswith("the mapping has 'RMSnorm': did you mean 'RMSNorm'?")


def test_the_layer_decorator_without_parentheses_says_how_to_write_it():
    with pytest.raises(KernelTaggingError) as info:

        @use_kernel_forward_from_hub
        class SiluAndMul(nn.Module):
            pass

    assert '@use_kernel_forward_from_hub("SiluAndMul") above class SiluAndMul' in str(info.value)
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value, KernelMappingError)  # what a bad layer name raised before


def test_the_function_decorators_without_parentheses_say_how_to_write_them():
    def rotary(q):
        return q

    with pytest.raises(KernelTaggingError, match=r'forward_from_hub\("rotary"\) above function'):
        use_kernel_forward_from_hub(rotary)
    with pytest.raises(KernelTaggingError, match=r'func_from_hub\("rotary"\) above function'):
        use_kernel_func_from_hub(rotary)


def test_a_layer_name_that_is_not_a_string_is_refused_at_once():
    with pytest.raises(KernelTaggingError, match=r"takes the layer name as a string, got int 3"):
        use_kernel_forward_from_hub(3)


_CPU_LAUNCH = """
import os, sys
import torch
import kernels

norm = kernels.get_local_kernel(os.path.join(sys.argv[1], "norm"), "norm")
try:
    norm.rms_norm(torch.randn(4, 8), torch.ones(8), 1e-6)
except RuntimeError as exc:
    print(exc)
else:
    print("no error")
"""


def test_a_library_kernel_on_the_cpu_without_the_interpreter_says_how_to_run_it():
    pytest.importorskip("triton")
    # Triton reads TRITON_INTERPRET as `triton.jit` runs, so this needs a fresh process
    # (the test session's conftest turns the interpreter on).
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = run_python("-c", _CPU_LAUNCH, str(library_path()), env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    message = result.stdout
    assert "_rms_norm_fwd_kernel was called with CPU tensors" in message
    assert "set TRITON_INTERPRET=1" in message and ".to('cuda')" in message


def test_a_wrapped_error_that_ends_a_sentence_gets_no_second_period():
    # The load error already ends in '.'; the NoKernelError/KernelLoadError wrapper used to
    # add another one.
    missing = {"RMSNorm": {"cpu": LocalLayerRepository("/nowhere", layer_name="RMSNorm")}}
    with use_kernel_mapping(missing), pytest.raises(KernelLoadError) as info:
        kernelize(RMSNorm(), mode=Mode.INFERENCE, use_fallback=False)
    message = str(info.value)
    assert message.endswith("/nowhere does not exist.") and not message.endswith("..")
