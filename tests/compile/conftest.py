"""Set-up for the torch.compile backend's tests (kernels.compile).

Without a CUDA GPU our Triton kernels run through Triton's interpreter on CPU tensors
(``TRITON_INTERPRET=1``, set before anything imports triton), which is also what lets the
backend's guards accept CPU tensors; with one, the tests run on the GPU.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tests.support.compile import DEVICE  # noqa: E402  (after TRITON_INTERPRET is set)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch: no graph or guard of another test's model is reused,
    and no test runs into Dynamo's limit on recompilations of one function."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="session")
def _library_registry():
    from kernels.compile import KernelRegistry

    return KernelRegistry.library()


@pytest.fixture
def library(_library_registry):
    """The library's registry (loaded once), as a copy each test may change."""
    return _library_registry.copy()


@pytest.fixture
def device():
    return DEVICE
