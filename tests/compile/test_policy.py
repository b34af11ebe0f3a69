"""When entries apply: the library's defaults, the user's kernels, and overriding them.

A downstream callable counts as a fusing compiler (as inductor does), which lets these tests
check the policy without compiling C++ on the CPU: it runs the rewritten graph as it is.
"""

import pytest
import torch
import torch.nn.functional as F

from kernels.compile import KernelRegistrationError, KernelRegistry, Policy, kernels_backend
from tests.support.compile import randn, triton_relu


def fusing_compiler(gm, example_inputs):
    return gm.forward


def mlp_tail(gate, up):
    # A lone SiLU, a gated SiLU and a ReLU: one of each kind of entry.
    return F.silu(gate) + F.silu(gate) * up + F.relu(up)


def _compile(registry, downstream):
    backend = kernels_backend(registry, downstream=downstream)
    gate, up = randn(4, 16, seed=1), randn(4, 16, seed=2)
    out = torch.compile(mlp_tail, backend=backend)(gate, up)
    torch.testing.assert_close(out, mlp_tail(gate, up), rtol=1e-5, atol=1e-6)
    return backend


def test_library_defaults():
    registry = KernelRegistry.library()
    assert [e.pattern.name for e in registry.entries()] == [
        "rms_norm", "layer_norm", "silu_mul", "gelu_mul", "gelu_tanh_mul", "silu", "gelu",
        "gelu_tanh",
    ]  # fmt: skip
    assert {e.policy for e in registry.entries()} == {Policy.EAGER_ONLY}
    forced = KernelRegistry.library(["rms_norm"], policy="always")
    assert [(e.pattern.name, e.policy) for e in forced.entries()] == [("rms_norm", Policy.ALWAYS)]


def test_library_entries_are_left_to_a_fusing_compiler(library):
    backend = _compile(library, fusing_compiler)
    assert backend.count() == 0
    kept = {r.pattern: r.reason for r in backend.reports[0].kept}
    assert set(kept) == {"silu_mul", "silu"}  # each SiLU once as a product, once alone
    assert kept["silu"] == (
        "its entry's policy is 'eager_only': the downstream compiler (fusing_compiler) gets "
        "the original ops"
    )


@pytest.mark.parametrize("downstream", ["eager", "aot_eager"])
def test_library_entries_apply_when_nothing_fuses(library, downstream):
    backend = _compile(library, downstream)
    assert (backend.count("silu_mul"), backend.count("silu")) == (1, 1)


def test_user_kernels_apply_under_a_fusing_compiler(library):
    library.register("relu", triton_relu)
    backend = _compile(library, fusing_compiler)
    assert backend.count("relu") == 1
    assert backend.reports[0].replaced[0].kernel == "triton_relu"


def test_user_kernel_registered_eager_only(library):
    library.register("relu", triton_relu, policy="eager_only")
    assert _compile(library, fusing_compiler).count("relu") == 0
    torch._dynamo.reset()
    assert _compile(library, "eager").count("relu") == 1


def test_set_policy_overrides_a_default(library):
    library.set_policy("silu", "always")
    library.set_policy("silu_mul", Policy.NEVER)
    backend = _compile(library, fusing_compiler)
    assert (backend.count("silu_mul"), backend.count("silu")) == (0, 2)
    assert "its entry's policy is 'never'" in backend.report()


def test_changing_a_copy_leaves_the_original(library):
    other = library.copy()
    other.set_policy("silu", "always")
    other.remove("gelu")
    assert library.entry("silu").policy is Policy.EAGER_ONLY
    assert "gelu" in library and "gelu" not in other


def test_unknown_policy_is_refused(library):
    with pytest.raises(KernelRegistrationError, match="Unknown policy 'sometimes'.*'eager_only'"):
        library.set_policy("silu", "sometimes")
    with pytest.raises(KernelRegistrationError, match="Unknown policy"):
        library.register("relu", triton_relu, policy="eager")
