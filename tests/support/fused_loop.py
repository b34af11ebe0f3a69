"""Checks of the fused loop that run on every transformers version: tests/generation
(4.57) and tests/clients/transformers5 (5.x) call the same functions, on the tiny Llama of
generation_checks.

A few tokens cover a block's edges when blocks are short: the CPU checks use K = 4 and 1,
K - 1 and K + 3 new tokens (no decode step; one block cut short; a warm-up block, then a
captured one cut short). The end token is one the model emits itself, early in the first
sequence and never in another, so that a batch has finished and unfinished sequences at once
and a single sequence stops in the middle of a block.
"""

from __future__ import annotations

import contextlib

import torch

from tests.support.generation import TINY, eager_greedy, eager_static_greedy

FUSED_STEPS = 4
NEW_TOKENS_CASES = (1, FUSED_STEPS - 1, FUSED_STEPS + 3)
#: Prompt lengths of the left-padded batch.
PADDED_LENGTHS = (7, 4, 5)
PROMPT_CASES = ("batch 1", "left-padded batch 3")
#: The settings of `fused_settings`, by name (pytest parameters, known without transformers):
#: each decoded by the fused loop with generate()'s own tokens (sampled ones from the same seed).
FUSED_SETTING_CASES = (
    "sampling",
    "temperature",
    "top_p",
    "min_p",
    "typical_p",
    "epsilon_cutoff",
    "eta_cutoff",
    "repetition_penalty",
    "repetition_penalty_sampling",
    "prompt_ignore_length",
    "min_new_tokens",
    "min_length",
    "no_repeat_ngram_size",
    "no_repeat_ngram_size_1",
    "forced_eos_token_id",
    "suppress_tokens",
    "bad_words_ids",
    "sequence_bias",
    "streamer",
    "max_time",
    "num_return_sequences",
    "chat_sampling",
)
#: The settings of `fallback_settings`, by name.
FALLBACK_CASES = (
    "logits_processor",
    "stopping_criteria",
)
#: The calls of `check_dict_output`, by name: return_dict_in_generate with per-step scores and
#: logits, greedy, sampled, and with processors whose scores differ from the raw logits.
DICT_CASES = ("greedy", "sampling", "min_new_tokens_repetition_penalty")
#: Settings that keep per-step tensors of every layer: such calls run as model.generate().
PER_LAYER_CASES = ("output_attentions", "output_hidden_states")


def padded_prompt(lengths=PADDED_LENGTHS, device="cpu", seed: int = 2):
    """(input ids, attention mask) of random prompts of ``lengths``, left-padded with the pad
    token to the longest."""
    generator = torch.Generator().manual_seed(seed)
    longest = max(lengths)
    ids = torch.full((len(lengths), longest), TINY["pad_token_id"], dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        ids[row, longest - length :] = torch.randint(
            1, TINY["vocab_size"], (length,), generator=generator
        )
        mask[row, longest - length :] = 1
    return ids.to(device), mask.to(device)


def case_prompt(name: str, device="cpu"):
    """The prompt of a case of `PROMPT_CASES`: (input ids, attention mask)."""
    from tests.support.generation import prompt

    # seed 3: the single sequence emits a token it had not emitted before in the second block
    return prompt(1, device=device, seed=3) if name == "batch 1" else padded_prompt(device=device)


def early_end_token(
    model, ids, mask, first_index: int = 1, new_tokens: int = FUSED_STEPS + 3
) -> int:
    """A token the first sequence greedily emits as its new token ``first_index`` or a later one
    (not before), and that some other sequence never emits: as the end token, it finishes the
    first sequence early while another goes on."""
    new = eager_greedy(model, ids, mask, new_tokens)[:, ids.shape[1] :].tolist()
    first, others = new[0], new[1:]
    for i in range(first_index, len(first)):
        token = first[i]
        if token not in first[:i] and (not others or any(token not in row for row in others)):
            return token
    raise AssertionError(f"no early end token in {new}: pick another prompt seed")


def check_case(model, prompt_case: str, with_eos: bool, new_tokens: int) -> None:
    """`check_fused_matches_generate` for a prompt of `PROMPT_CASES`, with or without an early
    end token."""
    ids, mask = case_prompt(prompt_case)
    # A single sequence ends inside the captured block (the second), a batch's first sequence
    # inside the first.
    first_index = FUSED_STEPS + 1 if ids.shape[0] == 1 else 1
    eos = early_end_token(model, ids, mask, first_index) if with_eos else None
    check_fused_matches_generate(model, ids, mask, new_tokens, eos)


def check_fused_matches_generate(model, ids, mask, new_tokens: int, eos: int | None, **options):
    """The fused loop's greedy tokens equal ``model.generate()``'s with a dynamic and a static
    cache, shape included; decode steps after the first token came from the fused loop (none
    through generate()'s loop). Returns the generator."""
    from kernels.generation import CudaGraphGenerator

    settings = dict(eos_token_id=eos) if eos is not None else {}
    expected = eager_greedy(model, ids, mask, new_tokens, **settings)
    static = eager_static_greedy(model, ids, mask, new_tokens, **settings)
    assert torch.equal(static, expected), f"{static.tolist()} != {expected.tolist()}"
    generator = CudaGraphGenerator(model, fused_steps=FUSED_STEPS, **options)
    got = generator.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, **settings)
    assert got.shape == expected.shape and torch.equal(got, expected), (
        f"{got.tolist()} != {expected.tolist()}"
    )
    stats = generator.stats
    assert stats.replays == 0 and stats.captures == 0, stats  # no step through generate()'s loop
    decoded = expected.shape[1] - ids.shape[1] - 1  # tokens after the prefill's
    if decoded:
        assert stats.fused_calls == 1 and stats.fused_tokens == decoded, stats
    assert stats.eager_steps % FUSED_STEPS == 0, stats  # whole blocks
    assert "forward" not in vars(model) and "_get_logits_processor" not in vars(model)
    return generator


