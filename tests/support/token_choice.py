"""Checks of `kernels.generation.token_choice` that run on every transformers version
(tests/generation on 4.57, tests/clients/transformers5 on 5.x): each device version of a logits
processor gives exactly the scores transformers' own processor gives for the same ids, read
from a buffer of fixed shape whose columns past the sequence hold other ids."""

from __future__ import annotations

import math

import torch

VOCAB = 37
BATCH = 3
CAPACITY = 24
#: Sequence lengths: shorter than any n-gram, around the prompt's end, and the buffer's last.
LENGTHS = (1, 2, 5, 9, CAPACITY)
PROMPT = 5
#: The processors with a device version, by name (pytest parameters, known without transformers).
DEVICE_CASES = (
    "min_length",
    "min_new_tokens",
    "repetition_penalty",
    "repetition_penalty_ignore_int",
    "repetition_penalty_ignore_tensor",
    "no_repeat_ngram_1",
    "no_repeat_ngram_2",
    "no_repeat_ngram_3",
    "forced_eos",
    "bad_words_single",
    "bad_words_multi",
    "bad_words_overlapping",
    "bad_words_with_eos",
    "sequence_bias",
    "sequence_bias_overlapping",
)


def processor(name: str):
    """Transformers' processor of case ``name``, with two end tokens where it takes them."""
    import transformers.generation.logits_process as lp

    eos = [3, 11]
    makers = {
        "min_length": lambda: lp.MinLengthLogitsProcessor(7, eos),
        "min_new_tokens": lambda: lp.MinNewTokensLengthLogitsProcessor(PROMPT, 3, eos),
        "repetition_penalty": lambda: lp.RepetitionPenaltyLogitsProcessor(1.7),
        "repetition_penalty_ignore_int": lambda: lp.RepetitionPenaltyLogitsProcessor(
            1.7, prompt_ignore_length=PROMPT
        ),
        "repetition_penalty_ignore_tensor": lambda: lp.RepetitionPenaltyLogitsProcessor(
            0.6, prompt_ignore_length=torch.tensor([0, 2, PROMPT])
        ),
        "no_repeat_ngram_1": lambda: lp.NoRepeatNGramLogitsProcessor(1),
        "no_repeat_ngram_2": lambda: lp.NoRepeatNGramLogitsProcessor(2),
        "no_repeat_ngram_3": lambda: lp.NoRepeatNGramLogitsProcessor(3),
        "forced_eos": lambda: lp.ForcedEOSTokenLogitsProcessor(10, eos),
        # The sequences hold ids 0-5, so that prefixes match in some rows at some lengths.
        "bad_words_single": lambda: lp.NoBadWordsLogitsProcessor([[5], [2]], eos),
        "bad_words_multi": lambda: lp.NoBadWordsLogitsProcessor([[1, 2], [2, 3, 4], [4, 4]], eos),
        "bad_words_overlapping": lambda: lp.NoBadWordsLogitsProcessor(
            [[1, 2], [2], [0, 1, 2], [1, 2, 3], [2, 2], [0, 1, 2, 3, 4]], eos
        ),
        # [3] and [11] alone are end tokens, which transformers does not ban; within a longer
        # bad word an end token is banned like any other id.
        "bad_words_with_eos": lambda: lp.NoBadWordsLogitsProcessor(
            [[3], [11], [1, 3], [3, 1], [5], [4, 11]], eos
        ),
        "sequence_bias": lambda: lp.SequenceBiasLogitsProcessor(
            [[[5], -1.25], [[2], 0.75], [[1, 2], 2.5], [[2, 3, 4], -3.0]]
        ),
        "sequence_bias_overlapping": lambda: lp.SequenceBiasLogitsProcessor(
            [[[2], 0.3], [[1, 2], -0.7], [[4, 1, 2], 1.1], [[3, 1, 2], 0.9], [[1, 1], -2.0]]
        ),
    }
    return makers[name]()


def _sequences(seed: int) -> torch.Tensor:
    # Few distinct ids, so that tokens and n-grams repeat.
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 6, (BATCH, CAPACITY), generator=generator)


