"""``kernels._internals.hf_hub``: where a Hub kernel came from, our public `kernels.RepoInfo`;
the HfApi a call with ``user_agent=`` makes (``_get_hf_api``) and the platform part of the
user agent (``_platform``), whose public face is the User-Agent header both clients send.

Their trust check and cache folder (``_get_cache_dir``) are private and have no counterpart
here: those names stay gaps.
"""

from kernels import RepoInfo
from kernels.repos.hubclient import _machine, hub_api, user_agent_for
from tests.hf_suite.gaps import gaps_for

__getattr__ = gaps_for(__name__)

__all__ = ["RepoInfo", "_get_hf_api", "_platform"]


def _get_hf_api(user_agent=None):
    """The HfApi our loads use when called with ``user_agent=`` (its ``user_agent`` is the
    header sent)."""
    with user_agent_for(user_agent):
        return hub_api()


def _platform() -> str:
    """``<cpu>-<os>`` of this machine, as the user agent's ``platform/`` part names it."""
    return _machine()[1]
