"""What a call with ``return_dict_in_generate=True`` gets from the fused loop: ``generate()``'s
own output class, with the per-step scores and logits it asked for and the cache as
``generate()`` would have left it.

``generate()`` keeps, for each token it makes, the logits processors' output
(``output_scores=True``: ``scores``, what its argmax or sampling reads) and the raw last-position
logits in float32 (``output_logits=True``: ``logits``). The fused loop keeps the same two per
step in device buffers of its block (`StepOutputs` says which; a block that keeps neither has
neither buffer), copied out after each block and cut at the step where ``generate()`` would
have stopped, as its tokens are. The first token's pair is ``generate()``'s own (it made that
token before handing the call over; `kernels.generation.fused_rule.recording_setup` records
it).

The cache: ``generate()`` returns the static cache it decoded with, the generator's, holding
every position it fed (the prompt and every token but the last). The loop's last block may feed
up to K - 1 positions more; `crop_static_cache` clears them (and on transformers 5.x sets each
layer's position counter back), so the cache returned holds what ``generate()``'s would.

Example:
    ```python
    keep = StepOutputs(scores=True, logits=False, vocab=logits.shape[-1])
    decoded = loop.decode(..., keep=keep)  # decoded.scores: one [batch, vocab] a step
    ```
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


@dataclasses.dataclass(frozen=True)
class StepOutputs:
    """Which per-step tensors a fused block keeps besides its tokens, each ``[batch, vocab]``
    float32 a step: part of the block's key, so that a block which keeps none has no buffers
    and copies nothing."""

    #: The processed scores (``output_scores=True``).
    scores: bool
    #: The raw logits (``output_logits=True``).
    logits: bool
    #: The logits' last dimension (the buffers' width).
    vocab: int

    @property
    def any(self) -> bool:
        """Whether anything is kept."""
        return self.scores or self.logits


def crop_static_cache(cache: Any, length: int) -> None:
    """Leave ``cache`` (its layers `StaticLayer`s) holding its first ``length`` positions only,
    as a cache that was never fed further: later positions zeroed (what ``reset`` leaves, and
    what transformers 4.57's ``get_seq_length`` counts by) and, on 5.x, each layer's position
    counter set to ``length``."""
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", False):
            continue
        layer.keys[:, :, length:].zero_()
        layer.values[:, :, length:].zero_()
        counter = getattr(layer, "cumulative_length", None)
        if isinstance(counter, torch.Tensor):
            counter.fill_(length)


def generate_output(
    sequences: torch.Tensor,
    *,
    scores: tuple[torch.Tensor, ...] | None,
    logits: tuple[torch.Tensor, ...] | None,
    cache: Any,
) -> Any:
    """transformers' ``GenerateDecoderOnlyOutput`` (what ``generate()`` returns for greedy and
    sampled calls of a decoder-only model with ``return_dict_in_generate=True``), its cache
    field named as the installed line names it (``past_key_values`` in 4.57, ``cache`` in 5.x);
    no attentions or hidden states (calls that ask for them do not reach the loop)."""
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    # Any: its fields are annotated LongTensor / FloatTensor, which plain tensors are at runtime.
    output_class: Any = GenerateDecoderOnlyOutput
    names = {field.name for field in dataclasses.fields(output_class)}
    cache_field = "cache" if "cache" in names else "past_key_values"
    return output_class(sequences=sequences, scores=scores, logits=logits, **{cache_field: cache})
