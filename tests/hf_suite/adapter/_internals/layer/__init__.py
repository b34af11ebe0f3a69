"""``kernels._internals.layer``: their package of the layer API's modules."""

from tests.hf_suite.gaps import gaps_for

__getattr__ = gaps_for(__name__)
