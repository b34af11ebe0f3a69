"""The rules a kernel layer must follow, each with the error a kernel author sees."""

import pytest
import torch
import torch.nn as nn

from kernels import KernelLayerError
from kernels.layer.validation import signature_difference, validate_kernel_layer


class Original(nn.Module):
    def forward(self, hidden_states, residual=None, *, scale: float = 1.0):
        return hidden_states


def check(kernel):
    validate_kernel_layer(kernel, Original, kernel_source="repo X", layer_name="Norm")


def test_a_good_kernel_layer_passes():
    class Good(nn.Module):
        has_backward = True
        can_torch_compile = False

        def forward(self, hidden_states, residual=None, *, scale: float = 1.0):
            return hidden_states

    check(Good)


def test_error_names_the_kernel_and_the_layer():
    class Bad(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, hidden_states, residual=None, *, scale: float = 1.0):
            return hidden_states

    with pytest.raises(KernelLayerError) as info:
        check(Bad)
    message = str(info.value)
    assert (
        "Kernel layer test_error_names_the_kernel_and_the_layer.<locals>.Bad from repo X" in message
    )
    assert f"registered for layer 'Norm' ({__name__}.Original)" in message
    assert "defines __init__" in message
    assert isinstance(info.value, TypeError)


def test_not_a_module():
    with pytest.raises(KernelLayerError, match="is not a torch.nn.Module subclass"):
        check(lambda hidden_states: hidden_states)


def test_extra_members_are_listed():
    class Helpers(nn.Module):
        block_size = 128

        def _launch(self):
            pass

        def forward(self, hidden_states, residual=None, *, scale: float = 1.0):
            return hidden_states

    with pytest.raises(
        KernelLayerError,
        match="has class members _launch, block_size; a kernel layer may only define",
    ):
        check(Helpers)


def test_members_inherited_from_a_base_count_too():
    class Base(nn.Module):
        def helper(self):
            pass

    class Derived(Base):
        def forward(self, hidden_states, residual=None, *, scale: float = 1.0):
            return hidden_states

    with pytest.raises(KernelLayerError, match="has class members helper"):
        check(Derived)


def test_init_in_a_base_counts_too():
    class Base(nn.Module):
        def __init__(self):
            super().__init__()

    class Derived(Base):
        def forward(self, hidden_states, residual=None, *, scale: float = 1.0):
            return hidden_states

    with pytest.raises(KernelLayerError, match=r"defines __init__ \(in .*Base\)"):
        check(Derived)


def test_flags_must_be_bools():
    class Flag(nn.Module):
        has_backward = "yes"

        def forward(self, hidden_states, residual=None, *, scale: float = 1.0):
            return hidden_states

    with pytest.raises(
        KernelLayerError, match="sets has_backward = 'yes'; it must be True or False"
    ):
        check(Flag)


def kernel_with(signature: str) -> type:
    namespace = {"nn": nn, "torch": torch}
    exec(f"class K(nn.Module):\n    def forward{signature}:\n        return None\n", namespace)
    return namespace["K"]


@pytest.mark.parametrize(
    "signature, difference",
    [
        (
            "(self, x, residual=None, *, scale: float = 1.0)",
            "parameter 2 is 'x' in the kernel but 'hidden_states'",
        ),
        ("(self, residual=None, hidden_states=None, *, scale=1.0)", "parameter 2 is 'residual'"),
        (
            "(self, hidden_states, residual, *, scale=1.0)",
            "parameter 'residual' has no default in the kernel but default None",
        ),
        (
            "(self, hidden_states, residual=None, *, scale=2.0)",
            "parameter 'scale' has default 2.0 in the kernel but default 1.0",
        ),
        (
            "(self, hidden_states, residual=None, scale=1.0)",
            "parameter 'scale' is positional or keyword in the kernel but keyword-only",
        ),
        ("(self, hidden_states, residual=None)", "only the layer has parameter\\(s\\) scale"),
        (
            "(self, hidden_states, residual=None, *, scale=1.0, eps=1e-6)",
            "only the kernel has parameter\\(s\\) eps",
        ),
        ("(self, *args, **kwargs)", "parameter 2 is 'args'"),
    ],
)
def test_signature_mismatches(signature, difference):
    with pytest.raises(KernelLayerError, match=difference):
        check(kernel_with(signature))


def test_annotations_are_not_compared():
    assert (
        signature_difference(
            kernel_with(
                "(self, hidden_states: torch.Tensor, residual=None, *, scale: int = 1.0)"
            ).forward,
            Original.forward,
        )
        is None
    )


def test_tensor_defaults_do_not_crash_the_comparison():
    a = torch.ones(2)

    def f(self, x=a):
        return x

    def g(self, x=torch.ones(2)):
        return x

    assert signature_difference(f, f) is None
    assert "has default" in signature_difference(f, g)
