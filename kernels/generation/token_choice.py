"""How the fused decode loop chooses each next token on the device: ``generate()``'s logits
processors, then argmax or a sample, with nothing read back to the host.

``generate()`` turns a step's last-position logits (float32) into the next tokens with its
logits processors (``scores = processor(input_ids, scores)`` for each, in order), then takes the
argmax or, with ``do_sample=True``, samples from their softmax (``torch.multinomial(probs, 1)``).
Some processors read only the scores (temperature, top-k, top-p, min-p, typical, epsilon, eta,
suppressed tokens, log-softmax): `TokenChoice` calls those very objects, so their arithmetic is
transformers' own (eta's step as transformers writes it, but for the argument check: `_Eta`). Others read the sequence so far, through ``input_ids``, whose length grows
each step, which a captured graph cannot follow: for those the choice keeps the sequence in a
buffer of fixed shape (`SequenceSoFar`: the ids, and their count as a device tensor) and runs a
device version of the processor that computes what transformers' computes from that buffer:

- ``MinLengthLogitsProcessor`` and ``MinNewTokensLengthLogitsProcessor``: end tokens banned while
  the sequence (or its new part) is shorter than asked;
- ``RepetitionPenaltyLogitsProcessor``: each token present once or more, its score divided by
  the penalty (multiplied where negative), ``prompt_ignore_length`` included;
- ``NoRepeatNGramLogitsProcessor``: tokens that would complete an n-gram seen before banned;
- ``ForcedEOSTokenLogitsProcessor``: only end tokens at the step before ``max_length``;
- ``SequenceBiasLogitsProcessor`` and ``NoBadWordsLogitsProcessor`` (biases of -inf): a single
  token's bias always, a longer sequence's where the sequence so far ends with its prefix.

A sample is drawn as ``torch.multinomial`` draws a single one: exponential noise ``q`` from the
default generator, then ``argmax(probs / q)``; that is its own code path for one sample, so the
tokens are those ``generate()`` samples from the same generator state, but without the check
of the probabilities that ``multinomial`` reads back to the host (which no graph can capture).

`choice_blocker` says why a call's processors cannot be chosen from on the device (another
processor, one of the user's own), or None.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

#: transformers' processors that read only the scores (not ``input_ids``) and read nothing back
#: to the host: called as they are.
SCORES_ONLY = frozenset(
    {
        "TemperatureLogitsWarper",
        "TopKLogitsWarper",
        "TopPLogitsWarper",
        "MinPLogitsWarper",
        "TypicalLogitsWarper",
        "EpsilonLogitsWarper",
        "EtaLogitsWarper",
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


class _VocabularyTable:
    """A tensor over the vocabulary that a device processor makes from its loaded buffers (an
    end-token mask, a bias per token), so that a step reads it rather than remaking it. The
    vocabulary is the scores' width, unknown before the first step: the table is made there,
    and every later `refill` (a call's `DeviceProcessor.load`) remakes it in place.

    Made from device buffers of fixed shape only, it stays right wherever it was first made:
    made while a graph is being captured (no eager block before), the graph remakes it at each
    replay from the same buffers, which `load` refills."""

    def __init__(self, make: Callable[[int], torch.Tensor]):
        self._make = make
        self._vocab: int | None = None
        self._table: torch.Tensor | None = None

    def __call__(self, vocab: int) -> torch.Tensor:
        if self._table is None or self._vocab != vocab:
            self._table, self._vocab = self._make(vocab), vocab
        return self._table

    def refill(self) -> None:
        if self._table is not None and self._vocab is not None:
            self._table.copy_(self._make(self._vocab))


class _BanEndTokensUntil(DeviceProcessor):
    """``MinLengthLogitsProcessor`` and ``MinNewTokensLengthLogitsProcessor``: end tokens at
    -inf while ``length - skip < minimum`` (skip: the prompt's length, or 0), that is while
    ``length < minimum + skip``."""

    def __init__(self, processor: Any, device: torch.device):
        self.until = torch.zeros((), dtype=torch.long, device=device)
        self.eos = torch.zeros(_eos_ids(processor).numel(), dtype=torch.long, device=device)
        self.is_end = _VocabularyTable(lambda vocab: _is_end_token(vocab, self.eos))

    @staticmethod
    def key(processor: Any) -> tuple:
        return (_eos_ids(processor).numel(),)

    def load(self, processor: Any) -> None:
        new_tokens = hasattr(processor, "min_new_tokens")
        minimum = processor.min_new_tokens if new_tokens else processor.min_length
        self.until.fill_(minimum + (processor.prompt_length_to_skip if new_tokens else 0))
        self.eos.copy_(_eos_ids(processor))
        self.is_end.refill()

    def __call__(self, scores: torch.Tensor, seq: SequenceSoFar) -> torch.Tensor:
        banned = self.is_end(scores.shape[-1]) & (seq.length < self.until)
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
        #: The sequence's length at the step before max_length.
        self.last_step = torch.zeros((), dtype=torch.long, device=device)
        self.eos = torch.zeros(_eos_ids(processor).numel(), dtype=torch.long, device=device)
        self.forced = _VocabularyTable(
            lambda vocab: torch.where(_is_end_token(vocab, self.eos), 0.0, -math.inf)
        )

    @staticmethod
    def key(processor: Any) -> tuple:
        return (_eos_ids(processor).numel(),)

    def load(self, processor: Any) -> None:
        self.last_step.fill_(processor.max_length - 1)
        self.eos.copy_(_eos_ids(processor))
        self.forced.refill()

    def __call__(self, scores: torch.Tensor, seq: SequenceSoFar) -> torch.Tensor:
        forced = self.forced(scores.shape[-1])
        return torch.where(seq.length == self.last_step, forced, scores)


def _sequence_biases(processor: Any) -> tuple[list, list]:
    """``SequenceBiasLogitsProcessor``'s biases (``NoBadWordsLogitsProcessor``'s: -inf, its end
    tokens alone already dropped by its constructor) as ``(single, multi)``: ``[(id, bias)]``
    for single tokens, ``[(prefix, last id, bias)]`` for longer sequences, in the order in which
    the processor adds them up (so that the sums round as its do): the dict's on 4.57; on 5.x,
    which matches the sequences a prefix length at a time (``multi_token_biases``), grouped by
    prefix length in the order of each length's first sequence."""
    single: list = []
    groups: dict[int, list] = {}
    for ids, bias in processor.sequence_bias.items():
        ids = [int(i) for i in ids]
        if len(ids) == 1:
            single.append((ids[0], float(bias)))
        else:
            groups.setdefault(len(ids) - 1 if _grouped(processor) else 0, []).append(
                (ids[:-1], ids[-1], float(bias))
            )
    return single, [entry for group in groups.values() for entry in group]


def _grouped(processor: Any) -> bool:
    # 5.x keeps its grouped tensors in multi_token_biases (None until its first call).
    return hasattr(processor, "multi_token_biases")


class _SequenceBias(DeviceProcessor):
    """``SequenceBiasLogitsProcessor`` and ``NoBadWordsLogitsProcessor`` (its subclass, biases
    of -inf): ``scores + bias``, where a single token's bias applies always (a table over the
    vocabulary, made once: `_VocabularyTable`) and a longer sequence's bias is added to its last
    id's where the sequence's last ids equal its prefix. Those prefixes are compared on the
    device: right-aligned in a ``[sequences, longest prefix]`` buffer (columns before a shorter
    prefix match anything) against each row's last ids. transformers skips a sequence while the
    ids so far are fewer than the whole sequence (4.57) or than its prefix (5.x): each
    sequence's least length is loaded with it.

    The key is the number of single tokens, of longer sequences and the longest prefix (the
    buffers' shapes); the ids and biases are loaded. Ids past the scores' vocabulary (which
    transformers refuses at its first call) match nothing and bias nothing."""

    def __init__(self, processor: Any, device: torch.device):
        singles, multi, longest = self.key(processor)
        self.single_ids = torch.zeros(singles, dtype=torch.long, device=device)
        self.single_biases = torch.zeros(singles, dtype=torch.float32, device=device)
        self.prefixes = torch.zeros(multi, longest, dtype=torch.long, device=device)
        #: Whether a prefix column is one of its sequence's (right-aligned), or matches anything.
        self.anything = torch.ones(multi, longest, dtype=torch.bool, device=device)
        self.last_ids = torch.zeros(multi, dtype=torch.long, device=device)
        self.biases = torch.zeros(multi, dtype=torch.float32, device=device)
        self.least_length = torch.zeros(multi, dtype=torch.long, device=device)
        self.longest = longest
        self.offsets = torch.arange(longest, device=device)
        self.single = _VocabularyTable(self._single_table)

    @staticmethod
    def key(processor: Any) -> tuple:
        single, multi = _sequence_biases(processor)
        return (len(single), len(multi), max((len(m[0]) for m in multi), default=0))

    def load(self, processor: Any) -> None:
        single, multi = _sequence_biases(processor)
        device = self.single_ids.device
        if single:
            ids, biases = zip(*single, strict=True)
            self.single_ids.copy_(torch.tensor(ids))
            self.single_biases.copy_(torch.tensor(biases, dtype=torch.float32))
        if multi:
            prefixes = torch.zeros(self.prefixes.shape, dtype=torch.long)
            anything = torch.ones(self.anything.shape, dtype=torch.bool)
            for row, (prefix, _, _) in enumerate(multi):
                prefixes[row, self.longest - len(prefix) :] = torch.tensor(prefix)
                anything[row, self.longest - len(prefix) :] = False
            self.prefixes.copy_(prefixes.to(device))
            self.anything.copy_(anything.to(device))
            self.last_ids.copy_(torch.tensor([m[1] for m in multi]))
            self.biases.copy_(torch.tensor([m[2] for m in multi], dtype=torch.float32))
            lengths = [len(m[0]) + (0 if _grouped(processor) else 1) for m in multi]
            self.least_length.copy_(torch.tensor(lengths))
        self.single.refill()

    def _single_table(self, vocab: int) -> torch.Tensor:
        """``[vocab + 1]``: the single tokens' biases (0 elsewhere; the last column takes those
        of ids past the vocabulary)."""
        table = torch.zeros(vocab + 1, dtype=torch.float32, device=self.single_ids.device)
        return table.index_put_((self.single_ids.clamp(max=vocab),), self.single_biases)

    def __call__(self, scores: torch.Tensor, seq: SequenceSoFar) -> torch.Tensor:
        batch, vocab = scores.shape
        single = self.single(vocab)
        if self.prefixes.shape[0] == 0:
            return scores + single[:vocab]
        # Each row's last `longest` ids (clamped while the sequence is shorter, or past the
        # buffer: a prefix is only counted where the sequence is long enough).
        columns = (seq.length - self.longest + self.offsets).clamp(0, seq.ids.shape[1] - 1)
        last = seq.ids.index_select(1, columns)  # [batch, longest]
        same = (last[:, None, :] == self.prefixes[None]) | self.anything[None]
        matched = same.all(dim=-1) & (seq.length >= self.least_length)  # [batch, sequences]
        # As transformers: the bias starts at the single tokens', and each longer sequence adds
        # its bias, or 0 where it does not match, in its order.
        bias = single.expand(batch, vocab + 1).contiguous()
        added = torch.where(matched, self.biases, 0.0)
        bias.index_add_(1, self.last_ids.clamp(max=vocab), added)
        return scores + bias[:, :vocab]


_DEVICE_VERSIONS: dict[str, type[DeviceProcessor]] = {
    "MinLengthLogitsProcessor": _BanEndTokensUntil,
    "MinNewTokensLengthLogitsProcessor": _BanEndTokensUntil,
    "RepetitionPenaltyLogitsProcessor": _RepetitionPenalty,
    "NoRepeatNGramLogitsProcessor": _NoRepeatNGram,
    "ForcedEOSTokenLogitsProcessor": _ForcedEndToken,
    "SequenceBiasLogitsProcessor": _SequenceBias,
    "NoBadWordsLogitsProcessor": _SequenceBias,
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


class _Eta:
    """EtaLogitsWarper's step, as transformers (4.57 and 5.x alike) computes it, but for the
    entropy's ``Categorical``, built here with ``validate_args=False``: validating (Python's
    default) reads back to the host whether every logit is a number, which no graph can
    capture. Without the check a NaN score gives NaN scores instead of a ValueError. Set on the
    distribution itself, not through torch.distributions' process-wide default, which other
    threads would see changed."""

    def __init__(self, processor: Any):
        self.processor = processor

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        eta = self.processor
        probabilities = scores.softmax(dim=-1)
        entropy = torch.distributions.Categorical(logits=scores, validate_args=False).entropy()
        cutoff = torch.min(eta.epsilon, torch.sqrt(eta.epsilon) * torch.exp(-entropy))[..., None]
        remove = probabilities < cutoff
        top_k = min(eta.min_tokens_to_keep, scores.size(-1))
        remove = remove & (scores < torch.topk(scores, top_k)[0][..., -1, None])
        return scores.masked_fill(remove, eta.filter_value)


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
            elif type(p).__name__ == "EtaLogitsWarper":
                self._processors.append(_Eta(p))
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
