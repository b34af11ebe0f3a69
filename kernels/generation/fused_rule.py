"""Which ``generate()`` calls the fused loop may decode, read from what ``generate()`` itself set
up for the call, and what the loop needs to know of them.

The fused loop (`kernels.generation.fused_loop`) replaces ``generate()``'s decode loop with
steps that choose each token on the device (`kernels.generation.token_choice`), update the end
tokens and advance the inputs, so it may only take calls where ``generate()`` would do exactly
that. Rather than re-deriving generate()'s defaults (which differ between transformers 4.57 and
5.x and between models' generation configs), `recording_setup` records what ``generate()``
built for the call: the effective generation config, the logits processors and the stopping
criteria (it stands in front of the model's ``_get_logits_processor`` and
``_get_stopping_criteria`` for the length of the call). `fused_blocker` then says why the loop
must not take the call, or None when it may:

- greedy search or sampling (one beam, no contrastive, DoLa or assisted decoding);
- logits processors the loop has a device version of, or calls as they are (temperature,
  top-k/p, min-p, typical, epsilon, eta, repetition penalty, min length and
  ``min_new_tokens``, ``no_repeat_ngram_size``, ``forced_eos_token_id``, ``suppress_tokens``,
  bad words, sequence bias: `choice_blocker`); any other (a subclass, one of the user's)
  keeps the call in generate()'s loop;
- stopping criteria of max length, end tokens, stop strings (`kernels.generation.stop_strings`)
  and ``max_time`` (checked between blocks) only, not the user's own;
- no ``synced_gpus``, ``custom_generate``, prefill chunking or token healing; with
  ``return_dict_in_generate``, no ``output_attentions`` or ``output_hidden_states`` (per-step
  tensors of every layer, which the loop does not keep). Per-step scores and logits are kept
  by the loop (`kernels.generation.step_outputs`), the first token's as ``generate()`` made
  them (`GenerateSetup.first_step`). A streamer is given each block's tokens step by step after
  the block.

Example:
    ```python
    from kernels.generation.fused_rule import fused_blocker, recording_setup

    with recording_setup(model) as setup:
        model.generate(input_ids, max_new_tokens=8)
    print(fused_blocker(setup, {}))  # None: the loop may take it
    ```
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from .attributes import instance_attribute


@dataclass
class GenerateSetup:
    """What ``generate()`` built for one call (None until it built it)."""

    generation_config: Any = None
    logits_processor: Any = None
    stopping_criteria: Any = None
    #: The first call of its logits processors (the prefill's token): (the raw logits it was
    #: given, the scores it returned), the first entries of ``generate()``'s ``logits`` and
    #: ``scores``.
    first_step: tuple[torch.Tensor, torch.Tensor] | None = None


#: The clock ``max_time`` is measured on: MaxTimeCriteria's.
_clock = time.time


@dataclass(frozen=True)
class StopSettings:
    """When ``generate()``'s loop stops, and what finished sequences emit."""

    #: Tokens in all (prompt included) at which generation stops.
    max_length: int
    #: End-of-sequence token ids (1-D tensor), or None when no end token stops generation.
    eos: torch.Tensor | None
    #: The token finished sequences emit (0-D tensor); None when ``eos`` is None.
    pad: torch.Tensor | None
    #: ``max_time``: seconds after ``started`` (``time.time()``) past which no step begins.
    max_time: float | None = None
    started: float | None = None
    #: transformers' ``StopStringCriteria`` of the call (``stop_strings=``), run on the device.
    stop_strings: tuple = ()

    def out_of_time(self) -> bool:
        """Whether ``max_time`` has passed (checked between blocks: a block runs whole)."""
        if self.max_time is None or self.started is None:
            return False
        return _clock() - self.started > self.max_time


@dataclass(frozen=True)
class ChoiceSettings:
    """How a call's tokens are chosen, for a `kernels.generation.token_choice.TokenChoice`."""

    #: The call's logits processors, as generate() built them.
    processors: tuple
    do_sample: bool
    #: generate()'s ids so far at the handed-over step: prompt, padding and its token.
    sequence: torch.Tensor
    #: The most ids a sequence reaches (the static cache's length).
    capacity: int


@contextlib.contextmanager
def recording_setup(model: Any) -> Iterator[GenerateSetup]:
    """For the block, record in the `GenerateSetup` it yields the generation config, logits
    processors and stopping criteria that ``model.generate()`` builds."""
    setup = GenerateSetup()
    with contextlib.ExitStack() as stack:
        for method_name, field in (
            ("_get_logits_processor", "logits_processor"),
            ("_get_stopping_criteria", "stopping_criteria"),
        ):
            method = getattr(model, method_name, None)
            if method is not None:
                recorder = _recorder(method, setup, field)
                stack.enter_context(instance_attribute(model, method_name, recorder))
        yield setup


def _recorder(method: Any, setup: GenerateSetup, field: str) -> Any:
    @functools.wraps(method)
    def record(*args, **kwargs):
        result = method(*args, **kwargs)
        if field == "logits_processor":
            result = _first_call_recorded(result, setup)
        setattr(setup, field, result)
        setup.generation_config = kwargs.get("generation_config", args[0] if args else None)
        return result

    return record


def _first_call_recorded(processors: Any, setup: GenerateSetup) -> Any:
    """``processors`` (transformers' ``LogitsProcessorList``) as a list that also records its
    first call in ``setup.first_step``; any other object as it is."""
    from transformers.generation.logits_process import LogitsProcessorList

    if type(processors) is not LogitsProcessorList:
        return processors
    recorded = _first_call_recording_list()(processors)
    recorded.setup = setup
    return recorded


