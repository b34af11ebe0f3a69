"""`kernels.generation.folded_layers`: a Llama-style decoder layer's decode step with its norms
and residual adds folded into the projections. Which code folds (read from the source), a
folded step against the unfused kernelized layer and a float64 model, `CudaGraphGenerator`
decoding through it, and what keeps a layer unfolded. On the CPU through Triton's interpreter
(or a GPU), in bf16."""

from __future__ import annotations

import contextlib
import copy
import textwrap

import pytest
import torch
from torch import nn

from kernels.generation import CudaGraphGenerator, folded_layers, generator
from kernels.generation.folded_layers import (
    attention_is_foldable,
    decoder_layer_calls,
    folded_decoder_layers,
)
from kernels.generation.projections import grouped_projections
from tests.support.generation import (
    NEW_TOKENS,
    eager_greedy,
    prompt,
    same_projections,
    tiny_llama,
)

BF16 = torch.bfloat16
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _compiled(source: str, name: str):
    """The function ``name`` defined by ``source`` (a class body's method, dedented), with a
    source that ``inspect`` can read: written to a module file of its own."""
    import importlib.util
    import tempfile
    from pathlib import Path

    folder = Path(tempfile.mkdtemp(prefix="folded-layer-source-"))
    path = folder / f"{name}_module.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


_LAYER = """
def forward(self, hidden_states, attention_mask=None, position_embeddings=None, **kwargs):
    \"\"\"A docstring is not a statement.\"\"\"
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    hidden_states, _ = self.self_attn(
        hidden_states=hidden_states,
        attention_mask=attention_mask,
        position_embeddings=position_embeddings,
        **kwargs,
    )
    hidden_states = residual + hidden_states
    residual = hidden_states
    hidden_states = self.post_attention_layernorm(hidden_states)
    hidden_states = self.mlp(hidden_states)
    hidden_states = residual + hidden_states
    return hidden_states
"""

_ATTENTION = """
def forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
    input_shape = hidden_states.shape[:-1]
    q = self.q_proj(hidden_states)
    k = self.k_proj(hidden_states)
    v = self.v_proj(hidden_states)
    attn_output = attend(q, k, v, attention_mask).reshape(*input_shape, -1)
    attn_output = self.o_proj(attn_output)
    return attn_output, None
"""


def test_llama_layers_and_attention_fold_statement_for_statement():
    from transformers.models.llama import modeling_llama as llama

    calls = decoder_layer_calls(llama.LlamaDecoderLayer.forward)
    assert calls is not None and calls.hidden == "hidden_states" and calls.rest == "kwargs"
    assert {"attention_mask", "position_embeddings", "use_cache"} <= set(calls.passed)
    assert attention_is_foldable(llama.LlamaAttention.forward)
    forward = _compiled(_LAYER, "forward")
    assert decoder_layer_calls(forward).passed == ("attention_mask", "position_embeddings")
    assert attention_is_foldable(_compiled(_ATTENTION, "forward"))


@pytest.mark.parametrize(
    "old, new",
    [
        # a scaled residual (Granite's): the add is not the plain sum
        (
            "    hidden_states = residual + hidden_states\n    residual",
            "    hidden_states = residual + hidden_states * 0.5\n    residual",
        ),
        # the attention called with a value the layer computed, not its own argument
        ("attention_mask=attention_mask,", "attention_mask=attention_mask[:, None],"),
        # a norm after the attention (Gemma 2's, OLMo 2's): one more statement
        (
            "    hidden_states = residual + hidden_states\n    residual",
            "    hidden_states = self.post_norm(hidden_states)\n    hidden_states = residual + hidden_states\n    residual",
        ),
        # the MLP fed the un-normalised state
        ("self.mlp(hidden_states)", "self.mlp(residual)"),
    ],
    ids=["scaled-residual", "computed-argument", "extra-norm", "other-mlp-input"],
)
def test_a_layer_whose_code_differs_does_not_fold(old, new):
    assert old in _LAYER
    assert decoder_layer_calls(_compiled(_LAYER.replace(old, new, 1), "forward")) is None


