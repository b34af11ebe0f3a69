"""The fused lm_head + cross-entropy on transformers 5.24 models.

5.24's ``*ForCausalLM.forward`` differs from 4.57's (``cache`` for ``past_key_values``,
``slice_logits_to_keep``, ``@deprecate_kwarg``, ``cache=`` in the output), and nothing in 5.24
tags it; `tag_causal_lm_losses` recognises it by its source, and `register_library_kernels()`
has every `kernelize` (transformers' ``use_kernels`` included) tag it. Every test compares with
an untouched copy of the model: loss, every parameter's gradient, and the logits where the
model's own forward must run. On the CPU the kernels run through Triton's interpreter.
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import re
import sys
import warnings
from pathlib import Path

import pytest
import torch
import transformers

from kernels import Mode, kernelize, library_mapping, use_kernel_mapping
from kernels.layer.decorators import use_kernel_forward_from_hub
from kernels.layer.swap import kernel_layer_of
from kernels.layer.validation import validate_kernel_layer
from kernels.library import (
    load_library_package,
    register_library_kernels,
    tag_causal_lm_losses,
    tag_on_kernelize,
)
from kernels.library import transformers_tags as tags
from kernels.library.transformers_tags import _causal_lm_layer
from tests.support.tf5_models import DEVICE, make_model

VOCAB = 101
IGNORE = -100

#: family -> (config class, model class, extra config, the layer name it is tagged with)
LOSS_FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}, "CausalLMFusedLoss"),
    # Gemma 2 and Gemma 3 text soft-cap their final logits (a cap small enough to matter for
    # the logits of this tiny model, whose lm_head is scaled up below).
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {"final_logit_softcapping": 3.0, "attn_implementation": "eager"},
        "GemmaCausalLMFusedLoss",
    ),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {"final_logit_softcapping": 3.0, "attn_implementation": "eager", "sliding_window": 4},
        "GemmaCausalLMFusedLoss",
    ),
}

TINY = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=40,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=32,
)


def build(config_name: str, model_name: str, config: dict):
    """A model of transformers' ``model_name`` from ``config_name(**config)`` on DEVICE, in
    training mode, its lm_head scaled so that the loss is far from log(vocab) and soft-capping
    changes the logits."""
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(**config)
    model = getattr(transformers, model_name)(config).to(DEVICE)
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)  # tied to the embeddings in Gemma: both scaled
    return model.train()


def tiny(family: str, **config):
    """A tiny model of `family` (`LOSS_FAMILIES`) with ``config`` on top, see `build`."""
    config_name, model_name, extra, _ = LOSS_FAMILIES[family]
    return build(
        config_name, model_name, {"attn_implementation": "sdpa", **TINY, **extra, **config}
    )


def batch(seq: int = 9):
    torch.manual_seed(1)
    tokens = torch.randint(0, VOCAB, (2, seq), device=DEVICE)
    labels = tokens.clone()
    labels[0, :4] = IGNORE  # a prompt the loss ignores
    labels[1, -2] = IGNORE
    mask = torch.ones_like(tokens)
    mask[1, :2] = 0  # left padding
    return tokens, labels, mask


def step(model, *args, **kwargs):
    model.zero_grad(set_to_none=True)
    out = model(*args, **kwargs)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_step(got, want, *, loss_tol=(1e-5, 1e-6), grad_tol=(1e-4, 1e-5)) -> None:
    """The same loss and gradients, fp32: tight where only the loss is ours; pass looser
    tolerances where the norms and MLPs run our kernels too. A gradient's absolute tolerance
    is relative to its largest element: summed in another order, fp32 sums differ by a few
    ulp of the terms, not of the (possibly cancelling) result."""
    (out, grads), (expected, expected_grads) = got, want
    rtol, atol = loss_tol
    torch.testing.assert_close(out.loss, expected.loss, rtol=rtol, atol=atol)
    assert grads.keys() == expected_grads.keys()
    rtol, scale = grad_tol
    for name, grad in expected_grads.items():
        torch.testing.assert_close(
            grads[name],
            grad,
            rtol=rtol,
            atol=scale * grad.abs().max().item(),
            msg=lambda m, name=name: f"{name}: {m}",
        )


#: The layer of Llama's forward, alone: a test of the loss kernelizes only it, as the norms'
#: MLPs' and rotary's kernels through Triton's interpreter took most of such a test's time on
#: the CPU. The tests through ``use_kernels`` (test_use_kernels_after_register_library_kernels,
#: test_from_pretrained_with_use_kernels) run every kernel together.
LOSS = ["CausalLMFusedLoss"]

#: Tolerances for a model whose other layers run our kernels too (as in test_models.py).
ALL_KERNELS = dict(loss_tol=(1e-4, 1e-5), grad_tol=(1e-4, 1e-4))


def kernelized(model, mode=Mode.TRAINING, layers=None):
    """``model`` tagged and kernelized with our kernels (only those for ``layers``, if given:
    the rest of the model then runs transformers' code)."""
    tag_causal_lm_losses(model)
    with use_kernel_mapping(library_mapping(devices=[DEVICE], layers=layers)):
        kernelize(model, mode=mode, device=DEVICE)
    return model


# ---- which classes are tagged ---------------------------------------------------------------


@pytest.mark.parametrize(
    "name,layer",
    [
        ("LlamaForCausalLM", "CausalLMFusedLoss"),
        ("Qwen3ForCausalLM", "CausalLMFusedLoss"),
        ("Qwen3_5ForCausalLM", "CausalLMFusedLoss"),
        ("MistralForCausalLM", "CausalLMFusedLoss"),
        ("GemmaForCausalLM", "CausalLMFusedLoss"),
        # deprecate_kwarg innermost, as in Gemma2's: the same forward
        ("Ernie4_5ForCausalLM", "CausalLMFusedLoss"),
        ("Gemma2ForCausalLM", "GemmaCausalLMFusedLoss"),
        ("Gemma3ForCausalLM", "GemmaCausalLMFusedLoss"),
        ("NanoChatForCausalLM", "GemmaCausalLMFusedLoss"),
        # a router loss: its own layer (test_moe_causal_lm_loss.py)
        ("MixtralForCausalLM", "MoeCausalLMFusedLoss"),
        # the router logits returned without a loss (test_moe_router_causal_lm_loss.py);
        # HunYuan V3 spells out aux_loss=None
        ("DeepseekV3ForCausalLM", "MoeRouterCausalLMFusedLoss"),
        ("Glm4MoeForCausalLM", "MoeRouterCausalLMFusedLoss"),
        ("HYV3ForCausalLM", "MoeRouterCausalLMFusedLoss"),
        ("DeepseekV4ForCausalLM", "MoeCausalLMFusedLoss"),  # Mixtral's forward
        # left alone: another loss path (Gemma 4); near copies of DeepSeek-V3's that compute
        # something else: the hidden states cast to the lm_head's dtype (HunYuan V4), the
        # logits scaled (Cohere 2 MoE), the hidden states divided and the vocabulary trimmed
        # (Inkling)
        ("Gemma4ForCausalLM", None),
        ("HYV4ForCausalLM", None),
        ("Cohere2MoeForCausalLM", None),
        ("InklingForCausalLM", None),
    ],
)
def test_recognised_forwards(name, layer):
    assert _causal_lm_layer(getattr(transformers, name)) == layer


def _identifiers(source: str) -> set[str]:
    """Every identifier in a forward's definition key (`_definition_key`: names, attributes,
    arguments, keywords, the function's name and its decorators'; annotations dropped, as the
    key drops them)."""
    function = tags._WithoutAnnotations().visit(copy.deepcopy(ast.parse(source).body[0]))
    found = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.arg) or (isinstance(node, ast.keyword) and node.arg):
            found.add(node.arg)
        elif isinstance(node, ast.FunctionDef):
            found.add(node.name)
    return found


