"""``kernels._internals.archs``: whether a build's declared GPU archs support this device,
our `kernels.repos.archs`."""

from kernels.repos.archs import cuda_archs_run_on
from tests.hf_suite.gaps import gaps_for

__getattr__ = gaps_for(__name__)


def _supports_cuda_capability(archs: list[str], capability: tuple[int, int]) -> bool:
    """Whether any of `archs` runs on the CUDA `capability` (True when none can be read)."""
    return cuda_archs_run_on(archs, capability)
