"""How the fused decode loop chooses each next token on the device: ``generate()``'s logits
processors, then argmax or a sample, with nothing read back to the host.

``generate()`` turns a step's last-position logits (float32) into the next tokens with its
logits processors (``scores = processor(input_ids, scores)`` for each, in order), then takes the
argmax or, with ``do_sample=True``, samples from their softmax (``torch.multinomial(probs, 1)``).
Some processors read only the scores (temperature, top-k, top-p, min-p, typical, epsilon, eta,
suppressed tokens, log-softmax): `TokenChoice` calls those very objects, so their arithmetic is
transformers' own. Others read the sequence so far, through ``input_ids``, whose length grows
each step, which a captured graph cannot follow: for those the choice keeps the sequence in a
buffer of fixed shape (`SequenceSoFar`: the ids, and their count as a device tensor) and runs a
device version of the processor that computes what transformers' computes from that buffer:

- ``MinLengthLogitsProcessor`` and ``MinNewTokensLengthLogitsProcessor``: end tokens banned while
  the sequence (or its new part) is shorter than asked;
- ``RepetitionPenaltyLogitsProcessor``: each token present once or more, its score divided by
  the penalty (multiplied where negative), ``prompt_ignore_length`` included;
- ``NoRepeatNGramLogitsProcessor``: tokens that would complete an n-gram seen before banned;
- ``ForcedEOSTokenLogitsProcessor``: only end tokens at the step before ``max_length``.

A sample is drawn as ``torch.multinomial`` draws a single one: exponential noise ``q`` from the
default generator, then ``argmax(probs / q)``; that is its own code path for one sample, so the
tokens are those ``generate()`` samples from the same generator state, but without the check
of the probabilities that ``multinomial`` reads back to the host (which no graph can capture).

`choice_blocker` says why a call's processors cannot be chosen from on the device (another
processor, one of the user's own), or None.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

#: transformers' processors that read only the scores (not ``input_ids``) and read nothing back
#: to the host: called as they are. (EtaLogitsWarper is not: its Categorical checks its
#: argument on the host.)
SCORES_ONLY = frozenset(
    {
        "TemperatureLogitsWarper",
        "TopKLogitsWarper",
        "TopPLogitsWarper",
        "MinPLogitsWarper",
        "TypicalLogitsWarper",
        "EpsilonLogitsWarper",
        "SuppressTokensLogitsProcessor",
        "LogitNormalization",
    }
)


class SequenceSoFar:
    """Each sequence's ids so far (prompt, padding and generated tokens) in a buffer of fixed
    shape ``[batch, capacity]``, and how many of its columns are filled (a device tensor), for
    the processors that read ``input_ids``."""

    def __init__(self, batch: int, capacity: int, device: torch.device):
        self.ids = torch.zeros(batch, capacity, dtype=torch.long, device=device)
        self.length = torch.zeros((), dtype=torch.long, device=device)
        self.columns = torch.arange(capacity, device=device)

    def load(self, ids: torch.Tensor) -> None:
        """Start from ``ids`` ``[batch, n]``: what ``generate()`` had at the step handed over."""
        n = ids.shape[1]
        if n > self.ids.shape[1]:
            raise ValueError(f"{n} ids do not fit a buffer of {self.ids.shape[1]}")
        self.ids.zero_()
        self.ids[:, :n].copy_(ids)
        self.length.fill_(n)

    def filled(self) -> torch.Tensor:
        """``[1, capacity]``: which columns hold ids."""
        return (self.columns < self.length)[None, :]

    def append(self, tokens: torch.Tensor) -> None:
        """Write ``tokens`` ``[batch]`` into the next column (nothing past the buffer's end)."""
        column = self.columns == self.length
        self.ids.copy_(torch.where(column[None, :], tokens[:, None], self.ids))
        self.length.add_(1)


def _eos_ids(processor: Any) -> torch.Tensor:
    return torch.as_tensor(processor.eos_token_id).reshape(-1)


class DeviceProcessor:
    """A device version of a transformers processor that reads ``input_ids``. What a captured
    graph may bake in (shapes, structure) is in `key`; every value that changes between calls
    of the same key (lengths that follow the prompt, end tokens, penalties) lives in a device
    tensor that `load` refills before each call."""

    @staticmethod
    def key(processor: Any) -> tuple:
        return ()

    def load(self, processor: Any) -> None:
        raise NotImplementedError

    def __call__(self, scores: torch.Tensor, seq: SequenceSoFar) -> torch.Tensor:
        raise NotImplementedError


def _is_end_token(vocab: int, eos: torch.Tensor) -> torch.Tensor:
    """``[1, vocab]``: whether each id is one of ``eos`` (a comparison: no size-dependent
    path, as torch.isin may take)."""
    ids = torch.arange(vocab, device=eos.device)
    return (ids[:, None] == eos[None, :]).any(dim=-1)[None, :]


class _BanEndTokensUntil(DeviceProcessor):
    """``MinLengthLogitsProcessor`` and ``MinNewTokensLengthLogitsProcessor``: end tokens at
    -inf while ``length - skip < minimum`` (skip: the prompt's length, or 0)."""

    def __init__(self, processor: Any, device: torch.device):
        self.minimum = torch.zeros((), dtype=torch.long, device=device)
        self.skip = torch.zeros((), dtype=torch.long, device=device)
        self.eos = torch.zeros(_eos_ids(processor).numel(), dtype=torch.long, device=device)

    @staticmethod
    def key(processor: Any) -> tuple:
        return (_eos_ids(processor).numel(),)

    def load(self, processor: Any) -> None:
        new_tokens = hasattr(processor, "min_new_tokens")
        self.minimum.fill_(processor.min_new_tokens if new_tokens else processor.min_length)
        self.skip.fill_(processor.prompt_length_to_skip if new_tokens else 0)
        self.eos.copy_(_eos_ids(processor))

    def __call__(self, scores: torch.Tensor, seq: SequenceSoFar) -> torch.Tensor:
        early = (seq.length - self.skip) < self.minimum
        banned = _is_end_token(scores.shape[-1], self.eos) & early
        return torch.where(banned, -math.inf, scores)


class _RepetitionPenalty(DeviceProcessor):
    """``RepetitionPenaltyLogitsProcessor``: every token present in the sequence (from
    ``prompt_ignore_length`` on), its score divided by the penalty, or multiplied where
    negative; once per token, however often it occurs."""

    def __init__(self, processor: Any, device: torch.device, batch: int):
        self.penalty = torch.ones((), dtype=torch.float32, device=device)
        self.ignore = torch.zeros(batch, dtype=torch.long, device=device)

    def load(self, processor: Any) -> None:
        self.penalty.fill_(processor.penalty)
        ignore = getattr(processor, "prompt_ignore_length", None)
        if isinstance(ignore, torch.Tensor):
            self.ignore.copy_(ignore.reshape(-1))
        else:
            self.ignore.fill_(ignore or 0)

    def __call__(self, scores: torch.Tensor, seq: SequenceSoFar) -> torch.Tensor:
        batch, vocab = scores.shape
        counted = seq.filled() & (seq.columns[None, :] >= self.ignore[:, None])
        # Ids not counted, and ids past the scores' vocabulary (which no step can emit), go to
        # a spare column past the vocabulary, dropped after the scatter.
        index = torch.where(counted, seq.ids.clamp(max=vocab), vocab)
        present = torch.zeros(batch, vocab + 1, dtype=torch.bool, device=scores.device)
        present.scatter_(1, index, True)
        penalised = torch.where(scores < 0, scores * self.penalty, scores / self.penalty)
        return torch.where(present[:, :vocab], penalised, scores)


class _NoRepeatNGram(DeviceProcessor):
    """``NoRepeatNGramLogitsProcessor``: tokens that would complete an n-gram already in the
    sequence at -inf. Every window of ``n`` ids that ends before the last id and whose first
    ``n - 1`` equal the sequence's last ``n - 1`` bans its last id."""

    def __init__(self, processor: Any, device: torch.device):
        self.n = processor.ngram_size

    @staticmethod
    def key(processor: Any) -> tuple:
        return (processor.ngram_size,)

    def load(self, processor: Any) -> None:
        pass  # n is in the key

    def __call__(self, scores: torch.Tensor, seq: SequenceSoFar) -> torch.Tensor:
        batch, vocab = scores.shape
        n = self.n
        windows = seq.ids.unfold(1, n, 1)  # [batch, capacity - n + 1, n]
        starts = seq.columns[: windows.shape[1]]
        complete = (starts + n <= seq.length)[None, :].expand(batch, -1)
        if n > 1:
            # The last n - 1 ids (clamped while the sequence is shorter: no window is complete
            # then anyway).
            offsets = torch.arange(n - 1, device=scores.device)
            suffix = seq.ids.index_select(1, (seq.length - (n - 1) + offsets).clamp(min=0))
            complete = complete & (windows[..., :-1] == suffix[:, None, :]).all(dim=-1)
        index = torch.where(complete, windows[..., -1].clamp(max=vocab), vocab)
        banned = torch.zeros(batch, vocab + 1, dtype=torch.bool, device=scores.device)
        banned.scatter_(1, index, True)
        return scores.masked_fill(banned[:, :vocab], -math.inf)


class _ForcedEndToken(DeviceProcessor):
    """``ForcedEOSTokenLogitsProcessor``: at the step before ``max_length``, every score -inf
    but the end tokens', which are 0."""

    def __init__(self, processor: Any, device: torch.device):
        self.max_length = torch.zeros((), dtype=torch.long, device=device)
        self.eos = torch.zeros(_eos_ids(processor).numel(), dtype=torch.long, device=device)

    @staticmethod
    def key(processor: Any) -> tuple:
        return (_eos_ids(processor).numel(),)

    def load(self, processor: Any) -> None:
        self.max_length.fill_(processor.max_length)
        self.eos.copy_(_eos_ids(processor))

    def __call__(self, scores: torch.Tensor, seq: SequenceSoFar) -> torch.Tensor:
        forced = torch.where(_is_end_token(scores.shape[-1], self.eos), 0.0, -math.inf)
        return torch.where(seq.length == self.max_length - 1, forced, scores)


_DEVICE_VERSIONS: dict[str, type[DeviceProcessor]] = {
    "MinLengthLogitsProcessor": _BanEndTokensUntil,
    "MinNewTokensLengthLogitsProcessor": _BanEndTokensUntil,
    "RepetitionPenaltyLogitsProcessor": _RepetitionPenalty,
    "NoRepeatNGramLogitsProcessor": _NoRepeatNGram,
    "ForcedEOSTokenLogitsProcessor": _ForcedEndToken,
}


def _device_version(processor: Any) -> type[DeviceProcessor] | None:
    if not type(processor).__module__.startswith("transformers.generation"):
        return None  # a subclass or a processor of the user's: its code is unknown
    if getattr(processor, "logits_indices", None) is not None:
        return None  # continuous batching's packed layout
    return _DEVICE_VERSIONS.get(type(processor).__name__)


def _scores_only(processor: Any) -> bool:
    return (
        type(processor).__module__.startswith("transformers.generation")
        and type(processor).__name__ in SCORES_ONLY
    )


def choice_blocker(processors: Sequence[Any]) -> str | None:
    """Why the next tokens of a call with these logits processors cannot be chosen on the
    device, or None: each must be one of transformers' own, either in `SCORES_ONLY` or one with
    a device version (see the module's docstring)."""
    unknown = [
        type(p).__name__ for p in processors if not _scores_only(p) and _device_version(p) is None
    ]
    if unknown:
        return f"logits processors the fused loop has no device version of: {', '.join(unknown)}"
    return None


def reads_sequence(processors: Sequence[Any]) -> bool:
    """Whether any of these processors reads the sequence so far (has a device version)."""
    return any(_device_version(p) is not None for p in processors)


def _value_key(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.reshape(-1).tolist()))
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_value_key(v) for v in value)
    return type(value).__name__


