"""``kernels._internals.backends``: which accelerator backend this machine has."""

import torch

from tests.hf_suite.gaps import gaps_for

__getattr__ = gaps_for(__name__)


def _get_torch_privateuse_backend_name() -> str | None:
    """The name torch gives its private-use device (their conftest asks it whether an Ascend
    NPU is present): torch's own answer, no behaviour of a kernels client."""
    return torch._C._get_privateuse1_backend_name()