def check_device_version_matches(name: str) -> None:
    """For every length of `LENGTHS`, the device version's scores equal transformers'
    processor's on the sequence cut to that length (positive and negative scores)."""
    from kernels.generation.token_choice import SequenceSoFar, TokenChoice

    try:
        theirs = processor(name)
    except (TypeError, ValueError) as exc:  # 4.57 takes no tensor prompt_ignore_length
        import pytest

        pytest.skip(f"this transformers has no such processor argument: {exc}")
    ids = _sequences(seed=len(name))
    choice = TokenChoice([theirs], False, batch=BATCH, capacity=CAPACITY, device=ids.device)
    seq = choice.sequence
    assert isinstance(seq, SequenceSoFar)
    mine = choice._processors[0]
    generator = torch.Generator().manual_seed(1)
    for length in LENGTHS:
        choice.load([theirs], ids[:, :length])
        seq.ids[:, length:] = (ids[:, length:] + 1) % 6  # other ids past the sequence
        scores = torch.randn(BATCH, VOCAB, generator=generator) * 3
        expected = theirs(ids[:, :length].clone(), scores.clone())
        got = mine(scores.clone(), seq)
        assert torch.equal(got, expected), (name, length, got, expected)


def check_appends_past_the_end_change_nothing() -> None:
    """A sequence grows a column a step, and a step past its buffer writes nothing."""
    from kernels.generation.token_choice import SequenceSoFar

    seq = SequenceSoFar(2, 4, torch.device("cpu"))
    seq.load(torch.tensor([[1, 2], [3, 4]]))
    for token in (5, 6, 7):
        seq.append(torch.tensor([token, token + 10]))
    assert seq.ids.tolist() == [[1, 2, 5, 6], [3, 4, 15, 16]]
    assert int(seq.length) == 5


def check_sampling_is_multinomials() -> None:
    """A sample is ``torch.multinomial(probs, 1)``'s from the same generator state."""
    from kernels.generation.token_choice import TokenChoice

    choice = TokenChoice([], True, batch=BATCH, capacity=CAPACITY, device=torch.device("cpu"))
    logits = torch.randn(BATCH, VOCAB, generator=torch.Generator().manual_seed(0))
    for seed in range(50):
        torch.manual_seed(seed)
        expected = torch.multinomial(torch.softmax(logits, -1), 1).squeeze(1)
        torch.manual_seed(seed)
        assert torch.equal(choice(logits), expected), seed


def check_unknown_processors_are_refused() -> None:
    """A processor of the user's, a subclass of transformers', or one without a device version
    is named in the reason, and `TokenChoice` refuses it."""
    import pytest
    import transformers.generation.logits_process as lp

    from kernels.generation.token_choice import TokenChoice, choice_blocker

    class Mine(lp.TemperatureLogitsWarper):
        pass

    class MyBadWords(lp.NoBadWordsLogitsProcessor):
        pass

    for item, name in (
        (Mine(0.5), "Mine"),
        (MyBadWords([[5]], eos_token_id=3), "MyBadWords"),
        (lp.ExponentialDecayLengthPenalty((2, 1.1), 3, 5), "ExponentialDecayLengthPenalty"),
    ):
        reason = choice_blocker([lp.TemperatureLogitsWarper(0.5), item])
        assert reason is not None and name in reason and "TemperatureLogitsWarper" not in reason
        with pytest.raises(ValueError, match=name):
            TokenChoice([item], True, batch=1, capacity=4, device=torch.device("cpu"))