# A function bound to ``forward`` other than by a ``def forward`` in a class body: an
# assignment (``forward = ...``, ``Cls.forward = ...``, ``forward: ...``) or the name as a
# string (``setattr(cls, "forward", f)``, ``type(name, bases, {"forward": f})``).
_OTHER_FORWARD_BINDING = re.compile(r"\bforward\s*[:=](?!=)|['\"]forward['\"]")


def classes_tagged(*layers: str) -> dict[str, set[str]]:
    """For each of ``layers``, the names of the classes of transformers' modelling modules
    (``transformers.models.<model>.modeling_*``) that define their own ``forward`` and that
    `_causal_lm_layer` tags with it.

    Importing every modelling module takes about a minute, so a module is imported only where
    its file could give a class such a forward, and the answer is the one of importing them
    all. `_causal_lm_layer` tags a class only where its forward's definition (the ``def`` that
    ``inspect.getsource`` finds, unwrapping transformers' decorators) has the definition key of
    one of the layer's templates; that ``def``'s text then holds every identifier of the
    template, as the key compares them all (annotations aside) and Python spells an identifier
    one way only. A class gets a forward of its own either by a ``def forward`` in its body,
    in its module's file, or by a binding of a function defined elsewhere, which
    `_OTHER_FORWARD_BINDING` finds in the file's text. A file with neither every identifier of
    one of the templates nor such a binding has no class tagged with the layers."""
    return _classes_tagged(frozenset(layers))


