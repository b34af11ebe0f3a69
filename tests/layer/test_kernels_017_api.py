"""The layer API of Hugging Face kernels 0.16/0.17 that transformers 5.x uses:
`use_kernelized_func` and the `condition` of `use_kernel_forward_from_hub`."""

import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels import (
    KernelMappingError,
    LocalFuncRepository,
    LocalLayerRepository,
    Mode,
    explain,
    kernelize,
    register_kernel_mapping,
    use_kernel_forward_from_hub,
    use_kernel_func_from_hub,
    use_kernel_mapping,
    use_kernelized_func,
)
from kernels.layer.swap import kernel_layer_of, use_original_forward


@use_kernel_forward_from_hub("scale_add_017")
def scale_add(x, y, alpha: float = 2.0):
    return x * alpha + y


@use_kernel_func_from_hub("shift_017")
def shift(x):
    return x + 1


def plain_helper(x):  # not decorated: nothing to kernelize
    return x


@use_kernelized_func(scale_add)
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 3)

    def forward(self, x):
        return scale_add(self.proj(x), x)  # calls the function by its global name


@use_kernelized_func([shift])  # the list spelling transformers also uses
class ShiftBlock(Block):
    def forward(self, x):
        return shift(super().forward(x))


class Model(nn.Module):
    def __init__(self, block=Block, n=2):
        super().__init__()
        self.blocks = nn.ModuleList(block() for _ in range(n))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


FUNC_PACKAGE = """
def scale_add(x, y, alpha: float = 2.0):
    return x * alpha + y + 100

def shift(x):
    return x + 1000
"""


@pytest.fixture(autouse=True)
def clean():
    register_kernel_mapping({}, inherit_mapping=False)
    yield
    register_kernel_mapping({}, inherit_mapping=False)
    # The function modules are process-wide: leave them running their own forward.
    use_original_forward(scale_add)
    use_original_forward(shift)


@pytest.fixture
def func_repo(tmp_path):
    package = tmp_path / "fn" / "build" / "torch-universal" / "fn"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(FUNC_PACKAGE)
    return tmp_path / "fn"


def func_mapping(repo):
    return {
        "scale_add_017": {"cpu": LocalFuncRepository(repo, func_name="scale_add")},
        "shift_017": {"cpu": LocalFuncRepository(repo, func_name="shift")},
    }


# ---------------------------------------------------------------- use_kernelized_func


def test_attached_function_is_not_a_submodule():
    block = Block()
    assert [name for name, _ in block.named_modules()] == ["", "proj"]
    assert set(block.state_dict()) == {"proj.weight", "proj.bias"}
    assert "scale_add" not in repr(block)
    assert "scale_add" not in vars(block)
    assert list(block._kernel_funcs) == ["scale_add_017"]  # a private copy, not a submodule
    assert [name for name, _ in block.named_modules()] == ["", "proj"]


def test_kernelize_swaps_an_attached_function_and_restores_it(func_repo):
    model = Model()
    x = torch.randn(4, 3)
    own = model(x)
    with use_kernel_mapping(func_mapping(func_repo)):
        kernelize(model, mode=Mode.INFERENCE)
        assert all(kernel_layer_of(copy_of(block, "scale_add_017")) for block in model.blocks)
        assert kernel_layer_of(scale_add) is None  # the global itself is untouched
        # Two blocks, each adding the kernel's +100 on top of the function.
        p0, p1 = model.blocks[0].proj, model.blocks[1].proj
        y0 = p0(x) * 2 + x + 100
        torch.testing.assert_close(model(x), p1(y0) * 2 + y0 + 100)
        # Another mode the function kernel does not support (no can_torch_compile): back
        # to the function's own forward.
        kernelize(model, mode=Mode.INFERENCE | Mode.TORCH_COMPILE)
        assert kernel_layer_of(copy_of(model.blocks[0], "scale_add_017")) is None
        torch.testing.assert_close(model(x), own)
        kernelize(model, mode=Mode.INFERENCE)
        assert kernel_layer_of(copy_of(model.blocks[0], "scale_add_017")) is not None
    kernelize(model, mode=Mode.INFERENCE)  # no mapping now: restored again
    assert kernel_layer_of(copy_of(model.blocks[0], "scale_add_017")) is None
    torch.testing.assert_close(model(x), own)