@pytest.mark.parametrize(
    "old, new",
    [
        # the input read beyond the projections (a gate of its own)
        (
            "    v = self.v_proj(hidden_states)\n",
            "    v = self.v_proj(hidden_states) * self.gate(hidden_states)\n",
        ),
        # a projection of something else than the input
        ("self.q_proj(hidden_states)", "self.q_proj(self.norm(hidden_states))"),
        # o_proj's output changed before it is returned
        (
            "    return attn_output, None",
            "    attn_output = attn_output * 2\n    return attn_output, None",
        ),
        # the input reassigned
        ("    q = self.q_proj", "    hidden_states = hidden_states * 2\n    q = self.q_proj"),
    ],
    ids=["reads-input", "projects-other", "after-o-proj", "reassigned"],
)
def test_an_attention_whose_code_differs_does_not_fold(old, new):
    assert old in _ATTENTION
    assert not attention_is_foldable(_compiled(_ATTENTION.replace(old, new, 1), "forward"))


# --------------------------------------------------------------------------------------------
# A folded step
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kernelized():
    """A bf16 tiny Llama with our kernels, its generator, and the fold's kernels."""
    model = tiny_llama(DEVICE, BF16)
    gen = CudaGraphGenerator(model, kernels=True)
    return model, gen


@contextlib.contextmanager
def _folded(gen, model):
    with grouped_projections(model, gen._projection_kernels) as groups:
        with folded_decoder_layers(model, groups, gen._fold_kernels) as folded:
            yield folded


def _decode_step_logits(model, fold_with=None, batch=1, group_with=None):
    """The logits of one decode step after a prefill of 5 tokens, through a copy of the
    prefill's dynamic cache; folded when ``fold_with`` is the generator, its q, k and v
    grouped (only) when ``group_with`` is."""
    ids, _ = prompt(batch, length=5, device=DEVICE)
    with torch.no_grad():
        out = model(ids, use_cache=True)
        nxt = out.logits[:, -1:].argmax(-1)
        cache = copy.deepcopy(out.past_key_values)
        if group_with is not None:
            with grouped_projections(model, group_with._projection_kernels):
                return model(nxt, past_key_values=cache).logits.double(), []
        if fold_with is None:
            return model(nxt, past_key_values=cache).logits.double(), []
        with _folded(fold_with, model) as folded:
            logits = model(nxt, past_key_values=cache).logits.double()
        return logits, folded


@pytest.mark.parametrize("batch", [1, 3])
def test_a_folded_step_is_the_kernelized_layer_within_its_roundings(kernelized, batch, monkeypatch):
    """Every layer folds, and the logits are the unfused kernelized model's up to the
    roundings that moved (the rows' sums of squares added in another order): within a few
    bf16 ulps of the logits' scale, and no farther from a float64 model than the unfused. Also
    at 3 rows, which fold only where `FOLD_MAX_ROWS` lets them (a speed rule, not a limit of
    the kernels)."""
    monkeypatch.setattr(folded_layers, "FOLD_MAX_ROWS", 8)
    model, gen = kernelized
    unfused, _ = _decode_step_logits(model, batch=batch)
    folded_logits, folded = _decode_step_logits(model, fold_with=gen, batch=batch)
    assert len(folded) == model.config.num_hidden_layers
    assert all(f.steps == 1 for f in folded)
    scale = unfused.abs().max().item()
    assert (folded_logits - unfused).abs().max().item() <= 4 * 2.0**-8 * scale
    reference = tiny_llama(DEVICE, BF16).double()  # the same bf16 weights, in float64
    exact, _ = _decode_step_logits(reference, batch=batch)
    err_folded = (folded_logits - exact).abs().max().item()
    err_unfused = (unfused - exact).abs().max().item()
    assert err_folded <= 1.5 * err_unfused + 2.0**-9 * scale, (err_folded, err_unfused)