@functools.cache
def _classes_tagged(layers: frozenset[str]) -> dict[str, set[str]]:
    import importlib

    import transformers.models

    needed = [_identifiers(source) for name, source in tags._CAUSAL_LM_FORWARDS if name in layers]
    tagged = {layer: set() for layer in layers}
    for path in sorted(Path(transformers.models.__path__[0]).glob("*/modeling_*.py")):
        text = path.read_text(encoding="utf-8")
        words = set(re.findall(r"\w+", text))
        if not any(n <= words for n in needed) and not _OTHER_FORWARD_BINDING.search(text):
            continue
        try:
            module = importlib.import_module(f"transformers.models.{path.parent.name}.{path.stem}")
        except Exception:  # noqa: BLE001 - a model whose optional dependency is missing
            continue
        for name, cls in vars(module).items():
            if (
                inspect.isclass(cls)
                and cls.__module__ == module.__name__
                and "forward" in vars(cls)
            ):
                found = _causal_lm_layer(cls)
                if found in tagged:
                    tagged[found].add(name)
    return tagged


@pytest.mark.parametrize(
    "name,global_name",
    [
        ("LlamaForCausalLM", "slice_logits_to_keep"),
        ("MixtralForCausalLM", "MoeCausalLMOutputWithPast"),
        ("DeepseekV3ForCausalLM", "MoeCausalLMOutputWithPast"),
    ],
)
def test_a_forward_reading_other_globals_is_not_tagged(monkeypatch, name, global_name):
    """The same source, but a global of its modelling module is not transformers' (its own
    slicing, its own output class)."""
    cls = getattr(transformers, name)
    assert _causal_lm_layer(cls) is not None
    monkeypatch.setattr(sys.modules[cls.__module__], global_name, dict)
    assert _causal_lm_layer(cls) is None


# ---- the layers -----------------------------------------------------------------------------


