"""The fused loop: greedy decoding in blocks of K steps, each block one CUDA-graph replay.

``generate()`` spends longer between two decode steps (logits processors, stopping criteria with
a host sync, input preparation, cache bookkeeping) than the GPU spends on a replayed step. For a
plain greedy call (`kernels.generation.fused_rule`) `FusedDecodeLoop.decode` takes over at the
first decode step, with the arguments ``generate()`` passed to it, and runs `DecodeSteps` blocks
of K steps (`kernels.generation.decode_steps`): per key (as `kernels.generation.inputs.call_key`
makes it, plus the number of end tokens)

1. the first ``warmup_steps`` decode steps run eagerly, in whole blocks (Triton compiles, cuBLAS
   picks its kernels);
2. the next block is captured in one graph (`kernels.generation.graph`) and replayed;
3. later blocks, and later calls' blocks, replay it after loading their first step's arguments.

Between replays the host only checks whether every sequence has finished (one sync per block,
none at all without end tokens) and stops at ``max_length``; the tokens are cut exactly where
``generate()`` would have stopped. A graph is captured again when its cache's tensors move
(`kernels.generation.cache.fingerprint`); a key whose capture failed is logged and its calls are
left to ``generate()``'s own loop (`blocker` says so).

Example:
    ```python
    graphs = DecodeGraphs(default_backend(model.device), cache_argument="past_key_values",
                          device=model.device)
    graphs.add_cache(cache)
    loop = FusedDecodeLoop(graphs, steps=8)
    new = loop.decode(model.forward, decode_kwargs, cache, position=prompt_length,
                      new_tokens=120, stop=stop_settings(setup)).tokens  # [batch, <= 120]
    ```
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from .cache import capture_blocker, fingerprint
from .decode import DecodeGraphs, DecodeStats, key_cache_id
from .decode_steps import DecodeSteps, advance_blocker
from .fused_rule import ChoiceSettings, StopSettings
from .graph import CapturedCall, GraphBackend
from .inputs import CallKey, NotCapturable, call_key
from .step_outputs import StepOutputs
from .stop_strings import StringStops, stop_strings_key
from .token_choice import SequenceSoFar, TokenChoice, choice_key

logger = logging.getLogger(__name__)

#: Decode steps per graph by default. A block costs one graph launch and, with end tokens, one
#: host sync, which over 8 steps of a decode's GPU work is a small share of the block. More
#: steps per block buy little more, and cost more: a capture of that many forwards, up to K - 1
#: steps computed past the point where every sequence has finished, and as many more tokens of
#: cache.
DEFAULT_FUSED_STEPS = 8

#: A block's key: the first step's call key, how many end tokens it compares against, what its
#: token choice bakes in (`choice_key`; None: plain argmax), its stop strings
#: (`stop_strings_key`) and what it keeps of each step besides the token (None: nothing).
_BlockKey = tuple[CallKey, int | None, tuple | None, tuple, StepOutputs | None]


class Decoded(NamedTuple):
    """What `FusedDecodeLoop.decode` made: the tokens and, where kept, each step's processed
    scores and raw logits (``[batch, vocab]`` float32 a step, as many as tokens)."""

    tokens: torch.Tensor
    scores: tuple[torch.Tensor, ...] | None = None
    logits: tuple[torch.Tensor, ...] | None = None


@dataclass
class _Block:
    steps: DecodeSteps  # its kwargs hold the cache, which keeps it alive
    cache_id: int
    graph: CapturedCall | None = None
    fingerprint: tuple[int, ...] = ()
    warm_steps: int = 0


class FusedDecodeLoop:
    """Greedy decoding in blocks of ``steps`` decode steps, each block captured once per key and
    replayed, beside a `DecodeGraphs` whose settings it shares: its backend (so all graphs share
    one memory pool), the forward's name for the cache, the device, the eager warm-up steps per
    key before a capture (run in whole blocks here) and the statistics it counts into.

    Args:
        graphs: the per-step graphs it runs beside.
        steps: decode steps per block (K).
    """

    def __init__(self, graphs: DecodeGraphs, steps: int = DEFAULT_FUSED_STEPS):
        if steps < 1:
            raise ValueError(f"a fused block needs at least 1 step, got {steps}")
        self.graphs = graphs
        self.steps = steps
        self._blocks: dict[_BlockKey, _Block] = {}
        self._failed: dict[_BlockKey, str] = {}
        # The key `blocker` made and what it made it of, for `decode` to reuse when it is
        # handed the same objects: making it walks the step's arguments and the processors'
        # attributes, host work better done once a call.
        self._checked: tuple[tuple[Any, ...], _BlockKey] | None = None

    @property
    def backend(self) -> GraphBackend:
        """How blocks are captured: the per-step graphs' backend."""
        return self.graphs.backend

    @property
    def stats(self) -> DecodeStats:
        """The statistics it counts into: the per-step graphs'."""
        return self.graphs.stats

    def blocker(
        self,
        kwargs: dict[str, Any],
        cache: Any,
        *,
        position: int,
        new_tokens: int,
        capacity: int,
        stop: StopSettings,
        choice: ChoiceSettings | None = None,
        keep: StepOutputs | None = None,
    ) -> str | None:
        """Why `decode` cannot take over at this first decode step, or None when it can.

        Args:
            kwargs: the step's keyword arguments, as ``generate()`` passed them.
            cache: the static cache they must pass.
            position: the cache position of the token the step feeds.
            new_tokens: tokens left to generate after the one the step feeds.
            capacity: tokens the cache holds.
            stop: the call's end tokens and pad token.
            choice: the call's logits processors and sampling; None: plain argmax.
            keep: what `decode` will keep of each step besides its token.
        """
        reason = capture_blocker(cache)
        if reason is None:
            reason = advance_blocker(kwargs, self.graphs.cache_argument, cache, position)
        if reason is not None:
            return reason
        blocks = -(-new_tokens // self.steps)
        if position + blocks * self.steps > capacity:
            return (
                f"the cache holds {capacity} tokens, too few for whole blocks of "
                f"{self.steps} steps after a prompt of {position} (pass a larger max_cache_len)"
            )
        try:
            key = self._key(kwargs, cache, stop, choice, keep)
        except NotCapturable as exc:
            return str(exc)
        self._checked = ((kwargs, cache, stop, choice, keep), key)
        if key in self._failed:
            return f"capturing its fused decode block failed: {self._failed[key]}"
        return None

    def decode(
        self,
        forward: Callable[..., Any],
        kwargs: dict[str, Any],
        cache: Any,
        *,
        position: int,
        new_tokens: int,
        stop: StopSettings,
        additive_mask: torch.dtype | None = None,
        choice: ChoiceSettings | None = None,
        streamer: Any = None,
        keep: StepOutputs | None = None,
    ) -> Decoded:
        """The tokens ``generate()``'s loop would append after the token ``kwargs`` feed:
        ``[batch, n]`` with ``n <= new_tokens``, cut where every sequence has finished; and with
        ``keep`` the scores and logits ``generate()`` keeps for those ``n`` steps.

        Args:
            forward: the model's forward (not routed through the per-step graphs).
            kwargs: ``generate()``'s first decode step (`blocker` let it through).
            cache: the static cache ``kwargs`` pass.
            position: the cache position of the token ``kwargs`` feed.
            new_tokens: tokens left to generate (``max_length`` minus the sequence so far).
            stop: the call's end tokens and pad token.
            additive_mask: feed a boolean attention mask as an additive one of this dtype
                (`DecodeSteps`); None feeds it as it is.
            choice: the call's logits processors and sampling, and its ids so far; None: plain
                argmax.
            streamer: given each step's tokens (``put``, as generate() gives them), a block's
                worth after each block, then ``end()``.
            keep: the per-step tensors to keep besides the tokens (`StepOutputs`); None: none.
        """
        checked, self._checked = self._checked, None
        if checked is not None and all(
            a is b for a, b in zip(checked[0], (kwargs, cache, stop, choice, keep), strict=True)
        ):
            key = checked[1]
        else:
            key = self._key(kwargs, cache, stop, choice, keep)
        block = self._blocks.get(key)
        if block is None:
            eos_count = 0 if stop.eos is None else stop.eos.numel()
            token_choice, string_stops = None, None
            if choice is not None:
                batch, device = kwargs["input_ids"].shape[0], kwargs["input_ids"].device
                sequence = None
                if stop.stop_strings:  # they read the sequence so far, processors or not
                    sequence = SequenceSoFar(batch, choice.capacity, device)
                    string_stops = StringStops(stop.stop_strings)
                token_choice = TokenChoice(
                    choice.processors,
                    choice.do_sample,
                    batch=batch,
                    capacity=choice.capacity,
                    device=device,
                    sequence=sequence,
                )
            steps = DecodeSteps(
                forward,
                kwargs,
                self.steps,
                eos_count,
                additive_mask,
                token_choice,
                string_stops,
                keep,
            )
            block = _Block(steps, id(cache))
            self._blocks[key] = block
        elif block.graph is not None and block.fingerprint != fingerprint(cache):
            logger.info("the static cache's tensors moved; recapturing the fused decode block")
            block.graph = None
        steps = block.steps
        if choice is None:
            steps.load(kwargs, position, stop.eos, stop.pad)
        else:
            steps.load(kwargs, position, stop.eos, stop.pad, choice.processors, choice.sequence)
        if steps.tracks_finish and not bool(steps.unfinished.any()):
            new_tokens = 0  # every sequence ended at the token fed (generate() stops there)
        pieces = []
        # Each step's scores and logits where kept: [steps, batch, vocab] a block.
        buffers = {
            name: buffer
            for name, buffer in (("scores", steps.kept_scores), ("logits", steps.kept_logits))
            if buffer is not None
        }
        kept: dict[str, list[torch.Tensor]] = {name: [] for name in buffers}
        while new_tokens > 0:
            self._run(key, block)
            take = min(self.steps, new_tokens)
            new_tokens -= take
            pieces.append(steps.tokens[:, :take].clone())  # the next block overwrites them
            for name, buffer in buffers.items():
                kept[name].append(buffer[:take].clone())
            if steps.tracks_finish:
                alive = steps.alive[:take].tolist()  # the block's one host sync
                if not all(alive):
                    cut = alive.index(False) + 1
                    pieces[-1] = pieces[-1][:, :cut]
                    for name in buffers:
                        kept[name][-1] = kept[name][-1][:cut]
                    new_tokens = 0
            if streamer is not None:
                for column in pieces[-1].cpu().unbind(1):
                    streamer.put(column)
            if stop.out_of_time():
                break
        if streamer is not None:
            streamer.end()
        tokens = torch.cat(pieces, dim=1) if pieces else steps.tokens[:, :0].clone()
        self.stats.fused_calls += 1
        self.stats.fused_tokens += tokens.shape[1]
        per_step = {
            name: tuple(torch.cat(blocks).unbind(0)) if blocks else ()
            for name, blocks in kept.items()
        }
        return Decoded(tokens, per_step.get("scores"), per_step.get("logits"))

    def remove_cache(self, cache: Any) -> None:
        """Drop the blocks captured on ``cache``."""
        if self._checked is not None and self._checked[0][1] is cache:
            self._checked = None
        for key in [k for k, block in self._blocks.items() if block.cache_id == id(cache)]:
            del self._blocks[key]
        for key in [k for k in self._failed if key_cache_id(k[0]) == id(cache)]:
            del self._failed[key]

    def clear(self) -> None:
        """Drop every block (their memory goes when nothing else holds it)."""
        self._checked = None
        self._blocks.clear()
        self._failed.clear()

    @property
    def graph_count(self) -> int:
        """How many blocks are held as graphs now."""
        return sum(block.graph is not None for block in self._blocks.values())

    def _key(
        self,
        kwargs: dict[str, Any],
        cache: Any,
        stop: StopSettings,
        choice: ChoiceSettings | None,
        keep: StepOutputs | None,
    ) -> _BlockKey:
        eos_count = None if stop.eos is None else stop.eos.numel()
        return (
            call_key(kwargs, {self.graphs.cache_argument: cache}, self.graphs.device),
            eos_count,
            None if choice is None else choice_key(choice.processors, choice.do_sample),
            stop_strings_key(stop.stop_strings),
            keep if keep is not None and keep.any else None,
        )

    def _run(self, key: _BlockKey, block: _Block) -> None:
        """Run one block: eagerly while warming up, else from its graph (captured first)."""
        if (
            block.graph is None
            and block.warm_steps >= self.graphs.warmup_steps
            and key not in self._failed
        ):
            block.graph = self._capture(key, block)
        if block.graph is None:
            block.steps()
            block.warm_steps += self.steps
            self.stats.eager_steps += self.steps
            return
        block.graph.replay()
        self.stats.fused_replays += 1

    def _capture(self, key: _BlockKey, block: _Block) -> CapturedCall | None:
        started = time.perf_counter()
        batch = block.steps.tokens.shape[0]
        try:
            graph = self.backend.capture(block.steps)
        except Exception as exc:  # a capture can fail in any op; the blocks then run eagerly
            self._failed[key] = f"{type(exc).__name__}: {exc}"
            self.stats.failed_captures += 1
            logger.warning(
                "capturing a fused block of %s decode steps (batch %s) failed, so this call's "
                "blocks run eagerly and later calls decode step by step: %s: %s",
                self.steps,
                batch,
                type(exc).__name__,
                exc,
            )
            return None
        block.fingerprint = fingerprint(block.steps.inputs.kwargs[self.graphs.cache_argument])
        self.stats.fused_captures += 1
        logger.info(
            "captured a fused block of %s decode steps for batch %s (%s) in %.2f s",
            self.steps,
            batch,
            self.backend.name,
            time.perf_counter() - started,
        )
        return graph
