"""``kernels._internals.importer``: the record of an imported kernel, our public
`kernels.LoadedKernel`.

Their import function (``_import_from_path``) and registries (``_loaded_kernels``,
``_loaded_kernel_metadata``) are private: those names stay gaps.
"""

from kernels import LoadedKernel
from tests.hf_suite.gaps import gaps_for

__getattr__ = gaps_for(__name__)

__all__ = ["LoadedKernel"]