def copy_of(module, layer_name):
    """`module`'s private copy of the function module attached as `layer_name`."""
    return module._kernel_funcs[layer_name]


def test_kernelizing_one_model_leaves_another_of_the_same_classes_alone(func_repo):
    kernelized, other = Model(), Model()
    other.load_state_dict(kernelized.state_dict())
    x = torch.randn(4, 3)
    own = other(x)
    with use_kernel_mapping(func_mapping(func_repo)):
        kernelize(kernelized, mode=Mode.INFERENCE)
    assert not torch.allclose(kernelized(x), own)
    torch.testing.assert_close(other(x), own)  # built from the same classes: unchanged
    assert kernel_layer_of(copy_of(other.blocks[0], "scale_add_017")) is None
    assert scale_add(x, x) is not None and torch.equal(scale_add(x, x), x * 2 + x)


def test_use_kernelized_func_refuses_an_undecorated_function():
    with pytest.raises(ValueError, match="Function `plain_helper` is not decorated"):

        @use_kernelized_func([shift, plain_helper])
        class Broken(nn.Module):
            def forward(self, x):
                return plain_helper(shift(x))


def test_attached_function_without_kernel_raises_with_use_fallback_false():
    from kernels import NoKernelError

    with pytest.raises(NoKernelError, match=r"blocks\.0:scale_add"):
        kernelize(Model(), mode=Mode.INFERENCE, use_fallback=False)


def test_subclass_inherits_attachments_and_plain_functions_are_ignored(func_repo):
    model = Model(ShiftBlock, n=1)
    x = torch.randn(2, 3)
    with use_kernel_mapping(func_mapping(func_repo)):
        kernelize(model, mode=Mode.INFERENCE)
    block = model.blocks[0]
    assert set(block._kernel_funcs) == {"scale_add_017", "shift_017"}
    assert all(kernel_layer_of(fn) is not None for fn in block._kernel_funcs.values())
    p = model.blocks[0].proj
    torch.testing.assert_close(model(x), p(x) * 2 + x + 100 + 1000)


def test_each_layer_plans_its_own_copy_of_an_attached_function(func_repo):
    from kernels.layer.kernelize import plan

    with use_kernel_mapping(func_mapping(func_repo)):
        decisions = plan(Model(n=3), mode=Mode.INFERENCE, device="cpu").decisions
    assert [d.path for d in decisions] == [f"blocks.{i}:scale_add" for i in range(3)]


def test_transformers_hidden_kernels_are_found(func_repo):
    # transformers 5.x's own use_kernelized_func keeps {name: module} on each instance.
    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(3, 3)
            self.__dict__.setdefault("_hidden_kernels", {})["shift_017"] = shift

        def forward(self, x):
            return shift(self.proj(x))

    model = nn.Sequential(Attention())
    with use_kernel_mapping(func_mapping(func_repo)):
        kernelize(model, mode=Mode.INFERENCE)
    assert kernel_layer_of(shift) is not None


def test_use_kernelized_func_rejects_non_callables():
    with pytest.raises(TypeError, match="takes functions"):
        use_kernelized_func("scale_add")


def test_explain_lists_attached_functions(func_repo):
    with use_kernel_mapping(func_mapping(func_repo)):
        report = str(explain(Model(), mode=Mode.INFERENCE, device="cpu"))
    assert "- scale_add_017 (scale_add) at blocks.0:scale_add" in report
    assert "uses kernel layer scale_add" in report


# ---------------------------------------------------------------- condition


def wide_enough(module):
    return module.width >= 4


