"""`Mode` where Hugging Face's `kernels` keeps it: ``from kernels.layer.mode import Mode``.

transformers 5.x imports it from this path (``modeling_utils.py``). The definition lives in
`kernels.mapping.mode`, beside the rest of the mapping.
"""

from ..mapping.mode import Mode

__all__ = ["Mode"]
