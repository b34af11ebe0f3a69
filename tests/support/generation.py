"""A tiny Llama and the checks of `kernels.generation` that run on every transformers version:
tests/generation (transformers 4.57) and tests/clients/transformers5 (5.x) call the same functions.

The model is built from a config (no download). Its weights are drawn with a larger spread
than transformers' default, so that the best and second-best logits of each step are far apart
(0.03 at least, against float32 differences near 1e-6 between cache layouts and kernels): a
token differs only if the computation does.
"""

from __future__ import annotations

import types

import torch

from kernels.generation import EagerBackend
from tests.support.models import llama_config

TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=97,
    max_position_embeddings=256,
    initializer_range=0.1,
    # No end-of-sequence token, so every call generates all its tokens (the counts below hold);
    # a pad token, so that generate() builds the attention mask itself when none is passed.
    pad_token_id=0,
    bos_token_id=None,
    eos_token_id=None,
)
NEW_TOKENS = 6


def undo_kernelize() -> None:
    """Put back what ``kernels=True`` changed for the whole process: our tags (`untag`) and, on
    transformers 5.x, the forward of its rotary function modules (shared by every model)."""
    from kernels.library import untag

    untag()
    from tests.support.tf5_models import restore_function_modules

    restore_function_modules()


def tiny_llama(device="cpu", dtype=torch.float32, seed=0, **overrides):
    from transformers import LlamaForCausalLM

    config = llama_config(**{"attn_implementation": "sdpa", **TINY, **overrides})
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


def tiny_sliding_window_mistral():
    """A tiny Mistral whose attention is a sliding window of 4 tokens: its static cache has
    sliding-window layers, which keep their position in Python."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=50,
        sliding_window=4,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return MistralForCausalLM(config).eval()


def prompt(batch: int, length: int = 7, device="cpu", seed: int = 1):
    """(input ids, attention mask) of ``batch`` random prompts without padding."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, TINY["vocab_size"], (batch, length), generator=generator)
    ids = ids.to(device)
    return ids, torch.ones_like(ids)


def same_projections(generator, model):
    """The q/k/v grouping and the folded decoder layers the generator decodes with (our
    kernels), for a reference run of ``model.generate()``: a context manager (a no-op without
    our kernels)."""
    import contextlib

    from kernels.generation.folded_layers import folded_decoder_layers
    from kernels.generation.projections import grouped_projections

    @contextlib.contextmanager
    def both():
        with grouped_projections(model, generator._projection_kernels) as groups:
            if generator._fold_kernels is None:
                yield
                return
            with folded_decoder_layers(model, groups, generator._fold_kernels):
                yield

    if generator._projection_kernels is None:
        return contextlib.nullcontext()
    return both()


def eager_greedy(model, ids, mask, new_tokens=NEW_TOKENS, **kwargs):
    """transformers' own greedy decoding (dynamic cache unless ``kwargs`` say otherwise)."""
    return model.generate(
        ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False, **kwargs
    )


def eager_static_greedy(model, ids, mask, new_tokens=NEW_TOKENS, cache_len=None, **kwargs):
    """transformers' greedy decoding with a static cache of its own (``cache_len`` tokens, by
    default just enough), not compiled; ``kwargs`` go to generate()."""
    from kernels.generation.cache import cache_argument, new_static_cache

    cache = new_static_cache(model, cache_len or ids.shape[1] + new_tokens)
    return eager_greedy(
        model,
        ids,
        mask,
        new_tokens,
        disable_compile=True,
        **{cache_argument(model): cache},
        **kwargs,
    )


def check_greedy_matches_eager(model, device="cpu", batches=(1, 3), **generator_options):
    """Decoding step by step (the fused loop off), the generator's greedy tokens are
    transformers' (dynamic and static cache), at each batch size; each batch size is captured
    once and its later steps replayed."""
    from kernels.generation import CudaGraphGenerator

    generator = CudaGraphGenerator(model, fused_steps=0, **generator_options)
    for i, batch in enumerate(batches):
        ids, mask = prompt(batch, device=device, seed=batch)
        expected = eager_greedy(model, ids, mask)
        assert torch.equal(eager_static_greedy(model, ids, mask), expected)
        got = generator.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS)
        assert torch.equal(got, expected), f"batch {batch}: {got.tolist()} != {expected.tolist()}"
        stats = generator.stats
        # One prefill and NEW_TOKENS - 1 decode steps per call: one warm-up, then replays.
        assert stats.captures == i + 1 and stats.failed_captures == 0, stats
        assert stats.eager_steps == i + 1, stats
        assert stats.replays == (i + 1) * (NEW_TOKENS - 2), stats
    assert "forward" not in vars(model), "the forward wrapper outlived generate()"
    return generator