@functools.cache
def _first_call_recording_list() -> type:
    from transformers.generation.logits_process import LogitsProcessorList

    class FirstCallRecorded(LogitsProcessorList):
        """generate()'s logits processors, recording their first call (the prefill's token)."""

        setup: GenerateSetup

        def __call__(self, input_ids, scores, **kwargs):
            processed = super().__call__(input_ids, scores, **kwargs)
            if self.setup.first_step is None:
                self.setup.first_step = (scores, processed)
            return processed

    return FirstCallRecorded


def fused_blocker(setup: GenerateSetup, generate_kwargs: dict[str, Any]) -> str | None:
    """Why the fused loop must not decode this ``generate()`` call, or None when its tokens are
    those ``generate()`` makes (for sampling: from the same generator state).

    Args:
        setup: what ``generate()`` built for the call (`recording_setup`).
        generate_kwargs: the keyword arguments the call was given.
    """
    from .stop_strings import is_stop_string_criterion
    from .token_choice import choice_blocker

    config = setup.generation_config
    if config is None or setup.logits_processor is None or setup.stopping_criteria is None:
        return (
            "generate() did not build its logits processors and stopping criteria through "
            "_get_logits_processor and _get_stopping_criteria, so the loop cannot tell what "
            "they do"
        )
    for name, why in (
        ("synced_gpus", "synced_gpus=True"),
        ("custom_generate", "custom_generate= replaces generate()'s decoding"),
    ):
        if generate_kwargs.get(name):
            return why
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return "torch.distributed is initialised (generate() may sync GPUs between steps)"
    mode = config.get_generation_mode()
    mode = getattr(mode, "value", mode)
    if mode not in ("greedy_search", "sample"):
        return f"generation mode {mode}, not greedy search or sampling"
    if config.return_dict_in_generate:
        for name in ("output_attentions", "output_hidden_states"):
            if getattr(config, name, False):
                return (
                    f"return_dict_in_generate=True with {name}=True (per-step tensors of every "
                    "layer, which the fused loop does not keep)"
                )
        asked = config.output_scores or getattr(config, "output_logits", False)
        if asked and setup.first_step is None:
            return (
                "output_scores / output_logits: generate()'s logits processors were not called "
                "for its first token through the list _get_logits_processor built"
            )
    for name in ("prefill_chunk_size", "token_healing"):
        if getattr(config, name, None):
            return f"{name} is set"
    reason = choice_blocker(setup.logits_processor)
    if reason is not None:
        return reason
    from transformers.generation.stopping_criteria import (
        EosTokenCriteria,
        MaxLengthCriteria,
        MaxTimeCriteria,
    )

    known = (MaxLengthCriteria, EosTokenCriteria, MaxTimeCriteria)
    others = [
        type(c).__name__
        for c in setup.stopping_criteria
        if type(c) not in known and not is_stop_string_criterion(c)
    ]
    if others:
        return (
            "stopping criteria other than max length, end tokens, stop strings and max_time: "
            + ", ".join(others)
        )
    if not any(type(c) is MaxLengthCriteria for c in setup.stopping_criteria):
        return "generate() set no maximum length"
    if _has_eos(setup) and getattr(config, "_pad_token_tensor", None) is None:
        return "there are end tokens but no pad token for finished sequences"
    return None


def stop_settings(setup: GenerateSetup) -> StopSettings:
    """The `StopSettings` of a call that `fused_blocker` let through."""
    from transformers.generation.stopping_criteria import MaxLengthCriteria, MaxTimeCriteria

    from .stop_strings import is_stop_string_criterion

    criteria = setup.stopping_criteria
    max_length = min(c.max_length for c in criteria if type(c) is MaxLengthCriteria)
    timers = [c for c in criteria if type(c) is MaxTimeCriteria]
    extra: dict[str, Any] = {
        "stop_strings": tuple(c for c in criteria if is_stop_string_criterion(c))
    }
    if timers:
        first = min(timers, key=lambda c: c.initial_timestamp + c.max_time)
        extra.update(max_time=first.max_time, started=first.initial_timestamp)
    if not _has_eos(setup):
        return StopSettings(max_length, None, None, **extra)
    # generate() appends its end-token criterion last and stops on any end token it lists.
    eos = torch.cat([torch.as_tensor(c.eos_token_id).reshape(-1) for c in criteria if _is_eos(c)])
    return StopSettings(max_length, eos, setup.generation_config._pad_token_tensor, **extra)


def choice_settings(
    setup: GenerateSetup,
    prompt: torch.Tensor,
    first_tokens: torch.Tensor,
    capacity: int,
    stop: StopSettings,
) -> ChoiceSettings | None:
    """How a call `fused_blocker` let through chooses its tokens, or None for plain argmax with
    nothing that reads the sequence so far (no processor, no sampling, no stop strings: the
    loop's cheapest step). ``prompt`` (one row a sequence) and ``first_tokens`` (generate()'s
    ``[batch, 1]``) make the sequence so far, built only when something reads it."""
    processors = tuple(setup.logits_processor)
    do_sample = bool(setup.generation_config.do_sample)
    if not processors and not do_sample and not stop.stop_strings:
        return None
    sequence = torch.cat([prompt.to(first_tokens.device), first_tokens], dim=1)
    return ChoiceSettings(processors, do_sample, sequence, capacity)


def _has_eos(setup: GenerateSetup) -> bool:
    # generate() replaces finished sequences' tokens by padding when any criterion has an
    # eos_token_id attribute (`has_eos_stopping_criteria` in its _sample).
    return any(_is_eos(c) for c in setup.stopping_criteria)


def _is_eos(criterion: Any) -> bool:
    return hasattr(criterion, "eos_token_id")