def check_additive_mask() -> None:
    """With eager attention the decode mask is additive (0.0 open, the dtype's minimum closed),
    not boolean: the loop opens its columns all the same."""
    from tests.support.generation import tiny_llama

    model = tiny_llama(attn_implementation="eager")
    ids, mask = padded_prompt()
    generator = check_fused_matches_generate(model, ids, mask, FUSED_STEPS + 3, None)
    assert generator._fused._blocks, "no block was made"
    block = next(iter(generator._fused._blocks.values()))
    assert block.steps.inputs.buffers["attention_mask"].dtype == torch.float32


def check_sdpa_mask_is_fed_additive() -> None:
    """With SDPA attention the loop feeds the boolean decode mask as an additive one in the
    model's dtype (0.0 open, the dtype's minimum closed), which SDPA takes as it is rather than
    converting it in every layer; the tokens stay generate()'s, padding included."""
    from tests.support.generation import tiny_llama

    model = tiny_llama()
    ids, mask = padded_prompt()
    generator = check_fused_matches_generate(model, ids, mask, FUSED_STEPS + 3, None)
    block = next(iter(generator._fused._blocks.values()))
    fed = block.steps.inputs.buffers["attention_mask"]
    assert fed.dtype == torch.float32
    closed = torch.finfo(torch.float32).min
    assert bool(((fed == 0.0) | (fed == closed)).all())
    assert bool((fed == closed).any()) and bool((fed == 0.0).any())


def check_kernelized(model) -> None:
    """With ``kernels=True`` the fused loop's tokens are the kernelized model's own greedy tokens
    (the model is kernelized first, so that the references run our kernels too)."""
    from kernels.generation import CudaGraphGenerator

    CudaGraphGenerator(model, kernels=True)
    ids, mask = padded_prompt()
    eos = early_end_token(model, ids, mask)
    generator = check_fused_matches_generate(model, ids, mask, FUSED_STEPS + 3, eos, kernels=True)
    assert generator.kernelized


def check_our_attention_pads_on_the_device() -> None:
    """With our attention (``kernels_attention``) generate() hands the loop a 2D padding mask a
    column longer each step; widened to the cache's length it advances in place as the 4D mask
    does. The tokens are SDPA's, and a block's steps read nothing on the host while being
    captured (a CUDA graph can capture them; here the capture is only announced, through
    ``kernels.library.attention.capturing``, to the mask function that asks)."""
    import kernels.library.attention as attention_module
    from kernels.generation import CudaGraphGenerator
    from kernels.generation.decode_steps import DecodeSteps
    from kernels.library.attention import ATTENTION_IMPLEMENTATION, register_attention
    from tests.support.generation import tiny_llama
    from tests.support.host_reads import OpNames

    register_attention()
    model = tiny_llama(num_hidden_layers=1)
    ids, mask = padded_prompt()
    new_tokens = FUSED_STEPS + 3
    expected = eager_greedy(model, ids, mask, new_tokens)
    model.set_attn_implementation(ATTENTION_IMPLEMENTATION)
    reads: list[set[str]] = []
    original = DecodeSteps.__call__

    def watched(self) -> None:
        capturing = attention_module.capturing
        attention_module.capturing = lambda: True
        try:
            with OpNames() as ops:
                original(self)
        finally:
            attention_module.capturing = capturing
        reads.append(ops.host_reads)

    DecodeSteps.__call__ = watched
    try:
        generator = CudaGraphGenerator(model, fused_steps=FUSED_STEPS)
        got = generator.generate(ids, attention_mask=mask, max_new_tokens=new_tokens)
    finally:
        DecodeSteps.__call__ = original
    assert torch.equal(got, expected), f"{got.tolist()} != {expected.tolist()}"
    stats = generator.stats
    assert stats.fused_calls == 1 and stats.fused_tokens == new_tokens - 1, stats
    assert reads and not any(reads), reads


