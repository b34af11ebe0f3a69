"""Taggers: functions `kernelize` calls with each model before it plans.

A model's code tags the layers it wants kernelized. Where it leaves some untagged (the gated
MLPs of transformers' Llama-family models, for one), a tagger can tag them: it is called with
the model at the start of every `kernelize` and `explain`, before any layer is looked at, so
models that a library builds and kernelizes for you (transformers' ``use_kernels=True``) are
covered too. Taggers are process-wide, like the tags they set.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

#: A tagger: called with the model; tags classes (its return value is ignored).
Tagger = Callable[["nn.Module"], object]

_taggers: tuple[Tagger, ...] = ()
_lock = threading.Lock()


def add_tagger(tagger: Tagger) -> Callable[[], None]:
    """Have `kernelize` (and `explain`) call `tagger(model)` before planning each model.

    Adding the same tagger again changes nothing. Returns a function that removes it.

    Example:
        ```python
        from kernels.layer.taggers import add_tagger
        from kernels.library import tag_gated_mlps

        remove = add_tagger(tag_gated_mlps)  # every model kernelized from now on
        ...
        remove()
        ```
    """
    global _taggers
    if not callable(tagger):
        raise TypeError(
            f"A tagger is called with the model; got {tagger!r}, which is not callable."
        )
    with _lock:
        if tagger not in _taggers:
            _taggers = (*_taggers, tagger)

    def remove() -> None:
        global _taggers
        with _lock:
            _taggers = tuple(t for t in _taggers if t is not tagger)

    return remove


def run_taggers(model: nn.Module) -> None:
    """Call every tagger with `model`, in the order they were added."""
    for tagger in _taggers:
        tagger(model)