def test_layer_names_resolve_to_the_5_24_signatures():
    """The loss repository gives each layer name the layer whose signature is 5.24's (read from
    ``CausalLMOutputWithPast``'s fields); kernelize's own check accepts it."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    loss = load_library_package("loss")
    assert loss.causal_lm.cache_output_field() == "cache"
    replaces = {
        "CausalLMFusedLoss": transformers.LlamaForCausalLM,
        "GemmaCausalLMFusedLoss": transformers.Gemma2ForCausalLM,
        "MoeCausalLMFusedLoss": transformers.MixtralForCausalLM,
        "MoeRouterCausalLMFusedLoss": transformers.DeepseekV3ForCausalLM,
        "ForCausalLMLoss": type(use_kernel_forward_from_hub("ForCausalLMLoss")(ForCausalLMLoss)),
    }
    for name, original in replaces.items():
        layer = getattr(loss.layers, name)
        assert layer.__name__ == name and name in dir(loss.layers)
        parameters = inspect.signature(layer.forward).parameters
        assert list(parameters) == list(inspect.signature(original.forward).parameters)
        validate_kernel_layer(layer, original, kernel_source="library/loss", layer_name=name)
    with pytest.raises(AttributeError):
        loss.layers.NoSuchLayer  # noqa: B018


@pytest.mark.parametrize("family", sorted(LOSS_FAMILIES))
def test_fused_loss_matches_the_untouched_model(clean_kernels, family):
    model = tiny(family)
    reference = copy.deepcopy(model)
    tokens, labels, mask = batch()
    items = torch.tensor(11, device=DEVICE)  # gradient accumulation: the Trainer passes it
    kwargs = dict(attention_mask=mask, labels=labels, num_items_in_batch=items)
    want = step(reference, tokens, **kwargs)

    layer = LOSS_FAMILIES[family][3]
    assert tag_causal_lm_losses(model) == [type(model).__name__]
    assert tag_causal_lm_losses(model) == []  # already tagged
    kernelized(model, layers=[layer])
    assert kernel_layer_of(model).__name__ == layer

    got = step(model, tokens, **kwargs)
    assert got[0].logits is None  # training with labels: no logits held, none returned
    assert type(got[0].cache) is type(want[0].cache)  # 5.24's output field, filled
    # with the model's own keys and values, detached from the step (nothing reads them)
    for ours, theirs in zip(got[0].cache.layers, want[0].cache.layers, strict=True):
        assert theirs.keys.requires_grad and not ours.keys.requires_grad
        assert not ours.values.requires_grad
        torch.testing.assert_close(ours.keys, theirs.keys.detach())
        torch.testing.assert_close(ours.values, theirs.values.detach())
    assert_same_step(got, want)
    # without num_items_in_batch: the mean over the labels not ignored
    plain = step(reference, tokens, labels=labels)
    assert_same_step(step(model, tokens, labels=labels), plain)
    as_tuple = model(tokens, labels=labels, return_dict=False)  # can_return_tuple's contract
    torch.testing.assert_close(as_tuple[0], plain[0].loss, rtol=1e-5, atol=1e-6)

    # The model's own forward where the logits are asked for: no labels, or evaluation.
    with torch.no_grad():
        torch.testing.assert_close(model(tokens).logits, reference(tokens).logits)
        model.eval()
        reference.eval()
        evaluated, expected = model(tokens, labels=labels), reference(tokens, labels=labels)
    torch.testing.assert_close(evaluated.logits, expected.logits)
    torch.testing.assert_close(evaluated.loss, expected.loss)


def test_soft_capping_is_in_the_fused_loss(clean_kernels):
    """The Gemma layer's loss is that of the soft-capped logits (the cap changes it here)."""
    model = kernelized(tiny("gemma2"), layers=["GemmaCausalLMFusedLoss"])
    uncapped = copy.deepcopy(model)
    uncapped.config.final_logit_softcapping = None
    tokens, labels, _ = batch()
    capped_loss = model(tokens, labels=labels).loss
    assert not torch.allclose(capped_loss, uncapped(tokens, labels=labels).loss, rtol=1e-2)
    with torch.no_grad():
        logits = model.eval()(tokens).logits
    assert logits.abs().max() <= 3.0  # the model's own forward caps them
    torch.testing.assert_close(capped_loss, transformers_loss(logits, labels))


def transformers_loss(logits, labels, **kwargs):
    from transformers.loss.loss_utils import ForCausalLMLoss

    return ForCausalLMLoss(logits, labels, logits.shape[-1], **kwargs)


def test_shift_labels_and_ignore_index_kwargs(clean_kernels):
    """5.24 passes the model's keyword arguments to its loss: already shifted labels
    (sequence parallelism), another ignore_index."""
    model = tiny("llama")
    reference = copy.deepcopy(model)
    kernelized(model, layers=LOSS)
    tokens, labels, _ = batch()
    shifted = torch.roll(labels, -1, dims=1)
    shifted[:, -1] = IGNORE
    for kwargs in (
        dict(labels=labels, shift_labels=shifted),
        dict(labels=torch.where(labels == IGNORE, -1, labels), ignore_index=-1),
    ):
        got, want = step(model, tokens, **kwargs), step(reference, tokens, **kwargs)
        assert got[0].logits is None, kwargs
        assert_same_step(got, want)


def test_deprecated_past_key_values_as_5_24_handles_it(clean_kernels):
    """5.24's forward carries ``@deprecate_kwarg("past_key_values", "5.40.0",
    new_name="cache")``; the layer replacing it renames and warns the same way."""
    model = tiny("llama")
    reference = copy.deepcopy(model)
    kernelized(model, layers=LOSS)
    tokens, labels, _ = batch()

    def run(m, **kwargs):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = m(tokens, labels=labels, use_cache=True, **kwargs)
        return out, [(w.category, str(w.message)) for w in caught if "cache" in str(w.message)]

    # (a fresh cache for each call: a forward fills the one it is given)
    for passed in (
        lambda: {"past_key_values": None},
        lambda: {"past_key_values": None, "cache": None},
        lambda: {"past_key_values": transformers.DynamicCache(config=model.config)},
    ):
        out, messages = run(model, **passed())
        expected, expected_messages = run(reference, **passed())
        assert messages == expected_messages and messages, sorted(passed())
        assert messages[0][0] is FutureWarning
        assert out.logits is None
        torch.testing.assert_close(out.loss, expected.loss, rtol=1e-5, atol=1e-6)
        assert out.cache.get_seq_length() == expected.cache.get_seq_length() == tokens.shape[1]