def check_second_call_replays_its_blocks(model, ids, mask, eos: int | None = None):
    """A second call of the same batch size replays its captured block for every block, and
    gives generate()'s tokens for another prompt."""
    from kernels.generation import CudaGraphGenerator

    new_tokens = 3 * FUSED_STEPS + 1  # the prefill's token, then three blocks
    settings = dict(eos_token_id=eos) if eos is not None else {}
    generator = CudaGraphGenerator(model, fused_steps=FUSED_STEPS)
    generator.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, **settings)
    before = generator.stats
    assert before.fused_captures == 1 and before.eager_steps == FUSED_STEPS, before
    other = ids.flip(0), mask.flip(0)
    got = generator.generate(
        other[0], attention_mask=other[1], max_new_tokens=new_tokens, **settings
    )
    expected = eager_greedy(model, *other, new_tokens, **settings)
    assert torch.equal(got, expected), f"{got.tolist()} != {expected.tolist()}"
    after = generator.stats
    blocks = -(-(got.shape[1] - ids.shape[1] - 1) // FUSED_STEPS)
    assert after.fused_captures == 1 and after.eager_steps == before.eager_steps, after
    assert after.fused_replays == before.fused_replays + blocks, after
    return generator


class BanToken:
    """A logits processor of the user's: token 5 is never chosen."""

    def __call__(self, input_ids, scores):
        scores[:, 5] = -float("inf")
        return scores


class NeverStop:
    """A stopping criterion of the user's that never stops anything."""

    def __call__(self, input_ids, scores, **kwargs):
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


class Tokens:
    """A streamer that keeps what it is given."""

    def __init__(self):
        self.puts = []
        self.ended = 0

    def put(self, value):
        self.puts.append(value)

    def end(self):
        self.ended += 1


def fused_settings(eos: int) -> dict:
    """{name: generate() options}: each setting of `FUSED_SETTING_CASES`, with ``eos`` the
    call's end token."""
    from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

    sample = dict(do_sample=True, top_k=0)
    return {
        "sampling": dict(do_sample=True, top_k=20),
        "temperature": dict(sample, temperature=0.7),
        "top_p": dict(sample, temperature=0.7, top_p=0.9),
        "min_p": dict(sample, min_p=0.2),
        "typical_p": dict(sample, typical_p=0.8),
        "epsilon_cutoff": dict(sample, epsilon_cutoff=0.01),
        "eta_cutoff": dict(sample, eta_cutoff=0.01),
        "repetition_penalty": dict(repetition_penalty=1.5),
        "repetition_penalty_sampling": dict(sample, top_p=0.9, repetition_penalty=1.3),
        "prompt_ignore_length": dict(
            logits_processor=LogitsProcessorList(
                [RepetitionPenaltyLogitsProcessor(1.5, prompt_ignore_length=5)]
            )
        ),
        # The end token is one the first sequence emits early: banned until step K + 1.
        "min_new_tokens": dict(min_new_tokens=FUSED_STEPS + 1),
        "min_length": dict(min_length=max(PADDED_LENGTHS) + FUSED_STEPS),
        "no_repeat_ngram_size": dict(no_repeat_ngram_size=2),
        "no_repeat_ngram_size_1": dict(no_repeat_ngram_size=1),
        "forced_eos_token_id": dict(forced_eos_token_id=eos),
        "suppress_tokens": dict(suppress_tokens=[5, eos]),
        # [eos] alone is dropped by transformers (end tokens are never banned); in a longer bad
        # word it is banned like any other id.
        "bad_words_ids": dict(bad_words_ids=[[5], [eos], [7, 9], [3, 4, 6], [9, eos]]),
        "sequence_bias": dict(sequence_bias=[[[5], -2.0], [[7, 9], 3.5], [[3, 4, 6], 1.25]]),
        "streamer": dict(streamer=Tokens()),
        "max_time": dict(max_time=600.0),
        "num_return_sequences": dict(sample, top_p=0.9, num_return_sequences=2),
        # A chat model's usual settings, all at once.
        "chat_sampling": dict(
            do_sample=True,
            temperature=0.7,
            top_p=0.9,
            top_k=50,
            repetition_penalty=1.1,
            min_new_tokens=2,
        ),
    }


def fallback_settings() -> dict:
    """{name: (generate() options, a phrase of the logged reason)}: each setting of
    `FALLBACK_CASES`."""
    from transformers import LogitsProcessorList, StoppingCriteriaList

    return {
        "logits_processor": (
            dict(logits_processor=LogitsProcessorList([BanToken()])),
            "BanToken",
        ),
        "stopping_criteria": (
            dict(stopping_criteria=StoppingCriteriaList([NeverStop()])),
            "NeverStop",
        ),
    }


def _static_generate(model, ids, call: dict, seed: int = 123):
    """``model.generate()`` on a static cache (as the generator's), from seed ``seed``."""
    from kernels.generation.cache import cache_argument, new_static_cache

    torch.manual_seed(seed)
    cache = new_static_cache(model, 64)
    return model.generate(ids, disable_compile=True, **{cache_argument(model): cache}, **call)


@contextlib.contextmanager
def host_reads_of_blocks():
    """For the block, the aten ops of each fused block's steps that read a tensor on the host
    (one set per block run, in the list it yields): none may, for a CUDA graph to capture
    the block."""
    from kernels.generation.decode_steps import DecodeSteps
    from tests.support.host_reads import OpNames

    reads: list[set[str]] = []
    original = DecodeSteps.__call__

    def watched(self) -> None:
        with OpNames() as ops:
            original(self)
        reads.append(ops.host_reads)

    DecodeSteps.__call__ = watched
    try:
        yield reads
    finally:
        DecodeSteps.__call__ = original


def check_fused_setting(model, name: str, caplog) -> None:
    """Setting ``name`` of `fused_settings` is decoded by the fused loop, every step after the
    first token (no step through generate()'s loop); its tokens are ``model.generate()``'s from
    the same seed (a streamer gets the same tokens in the same calls); a block's steps read no
    tensor on the host (so that a CUDA graph can capture them)."""
    import copy
    import logging

    from kernels.generation import CudaGraphGenerator

    ids, mask = padded_prompt()
    eos = early_end_token(model, ids, mask)
    options = fused_settings(eos)[name]
    new_tokens = 2 * FUSED_STEPS + 3  # a warm-up block, a captured one, one cut short
    call = dict(attention_mask=mask, max_new_tokens=new_tokens, eos_token_id=eos, **options)
    expected = _static_generate(model, ids, call)
    ours = dict(call)
    if "streamer" in call:
        ours["streamer"] = Tokens()
    elif "logits_processor" in call:  # a processor holds state: each call gets its own
        ours["logits_processor"] = copy.deepcopy(call["logits_processor"])
    generator = CudaGraphGenerator(model, fused_steps=FUSED_STEPS)
    with host_reads_of_blocks() as reads:
        torch.manual_seed(123)
        with caplog.at_level(logging.INFO, logger="kernels.generation"):
            got = generator.generate(ids, **ours)
    assert torch.equal(got, expected), f"{got.tolist()} != {expected.tolist()}"
    stats = generator.stats
    assert stats.fused_calls == 1 and stats.replays == 0 and stats.captures == 0, stats
    assert stats.fused_tokens == expected.shape[1] - ids.shape[1] - 1, stats
    assert reads and not any(reads), reads
    lines = [r.getMessage() for r in caplog.records if "generate():" in r.getMessage()]
    assert any("the fused loop decodes" in line for line in lines), lines
    if "streamer" in call:
        theirs, mine = call["streamer"], ours["streamer"]
        assert len(mine.puts) == len(theirs.puts) and mine.ended == theirs.ended == 1
        for a, b in zip(mine.puts, theirs.puts, strict=True):
            assert torch.equal(a, b), (a, b)


def _first_time(rows: list[list[int]], size: int, start: int) -> int:
    """The first index ``i >= start`` where the first row's ``size`` tokens from ``i`` occur in
    no row before ``i`` (so that banning or biasing them changes the tokens from there on)."""
    first = rows[0]
    for i in range(start, len(first) - size + 1):
        piece = first[i : i + size]
        seen = [row[j : j + size] for row in rows for j in range(min(i, len(row) - size + 1))]
        if piece not in seen:
            return i
    raise AssertionError(f"no {size} tokens of {first} occur first after {start}: another prompt")


def _contains(row: list[int], piece: list[int]) -> bool:
    return any(row[j : j + len(piece)] == piece for j in range(len(row) - len(piece) + 1))


def check_bans_and_biases_bite(model, caplog) -> None:
    """Bad words and sequence biases built from the tokens greedy decoding makes in the loop's
    blocks change what it makes there, and the fused loop makes transformers' tokens: a
    single-token bad word and a two-token one (its prefix matched on the device) never occur
    in the new tokens (which they did without the ban), and a large bias on an unlikely id
    after a token the first sequence makes puts that id there."""
    import logging

    from kernels.generation import CudaGraphGenerator

    ids, mask = padded_prompt()
    new_tokens = 3 * FUSED_STEPS
    start = ids.shape[1]
    plain = eager_greedy(model, ids, mask, new_tokens)
    rows = plain[:, start:].tolist()
    i = _first_time(rows, 1, FUSED_STEPS + 1)  # in the captured block
    j = _first_time(rows, 2, FUSED_STEPS + 1)
    pair = rows[0][j : j + 2]
    unlikely = next(t for t in range(1, TINY["vocab_size"]) if all(t not in r for r in rows))
    cases = {
        "single bad word": dict(bad_words_ids=[[rows[0][i]]]),
        "two-token bad word": dict(bad_words_ids=[pair]),
        "sequence bias": dict(sequence_bias=[[[rows[0][j], unlikely], 100.0]]),
    }
    for name, options in cases.items():
        call = dict(attention_mask=mask, max_new_tokens=new_tokens, do_sample=False, **options)
        expected = _static_generate(model, ids, call)
        assert not torch.equal(expected, plain), f"{name}: {options} changed nothing"
        new = expected[:, start:].tolist()
        if "bad_words_ids" in options:
            banned = options["bad_words_ids"][-1]
            assert not any(_contains(row, banned) for row in new), (name, banned, new)
        else:
            assert _contains(new[0], [rows[0][j], unlikely]), (name, new)
        generator = CudaGraphGenerator(model, fused_steps=FUSED_STEPS)
        with host_reads_of_blocks() as reads:
            with caplog.at_level(logging.INFO, logger="kernels.generation"):
                got = generator.generate(ids, **call)
        assert torch.equal(got, expected), (name, got.tolist(), expected.tolist())
        stats = generator.stats
        assert stats.fused_calls == 1 and stats.replays == 0 and stats.fused_replays, stats
        assert reads and not any(reads), reads


def check_stop_strings(model, prompt_case: str, caplog) -> None:
    """``stop_strings=`` run in the fused loop: a string that spans two of the first sequence's
    tokens (ending inside the first block for a batch, in a later one for a single sequence)
    stops it as generate() does (padded with a pad token while the others go on), every step
    from the loop, no host read in a block."""
    import logging

    from kernels.generation import CudaGraphGenerator
    from tests.support.generation import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    ids, mask = case_prompt(prompt_case)
    new_tokens = 2 * FUSED_STEPS + 3
    plain = eager_greedy(model, ids, mask, new_tokens)
    unused = next(t for t in range(1, TINY["vocab_size"]) if t not in plain[:, ids.shape[1] :])
    first = [tokenizer.convert_ids_to_tokens(int(t)) for t in plain[0, ids.shape[1] :]]
    call = dict(
        attention_mask=mask, max_new_tokens=new_tokens, tokenizer=tokenizer, eos_token_id=unused
    )
    start = FUSED_STEPS + 1 if ids.shape[0] == 1 else 2
    for i in range(start, len(first)):
        stop = first[i - 1][-1] + first[i]  # ends with token i, starts inside token i - 1
        expected = _static_generate(model, ids, dict(call, stop_strings=[stop]))
        if not torch.equal(expected, plain):  # it stopped something
            break
    else:
        raise AssertionError(f"no stop string spanning two tokens stops {first}")
    generator = CudaGraphGenerator(model, fused_steps=FUSED_STEPS)
    with host_reads_of_blocks() as reads:
        with caplog.at_level(logging.INFO, logger="kernels.generation"):
            got = generator.generate(ids, **call, stop_strings=[stop])
    assert torch.equal(got, expected), (stop, got.tolist(), expected.tolist())
    stats = generator.stats
    assert stats.fused_calls == 1 and stats.replays == 0, stats
    assert reads and not any(reads), reads


def check_max_time_stops_between_blocks(model, monkeypatch) -> None:
    """``max_time`` is checked after each block: a call whose time runs out in its first block
    ends after that block, its tokens generate()'s greedy ones so far."""
    import kernels.generation.fused_rule as rule
    from kernels.generation import CudaGraphGenerator

    ids, mask = padded_prompt()
    new_tokens = 3 * FUSED_STEPS
    expected = eager_greedy(model, ids, mask, new_tokens)
    checked = []

    def clock():  # the time runs out once the first block has run
        checked.append(True)
        return float("inf")

    monkeypatch.setattr(rule, "_clock", clock)
    generator = CudaGraphGenerator(model, fused_steps=FUSED_STEPS)
    got = generator.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, max_time=600.0)
    assert checked
    assert got.shape[1] == ids.shape[1] + 1 + FUSED_STEPS, got.shape
    assert torch.equal(got, expected[:, : got.shape[1]])
    assert generator.stats.fused_calls == 1


