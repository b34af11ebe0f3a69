"""A block of decode steps whose inputs advance on the device, so that one CUDA graph can hold
several steps.

`DecodeSteps` holds static copies of the keyword arguments ``generate()`` passed at its first
decode step, and a call of it runs ``steps`` decode steps on them. Each step is what
``generate()``'s loop does, without the host:

1. the model's forward on the static arguments (the static KV cache included);
2. argmax of the last position's logits in float32, or with a `TokenChoice` the call's logits
   processors and then argmax or a sample (`kernels.generation.token_choice`);
3. with end tokens: finished sequences emit the pad token, and a sequence that emits an end
   token is finished (``unfinished``); whether any sequence is left is noted per step (``alive``);
4. the token is written into ``tokens`` and the next step's arguments are made in place:
   ``input_ids`` the new tokens, ``cache_position`` (4.57) and ``position_ids`` one further, and
   the attention mask opened one column further.

The arguments it advances are those generate() passes at a decode step on a static cache, on
both transformers lines (recorded from real calls): 4.57 passes ``input_ids``,
``cache_position``, ``position_ids`` and a 4D mask ``[batch, 1, 1, cache length]`` that
``prepare_inputs_for_generation`` builds (boolean; additive, 0.0 or the dtype's minimum, with
eager attention); 5.x passes ``input_ids``, ``position_ids`` and the same 4D mask, and its cache
counts positions itself (a device tensor its forward increments). In that mask the column of the
token being fed is open for every sequence (padding stays closed) and later columns are closed,
so the next step's mask is this one with the next column opened: `advance_blocker` checks that
before a call is handed over, and anything else it does not know (another tensor argument)
keeps the call on generate()'s own loop. An attention implementation with flash attention's
mask function (ours, ``kernels_attention``) gets generate()'s 2D padding mask instead, one
column a token so far, a column longer each step: `widen_padding_mask` gives it the cache's
length (later columns closed), so that it advances as the 4D mask does, in a buffer of one
shape.

Example:
    ```python
    from kernels.generation.decode_steps import DecodeSteps

    block = DecodeSteps(model.forward, decode_kwargs, steps=8, eos_count=1)
    block.load(decode_kwargs, position=prompt_length, eos=eos, pad=pad)
    block()  # 8 decode steps; block.tokens[:, i] is step i's token
    ```
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .inputs import StaticInputs
from .step_outputs import StepOutputs
from .stop_strings import StringStops
from .token_choice import TokenChoice

#: Tensor arguments of a decode step that the block knows how to advance.
ADVANCED = ("input_ids", "cache_position", "position_ids", "attention_mask")
_PLAIN_TYPES = (type(None), bool, int, float, str)


def advance_blocker(
    kwargs: dict[str, Any], cache_argument: str, cache: Any, position: int
) -> str | None:
    """Why `DecodeSteps` cannot advance a decode step's arguments on the device, or None.

    Args:
        kwargs: the keyword arguments of ``generate()``'s first decode step.
        cache_argument: the forward's name for the KV cache.
        cache: the static cache the step must pass.
        position: the cache position of the token the step feeds (the prompt's length).
    """
    for name, value in kwargs.items():
        if name == cache_argument:
            if value is not cache:
                return f"the decode step passes another cache as {name}"
        elif isinstance(value, torch.Tensor):
            if name not in ADVANCED:
                return f"the decode step passes a tensor {name!r} the loop does not advance"
        elif not isinstance(value, _PLAIN_TYPES):
            return f"the decode step passes {name!r} as a {type(value).__name__}"
    ids = kwargs.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[1] != 1:
        return "the decode step does not feed one input id per sequence"
    cache_position = kwargs.get("cache_position")
    if cache_position is not None and cache_position.tolist() != [position]:
        return f"the decode step's cache_position is not [{position}]"
    position_ids = kwargs.get("position_ids")
    if position_ids is not None and position_ids.shape != ids.shape:
        return f"position_ids of shape {tuple(position_ids.shape)}, not {tuple(ids.shape)}"
    return _mask_blocker(kwargs.get("attention_mask"), ids.shape[0], position)


def _mask_blocker(mask: torch.Tensor | None, batch: int, position: int) -> str | None:
    if mask is None:  # the model makes its causal mask itself from the cache
        return None
    four_d = mask.dim() == 4 and tuple(mask.shape[:3]) == (batch, 1, 1)
    two_d = mask.dim() == 2 and mask.shape[0] == batch
    if not (four_d or two_d) or mask.shape[-1] <= position:
        return (
            f"the decode step's attention mask has shape {tuple(mask.shape)}, not "
            f"[{batch}, 1, 1, cache length] (the static cache's 4D mask) or [{batch}, cache "
            "length] (a 2D padding mask, widened)"
        )
    current = mask[..., position]
    if not bool((current == current.flatten()[0]).all()):
        return "the attention mask does not open the fed token's column for every sequence"
    if bool((mask[..., position + 1 :] == current.flatten()[0]).any()):
        return "the attention mask opens columns past the fed token's"
    return None


class DecodeSteps:
    """``steps`` greedy decode steps on static buffers, advancing them in place (a function of no
    arguments, so that a backend can capture it).

    Args:
        forward: the model's forward.
        kwargs: the first decode step's keyword arguments (`advance_blocker` let them through);
            their tensors are copied into the static buffers.
        steps: decode steps per call.
        eos_count: how many end tokens stop a sequence (0: none, tokens are never replaced).
        choice: how each step's tokens are chosen from its logits (`TokenChoice`: the call's
            logits processors, argmax or a sample); None: argmax of the logits.
        string_stops: the call's stop strings (`StringStops`), read from the choice's sequence
            so far; a sequence that ends with one is finished.
        additive_mask: a floating dtype to feed a boolean attention mask as an additive one of
            (0 open, the dtype's minimum closed), for a model whose attention is PyTorch's
            ``scaled_dot_product_attention``: it would otherwise turn the boolean mask into
            that additive one in every layer of every step (a select and two fills, 3 of a
            1.1B Llama's ~11 small kernels a layer). The closed columns' weights are exactly
            zero either way (the fed token's own column is always open), so the tokens are
            the same. None (default) feeds the mask as it is.
        keep: the per-step tensors to keep besides the tokens (`StepOutputs`: the processed
            scores in ``kept_scores``, the raw logits in ``kept_logits``, each ``[steps, batch,
            vocab]`` float32, written by step i at row i); None keeps neither (no buffers).
    """

    def __init__(
        self,
        forward: Callable[..., Any],
        kwargs: dict[str, Any],
        steps: int,
        eos_count: int,
        additive_mask: torch.dtype | None = None,
        choice: TokenChoice | None = None,
        string_stops: StringStops | None = None,
        keep: StepOutputs | None = None,
    ):
        self.forward = forward
        self.steps = steps
        self.choice = choice
        self.string_stops = string_stops
        #: The sequence so far, for processors and stop strings that read it (the choice's).
        self.sequence = None if choice is None else choice.sequence
        if string_stops is not None and self.sequence is None:
            raise ValueError("stop strings read the sequence so far: pass a choice that keeps it")
        mask = kwargs.get("attention_mask")
        self.additive_mask = None
        if (
            additive_mask is not None
            and isinstance(mask, torch.Tensor)
            and mask.dtype == torch.bool
        ):
            self.additive_mask = additive_mask
        # Allocated before any capture, with the ordinary allocator: graphs read and write them.
        self.inputs = StaticInputs(self._fed(kwargs))
        ids = self.inputs.buffers["input_ids"]
        batch, device = ids.shape[0], ids.device
        #: Step i's tokens, for each sequence.
        self.tokens = torch.zeros(batch, steps, dtype=torch.long, device=device)
        #: Step i's processed scores and raw logits, where kept (``keep``).
        self.kept_scores, self.kept_logits = None, None
        if keep is not None:
            shape = (steps, batch, keep.vocab)
            if keep.scores:
                self.kept_scores = torch.zeros(shape, dtype=torch.float32, device=device)
            if keep.logits:
                self.kept_logits = torch.zeros(shape, dtype=torch.float32, device=device)
        #: Whether any sequence was unfinished after step i (kept with end tokens or stop strings).
        self.alive = torch.ones(steps, dtype=torch.bool, device=device)
        #: 1 for sequences still generating, as generate()'s ``unfinished_sequences``.
        self.unfinished = torch.ones(batch, dtype=torch.long, device=device)
        #: The cache position (mask column) of the token the next step feeds.
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self.eos = torch.zeros(eos_count, dtype=torch.long, device=device) if eos_count else None
        self.pad = torch.zeros((), dtype=torch.long, device=device)
        mask = self.inputs.buffers.get("attention_mask")
        if mask is not None:
            #: The mask's column indices, and the value of an open column (True, or 0.0).
            self.columns = torch.arange(mask.shape[-1], device=device)
            self.open_value = torch.zeros((), dtype=mask.dtype, device=device)

    def load(
        self,
        kwargs: dict[str, Any],
        position: int,
        eos: torch.Tensor | None,
        pad: torch.Tensor | None,
        processors: Any = (),
        sequence: torch.Tensor | None = None,
    ) -> None:
        """Start from a new first decode step: its arguments, the cache position of the token it
        feeds, the end tokens and the pad token (same count of end tokens as at construction),
        and for a `TokenChoice` the call's logits processors and ids so far (prompt, padding
        and the token the step feeds)."""
        self.inputs.load(self._fed(kwargs))
        if self.choice is not None:
            assert sequence is not None
            self.choice.load(processors, sequence)
        self.position.fill_(position)
        mask = self.inputs.buffers.get("attention_mask")
        if mask is not None:
            self.open_value.copy_(mask.flatten(1)[0, position])
        self.unfinished.fill_(1)
        if self.eos is not None:
            # Built with end tokens, so the caller has them (the same count) and a pad token.
            assert eos is not None and pad is not None
            self.eos.copy_(eos.reshape(-1))
            self.pad.copy_(pad)
            # The fed tokens are generate()'s first: a sequence that ended there is finished.
            ended = _is_end(self.inputs.buffers["input_ids"][:, 0], self.eos)
            self.unfinished.mul_(~ended)
        if self.string_stops is not None:
            assert self.sequence is not None
            self.unfinished.mul_(~self.string_stops(self.sequence))

    @property
    def tracks_finish(self) -> bool:
        """Whether sequences can finish before the maximum length (end tokens, stop strings):
        then `alive` says after which step none was left."""
        return self.eos is not None or self.string_stops is not None

    def _fed(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``kwargs`` as the forward is fed them: a boolean mask made additive where asked."""
        if self.additive_mask is None:
            return kwargs
        mask = kwargs["attention_mask"]
        closed = torch.finfo(self.additive_mask).min
        additive = torch.zeros(mask.shape, dtype=self.additive_mask, device=mask.device)
        return {**kwargs, "attention_mask": additive.masked_fill_(~mask, closed)}

    def __call__(self) -> None:
        for i in range(self.steps):
            self._step(i)

    def _step(self, i: int) -> None:
        outputs = self.forward(**self.inputs.kwargs)
        # As generate(): the last position's logits in float32, then its choice.
        logits = outputs.logits[:, -1].to(torch.float32)
        if self.choice is None:
            scores, tokens = logits, torch.argmax(logits, dim=-1)
        else:
            scores = self.choice.process(logits)
            tokens = self.choice.pick(scores)
        # As generate() keeps them: after the processors ran, finished sequences' rows as they
        # are (their tokens become the pad token below, their scores stay).
        if self.kept_scores is not None:
            self.kept_scores[i].copy_(scores)
        if self.kept_logits is not None:
            self.kept_logits[i].copy_(logits)
        # As generate(): finished sequences emit the pad token (with end tokens only), the token
        # joins the sequence, then the stopping criteria see the sequence.
        if self.eos is not None:
            tokens = tokens * self.unfinished + self.pad * (1 - self.unfinished)
        if self.sequence is not None:
            self.sequence.append(tokens)
        if self.eos is not None:
            self.unfinished.mul_(~_is_end(tokens, self.eos))
        if self.string_stops is not None:
            assert self.sequence is not None
            self.unfinished.mul_(~self.string_stops(self.sequence))
        if self.tracks_finish:
            self.alive[i] = self.unfinished.any()
        self.tokens[:, i] = tokens
        self._advance(tokens)

    def _advance(self, tokens: torch.Tensor) -> None:
        buffers = self.inputs.buffers
        buffers["input_ids"].copy_(tokens[:, None])
        for name in ("cache_position", "position_ids"):
            if name in buffers:
                buffers[name].add_(1)
        mask = buffers.get("attention_mask")
        if mask is not None:
            # Open the next column for every sequence. A comparison and a select rather than an
            # index write: the same kernels for boolean and additive masks, and past a block's
            # last step (the next column beyond the cache) it changes nothing.
            following = self.columns == self.position + 1
            mask.copy_(torch.where(following, self.open_value, mask))
        self.position.add_(1)


def _is_end(tokens: torch.Tensor, eos: torch.Tensor) -> torch.Tensor:
    # torch.isin, spelled as a comparison so that no kernel picks a path by the sizes' values.
    return (tokens[:, None] == eos[None, :]).any(dim=-1)