def choice_key(processors: Sequence[Any], do_sample: bool) -> tuple:
    """What a captured block bakes in of a call's choice: argmax or sample, and per processor
    its class and, for those called as they are, every attribute (a temperature or ``top_k``
    is a Python number in their code); a new value is a new key, captured apart."""
    parts: list[tuple] = []
    for p in processors:
        version = _device_version(p)
        if version is not None:
            parts.append((type(p).__name__, version.key(p)))
        else:
            attributes = tuple(sorted((k, _value_key(v)) for k, v in vars(p).items()))
            parts.append((type(p).__name__, attributes))
    return (bool(do_sample), tuple(parts))


class TokenChoice:
    """The next tokens from a step's logits, as ``generate()`` chooses them: the processors in
    order, then argmax, or a sample with ``do_sample``; every operation on the device, so that
    a graph can capture it. Built for one `choice_key`; `load` takes each call's processors.

    Args:
        processors: the first call's logits processors (`choice_blocker` let them through).
        do_sample: sample from the softmax of the scores rather than take their argmax.
        batch: sequences per step.
        capacity: the most ids a sequence reaches (the cache's length), for the buffer of the
            sequence so far, made only when a processor reads it.
        device: where the steps run.
        sequence: the buffer of the sequence so far to read, when the caller keeps one (for
            stop strings too); by default one is made when a processor reads it.
    """

    def __init__(
        self,
        processors: Sequence[Any],
        do_sample: bool,
        *,
        batch: int,
        capacity: int,
        device: torch.device,
        sequence: SequenceSoFar | None = None,
    ):
        reason = choice_blocker(processors)
        if reason is not None:
            raise ValueError(reason)
        self.do_sample = do_sample
        self._processors: list[Any] = []
        for p in processors:
            version = _device_version(p)
            if version is _RepetitionPenalty:
                self._processors.append(_RepetitionPenalty(p, device, batch))
            elif version is not None:
                self._processors.append(version(p, device))  # type: ignore[call-arg]
            else:
                self._processors.append(p)
        if sequence is None and reads_sequence(processors):
            sequence = SequenceSoFar(batch, capacity, device)
        self.sequence = sequence
        # input_ids for the processors that take it but read only its batch size.
        self._ids = torch.zeros(batch, 1, dtype=torch.long, device=device)

    def load(self, processors: Sequence[Any], ids: torch.Tensor) -> None:
        """Start a call: its processors (of this choice's key) and ``generate()``'s ids so far
        ``[batch, n]`` (prompt, padding and the tokens it made)."""
        for mine, theirs in zip(self._processors, processors, strict=True):
            if isinstance(mine, DeviceProcessor):
                mine.load(theirs)
        if self.sequence is not None:
            self.sequence.load(ids)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """``[batch]`` next tokens from ``logits`` ``[batch, vocab]`` (float32)."""
        return self.pick(self.process(logits))

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """The scores the processors make of ``logits`` ``[batch, vocab]`` (float32): what
        ``generate()`` calls ``next_token_scores`` and keeps with ``output_scores=True``."""
        scores = logits
        for processor in self._processors:
            if isinstance(processor, DeviceProcessor):
                assert self.sequence is not None
                scores = processor(scores, self.sequence)
            else:
                scores = processor(self._ids, scores)
        return scores

    def pick(self, scores: torch.Tensor) -> torch.Tensor:
        """``[batch]`` next tokens from processed ``scores``: argmax, or a sample."""
        if not self.do_sample:
            return torch.argmax(scores, dim=-1)
        probs = torch.softmax(scores, dim=-1)
        # torch.multinomial(probs, 1) without its host-side check: the same noise from the same
        # generator, the same division and argmax.
        noise = torch.empty_like(probs).exponential_(1)
        return torch.argmax(probs / noise, dim=-1)