def check_falls_back(model, name: str, caplog) -> None:
    """Setting ``name`` of `fallback_settings` keeps the call in generate()'s loop (per-step
    graphs, no fused call), logs why, and gives the tokens ``model.generate()`` gives with a
    static cache (from the same seed, where it samples)."""
    import logging

    from kernels.generation import CudaGraphGenerator

    options, reason = fallback_settings()[name]
    ids, mask = padded_prompt()
    eos = early_end_token(model, ids, mask)
    new_tokens = FUSED_STEPS + 3
    call = dict(attention_mask=mask, max_new_tokens=new_tokens, eos_token_id=eos, **options)
    expected = _static_generate(model, ids, call)
    generator = CudaGraphGenerator(model, fused_steps=FUSED_STEPS)
    torch.manual_seed(123)
    with caplog.at_level(logging.INFO, logger="kernels.generation"):
        got = generator.generate(ids, **call)
    assert torch.equal(got, expected), f"{got.tolist()} != {expected.tolist()}"
    stats = generator.stats
    assert stats.fused_calls == 0 and stats.fused_tokens == 0 and stats.replays > 0, stats
    lines = [r.getMessage() for r in caplog.records if "step by step" in r.getMessage()]
    assert len(lines) == 1 and reason in lines[0], lines


def dict_settings() -> dict:
    """{name: generate() options}: each call of `DICT_CASES` (``max_new_tokens`` and the end
    token are the check's)."""
    asked = dict(return_dict_in_generate=True, output_scores=True, output_logits=True)
    return {
        "greedy": asked,
        "sampling": dict(asked, do_sample=True, temperature=0.7, top_p=0.9),
        "min_new_tokens_repetition_penalty": dict(
            asked, min_new_tokens=FUSED_STEPS + 1, repetition_penalty=1.5
        ),
    }