def check_choice_keys() -> None:
    """A captured block bakes in what a processor called as it is holds (a temperature), so a
    new value is a new key; the device versions' values (a prompt's length) are loaded, so a
    new value is the same key."""
    import transformers.generation.logits_process as lp

    from kernels.generation.token_choice import choice_key

    def key(*processors, sample=True):
        return choice_key(list(processors), sample)

    assert key(lp.TemperatureLogitsWarper(0.7)) == key(lp.TemperatureLogitsWarper(0.7))
    assert key(lp.TemperatureLogitsWarper(0.7)) != key(lp.TemperatureLogitsWarper(0.8))
    assert key(lp.TemperatureLogitsWarper(0.7)) != key(
        lp.TemperatureLogitsWarper(0.7), sample=False
    )
    assert key(lp.MinNewTokensLengthLogitsProcessor(5, 3, [2])) == key(
        lp.MinNewTokensLengthLogitsProcessor(9, 4, [7])
    )
    assert key(lp.MinNewTokensLengthLogitsProcessor(5, 3, [2])) != key(
        lp.MinNewTokensLengthLogitsProcessor(5, 3, [2, 7])
    )
    assert key(lp.NoRepeatNGramLogitsProcessor(2)) != key(lp.NoRepeatNGramLogitsProcessor(3))
    # Bad words and biases: the ids and biases are loaded; the counts of single tokens and of
    # longer sequences, and the longest prefix, shape the buffers a graph reads.
    bad = lp.NoBadWordsLogitsProcessor
    assert key(bad([[5], [1, 2]], 3)) == key(bad([[7], [4, 6]], 3))
    assert key(bad([[5], [1, 2]], 3)) != key(bad([[5], [1, 2, 4]], 3))
    assert key(bad([[5], [1, 2]], 3)) != key(bad([[5], [1, 2], [4, 6]], 3))
    assert key(bad([[5], [1, 2]], 3)) != key(bad([[5], [6], [1, 2]], 3))
    assert key(bad([[3], [1, 2]], 3)) == key(bad([[1, 2]], 3))  # an end token alone is dropped
    bias = lp.SequenceBiasLogitsProcessor
    assert key(bias([[[5], 1.0], [[1, 2], -2.0]])) == key(bias([[[6], -3.0], [[4, 1], 0.5]]))
    assert key(lp.EtaLogitsWarper(0.01)) != key(lp.EtaLogitsWarper(0.02))


def check_stop_strings_match_transformers() -> None:
    """`StringStops` says what transformers' StopStringCriteria says of the sequence so far, at
    every length, shorter than the longest match included (where the columns before the start
    must match nothing, not repeat the first id), the buffer past the length holding other
    ids."""
    from transformers.generation.stopping_criteria import StopStringCriteria

    from kernels.generation.stop_strings import StringStops
    from kernels.generation.token_choice import SequenceSoFar
    from tests.support.generation import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    vocab = tokenizer.get_vocab()
    criterion = StopStringCriteria(tokenizer, ["aa", "bca", "jj"])
    stops = StringStops([criterion])
    rows = [["a"], ["a", "a"], ["b", "ca"], ["bc", "a"], ["x", "b", "c", "a"], ["j", "j"], ["aa"]]
    seq = SequenceSoFar(1, 8, torch.device("cpu"))
    for row in rows:
        ids = torch.tensor([[vocab[t] for t in row]])
        for length in range(1, len(row) + 1):
            seq.load(ids[:, :length])
            seq.ids[:, length:] = vocab["a"]  # an id that would complete "aa" if read
            expected = criterion(ids[:, :length], None)
            assert torch.equal(stops(seq), expected), (row, length)


def _tokens(*rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long)


def check_bad_word_prefixes_are_banned() -> None:
    """A multi-token bad word bans its last id exactly in the rows that end with its prefix, on
    the step transformers starts looking (4.57: once the ids so far are as many as the whole
    bad word; 5.x: as many as its prefix), and a single-token bad word everywhere."""
    import transformers.generation.logits_process as lp

    from kernels.generation.token_choice import TokenChoice

    theirs = lp.NoBadWordsLogitsProcessor([[1, 2, 9], [4]], eos_token_id=3)
    choice = TokenChoice([theirs], False, batch=3, capacity=8, device=torch.device("cpu"))
    mine = choice._processors[0]
    grouped = hasattr(theirs, "multi_token_biases")  # 5.x
    scores = torch.zeros(3, VOCAB)
    for ids, banned_rows in (
        (_tokens([5, 1, 2], [1, 2, 5], [0, 0, 2]), [0]),  # only row 0 ends with 1, 2
        (_tokens([1, 2], [2, 1], [1, 1]), [0] if grouped else []),  # as long as the prefix
        (_tokens([1], [2], [9]), []),
    ):
        choice.load([theirs], ids)
        got = mine(scores.clone(), choice.sequence)
        assert torch.equal(got, theirs(ids, scores.clone())), (ids, got)
        assert bool((got[:, 4] == -math.inf).all()), got
        banned = [row for row in range(3) if got[row, 9] == -math.inf]
        assert banned == banned_rows, (ids.tolist(), banned)