@use_kernel_forward_from_hub("CondSiluAndMul", condition=wide_enough)
class CondSiluAndMul(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.width = width

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        d = input.shape[-1] // 2
        return F.silu(input[..., :d]) * input[..., d:]


@pytest.fixture
def cond_mapping(kernel_repo):
    repo = LocalLayerRepository(
        kernel_repo("activation"), package_name="activation", layer_name="SiluAndMul"
    )
    return {"CondSiluAndMul": {"cpu": repo}}


def test_condition_false_keeps_that_instance_while_another_is_swapped(cond_mapping):
    narrow, wide = CondSiluAndMul(2), CondSiluAndMul(8)
    model = nn.Sequential(narrow, wide)
    with use_kernel_mapping(cond_mapping):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
    assert kernel_layer_of(narrow) is None
    assert kernel_layer_of(wide) is not None
    x = torch.randn(2, 8)
    torch.testing.assert_close(narrow(x), F.silu(x[..., :4]) * x[..., 4:])
    torch.testing.assert_close(wide(x), F.silu(x[..., :4]) * x[..., 4:] + 1000)


def test_condition_is_evaluated_again_at_every_kernelize(cond_mapping):
    layer = CondSiluAndMul(8)
    model = nn.Sequential(layer)
    with use_kernel_mapping(cond_mapping):
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
        assert kernel_layer_of(layer) is not None
        layer.width = 2  # the condition now says no: the instance gets its forward back
        kernelize(model, mode=Mode.INFERENCE, device="cpu")
        assert kernel_layer_of(layer) is None


def test_condition_skip_is_not_an_error_with_use_fallback_false(cond_mapping, caplog):
    model = nn.Sequential(CondSiluAndMul(2))
    with (
        use_kernel_mapping(cond_mapping),
        caplog.at_level(logging.INFO, logger="kernels"),
    ):
        kernelize(model, mode=Mode.INFERENCE, device="cpu", use_fallback=False)
    assert kernel_layer_of(model[0]) is None
    assert any("condition wide_enough returned False" in r.getMessage() for r in caplog.records)


def test_explain_shows_the_condition_skip(cond_mapping):
    model = nn.Sequential(CondSiluAndMul(2), CondSiluAndMul(8))
    with use_kernel_mapping(cond_mapping):
        explanation = explain(model, mode=Mode.INFERENCE, device="cpu")
    outcomes = {layer.paths: layer.outcome for layer in explanation.layers}
    assert outcomes == {("0",): "skipped", ("1",): "kernel"}
    report = str(explanation)
    assert (
        "- CondSiluAndMul (CondSiluAndMul) at 0\n    kernelization skipped: Skipping "
        "kernelization for `CondSiluAndMul` using `CondSiluAndMul` due to kernel_condition"
    ) in report
    assert "wide_enough returned False for this instance" in report


def test_condition_is_passed_the_instance_and_works_on_functions(func_repo):
    seen = []

    def only_first(module):
        seen.append(module)
        return False

    @use_kernel_forward_from_hub("scale_add_017", condition=only_first)
    def scale_add_cond(x, y, alpha: float = 2.0):
        return x * alpha + y

    @use_kernelized_func(scale_add_cond)
    class B(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(3, 3)

    block = B()
    with use_kernel_mapping(func_mapping(func_repo)):
        kernelize(nn.Sequential(block), mode=Mode.INFERENCE)
    assert seen == [block._kernel_funcs["scale_add_017"]]  # the block's copy
    assert kernel_layer_of(block._kernel_funcs["scale_add_017"]) is None


def test_a_subclass_tagged_anew_drops_the_condition(cond_mapping):
    @use_kernel_forward_from_hub("CondSiluAndMul")
    class Unconditional(CondSiluAndMul):
        pass

    layer = Unconditional(2)
    with use_kernel_mapping(cond_mapping):
        kernelize(nn.Sequential(layer), mode=Mode.INFERENCE, device="cpu")
    assert kernel_layer_of(layer) is not None


def test_condition_must_be_callable():
    with pytest.raises(KernelMappingError, match="must be callable"):

        @use_kernel_forward_from_hub("X", condition=True)
        class X(nn.Module):
            pass