def _end_token_of(reference, prompt_length: int, first_index: int) -> int:
    """A token the first sequence of ``reference`` (generate()'s ids, made without an end token)
    emits first as its new token ``first_index`` or later, and that some other sequence never
    emits: as the end token, the same call stops the first sequence there and not another."""
    new = reference[:, prompt_length:].tolist()
    first, others = new[0], new[1:]
    for i in range(first_index, len(first)):
        token = first[i]
        if token not in first[:i] and (not others or any(token not in row for row in others)):
            return token
    raise AssertionError(f"no end token ends {new[0]} at {first_index} or later")


def check_dict_output(model, name: str, prompt_case: str, caplog) -> None:
    """Call ``name`` of `dict_settings` with ``return_dict_in_generate=True`` is decoded by the
    fused loop and returns what ``model.generate()`` returns from the same seed on a static
    cache: the same output class, the same sequences, one processed score and one raw logit
    tensor a generated token, each equal to generate()'s (float32), and its cache holding the
    positions generate() fed, no more; a block's steps read nothing on the host. The end token stops the single sequence inside its
    second block (the loop ran past it: the scores are cut there), or the batch's first
    sequence in its first block while the others go on (its rows are generate()'s padding
    steps)."""
    import logging

    from kernels.generation import CudaGraphGenerator

    ids, mask = case_prompt(prompt_case)
    options = dict_settings()[name]
    new_tokens = 3 * FUSED_STEPS  # a warm-up block, a captured one, a third
    call = dict(attention_mask=mask, max_new_tokens=new_tokens, **options)
    # min_new_tokens bans the end token before step K + 1: the end token comes after that.
    first_index = FUSED_STEPS + 1 if ids.shape[0] == 1 or "min_new_tokens" in options else 1
    plain = dict(call)
    plain.pop("min_new_tokens", None)  # without an end token it does nothing anyway
    eos = _end_token_of(_static_generate(model, ids, plain).sequences, ids.shape[1], first_index)
    call["eos_token_id"] = eos
    expected = _static_generate(model, ids, call)
    generated = expected.sequences.shape[1] - ids.shape[1]
    assert generated > first_index, generated
    if ids.shape[0] == 1:
        assert generated < new_tokens, "the end token did not stop the call"
    else:  # the first sequence ended, then made padding steps while the others went on
        assert eos in expected.sequences[0, ids.shape[1] : -1].tolist()
    generator = CudaGraphGenerator(model, fused_steps=FUSED_STEPS)
    torch.manual_seed(123)
    with host_reads_of_blocks() as reads:
        with caplog.at_level(logging.INFO, logger="kernels.generation"):
            got = generator.generate(ids, **call)
    stats = generator.stats
    assert stats.fused_calls == 1 and stats.replays == 0 and stats.captures == 0, stats
    assert reads and not any(reads), reads  # a CUDA graph can capture the block, buffers and all
    assert type(got) is type(expected), (type(got), type(expected))
    assert torch.equal(got.sequences, expected.sequences), (
        f"{got.sequences.tolist()} != {expected.sequences.tolist()}"
    )
    for field in ("scores", "logits"):
        mine, theirs = getattr(got, field), getattr(expected, field)
        assert isinstance(mine, tuple) and len(mine) == len(theirs) == generated, (
            field,
            len(mine),
            len(theirs),
        )
        for step, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape, (field, step)
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"{field} of step {step}")
    assert got.attentions is None and got.hidden_states is None
    if "min_new_tokens" in options:  # the processors changed the scores the loop kept
        decoded = range(1, generated)
        assert any(not torch.equal(got.scores[i], got.logits[i]) for i in decoded)
    check_same_cache(output_cache(got), output_cache(expected), expected.sequences.shape[1] - 1)


