"""Which path each overridden call took: our kernel, or PyTorch's and why.

Every call of an override is counted under ``(op, path)``: ``path`` is `OURS` when our kernel
ran, else the reason the call fell through to PyTorch's kernel (``"dtype float64"``,
``"no weight"``, ...). The first fall-through of each reason is logged at DEBUG on the
``kernels.overrides`` logger, so a model that never reaches our kernels can be told from one
that does without a per-call log.

Counting costs a dict update per call, small beside the dispatcher's hand-off to Python. Under
several threads calling overridden ops at once the counts may miss an increment (no lock: the
counter is for diagnosis, not accounting).
"""

from __future__ import annotations

import logging
from collections import Counter

logger = logging.getLogger("kernels.overrides")

#: The path of a call that ran our kernel.
OURS = "ours"

_counts: Counter[tuple[str, str]] = Counter()


def record(op: str, path: str) -> None:
    """Count one call of the override of ``op`` that took ``path``."""
    key = (op, path)
    if path != OURS and key not in _counts:
        logger.debug("aten::%s: PyTorch's kernel runs for this call (%s)", op, path)
    _counts[key] += 1


def aten_override_calls() -> dict[tuple[str, str], int]:
    """How many calls each override took each path since the last reset.

    Returns:
        ``{(op, path): calls}``: ``op`` an aten operator name (``"native_layer_norm"``), ``path``
        ``"ours"`` when our kernel ran, else the reason PyTorch's kernel ran
        (``"dtype float64"``, ``"non-contiguous input"``, ...).

    Example:
        ```python
        from kernels.overrides import aten_override_calls, reset_aten_override_calls, use_aten_overrides

        reset_aten_override_calls()
        with use_aten_overrides():
            model(x).sum().backward()
        print(aten_override_calls())  # {('native_layer_norm', 'ours'): 24, ...}
        ```
    """
    return dict(_counts)


def reset_aten_override_calls() -> None:
    """Forget the counts of `aten_override_calls` (and log the next first fall-throughs again)."""
    _counts.clear()
