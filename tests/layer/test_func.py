"""Function kernels: a decorated function becomes a tagged module a kernel can replace."""

import pytest
import torch
import torch.nn as nn

from kernels import (
    KernelLayerError,
    KernelLoadError,
    LocalFuncRepository,
    Mode,
    kernelize,
    register_kernel_mapping,
    use_kernel_forward_from_hub,
    use_kernel_func_from_hub,
    use_kernel_mapping,
)
from kernels.layer.swap import kernel_layer_of


@use_kernel_func_from_hub("scale_add")
def scale_add(x, y, alpha: float = 2.0):
    """x * alpha + y."""
    return x * alpha + y


@use_kernel_forward_from_hub("scale_add")  # the spelling newer transformers uses
def scale_add_too(x, y, alpha: float = 2.0):
    return x * alpha + y


class Model(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.proj = nn.Linear(3, 3)
        self.fn = fn

    def forward(self, x):
        return self.fn(self.proj(x), x)


KERNEL_PACKAGE = """
def scale_add(x, y, alpha: float = 2.0):
    return x * alpha + y + 100

def compiled_scale_add(x, y, alpha: float = 2.0):
    return x * alpha + y + 200

compiled_scale_add.can_torch_compile = True

def wrong_signature(x, y, beta: float = 2.0):
    return x

def _private(x):
    return x
"""


@pytest.fixture(autouse=True)
def clean_mapping():
    register_kernel_mapping({}, inherit_mapping=False)
    yield
    register_kernel_mapping({}, inherit_mapping=False)


@pytest.fixture
def func_repo(tmp_path):
    package = tmp_path / "fn" / "build" / "torch-universal" / "fn"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(KERNEL_PACKAGE)
    return tmp_path / "fn"


@pytest.mark.parametrize("fn", [scale_add, scale_add_too])
def test_decorated_function_still_behaves_like_the_function(fn):
    x, y = torch.randn(2), torch.randn(2)
    torch.testing.assert_close(fn(x, y), x * 2 + y)
    torch.testing.assert_close(fn(x, y=y, alpha=3.0), x * 3 + y)
    assert isinstance(fn, nn.Module)


@pytest.mark.parametrize("fn", [scale_add, scale_add_too])
def test_function_kernel_replaces_the_function_inside_a_model(func_repo, fn):
    model = Model(fn)
    x = torch.randn(4, 3)
    expected = model(x) + 100
    with use_kernel_mapping(
        {"scale_add": {"cpu": LocalFuncRepository(func_repo, func_name="scale_add")}}
    ):
        kernelize(model, mode=Mode.INFERENCE)
    torch.testing.assert_close(model(x), expected)
    assert kernel_layer_of(model.fn) is not None
    kernelize(model, mode=Mode.INFERENCE)  # no mapping: back to the function
    torch.testing.assert_close(model(x), expected - 100)


def test_function_kernel_signature_is_checked(func_repo):
    repo = LocalFuncRepository(func_repo, func_name="wrong_signature")
    with use_kernel_mapping({"scale_add": {"cpu": repo}}):
        with pytest.raises(
            KernelLayerError, match="parameter 4 is 'beta' in the kernel but 'alpha'"
        ):
            kernelize(Model(scale_add), mode=Mode.INFERENCE)


def test_missing_function_lists_what_exists(func_repo):
    repo = LocalFuncRepository(func_repo, func_name="nope")
    with use_kernel_mapping({"scale_add": {"cpu": repo}}):
        with pytest.raises(
            KernelLoadError,
            match="has no function 'nope'. Functions it provides: compiled_scale_add, scale_add, wrong_signature",
        ):
            kernelize(Model(scale_add), mode=Mode.INFERENCE, use_fallback=False)


def test_function_kernels_declare_compile_support_as_attributes(func_repo):
    # A plain function declares nothing, so it is not assumed to be compile-safe.
    model = Model(scale_add)
    with use_kernel_mapping(
        {"scale_add": {"cpu": LocalFuncRepository(func_repo, func_name="scale_add")}}
    ):
        kernelize(model, mode=Mode.INFERENCE | Mode.TORCH_COMPILE)
    assert kernel_layer_of(model.fn) is None
    compiled = LocalFuncRepository(func_repo, func_name="compiled_scale_add")
    with use_kernel_mapping({"scale_add": {"cpu": compiled}}):
        kernelize(model, mode=Mode.INFERENCE | Mode.TORCH_COMPILE)
    assert kernel_layer_of(model.fn).can_torch_compile is True
    x = torch.randn(4, 3)
    torch.testing.assert_close(
        torch.compile(model, backend="eager", fullgraph=True)(x), model.proj(x) * 2 + x + 200
    )