def output_cache(output):
    """The cache of a generate() output (``past_key_values`` in 4.57, ``cache`` in 5.x)."""
    return output.get("cache", output.get("past_key_values"))


def check_same_cache(got, expected, fed: int) -> None:
    """``got`` (the generator's static cache) holds what ``expected`` (generate()'s static
    cache, maybe shorter) holds: the same class and length, the same keys and values in the
    ``fed`` positions, zeros after them."""
    assert type(got) is type(expected), (type(got), type(expected))
    # (4.57 counts the first sequence's positions whose keys are not all zero: a finished
    # sequence's padding steps have zero keys in this model; 5.x counts the positions fed.)
    assert int(got.get_seq_length()) == int(expected.get_seq_length()), (
        int(got.get_seq_length()),
        int(expected.get_seq_length()),
    )
    assert len(got.layers) == len(expected.layers)
    for mine, theirs in zip(got.layers, expected.layers, strict=True):
        for a, b in ((mine.keys, theirs.keys), (mine.values, theirs.values)):
            torch.testing.assert_close(a[:, :, :fed], b[:, :, :fed], rtol=1e-5, atol=1e-5)
            assert not bool(a[:, :, fed:].any()) and not bool(b[:, :, fed:].any())


def check_dict_output_without_scores(model) -> None:
    """``return_dict_in_generate=True`` alone: generate()'s output class with no scores or
    logits, from the fused loop, whose blocks keep nothing of the steps (no buffers); a plain
    call after it runs a block with no buffers either."""
    from kernels.generation import CudaGraphGenerator

    ids, mask = padded_prompt()
    call = dict(attention_mask=mask, max_new_tokens=2 * FUSED_STEPS, return_dict_in_generate=True)
    expected = _static_generate(model, ids, call)
    generator = CudaGraphGenerator(model, fused_steps=FUSED_STEPS)
    got = generator.generate(ids, **call)
    assert type(got) is type(expected) and torch.equal(got.sequences, expected.sequences)
    assert got.scores is None and got.logits is None and expected.scores is None
    check_same_cache(output_cache(got), output_cache(expected), expected.sequences.shape[1] - 1)
    plain = generator.generate(ids, attention_mask=mask, max_new_tokens=2 * FUSED_STEPS)
    assert torch.equal(plain, expected.sequences)
    assert generator.stats.fused_calls == 2
    blocks = list(generator._fused._blocks.values())
    assert len(blocks) == 1, "the plain call made a block of its own"
    assert blocks[0].steps.kept_scores is None and blocks[0].steps.kept_logits is None