def test_the_model_s_own_forward_where_the_fused_loss_does_not_apply(clean_kernels):
    model = tiny("llama")
    reference = copy.deepcopy(model)
    kernelized(model, layers=LOSS)
    tokens, labels, _ = batch()
    with torch.no_grad():
        for kwargs in ({"logits_to_keep": 1}, {"logits_to_keep": torch.tensor([0, 3])}):
            torch.testing.assert_close(
                model(tokens, **kwargs).logits, reference(tokens, **kwargs).logits
            )
        # labels with a tensor logits_to_keep (here every position): the model's own forward
        every = {"labels": labels, "logits_to_keep": torch.arange(tokens.shape[1], device=DEVICE)}
        out, expected = model(tokens, **every), reference(tokens, **every)
    torch.testing.assert_close(out.logits, expected.logits)
    torch.testing.assert_close(out.loss, expected.loss)

    # a loss_function of the user's own: it gets the logits
    def zero_loss(logits, labels, vocab_size, **kwargs):
        return logits.sum() * 0

    model.loss_function = zero_loss
    out = model(tokens, labels=labels)
    assert out.logits is not None and out.loss.item() == 0
    del model._loss_function
    # an lm_head with a hook (LoRA, ZeRO-3 and FSDP live in hooks)
    handle = model.lm_head.register_forward_hook(lambda *args: None)
    assert model(tokens, labels=labels).logits is not None
    handle.remove()
    assert model(tokens, labels=labels).logits is None


def test_trainer_style_call(clean_kernels):
    """What Trainer.compute_loss does: ``model(**inputs)``, ``num_items_in_batch`` added when
    the forward takes ``**kwargs`` (``model_accepts_loss_kwargs``, read from the signature)."""
    model = tiny("llama")
    reference = copy.deepcopy(model)
    kernelized(model, layers=LOSS)
    accepts = [
        p.kind == inspect.Parameter.VAR_KEYWORD
        for p in inspect.signature(model.forward).parameters.values()
    ]
    assert any(accepts)
    tokens, labels, mask = batch()
    inputs = {"input_ids": tokens, "attention_mask": mask, "labels": labels}
    items = (labels[:, 1:] != IGNORE).sum()  # the Trainer counts the shifted labels
    got = step(model, **inputs, num_items_in_batch=items)
    assert got[0].logits is None
    assert_same_step(got, step(reference, **inputs, num_items_in_batch=items))


def test_compiles_fullgraph(clean_kernels):
    model = tiny("llama", num_hidden_layers=1)  # each decoder layer lengthens the trace
    reference = copy.deepcopy(model)
    tag_causal_lm_losses(model)
    with use_kernel_mapping(library_mapping(devices=[DEVICE], layers=["CausalLMFusedLoss"])):
        kernelize(model, mode=Mode.TRAINING | Mode.TORCH_COMPILE, device=DEVICE)
    torch._dynamo.reset()
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop

    backwards = []

    def record_backward(graph, example_inputs):
        backwards.append(graph)
        return boxed_nop(graph, example_inputs)

    # aot_eager's compilers (boxed_nop), the backward's graph kept
    backend = aot_autograd(fw_compiler=boxed_nop, bw_compiler=record_backward)
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    tokens, labels, _ = batch(6)
    out, grads = step(compiled, tokens, labels=labels)
    expected, expected_grads = step(reference, tokens, labels=labels)
    assert out.logits is None
    grads = {name.removeprefix("_orig_mod."): grad for name, grad in grads.items()}
    assert_same_step((out, grads), (expected, expected_grads))
    # The backward takes a gradient of the loss only: the KV cache the forward returns is
    # detached, so AOTAutograd makes no zero gradients for its keys and values.
    (graph,) = backwards
    tangents = [n for n in graph.graph.nodes if n.op == "placeholder" and "tangent" in n.name]
    assert len(tangents) == 1, [n.name for n in tangents]


# ---- through transformers' own entry points --------------------------------------------------


