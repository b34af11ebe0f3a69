"""``kernels._internals.layer.func``: function kernels from a lock file, our public
`kernels.LockedFuncRepository`; the module's private HfApi factory stays a gap."""

from kernels import LockedFuncRepository
from tests.hf_suite.gaps import gaps_for

__getattr__ = gaps_for(__name__)

__all__ = ["LockedFuncRepository"]
