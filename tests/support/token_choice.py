"""Checks of `kernels.generation.token_choice` that run on every transformers version
(tests/generation on 4.57, tests/clients/transformers5 on 5.x): each device version of a logits
processor gives exactly the scores transformers' own processor gives for the same ids, read
from a buffer of fixed shape whose columns past the sequence hold other ids."""

from __future__ import annotations

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

    for item, name in (
        (Mine(0.5), "Mine"),
        (lp.NoBadWordsLogitsProcessor([[5]], eos_token_id=3), "NoBadWordsLogitsProcessor"),
        (lp.EtaLogitsWarper(0.01), "EtaLogitsWarper"),
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
