"""``kernels._internals.hf_hub``: where a Hub kernel came from, our public `kernels.RepoInfo`.

Their HfApi factory (``_get_hf_api``), trust check and cache folder (``_get_cache_dir``) are
private and have no counterpart here: those names stay gaps.
"""

from kernels import RepoInfo
from tests.hf_suite.gaps import gaps_for

__getattr__ = gaps_for(__name__)

__all__ = ["RepoInfo"]
