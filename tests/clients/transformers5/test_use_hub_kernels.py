"""transformers 5.25 reads ``USE_HUB_KERNELS`` when kernels are asked for, not at import.

Up to 5.24 the variable was read once, at import, and a false value made transformers' decorators
tag nothing. 5.25 tags with our `use_kernel_forward_from_hub` whatever the variable says and
checks it at each `use_kernels = True` (and `kernelize`): a false value then raises its own
ValueError, and switching it back on works without a restart.
"""

import pytest
import torch
import transformers
from packaging.version import Version

from kernels.layer.swap import kernel_layer_of
from kernels.library import register_library_kernels
from tests.support.tf5_models import make_model, tokens

pytestmark = pytest.mark.skipif(
    Version(transformers.__version__) < Version("5.25"),
    reason="transformers before 5.25 read USE_HUB_KERNELS once, at import",
)


def test_a_false_value_refuses_use_kernels_and_leaves_the_model(clean_kernels, monkeypatch):
    register_library_kernels(devices=["cpu"])
    model = make_model("llama").eval()
    with torch.no_grad():
        expected = model(tokens()).logits
    monkeypatch.setenv("USE_HUB_KERNELS", "NO")
    with pytest.raises(ValueError, match="USE_HUB_KERNELS=NO"):
        model.use_kernels = True
    norm = model.model.norm
    assert type(norm).kernel_layer_name == "RMSNorm"  # tagged all the same
    assert kernel_layer_of(norm) is None
    with torch.no_grad():
        torch.testing.assert_close(model(tokens()).logits, expected)


def test_switching_it_back_on_kernelizes_without_a_restart(clean_kernels, monkeypatch):
    register_library_kernels(devices=["cpu"])
    model = make_model("llama").eval()
    with torch.no_grad():
        expected = model(tokens()).logits
    monkeypatch.setenv("USE_HUB_KERNELS", "0")
    with pytest.raises(ValueError, match="USE_HUB_KERNELS"):
        model.use_kernels = True
    monkeypatch.setenv("USE_HUB_KERNELS", "YES")
    model.use_kernels = True
    assert kernel_layer_of(model.model.norm) is not None
    with torch.no_grad():
        torch.testing.assert_close(model(tokens()).logits, expected, rtol=1e-4, atol=1e-4)