def check_second_call_replays(model, device="cpu", **generator_options):
    """A second call of the same batch size replays every decode step (step by step, the fused
    loop off): no warm-up, no capture; a different prompt gives transformers' tokens for it."""
    from kernels.generation import CudaGraphGenerator

    generator = CudaGraphGenerator(model, fused_steps=0, **generator_options)
    ids, mask = prompt(2, device=device)
    generator.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS)
    before = generator.stats
    other_ids, other_mask = prompt(2, length=5, device=device, seed=9)
    got = generator.generate(other_ids, attention_mask=other_mask, max_new_tokens=NEW_TOKENS)
    assert torch.equal(got, eager_greedy(model, other_ids, other_mask))
    after = generator.stats
    assert after.captures == before.captures and after.eager_steps == before.eager_steps
    assert after.replays == before.replays + NEW_TOKENS - 1


def check_our_attention_replays_padded_steps() -> None:
    """Step by step (the fused loop off), with our attention, a left-padded batch's decode
    steps share one graph: generate() hands them a 2D padding mask a column longer each step,
    widened to the cache's length before the step is keyed, so the steps have one shape. The
    tokens are SDPA's."""
    from kernels.generation import CudaGraphGenerator
    from kernels.library.attention import ATTENTION_IMPLEMENTATION, register_attention
    from tests.support.fused_loop import padded_prompt

    register_attention()
    model = tiny_llama(num_hidden_layers=1)
    ids, mask = padded_prompt()
    expected = eager_greedy(model, ids, mask)
    model.set_attn_implementation(ATTENTION_IMPLEMENTATION)
    generator = CudaGraphGenerator(model, fused_steps=0)
    got = generator.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS)
    assert torch.equal(got, expected), f"{got.tolist()} != {expected.tolist()}"
    stats = generator.stats
    # One prefill and NEW_TOKENS - 1 decode steps: one warm-up, one capture, then replays.
    assert stats.captures == 1 and stats.eager_steps == 1, stats
    assert stats.replays == NEW_TOKENS - 2, stats


def check_sampling_matches_eager(model, device="cpu"):
    """With the same seed the generator draws the tokens transformers draws with a static
    cache: through the fused loop (the default: its steps sample on the device) and step by
    step (``fused_steps=0``: sampling runs in generate()'s loop, outside the graphs)."""
    from kernels.generation import CudaGraphGenerator
    from kernels.generation.cache import cache_argument, new_static_cache

    ids, mask = prompt(2, device=device)
    options = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=True, top_k=20)
    torch.manual_seed(123)
    cache = new_static_cache(model, 64)
    expected = model.generate(
        ids, disable_compile=True, **{cache_argument(model): cache}, **options
    )
    for fused_steps in (4, 0):
        generator = CudaGraphGenerator(model, fused_steps=fused_steps)
        torch.manual_seed(123)
        got = generator.generate(ids, **options)
        assert torch.equal(got, expected), fused_steps
        stats = generator.stats
        if fused_steps:
            assert stats.fused_calls == 1 and stats.replays == 0, stats
        else:
            assert stats.replays > 0 and stats.fused_calls == 0, stats


def check_kernelized_matches_its_own_eager(model):
    """With our kernels, the generator's greedy tokens are the kernelized model's own eager
    greedy tokens (not eager transformers': kernels round differently), every decode step
    after the first two replayed from one captured graph (step by step, the fused loop off).
    Returns the generator."""
    from kernels.generation import CudaGraphGenerator

    generator = CudaGraphGenerator(model, kernels=True, fused_steps=0)
    assert generator.kernelized
    ids, mask = prompt(2)
    expected = eager_greedy(model, ids, mask)
    got = generator.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS)
    assert torch.equal(got, expected)
    assert generator.stats.captures == 1 and generator.stats.replays == NEW_TOKENS - 2
    return generator


def counting_kernels():
    """The activation library's decode kernels, counting ``grouped_linear_decode``'s calls."""
    from kernels.generation.generator import _decode_kernels

    real = _decode_kernels()
    calls = []

    def grouped(x, weights, biases, config=None, **norm):
        calls.append(x.shape)
        return real.grouped_linear_decode(x, weights, biases, config, **norm)

    kernels = types.SimpleNamespace(
        grouped_linear_decode=grouped, takes_decode_kernels=real.takes_decode_kernels
    )
    return kernels, calls


