"""Set-up for the aten override tests.

Without a CUDA GPU our Triton kernels run through Triton's interpreter on CPU tensors
(``TRITON_INTERPRET=1``, set before anything imports triton), and the overrides are registered
for the CPU as well as CUDA. Every test starts and ends with PyTorch's own kernels: the
dispatcher is process-wide, and an override left registered would change every later test.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels.overrides import (  # noqa: E402
    active_aten_overrides,
    disable_aten_overrides,
    reset_aten_override_calls,
)
from tests.support.overrides import dispatch_tables  # noqa: E402  (after TRITON_INTERPRET is set)


@pytest.fixture(autouse=True)
def pytorch_kernels_around_each_test():
    """No override before or after a test, and the dispatch tables as PyTorch made them."""
    assert active_aten_overrides() == {}
    before = dispatch_tables()
    reset_aten_override_calls()
    yield
    disable_aten_overrides()
    assert active_aten_overrides() == {}, "a test left overrides registered"
    assert dispatch_tables() == before
