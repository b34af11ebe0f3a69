"""``kernels._internals.cli.cache``: ``kernels cache ls`` (our `kernels.cli.cache`).

Their tests point the command at a cache by setting huggingface_hub's own ``constants``
(``HF_HUB_CACHE``, ``HF_HUB_OFFLINE``) through this module; ours reads the same constants when
the command runs (`kernels.repos.hubclient.cache_dir`), so the module is all they need.
"""

from huggingface_hub import constants

from tests.hf_suite.gaps import gaps_for

__getattr__ = gaps_for(__name__)

__all__ = ["constants"]