def test_the_prefill_more_rows_and_float32_are_the_layers_own(kernelized):
    """The prefill, more rows than `FOLD_MAX_ROWS`, or float32 (left to cuBLAS), is the layer's
    own forward: the same bits as without folding, and no step counted."""
    model, gen = kernelized
    for batch, length in ((1, 9), (2, 1)):
        ids, _ = prompt(batch, length=length, device=DEVICE)
        with torch.no_grad():
            with grouped_projections(model, gen._projection_kernels):  # (q/k/v as folded)
                expected = model(ids).logits
            with _folded(gen, model) as folded:
                got = model(ids).logits
        assert torch.equal(got, expected) and all(f.steps == 0 for f in folded)
    model32 = tiny_llama(DEVICE, torch.float32)
    gen32 = CudaGraphGenerator(model32, kernels=True)
    ids, _ = prompt(1, length=1, device=DEVICE)
    with torch.no_grad():
        expected = model32(ids).logits
        with _folded(gen32, model32) as folded:
            got = model32(ids).logits
    assert torch.equal(got, expected) and all(f.steps == 0 for f in folded)


def test_a_hook_on_a_folded_module_keeps_its_layer_unfolded(kernelized):
    """A forward hook on a post-attention norm would not run inside the folded kernels: that
    layer decodes unfused (the hook runs), the others fold."""
    model, gen = kernelized
    seen = []
    norm = model.model.layers[0].post_attention_layernorm
    handle = norm.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    try:
        unfused, _ = _decode_step_logits(model)
        seen.clear()
        logits, folded = _decode_step_logits(model, fold_with=gen)
    finally:
        handle.remove()
    assert [f.steps for f in folded] == [0] + [1] * (len(folded) - 1)
    assert [shape[1] for shape in seen] == [5, 1]  # the prefill's call and the decode step's
    scale = unfused.abs().max().item()
    assert (logits - unfused).abs().max().item() <= 4 * 2.0**-8 * scale


def test_generation_folds_every_layer_and_leaves_nothing_behind(kernelized, monkeypatch):
    """`CudaGraphGenerator` with our kernels folds every decoder layer of every decode step,
    its tokens are the folded model's own greedy tokens, and afterwards no layer or
    projection keeps a forward of ours."""
    model, gen = kernelized
    seen = []
    real = generator.folded_decoder_layers

    @contextlib.contextmanager
    def recording(*args):
        with real(*args) as folded:
            seen.append(folded)
            yield folded

    monkeypatch.setattr(generator, "folded_decoder_layers", recording)
    ids, mask = prompt(1, device=DEVICE)
    got = gen.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS)
    layers = model.config.num_hidden_layers
    assert len(seen) == 1 and len(seen[0]) == layers
    assert all(f.steps >= NEW_TOKENS - 1 for f in seen[0])
    with same_projections(gen, model):
        expected = eager_greedy(model, ids, mask)
    assert torch.equal(got, expected)
    for module in model.modules():
        assert "forward" not in vars(module) or not isinstance(module, nn.Linear)
    assert all("forward" not in vars(layer) for layer in model.model.layers)


def test_qwen2_with_biases_folds():
    """Qwen2's q, k and v have biases (o_proj none): its layers fold, within roundings."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=97, max_position_embeddings=256, pad_token_id=0,
        initializer_range=0.1,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(DEVICE, BF16).eval()
    gen = CudaGraphGenerator(model, kernels=True)
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    unfused, _ = _decode_step_logits(model)
    logits, folded = _decode_step_logits(model, fold_with=gen)
    assert len(folded) == 2 and all(f.steps == 1 for f in folded)
    scale = unfused.abs().max().item()
    assert (logits - unfused).abs().max().item() <= 4 * 2.0**-8 * scale


def test_gemma_layers_pass_the_code_check_but_do_not_fold():
    """Gemma's decoder layer reads like Llama's, but its norm is ``(1 + weight)``-scaled (our
    ``GemmaRMSNorm`` kernel layer, not ``RMSNorm``): its layers stay unfolded, and a decode step
    is the kernelized model's own, bit for bit."""
    from transformers import GemmaConfig, GemmaForCausalLM

    config = GemmaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=97, max_position_embeddings=256,
        pad_token_id=0, initializer_range=0.1,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = GemmaForCausalLM(config).to(DEVICE, BF16).eval()
    gen = CudaGraphGenerator(model, kernels=True)
    assert decoder_layer_calls(type(model.model.layers[0]).forward) is not None
    unfused, _ = _decode_step_logits(model, group_with=gen)
    logits, folded = _decode_step_logits(model, fold_with=gen)
    assert len(folded) == 2 and all(f.steps == 0 for f in folded)
    assert torch.equal(logits, unfused)
