"""Which ``generate()`` calls the fused greedy loop may decode: plain greedy search, read from what
``generate()`` itself set up for the call.

The fused loop (`kernels.generation.greedy_loop`) replaces ``generate()``'s decode loop with
argmax, the end-of-sequence update and nothing else, so it may only take calls where
``generate()`` would do exactly that. Rather than re-deriving generate()'s defaults (which differ
between transformers 4.57 and 5.x and between models' generation configs), `recording_setup`
records what ``generate()`` built for the call: the effective generation config, the logits
processors and the stopping criteria (it stands in front of the model's
``_get_logits_processor`` and ``_get_stopping_criteria`` for the length of the call).
`greedy_blocker` then says why the loop must not take the call, or None when it may:

- greedy search (``do_sample=False``, one beam, no contrastive or DoLa decoding);
- no logits processor at all: any one (repetition penalty, ``min_new_tokens``, bad words,
  forced or suppressed tokens, yours through ``logits_processor=``, ...) changes the scores;
- stopping criteria of max length and end tokens only (not ``max_time``, stop strings or yours);
- no streamer, ``synced_gpus``, ``custom_generate``, ``return_dict_in_generate`` (the output
  would carry per-step scores or the cache, whose state differs after the loop), prefill
  chunking or token healing.

Example:
    ```python
    from kernels.generation.greedy_rule import greedy_blocker, recording_setup

    with recording_setup(model) as setup:
        model.generate(input_ids, max_new_tokens=8)
    print(greedy_blocker(setup, {}))  # None: plain greedy
    ```
"""

from __future__ import annotations

import contextlib
import functools
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


@dataclass(frozen=True)
class StopSettings:
    """When ``generate()``'s greedy loop stops, and what finished sequences emit."""

    #: Tokens in all (prompt included) at which generation stops.
    max_length: int
    #: End-of-sequence token ids (1-D tensor), or None when no end token stops generation.
    eos: torch.Tensor | None
    #: The token finished sequences emit (0-D tensor); None when ``eos`` is None.
    pad: torch.Tensor | None


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
        setattr(setup, field, result)
        setup.generation_config = kwargs.get("generation_config", args[0] if args else None)
        return result

    return record


def greedy_blocker(setup: GenerateSetup, generate_kwargs: dict[str, Any]) -> str | None:
    """Why the fused greedy loop must not decode this ``generate()`` call, or None when its tokens
    are ``generate()``'s.

    Args:
        setup: what ``generate()`` built for the call (`recording_setup`).
        generate_kwargs: the keyword arguments the call was given.
    """
    config = setup.generation_config
    if config is None or setup.logits_processor is None or setup.stopping_criteria is None:
        return (
            "generate() did not build its logits processors and stopping criteria through "
            "_get_logits_processor and _get_stopping_criteria, so the loop cannot tell that "
            "they are plain greedy's"
        )
    for name, why in (
        ("streamer", "a streamer takes each token as generate() makes it"),
        ("synced_gpus", "synced_gpus=True"),
        ("custom_generate", "custom_generate= replaces generate()'s decoding"),
    ):
        if generate_kwargs.get(name):
            return why
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return "torch.distributed is initialised (generate() may sync GPUs between steps)"
    if config.do_sample:
        return "sampling (do_sample=True)"
    mode = config.get_generation_mode()
    if getattr(mode, "value", mode) != "greedy_search":
        return f"generation mode {getattr(mode, 'value', mode)}, not greedy search"
    if config.return_dict_in_generate:
        return (
            "return_dict_in_generate=True (the output carries per-step scores, logits or the "
            "cache, which after the loop holds steps generate() would not have run)"
        )
    for name in ("prefill_chunk_size", "token_healing"):
        if getattr(config, name, None):
            return f"{name} is set"
    if len(setup.logits_processor):
        names = ", ".join(type(p).__name__ for p in setup.logits_processor)
        return f"logits processors would change the scores: {names}"
    from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

    others = [
        type(c).__name__
        for c in setup.stopping_criteria
        if type(c) not in (MaxLengthCriteria, EosTokenCriteria)
    ]
    if others:
        return f"stopping criteria other than max length and end tokens: {', '.join(others)}"
    if not any(type(c) is MaxLengthCriteria for c in setup.stopping_criteria):
        return "generate() set no maximum length"
    if _has_eos(setup) and getattr(config, "_pad_token_tensor", None) is None:
        return "there are end tokens but no pad token for finished sequences"
    return None


def stop_settings(setup: GenerateSetup) -> StopSettings:
    """The `StopSettings` of a call that `greedy_blocker` let through."""
    from transformers.generation.stopping_criteria import MaxLengthCriteria

    criteria = setup.stopping_criteria
    max_length = min(c.max_length for c in criteria if type(c) is MaxLengthCriteria)
    if not _has_eos(setup):
        return StopSettings(max_length, None, None)
    # generate() appends its end-token criterion last and stops on any end token it lists.
    eos = torch.cat([torch.as_tensor(c.eos_token_id).reshape(-1) for c in criteria if _is_eos(c)])
    return StopSettings(max_length, eos, setup.generation_config._pad_token_tensor)


def _has_eos(setup: GenerateSetup) -> bool:
    # generate() replaces finished sequences' tokens by padding when any criterion has an
    # eos_token_id attribute (`has_eos_stopping_criteria` in its _sample).
    return any(_is_eos(c) for c in setup.stopping_criteria)


def _is_eos(criterion: Any) -> bool:
    return hasattr(criterion, "eos_token_id")