def check_bias_sums_round_as_transformers() -> None:
    """Where several biased sequences end in the same id and match at once, the biases are
    added in transformers' order, which rounds differently on 4.57 (the sequences' order) and
    5.x (grouped by prefix length): 1 + 2**-24 - 1 is 0, 1 - 1 + 2**-24 is not."""
    import transformers.generation.logits_process as lp

    from kernels.generation.token_choice import TokenChoice

    theirs = lp.SequenceBiasLogitsProcessor(
        [[[7], 1.0], [[4, 5, 7], 3.0], [[5, 7], 2.0**-24], [[2, 5, 7], -1.0]]
    )
    ids = _tokens([1, 2, 5], [4, 5, 0])
    choice = TokenChoice([theirs], False, batch=2, capacity=8, device=torch.device("cpu"))
    choice.load([theirs], ids)
    scores = torch.zeros(2, VOCAB)
    expected = theirs(ids, scores.clone())
    got = choice._processors[0](scores.clone(), choice.sequence)
    assert torch.equal(got, expected), (got[:, 7], expected[:, 7])
    grouped = hasattr(theirs, "multi_token_biases")
    assert got[0, 7].item() == (2.0**-24 if grouped else 0.0)


def check_loads_refill_what_a_step_reads() -> None:
    """A second call of the same key loads its own values: end tokens (the masks made at the
    first step are remade in place), bad words and biases; its scores are the second
    processor's, with no table made anew."""
    import transformers.generation.logits_process as lp

    from kernels.generation.token_choice import TokenChoice, choice_key

    pairs = (
        (
            lp.MinNewTokensLengthLogitsProcessor(2, 5, [3]),
            lp.MinNewTokensLengthLogitsProcessor(3, 4, [4]),
        ),
        (lp.ForcedEOSTokenLogitsProcessor(4, [3, 11]), lp.ForcedEOSTokenLogitsProcessor(5, [4, 9])),
        (
            lp.NoBadWordsLogitsProcessor([[5], [1, 2]], 3),
            lp.NoBadWordsLogitsProcessor([[2], [0, 4]], 3),
        ),
        (
            lp.SequenceBiasLogitsProcessor([[[5], 1.5], [[1, 2], -2.0]]),
            lp.SequenceBiasLogitsProcessor([[[2], -0.5], [[4, 1], 3.0]]),
        ),
    )
    ids = _sequences(seed=7)[:, :4]
    for first, second in pairs:
        assert choice_key([first], False) == choice_key([second], False)
        choice = TokenChoice([first], False, batch=BATCH, capacity=CAPACITY, device=ids.device)
        mine = choice._processors[0]
        scores = torch.randn(BATCH, VOCAB, generator=torch.Generator().manual_seed(3))
        choice.load([first], ids)
        assert torch.equal(mine(scores.clone(), choice.sequence), first(ids, scores.clone()))
        tables = {k: id(getattr(v, "_table", None)) for k, v in vars(mine).items()}
        for length in (4, 3):
            choice.load([second], ids[:, :length])
            got = mine(scores.clone(), choice.sequence)
            assert torch.equal(got, second(ids[:, :length], scores.clone())), (second, got)
        assert tables == {k: id(getattr(v, "_table", None)) for k, v in vars(mine).items()}


def check_eta_runs_as_transformers_with_no_host_read() -> None:
    """EtaLogitsWarper's step without torch.distributions' argument check (a host read), set
    on its own distribution: transformers' scores exactly, no host read, and the process-wide
    default never touched (a thread validating meanwhile would see it change)."""
    import transformers.generation.logits_process as lp
    from torch.distributions import Distribution

    from kernels.generation.token_choice import TokenChoice
    from tests.support.host_reads import OpNames

    validating = Distribution._validate_args
    seen: list[bool] = []
    real = Distribution.set_default_validate_args
    theirs = lp.EtaLogitsWarper(0.05, min_tokens_to_keep=2)
    choice = TokenChoice([theirs], True, batch=BATCH, capacity=CAPACITY, device=torch.device("cpu"))
    generator = torch.Generator().manual_seed(5)
    for _ in range(5):
        scores = torch.randn(BATCH, VOCAB, generator=generator) * 3
        Distribution.set_default_validate_args = staticmethod(seen.append)  # type: ignore[method-assign]
        try:
            with OpNames() as ops:
                got = choice._processors[0](None, scores.clone())
        finally:
            Distribution.set_default_validate_args = staticmethod(real)  # type: ignore[method-assign]
        assert not ops.host_reads and not seen, (ops.host_reads, seen)
        expected = theirs(None, scores.clone())
        assert torch.equal(got, expected) and bool((got == -math.inf).any())
        assert Distribution._validate_args is validating
        with OpNames() as ops:
            choice(scores)
        assert not ops.host_reads, ops.host_reads
