"""``kernels._internals.deps``: a kernel's access to its ``kernel-depends`` while it is
imported, our public `kernels.get_kernel_dep`.

Their ``use_kernel_deps`` (installing dependency modules by hand) and ``resolve_kernel_tree``
(over their private resolvers) have no public counterpart: ours installs a kernel's
dependencies only from its metadata, during a load.
"""

from kernels import get_kernel_dep
from tests.hf_suite.gaps import gaps_for

__getattr__ = gaps_for(__name__)

__all__ = ["get_kernel_dep"]