def check_scores_block_is_apart(model) -> None:
    """A call that keeps scores gets a block of its own (with buffers); a plain call of the
    same shapes keeps its block without them, and its tokens and the scores call's match
    generate()'s."""
    from kernels.generation import CudaGraphGenerator

    ids, mask = padded_prompt()
    call = dict(attention_mask=mask, max_new_tokens=2 * FUSED_STEPS)
    generator = CudaGraphGenerator(model, fused_steps=FUSED_STEPS)
    plain = generator.generate(ids, **call)
    scored = generator.generate(ids, **call, return_dict_in_generate=True, output_scores=True)
    expected = _static_generate(
        model, ids, dict(call, return_dict_in_generate=True, output_scores=True)
    )
    assert torch.equal(plain, expected.sequences) and torch.equal(scored.sequences, plain)
    assert len(scored.scores) == len(expected.scores) == 2 * FUSED_STEPS
    for a, b in zip(scored.scores, expected.scores, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    blocks = list(generator._fused._blocks.values())
    kept = sorted(block.steps.kept_scores is not None for block in blocks)
    assert kept == [False, True], kept
    assert all(block.steps.kept_logits is None for block in blocks)


def check_per_layer_outputs_run_as_generate(setting: str, caplog) -> None:
    """A ``return_dict_in_generate`` call with ``setting`` (`PER_LAYER_CASES`) runs as
    ``model.generate()`` itself: its output is generate()'s, the per-layer tensors included;
    nothing went through the graphs or the fused loop; one log line names the setting."""
    import logging

    from kernels.generation import CudaGraphGenerator
    from kernels.generation.decode import DecodeStats
    from tests.support.generation import tiny_llama

    model = tiny_llama(attn_implementation="eager")  # SDPA returns no attention weights
    ids, mask = padded_prompt()
    new_tokens = FUSED_STEPS + 3
    call = dict(
        attention_mask=mask,
        max_new_tokens=new_tokens,
        return_dict_in_generate=True,
        output_scores=True,
        **{setting: True},
    )
    expected = model.generate(ids, **call)
    generator = CudaGraphGenerator(model, fused_steps=FUSED_STEPS)
    with caplog.at_level(logging.INFO, logger="kernels.generation"):
        got = generator.generate(ids, **call)
        generator.generate(ids, **call)
    assert type(got) is type(expected) and torch.equal(got.sequences, expected.sequences)
    field = "attentions" if setting == "output_attentions" else "hidden_states"
    mine, theirs = getattr(got, field), getattr(expected, field)
    assert mine is not None and len(mine) == len(theirs) == new_tokens
    for step_mine, step_theirs in zip(mine, theirs, strict=True):
        for a, b in zip(step_mine, step_theirs, strict=True):
            torch.testing.assert_close(a, b)
    assert generator.stats == DecodeStats(), generator.stats
    lines = [r.getMessage() for r in caplog.records if "model.generate() itself" in r.getMessage()]
    assert len(lines) == 1 and f"{setting}=True" in lines[0], lines


def check_dict_output_kernelized(model) -> None:
    """``fast_generate(..., kernels=True)`` with ``return_dict_in_generate``, scores and logits,
    sampling with a repetition penalty and ``min_new_tokens``: the fused loop's output is the
    kernelized model's own ``generate()``'s from the same seed (the model is kernelized first,
    so that the reference runs our kernels too)."""
    from kernels.generation import CudaGraphGenerator, fast_generate

    CudaGraphGenerator(model, kernels=True)
    ids, mask = padded_prompt()
    call = dict(
        attention_mask=mask,
        max_new_tokens=2 * FUSED_STEPS + 1,
        do_sample=True,
        top_k=20,
        repetition_penalty=1.3,
        min_new_tokens=2,
        eos_token_id=early_end_token(model, ids, mask),
        return_dict_in_generate=True,
        output_scores=True,
        output_logits=True,
    )
    expected = _static_generate(model, ids, call)
    torch.manual_seed(123)
    got = fast_generate(model, ids, kernels=True, **call)
    generator = vars(model)["_kernels_cuda_graph_generator"]
    assert generator.kernelized and generator.stats.fused_calls == 1, generator.stats
    assert torch.equal(got.sequences, expected.sequences)
    for field in ("scores", "logits"):
        mine, theirs = getattr(got, field), getattr(expected, field)
        assert len(mine) == len(theirs) == expected.sequences.shape[1] - ids.shape[1]
        for a, b in zip(mine, theirs, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    check_same_cache(output_cache(got), output_cache(expected), expected.sequences.shape[1] - 1)
