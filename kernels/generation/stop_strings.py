"""Stop strings in the fused loop: transformers' ``StopStringCriteria`` run on the device over the
sequence so far, so that a step needs no host read to know which sequences have finished.

``generate(..., stop_strings=..., tokenizer=...)`` stops a sequence once its text ends with one
of the strings. transformers' ``StopStringCriteria`` decides it with tensor operations alone (an
embedding of each token's possible overlaps with each string, matched backwards from the last
token) over ``input_ids[:, -maximum_token_len:]``. The loop keeps the sequence in a buffer of
fixed shape (`kernels.generation.token_choice.SequenceSoFar`), so `StringStops` hands each
criterion the last ``maximum_token_len`` columns up to the sequence's length, the columns before
its start replaced by an id past the vocabulary: the criterion maps such ids to its "matches
nothing" row, so a short sequence is judged as transformers judges it. The criterion objects
are called as they are (their arithmetic is transformers'); what a captured block bakes in of
them is in `stop_strings_key`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .token_choice import SequenceSoFar

#: An id past any vocabulary: StopStringCriteria clamps it to its row that matches nothing.
_NO_TOKEN = 2**62


def is_stop_string_criterion(criterion: Any) -> bool:
    """Whether ``criterion`` is transformers' own ``StopStringCriteria`` (not a subclass)."""
    return type(criterion).__name__ == "StopStringCriteria" and type(
        criterion
    ).__module__.startswith("transformers.generation")


def stop_strings_key(criteria: Sequence[Any]) -> tuple:
    """What a block bakes in of its stop-string criteria: the strings, their longest match in
    tokens and the shape of their token embedding; a block of another key is captured apart."""
    return tuple(
        (
            tuple(criterion.stop_strings),
            int(criterion.maximum_token_len),
            tuple(criterion.embedding_vec.shape),
        )
        for criterion in criteria
    )


class StringStops:
    """Which sequences end with one of the stop strings, from the sequence so far.

    Args:
        criteria: the call's ``StopStringCriteria`` (the first call's of a block's key).
    """

    def __init__(self, criteria: Sequence[Any]):
        if not criteria:
            raise ValueError("StringStops needs at least one StopStringCriteria")
        self.criteria = tuple(criteria)
        self.width = max(int(c.maximum_token_len) for c in self.criteria)

    def __call__(self, seq: SequenceSoFar) -> torch.Tensor:
        """``[batch]`` bool: whether each sequence's text now ends with a stop string."""
        offsets = torch.arange(self.width, device=seq.ids.device)
        columns = seq.length - self.width + offsets
        window = seq.ids.index_select(1, columns.clamp(min=0))
        window = torch.where((columns >= 0)[None, :], window, _NO_TOKEN)
        done = torch.zeros(seq.ids.shape[0], dtype=torch.bool, device=seq.ids.device)
        for criterion in self.criteria:
            done = done | criterion(window, None)
        return done
