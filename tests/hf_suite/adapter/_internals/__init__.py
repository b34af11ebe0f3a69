"""``kernels._internals``: their package of private modules; nothing of its own is tested."""

from tests.hf_suite.gaps import gaps_for

__getattr__ = gaps_for(__name__)