def test_use_kernels_after_register_library_kernels(clean_kernels):
    """``model.use_kernels = True`` kernelizes for the model's mode; `register_library_kernels`
    has that kernelize tag the forward, and ``train()`` / ``eval()`` switch modes."""
    reference = make_model("qwen3").train()
    tokens = torch.randint(0, 64, (2, 6), device=DEVICE)
    want = step(reference, tokens, labels=tokens)
    register_library_kernels(devices=[DEVICE])
    model = make_model("qwen3").train()
    model.use_kernels = True
    assert kernel_layer_of(model).__name__ == "CausalLMFusedLoss"
    got = step(model, tokens, labels=tokens)
    assert got[0].logits is None
    assert_same_step(got, want, **ALL_KERNELS)
    model.eval()
    reference.eval()
    assert kernel_layer_of(model).__name__ == "CausalLMFusedLoss"
    with torch.no_grad():
        evaluated, expected = model(tokens, labels=tokens), reference(tokens, labels=tokens)
    torch.testing.assert_close(evaluated.logits, expected.logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_from_pretrained_with_use_kernels(clean_kernels, tmp_path, family):
    tiny(family).save_pretrained(tmp_path)
    placement = {} if DEVICE == "cpu" else {"device_map": DEVICE}
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, **placement).train()
    tokens, labels, _ = batch()
    want = step(reference, tokens, labels=labels)
    register_library_kernels(devices=[DEVICE])
    model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, use_kernels=True, **placement
    )
    assert kernel_layer_of(model).__name__ == LOSS_FAMILIES[family][3]
    assert not model.training  # from_pretrained: evaluation mode, the model's own forward
    with torch.no_grad():
        torch.testing.assert_close(
            model(tokens).logits, reference.eval()(tokens).logits, rtol=1e-4, atol=1e-4
        )
    model.train()  # transformers kernelizes again, for TRAINING
    got = step(model, tokens, labels=labels)
    assert got[0].logits is None
    assert_same_step(got, want, **ALL_KERNELS)  # the norms and MLP run our kernels too


def test_generate_runs_the_model_s_own_forward(clean_kernels):
    register_library_kernels(devices=[DEVICE])
    reference = tiny("llama").eval()
    model = tiny("llama").eval()
    model.use_kernels = True
    assert kernel_layer_of(model).__name__ == "CausalLMFusedLoss"
    prompt = batch(4)[0]
    settings = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(prompt, **settings), reference.generate(prompt, **settings))


def test_tag_on_kernelize_without_losses(clean_kernels):
    register_library_kernels(devices=[DEVICE])
    tag_on_kernelize(losses=False)  # a training loop that reads the logits
    model = tiny("llama")
    model.use_kernels = True
    assert kernel_layer_of(model) is None
    assert kernel_layer_of(model.model.layers[0].mlp).__name__ == "SwiGLUMLP"
    tokens, labels, _ = batch()
    assert model(tokens, labels=labels).logits is not None


# ---- transformers' "ForCausalLMLoss" mapping --------------------------------------------------


def test_for_causal_lm_loss_layer_serves_5_24_s_loss_function(clean_kernels):
    """5.24 maps the name "ForCausalLMLoss" (to Liger's layer on cuda) but tags nothing with it;
    a function module of 5.24's ``ForCausalLMLoss`` tagged with it, kernelized with our
    mapping, is our layer: the model's own forward hands it the logits, and it computes their
    loss through our kernels, as 5.24's function does."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    model = tiny("llama")
    reference = copy.deepcopy(model)
    loss_fn = use_kernel_forward_from_hub("ForCausalLMLoss")(ForCausalLMLoss)
    with use_kernel_mapping(library_mapping(devices=[DEVICE], layers=["ForCausalLMLoss"])):
        kernelize(loss_fn, mode=Mode.TRAINING, device=DEVICE)
    assert kernel_layer_of(loss_fn).__name__ == "ForCausalLMLoss"

    def loss_function(logits, labels, vocab_size, **kwargs):  # through the function module
        return loss_fn(logits, labels, vocab_size, **kwargs)

    model.loss_function = loss_function
    # the fused forward steps aside for a loss_function of one's own
    kernelized(model, layers=LOSS)
    tokens, labels, _ = batch()
    items = torch.tensor(9, device=DEVICE)
    got = step(model, tokens, labels=labels, num_items_in_batch=items)
    assert got[0].logits is not None
    assert_same_step(got, step(reference, tokens, labels=labels, num_items_in_batch=items))
    # Liger's keyword contract for the name: hidden states and the lm_head weight, no logits
    hidden = torch.randn(2, 9, 32, device=DEVICE)
    fused = loss_fn(None, labels, VOCAB, hidden_states=hidden, lm_head_weight=model.lm_head.weight)
    torch.testing.assert_close(fused, transformers_loss(model.lm_head(hidden), labels))
