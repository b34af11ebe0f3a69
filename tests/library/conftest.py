"""Set-up for the tests of our kernel repositories (library/).

Without a CUDA GPU the Triton kernels run through Triton's interpreter on CPU tensors
(``TRITON_INTERPRET=1``, set before anything imports triton); with one, the same tests run on
the GPU, with larger shapes where a test asks for them (marked ``gpu``).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tests.support.library import load  # noqa: E402  (after TRITON_INTERPRET is set)


@pytest.fixture(scope="session")
def activation():
    return load("activation")


@pytest.fixture(scope="session")
def norm():
    return load("norm")


@pytest.fixture(scope="session")
def rotary():
    return load("rotary")


@pytest.fixture(scope="session")
def loss():
    return load("loss")