def counting_cache_kernels():
    """The rotary library's cache write, noting each call's position form (``("positions",)``
    or ``("counter",)``)."""
    from kernels.generation.generator import _library_package

    real = _library_package("rotary")
    forms = []

    def write(key_cache, value_cache, keys, values, **where):
        forms.append(tuple(where))
        real.write_kv_cache(key_cache, value_cache, keys, values, **where)

    kernels = types.SimpleNamespace(write_kv_cache=write, takes_kv_write=real.takes_kv_write)
    return kernels, forms


def cache_write_form() -> tuple[str]:
    """The form in which this transformers line's static layers get their positions: 5.x's
    count them in a device tensor, 4.57's are told them (``cache_position``). The version comes
    from the package's metadata, so collecting a test module does not import transformers."""
    from importlib.metadata import version

    return ("counter",) if int(version("transformers").split(".")[0]) >= 5 else ("positions",)


def _generate_with_our_kernels():
    """(model, generator, ids, mask, tokens): a bf16 tiny Llama's greedy tokens from a
    generator with ``kernels=True``, on the GPU or, without one, through Triton's interpreter."""
    from kernels.generation import CudaGraphGenerator

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = tiny_llama(device, torch.bfloat16)
    gen = CudaGraphGenerator(model, kernels=True)
    ids, mask = prompt(2, device=device)
    return model, gen, ids, mask, gen.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS)


def check_generator_groups_q_k_v(monkeypatch) -> None:
    """With ``kernels=True`` a bf16 Llama's decode steps project q, k and v in one launch (the
    prefill, more than 8 tokens, does not), and its tokens are the kernelized model's own greedy
    tokens with the same grouping; nothing is left on the projections afterwards."""
    from torch import nn

    from kernels.generation import generator

    kernels, calls = counting_kernels()
    monkeypatch.setattr(generator, "_decode_kernels", lambda: kernels)
    model, gen, ids, mask, got = _generate_with_our_kernels()
    layers = model.config.num_hidden_layers
    assert len(calls) >= layers * (NEW_TOKENS - 1)  # every decode step, every layer
    assert all(shape[:-1].numel() <= 8 for shape in calls)
    with same_projections(gen, model):
        expected = eager_greedy(model, ids, mask)
    assert torch.equal(got, expected)
    for module in model.modules():
        assert not isinstance(module, nn.Linear) or "forward" not in vars(module)


def check_generator_writes_the_cache_in_one_launch(monkeypatch) -> None:
    """With ``kernels=True`` every decode step's keys and values go into the static cache
    through the rotary library's ``write_kv_cache`` (transformers 5.x: its counter form, 4.57:
    its positions form), the tokens are the kernelized model's own greedy tokens (the writes
    are exact copies), and no ``update`` is left on the cache's layers afterwards."""
    from kernels.generation import generator

    load = generator._library_package
    rotary, forms = counting_cache_kernels()
    monkeypatch.setattr(
        generator, "_library_package", lambda n: rotary if n == "rotary" else load(n)
    )
    model, gen, ids, mask, got = _generate_with_our_kernels()
    layers = model.config.num_hidden_layers
    assert len(forms) >= layers * (NEW_TOKENS - 1)  # every decode step, every layer
    assert set(forms) == {cache_write_form()}
    with same_projections(gen, model):
        expected = eager_greedy(model, ids, mask)
    assert torch.equal(got, expected)
    for cache, _ in gen._caches.values():
        assert all("update" not in vars(layer) for layer in cache.layers)


class CountingBackend(EagerBackend):
    """EagerBackend that counts captures and replays, and raises on capture when told to."""

    name = "counting"

    def __init__(self, fail_with: Exception | None = None):
        self.captured = 0
        self.replayed = 0
        self.fail_with = fail_with

    def capture(self, fn):
        if self.fail_with is not None:
            raise self.fail_with
        self.captured += 1
        backend = self

        class Step:
            def replay(self):
                backend.replayed += 1
                return fn()

        return Step()


def tiny_tokenizer():
    """A fast tokenizer for `TINY`'s vocabulary (97 ids): the pad token, the 26 letters and
    70 pairs of letters ("aa", "ab", ...), text split into letters and tokens joined without
    spaces, so that a stop string can end inside a token or span several (``"bca"`` is "b" +
    "ca" or "bc" + "a")."""
    import itertools
    import string

    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = ["<pad>", *string.ascii_lowercase]
    pairs = ("".join(p) for p in itertools.product("abcdefghij", repeat=2))
    vocab += list(itertools.islice(pairs, TINY["vocab_size"] - len(vocab)))
    tokenizer = Tokenizer(WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>")
