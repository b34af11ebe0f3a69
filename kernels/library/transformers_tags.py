"""Tagging what transformers leaves untagged: gated MLPs, `apply_rotary_pos_emb` (4.57) and
the causal-LM loss.

transformers 4.57 tags its norms and activation modules, so `kernelize` reaches those by
itself. Its gated MLP classes carry no layer name, its attention layers call the module
global ``apply_rotary_pos_emb``, which `kernelize` cannot see, and its ``*ForCausalLM`` models
compute their logits and then their loss in one ``forward`` that nothing tags. transformers
5.24 tags ``apply_rotary_pos_emb`` itself, but still neither the gated MLPs nor the
``*ForCausalLM`` forwards. The functions here make them reachable, and only where the code is
exactly the formula our kernels compute: each reads the source of what it tags and leaves
anything else alone (logged at INFO).
"""

from __future__ import annotations

import ast
import contextlib
import copy
import functools
import inspect
import logging
import sys
import textwrap
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, TypeGuard

from ..layer.decorators import (
    use_kernel_forward_from_hub,
    use_kernel_func_from_hub,
    use_kernelized_func,
)
from ..layer.func import ATTACHED_ATTRIBUTE, is_attached
from ..layer.own_forward import own_forward
from ..layer.tagging import (
    CONDITION_ATTRIBUTE,
    TAG_ATTRIBUTE,
    replace_kernel_forward_from_hub,
    tag_of,
)

if TYPE_CHECKING:
    from torch import nn

logger = logging.getLogger(__name__)

#: The layer name of our kernel for Llama-style gated MLPs.
GATED_MLP_LAYER_NAME = "SwiGLUMLP"
#: The function kernel name transformers 5.x gives ``apply_rotary_pos_emb``; our rotary
#: kernel is registered under it.
ROTARY_FUNCTION_NAME = "rotary_pos_emb"
#: The layer names of our kernels for whole ``*ForCausalLM`` forwards: transformers 4.57's
#: ``LlamaForCausalLM.forward`` (and its copies), ``Gemma2ForCausalLM.forward`` (Gemma 2, 3,
#: 3n, VaultGemma: final-logit soft-capping), ``MixtralForCausalLM.forward`` (MoE models
#: that add the router's load-balancing loss: Qwen2Moe, Qwen3Moe, OlMoE, ...) and 5.24's
#: ``DeepseekV3ForCausalLM.forward`` (MoE models that return their router logits and add no
#: loss of them: DeepseekV2/V3, Glm4Moe, Dots1, ...).
CAUSAL_LM_LAYER_NAMES = (
    "CausalLMFusedLoss",
    "GemmaCausalLMFusedLoss",
    "MoeCausalLMFusedLoss",
    "MoeRouterCausalLMFusedLoss",
)

_GATED_MLP_ATTRIBUTES = ("gate_proj", "up_proj", "down_proj", "act_fn")
_GATED_MLP_EXPRESSION = "self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))"

# transformers' rotate-half RoPE, as Llama, Mistral, Qwen2, Qwen3, Gemma and their copies define
# it (docstrings and comments aside): what our rotary kernel computes.
_ROTARY_FUNCTION = "apply_rotary_pos_emb"
_ROTARY_SOURCE = """
def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed
"""
_ROTATE_HALF_SOURCE = """
def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)
"""


# What the tag functions changed, as calls that put it back (newest last).
_undo: list[Callable[[], None]] = []
# (tagger, the function that removes it) for the tagger `tag_on_kernelize` added, while it is.
_kernelize_tagger: list[tuple[Callable[[nn.Module], object], Callable[[], None]]] = []


def untag() -> None:
    """Undo every change `tag_gated_mlps`, `tag_rotary_embeddings` and `tag_causal_lm_losses`
    made in this process, and stop `tag_on_kernelize`'s tagging.

    The tagged MLP and ``*ForCausalLM`` classes lose their layer name, and each modelling
    module gets its own ``apply_rotary_pos_emb`` function back (and the attention classes
    their attachments).
    Models kernelized before keep their swapped MLP forwards, but their attention calls the
    original rotary function again. For programs that tag models they build and then hand the
    process back (a demo, a test), so that models built later start as transformers made them.
    """
    while _kernelize_tagger:
        _kernelize_tagger.pop()[1]()
    while _undo:
        _undo.pop()()


@contextlib.contextmanager
def untag_on_exit() -> Iterator[None]:
    """Undo, when the block exits, the tags made inside it (and only those).

    Example:
        ```python
        from kernels import Mode, explain
        from kernels.library.transformers_tags import tag_transformers_layers, untag_on_exit

        with untag_on_exit():
            tag_transformers_layers(model)
            print(explain(model, mode=Mode.INFERENCE))
        ```
    """
    start = len(_undo)
    try:
        yield
    finally:
        while len(_undo) > start:
            _undo.pop()()


def tag_transformers_layers(model: nn.Module) -> list[str]:
    """`tag_gated_mlps` and `tag_rotary_embeddings` on `model`: the class names tagged.

    On transformers 5.x, which tags ``apply_rotary_pos_emb`` itself, only the gated MLPs are
    left to tag.
    """
    tagged = tag_gated_mlps(model) + tag_rotary_embeddings(model)
    if tagged:
        logger.info("tagged what transformers leaves untagged: %s", ", ".join(tagged))
    return tagged


def tag_on_kernelize(*, losses: bool = True) -> None:
    """Have `kernelize` tag every model before planning it: `tag_transformers_layers` and, with
    ``losses`` (the default), `tag_causal_lm_losses`.

    Models that transformers builds and kernelizes itself (``from_pretrained(...,
    use_kernels=True)``, ``model.use_kernels = True``, ``model.train()``) then get their gated
    MLPs (and, on 4.57, their rotary embeddings) tagged before their layers are looked at, and
    their ``*ForCausalLM`` forward tagged for the fused loss: in training with labels such a
    model returns its loss and ``logits=None``. ``losses=False`` leaves the forwards alone (a
    training loop that reads the logits). Calling it again with the same ``losses`` changes
    nothing, with the other one replaces the tagger (tags already made stay); `untag` stops it.
    `register_library_kernels` calls it with the default.
    """
    from ..layer.taggers import add_tagger

    tagger = _tag_for_kernelize if losses else tag_transformers_layers
    if _kernelize_tagger and _kernelize_tagger[0][0] is tagger:
        return
    while _kernelize_tagger:
        _kernelize_tagger.pop()[1]()
    _kernelize_tagger.append((tagger, add_tagger(tagger)))


def _tag_for_kernelize(model: nn.Module) -> list[str]:
    """The tagger `tag_on_kernelize` adds by default: `tag_transformers_layers` and
    `tag_causal_lm_losses` (the class names tagged)."""
    tagged = tag_transformers_layers(model)
    losses = tag_causal_lm_losses(model)
    if losses:
        logger.info("tagged for the fused causal-LM loss: %s", ", ".join(losses))
    return tagged + losses


def _untagged_classes(model: nn.Module, qualifies: Callable[[nn.Module], bool]):
    """``(name, class)`` of each class of ``model``'s modules that carries no layer name yet,
    at its first module that ``qualifies`` (``name``: that module's path)."""
    seen: set[type] = set()
    for name, module in model.named_modules():
        cls = type(module)
        if cls in seen or not qualifies(module):
            continue
        seen.add(cls)
        if tag_of(cls) is None:
            yield name, cls


# What tagging a class sets on it, and untag() removes.
_TAG_ATTRIBUTES = (TAG_ATTRIBUTE, CONDITION_ATTRIBUTE)


def _remove_class_attributes(cls: type, names: tuple[str, ...]) -> None:
    for name in names:
        if name in vars(cls):
            delattr(cls, name)


def _restore_class_attribute(cls: type, name: str, value: object) -> None:
    if value is None:
        _remove_class_attributes(cls, (name,))
    else:
        setattr(cls, name, value)


def _function_ast(func: Callable | None) -> ast.FunctionDef | None:
    """The parsed definition of `func`, docstring dropped; None where the source is unknown."""
    if func is None:
        return None
    try:
        source = textwrap.dedent(inspect.getsource(func))
        function = ast.parse(source).body[0]
    except (AttributeError, OSError, TypeError, SyntaxError, IndexError):
        return None
    if not isinstance(function, ast.FunctionDef):
        return None
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        function.body = body[1:]
    return function


def _same_definition(func: Callable, source: str) -> bool:
    """Whether `func` is defined exactly as `source` (names, arguments, defaults, body)."""
    function = _function_ast(func)
    expected = ast.parse(source).body[0]
    return function is not None and ast.dump(function) == ast.dump(expected)


# ---- gated MLPs ------------------------------------------------------------------------------


def _has_gated_mlp_attributes(module: nn.Module) -> bool:
    return all(hasattr(module, a) for a in _GATED_MLP_ATTRIBUTES)


def _computes_gated_mlp(cls: type) -> bool:
    """Whether ``cls.forward`` is ``forward(self, x)`` returning exactly
    ``self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))`` (directly or through
    one local variable), undecorated: what the ``SwiGLUMLP`` kernel computes.

    transformers 4.57 has classes with the same four attributes and ``forward(self, x)`` that
    compute something else (``BitNetMLP`` normalises before ``down_proj``, ``FalconH1MLP``
    scales, ``T5GemmaMLP`` applies dropout), so the attributes alone do not decide.
    """
    function = _function_ast(getattr(cls, "forward", None))
    if function is None or function.decorator_list:
        return False
    args = function.args
    if (
        [a.arg for a in args.posonlyargs + args.args] != ["self", "x"]
        or args.vararg
        or args.kwonlyargs
        or args.kwarg
        or args.defaults
    ):
        return False
    match function.body:
        case [ast.Return(value=expression)]:
            pass
        case [
            ast.Assign(targets=[ast.Name(id=name)], value=expression),
            ast.Return(value=ast.Name(id=returned)),
        ] if name == returned:
            pass
        case _:
            return False
    return expression is not None and ast.unparse(expression) == _GATED_MLP_EXPRESSION


def tag_gated_mlps(model: nn.Module) -> list[str]:
    """Tag the untagged Llama-style gated MLP classes in ``model`` as ``"SwiGLUMLP"``.

    transformers 4.57 tags its norms and activation modules but not ``LlamaMLP``,
    ``MistralMLP``, ``Qwen2MLP``, ``Qwen3MLP`` and their copies in other models, so
    ``kernelize`` cannot reach them. This tags, through `replace_kernel_forward_from_hub`, the
    class of every submodule that has ``gate_proj``, ``up_proj``, ``down_proj`` and ``act_fn``,
    whose class carries no layer name yet, and whose ``forward(self, x)`` computes exactly
    ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` (its source is read; a class whose
    ``forward`` differs, e.g. with dropout or a norm inside, is left alone and logged).

    Tagging marks the class, so all its instances (in every model, and its subclasses) are
    tagged; it changes nothing until `kernelize` runs with a mapping that serves
    ``"SwiGLUMLP"`` (`library_mapping()` does). The kernel fuses ``act_fn(gate) * up`` when
    ``act_fn`` is SiLU and otherwise runs the module's own formula. Pass ``verify=`` to
    `kernelize` to have each swapped MLP checked against its own forward on real inputs.

    Returns:
        The names of the classes tagged by this call, in the order first met.

    Example:
        ```python
        from kernels import Mode, kernelize, library_mapping, use_kernel_mapping
        from kernels.library import tag_gated_mlps

        tag_gated_mlps(model)  # e.g. ["LlamaMLP"]
        with use_kernel_mapping(library_mapping()):
            kernelize(model, mode=Mode.TRAINING, verify=example_input_ids)
        ```
    """
    tagged: list[str] = []
    for name, cls in _untagged_classes(model, _has_gated_mlp_attributes):
        if not _computes_gated_mlp(cls):
            logger.info(
                "%s (%s.%s) has gate_proj, up_proj, down_proj and act_fn but its forward is not "
                "down_proj(act_fn(gate_proj(x)) * up_proj(x)); not tagged as %r",
                name or "<model>",
                cls.__module__,
                cls.__qualname__,
                GATED_MLP_LAYER_NAME,
            )
            continue
        replace_kernel_forward_from_hub(cls, GATED_MLP_LAYER_NAME)
        _undo.append(functools.partial(_remove_class_attributes, cls, _TAG_ATTRIBUTES))
        tagged.append(cls.__name__)
    return tagged


# ---- rotary embeddings -----------------------------------------------------------------------


def _rotary_module(namespace: dict) -> nn.Module | None:
    """The function module standing for ``apply_rotary_pos_emb`` in the module globals
    `namespace`, made on first use.

    The global is replaced by a module instance (tagged ``"rotary_pos_emb"``) that calls the
    original function, which is what transformers 5.x's ``@use_kernel_func_from_hub`` does at
    definition time; calls through the global then go through whatever forward `kernelize`
    gives that instance. None when the global is not transformers' rotate-half formula (or its
    ``rotate_half`` is not the usual one).
    """
    from torch import nn

    current = namespace.get(_ROTARY_FUNCTION)
    if isinstance(current, nn.Module):
        return current if tag_of(type(current)) == ROTARY_FUNCTION_NAME else None
    if not (
        inspect.isfunction(current)
        and _same_definition(current, _ROTARY_SOURCE)
        and inspect.isfunction(namespace.get("rotate_half"))
        and _same_definition(namespace["rotate_half"], _ROTATE_HALF_SOURCE)
        and namespace.get("torch") is sys.modules.get("torch")
        and _calls_fit_new_signature(sys.modules.get(namespace.get("__name__", "")))
    ):
        return None
    module = use_kernel_func_from_hub(ROTARY_FUNCTION_NAME)(_with_new_signature(current))
    namespace[_ROTARY_FUNCTION] = module
    _undo.append(functools.partial(namespace.__setitem__, _ROTARY_FUNCTION, current))
    logger.debug(
        "%s.%s now calls through a kernelizable module", namespace.get("__name__"), _ROTARY_FUNCTION
    )
    return module


def _calls_fit_new_signature(module: ModuleType | None) -> bool:
    """Whether every use of ``apply_rotary_pos_emb`` in `module`'s source is a call that passes
    at most ``q, k, cos, sin`` positionally and no keyword but ``unsqueeze_dim``: such calls
    mean the same with transformers 4.57's signature and with 5.x's, which dropped the unused
    ``position_ids`` before ``unsqueeze_dim``."""
    if module is None:
        return False
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError, SyntaxError):
        return False
    checked: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_rotary_name(node.func):
            if (
                len(node.args) > 4
                or any(isinstance(a, ast.Starred) for a in node.args)
                or any(kw.arg != "unsqueeze_dim" for kw in node.keywords)
            ):
                return False
            checked.add(id(node.func))
    # Any other read of the name (passed along, stored) could reach a call we cannot see.
    return all(
        id(node) in checked
        for node in ast.walk(tree)
        if _is_rotary_name(node) and isinstance(node.ctx, ast.Load)
    )


def _is_rotary_name(node: ast.AST) -> TypeGuard[ast.Name]:
    return isinstance(node, ast.Name) and node.id == _ROTARY_FUNCTION


def _with_new_signature(original: Callable) -> Callable:
    """`original` (transformers 4.57's ``apply_rotary_pos_emb``) with transformers 5.x's
    signature, the one our rotary kernel has, so that `kernelize` accepts the kernel for it."""

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        return original(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)

    # No ``__wrapped__``: inspect.signature would follow it back to the 4.57 signature.
    # Functions take any attribute; the checker knows only those every function has.
    apply_rotary_pos_emb.original = original  # type: ignore[attr-defined]
    apply_rotary_pos_emb.__module__ = original.__module__
    apply_rotary_pos_emb.__doc__ = original.__doc__
    return apply_rotary_pos_emb


def tag_rotary_embeddings(model: nn.Module) -> list[str]:
    """Make transformers 4.57's ``apply_rotary_pos_emb`` kernelizable in ``model``'s attention.

    transformers 4.57's attention layers call ``apply_rotary_pos_emb``, a plain function of
    their modelling module (``modeling_llama`` and co.), which `kernelize` cannot see.
    transformers 5.x makes it a kernelizable function named ``"rotary_pos_emb"`` and attaches it
    to the attention class; this does the same for 4.57: for every class in ``model`` whose
    ``forward`` calls the module global ``apply_rotary_pos_emb``, when that global is exactly
    transformers' rotate-half formula (its source is read, and its ``rotate_half``'s), the global
    is replaced by a function module tagged ``"rotary_pos_emb"`` that calls the original, and
    the module is attached to the class with `use_kernelized_func`. A class whose function
    differs (partial rotary, interleaved, multimodal sections) is left alone and logged.
    The function module has transformers 5.x's signature ``(q, k, cos, sin, unsqueeze_dim=1)``
    (4.57's had an unused ``position_ids`` before ``unsqueeze_dim``), so it is only made where
    every call in the modelling module passes at most ``q, k, cos, sin`` positionally.

    The replacement behaves as the original until `kernelize` runs with a mapping that serves
    ``"rotary_pos_emb"`` (`library_mapping()` does). It is one object per modelling module,
    as in transformers 5.x: kernelizing one model swaps it for every model of that module in
    the process, so kernelize the models you run together for the same device. Our rotary
    kernel runs the PyTorch formula for tensors it does not take, CPU tensors included
    (without ``TRITON_INTERPRET=1``).

    Returns:
        The names of the classes this call attached the function to, in the order first met.

    Example:
        ```python
        from kernels import Mode, kernelize, library_mapping, use_kernel_mapping
        from kernels.library import tag_gated_mlps, tag_rotary_embeddings

        tag_rotary_embeddings(model)  # e.g. ["LlamaAttention"]
        tag_gated_mlps(model)  # e.g. ["LlamaMLP"]
        with use_kernel_mapping(library_mapping()):
            kernelize(model, mode=Mode.TRAINING)
        ```
    """
    tagged: list[str] = []
    seen: set[type] = set()
    for name, module in model.named_modules():
        cls = type(module)
        if cls in seen:
            continue
        seen.add(cls)
        # transformers wraps some forwards (deprecated keyword arguments): read the inner one,
        # and look the global up where that function looks it up.
        forward = getattr(cls, "forward", None)
        if forward is None:
            continue
        forward = inspect.unwrap(forward)
        if not inspect.isfunction(forward) or _ROTARY_FUNCTION not in forward.__code__.co_names:
            continue
        rotary = _rotary_module(forward.__globals__)
        if rotary is None:
            logger.info(
                "%s (%s.%s) calls %s, which is not transformers' rotate-half formula; not "
                "tagged as %r",
                name or "<model>",
                cls.__module__,
                cls.__qualname__,
                _ROTARY_FUNCTION,
                ROTARY_FUNCTION_NAME,
            )
            continue
        if is_attached(module, rotary):
            continue
        previous = vars(cls).get(ATTACHED_ATTRIBUTE)
        use_kernelized_func(rotary)(cls)
        _undo.append(functools.partial(_restore_class_attribute, cls, ATTACHED_ATTRIBUTE, previous))
        tagged.append(cls.__name__)
    return tagged


# ---- causal-LM losses ------------------------------------------------------------------------

# The ``*ForCausalLM.forward`` bodies that our loss layers reimplement (argument and variable
# annotations, docstrings and comments aside), per transformers line; the layer name each is
# tagged with is the same on both lines, and the loss repository's ``layers`` module gives that
# name the layer whose signature fits the installed transformers.
#
# transformers 4.57: ``LlamaForCausalLM``'s, which 31 other ``*ForCausalLM`` classes share word
# for word, and ``Gemma2ForCausalLM``'s (Gemma 3, Gemma 3n and VaultGemma share it), which
# soft-caps the logits.
_LLAMA_FORWARD_4_57 = """
@can_return_tuple
@auto_docstring
def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
            inputs_embeds=None, labels=None, use_cache=None, cache_position=None,
            logits_to_keep=0, **kwargs):
    outputs = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, past_key_values=past_key_values,
                         inputs_embeds=inputs_embeds, use_cache=use_cache,
                         cache_position=cache_position, **kwargs)
    hidden_states = outputs.last_hidden_state
    slice_indices = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
    logits = self.lm_head(hidden_states[:, slice_indices, :])
    loss = None
    if labels is not None:
        loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
    return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=outputs.past_key_values,
                                  hidden_states=outputs.hidden_states, attentions=outputs.attentions)
"""
_GEMMA2_FORWARD_4_57 = """
@can_return_tuple
@auto_docstring
def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
            inputs_embeds=None, labels=None, use_cache=None, output_attentions=None,
            output_hidden_states=None, cache_position=None, logits_to_keep=0, **kwargs):
    output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
    output_hidden_states = (
        output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
    )
    outputs = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, past_key_values=past_key_values,
                         inputs_embeds=inputs_embeds, use_cache=use_cache,
                         output_attentions=output_attentions,
                         output_hidden_states=output_hidden_states,
                         cache_position=cache_position, **kwargs)
    hidden_states = outputs.last_hidden_state
    slice_indices = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
    logits = self.lm_head(hidden_states[:, slice_indices, :])
    if self.config.final_logit_softcapping is not None:
        logits = logits / self.config.final_logit_softcapping
        logits = torch.tanh(logits)
        logits = logits * self.config.final_logit_softcapping
    loss = None
    if labels is not None:
        loss = self.loss_function(logits, labels, self.vocab_size, **kwargs)
    return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=outputs.past_key_values,
                                  hidden_states=outputs.hidden_states, attentions=outputs.attentions)
"""
# transformers 5.24: the cache argument is ``cache`` (``past_key_values`` still accepted, renamed
# by ``@deprecate_kwarg``), ``cache_position`` is gone, ``slice_logits_to_keep`` slices, the
# output's field is ``cache``, and Gemma 2 no longer takes ``output_attentions`` /
# ``output_hidden_states`` (they travel in ``**kwargs``). ``LlamaForCausalLM``'s is shared by
# 32 other ``*ForCausalLM`` classes, ``Gemma2ForCausalLM``'s by Gemma 3, Gemma 3n, VaultGemma
# and NanoChat. Some classes stack the three decorators in another order (see
# `_definition_key`).
_LLAMA_FORWARD_5_24 = """
@deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
@can_return_tuple
@auto_docstring
def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
            inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
    outputs = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, cache=cache, inputs_embeds=inputs_embeds,
                         use_cache=use_cache, **kwargs)
    hidden_states = outputs.last_hidden_state
    hidden_states = slice_logits_to_keep(hidden_states, logits_to_keep)
    logits = self.lm_head(hidden_states)
    loss = None
    if labels is not None:
        loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
    return CausalLMOutputWithPast(loss=loss, logits=logits, cache=outputs.cache,
                                  hidden_states=outputs.hidden_states, attentions=outputs.attentions)
"""
_GEMMA2_FORWARD_5_24 = """
@can_return_tuple
@auto_docstring
@deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
            inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
    outputs = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, cache=cache, inputs_embeds=inputs_embeds,
                         use_cache=use_cache, **kwargs)
    hidden_states = outputs.last_hidden_state
    hidden_states = slice_logits_to_keep(hidden_states, logits_to_keep)
    logits = self.lm_head(hidden_states)
    if self.config.final_logit_softcapping is not None:
        logits = logits / self.config.final_logit_softcapping
        logits = torch.tanh(logits)
        logits = logits * self.config.final_logit_softcapping
    loss = None
    if labels is not None:
        loss = self.loss_function(logits, labels, self.vocab_size, **kwargs)
    return CausalLMOutputWithPast(loss=loss, logits=logits, cache=outputs.cache,
                                  hidden_states=outputs.hidden_states, attentions=outputs.attentions)
"""

# The MoE forward that adds the router's load-balancing loss: transformers 4.57's
# ``MixtralForCausalLM.forward``, and 5.24's, which 19 other ``*ForCausalLM`` classes share
# word for word (Qwen2Moe, Qwen3Moe, Qwen3.5Moe, Qwen3Next, OlMoE, PhiMoE, GptOss, MiniMax,
# Jamba, Ernie 4.5 MoE, FlexOlmo, ...). ``load_balancing_loss_func`` is each modelling module's
# own; the layer calls that one.
_MIXTRAL_FORWARD_4_57 = """
@can_return_tuple
@auto_docstring
def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
            inputs_embeds=None, labels=None, use_cache=None, output_router_logits=None,
            cache_position=None, logits_to_keep=0, **kwargs):
    output_router_logits = (
        output_router_logits if output_router_logits is not None else self.config.output_router_logits
    )
    outputs = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, past_key_values=past_key_values,
                         inputs_embeds=inputs_embeds, use_cache=use_cache,
                         output_router_logits=output_router_logits,
                         cache_position=cache_position, **kwargs)
    hidden_states = outputs.last_hidden_state
    slice_indices = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
    logits = self.lm_head(hidden_states[:, slice_indices, :])
    loss = None
    if labels is not None:
        loss = self.loss_function(logits, labels, self.vocab_size, **kwargs)
    aux_loss = None
    if output_router_logits:
        aux_loss = load_balancing_loss_func(outputs.router_logits, self.num_experts,
                                            self.num_experts_per_tok, attention_mask)
        if labels is not None:
            loss += self.router_aux_loss_coef * aux_loss.to(loss.device)
    return MoeCausalLMOutputWithPast(loss=loss, aux_loss=aux_loss, logits=logits,
                                     past_key_values=outputs.past_key_values,
                                     hidden_states=outputs.hidden_states,
                                     attentions=outputs.attentions,
                                     router_logits=outputs.router_logits)
"""
_MIXTRAL_FORWARD_5_24 = """
@can_return_tuple
@auto_docstring
@deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
            inputs_embeds=None, labels=None, use_cache=None, output_router_logits=None,
            logits_to_keep=0, **kwargs):
    output_router_logits = (
        output_router_logits if output_router_logits is not None else self.config.output_router_logits
    )
    outputs = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, cache=cache, inputs_embeds=inputs_embeds,
                         use_cache=use_cache, output_router_logits=output_router_logits, **kwargs)
    hidden_states = outputs.last_hidden_state
    hidden_states = slice_logits_to_keep(hidden_states, logits_to_keep)
    logits = self.lm_head(hidden_states)
    loss = None
    if labels is not None:
        loss = self.loss_function(logits, labels, self.vocab_size, **kwargs)
    aux_loss = None
    if output_router_logits:
        aux_loss = load_balancing_loss_func(outputs.router_logits, self.num_experts,
                                            self.num_experts_per_tok, attention_mask)
        if labels is not None:
            loss += self.router_aux_loss_coef * aux_loss.to(loss.device)
    return MoeCausalLMOutputWithPast(loss=loss, aux_loss=aux_loss, logits=logits,
                                     cache=outputs.cache, hidden_states=outputs.hidden_states,
                                     attentions=outputs.attentions,
                                     router_logits=outputs.router_logits)
"""

# The MoE forward that returns the router logits and adds no loss of them (DeepSeek-V3 balances
# its experts with a bias on the router's scores, not with a loss): transformers 5.24's
# ``DeepseekV3ForCausalLM.forward``, which 20 other ``*ForCausalLM`` classes share word for word
# (DeepseekV2, DeepseekV3.2, Glm4Moe, Glm4MoeLite, Dots1, HunYuanMoEV1, LongcatFlash, Lfm2Moe,
# KimiLinear, Mistral4, ...). It is 5.24's Llama forward (the decorators stacked in Gemma 2's
# order, which `_definition_key` ignores) over a base model that records ``router_logits``
# (when ``output_router_logits`` travels in ``**kwargs``), returned in
# ``MoeCausalLMOutputWithPast``. In 4.57 these classes returned ``CausalLMOutputWithPast`` with
# Llama's forward word for word, and are ``"CausalLMFusedLoss"`` there.
_LLAMA_OUTPUT_5_24 = """
    return CausalLMOutputWithPast(loss=loss, logits=logits, cache=outputs.cache,
                                  hidden_states=outputs.hidden_states, attentions=outputs.attentions)
"""
_DEEPSEEK_V3_FORWARD_5_24 = _LLAMA_FORWARD_5_24.replace(
    _LLAMA_OUTPUT_5_24,
    """
    return MoeCausalLMOutputWithPast(loss=loss, logits=logits, cache=outputs.cache,
                                     hidden_states=outputs.hidden_states,
                                     attentions=outputs.attentions,
                                     router_logits=outputs.router_logits)
""",
)
# HYV3ForCausalLM (5.24) writes the same forward with ``aux_loss=None``, the field's default.
_HYV3_FORWARD_5_24 = _DEEPSEEK_V3_FORWARD_5_24.replace(
    "(loss=loss, logits=logits,", "(loss=loss, aux_loss=None, logits=logits,"
)

#: (layer name, forward source) of every forward `tag_causal_lm_losses` recognises.
_CAUSAL_LM_FORWARDS: tuple[tuple[str, str], ...] = (
    ("CausalLMFusedLoss", _LLAMA_FORWARD_4_57),
    ("GemmaCausalLMFusedLoss", _GEMMA2_FORWARD_4_57),
    ("CausalLMFusedLoss", _LLAMA_FORWARD_5_24),
    ("GemmaCausalLMFusedLoss", _GEMMA2_FORWARD_5_24),
    ("MoeCausalLMFusedLoss", _MIXTRAL_FORWARD_4_57),
    ("MoeCausalLMFusedLoss", _MIXTRAL_FORWARD_5_24),
    ("MoeRouterCausalLMFusedLoss", _DEEPSEEK_V3_FORWARD_5_24),
    ("MoeRouterCausalLMFusedLoss", _HYV3_FORWARD_5_24),
)

# The module globals the forwards above read that decide what they compute, and where
# transformers defines each (module, attribute; None: the module itself). A class whose forward
# reads one of them bound to something else (its own output class, its own slicing) is not
# tagged. ``auto_docstring`` only writes documentation and is not checked.
_TRANSFORMERS_GLOBALS = {
    "torch": ("torch", None),
    "CausalLMOutputWithPast": ("transformers.modeling_outputs", "CausalLMOutputWithPast"),
    "MoeCausalLMOutputWithPast": ("transformers.modeling_outputs", "MoeCausalLMOutputWithPast"),
    "can_return_tuple": ("transformers.utils.generic", "can_return_tuple"),
    "deprecate_kwarg": ("transformers.utils.deprecation", "deprecate_kwarg"),
    "slice_logits_to_keep": ("transformers.modeling_utils", "slice_logits_to_keep"),
}


class _WithoutAnnotations(ast.NodeTransformer):
    """Drops type annotations: of arguments and return values, and ``x: T = v`` becomes
    ``x = v`` (transformers annotates ``outputs`` in some copies and not in others)."""

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.annotation = None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.returns = None
        self.generic_visit(node)
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        if node.value is None or not node.simple:
            return node
        return ast.Assign(targets=[node.target], value=node.value, lineno=node.lineno)


def _definition_key(function: ast.FunctionDef) -> str:
    """What two forwards must share to compute the same: their definition without annotations,
    and with the decorators in a fixed order. transformers 5.24 stacks ``deprecate_kwarg``,
    ``can_return_tuple`` and ``auto_docstring`` outermost first in ``LlamaForCausalLM`` and
    innermost first in ``Gemma2ForCausalLM`` and ``Ernie4_5ForCausalLM``; the order does not
    change what the forward does (one renames a keyword argument, one pops ``return_dict``
    and converts the output, one writes the docstring), and a forward must still carry exactly
    the template's decorators, with the template's arguments."""
    function = _WithoutAnnotations().visit(copy.deepcopy(function))
    function.decorator_list = sorted(function.decorator_list, key=ast.dump)
    return ast.dump(function)


@functools.cache
def _causal_lm_templates() -> dict[str, tuple[str, frozenset[str]]]:
    """Definition key -> (layer name, the `_TRANSFORMERS_GLOBALS` the forward reads)."""
    templates: dict[str, tuple[str, frozenset[str]]] = {}
    for name, source in _CAUSAL_LM_FORWARDS:
        function = ast.parse(source).body[0]
        assert isinstance(function, ast.FunctionDef), name  # each template is one `def`
        read = {node.id for node in ast.walk(function) if isinstance(node, ast.Name)}
        key = _definition_key(function)
        if key in templates and templates[key][0] != name:
            # e.g. a template derived from another by a replacement that no longer matches
            raise RuntimeError(
                f"two forwards of _CAUSAL_LM_FORWARDS are the same, tagged {templates[key][0]!r} "
                f"and {name!r}; each forward must be tagged with one layer name"
            )
        templates[key] = (name, frozenset(read & _TRANSFORMERS_GLOBALS.keys()))
    return templates


def _transformers_global(name: str) -> object:
    """The object transformers (or torch) binds to `name` (see `_TRANSFORMERS_GLOBALS`), or a
    fresh sentinel where the installed release does not define it."""
    import importlib

    module_name, attribute = _TRANSFORMERS_GLOBALS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return object()
    return module if attribute is None else getattr(module, attribute, object())


def _causal_lm_layer(cls: type) -> str | None:
    """The layer name of our kernel whose forward computes what ``cls.forward`` does, or None:
    the forward (read from its source) must be one of ``_CAUSAL_LM_FORWARDS``, the globals it
    reads bound to transformers' own (``CausalLMOutputWithPast``, ``slice_logits_to_keep``, ...)."""
    forward = getattr(cls, "forward", None)
    if forward is None:
        return None
    function = _function_ast(forward)
    if function is None:
        return None
    template = _causal_lm_templates().get(_definition_key(function))
    if template is None:
        return None
    name, read = template
    # transformers wraps the forward (deprecated keyword arguments, return_dict): the innermost
    # function's globals are its modelling module's.
    namespace = inspect.unwrap(forward).__globals__
    bound = all(namespace.get(g, None) is _transformers_global(g) for g in read)
    return name if bound else None


def _runs_forward(forward: Callable, module: nn.Module) -> bool:
    # The tag's condition: an instance of a subclass that defines its own forward keeps it
    # (a class kernelize made to bind a kernel is no such subclass).
    return own_forward(module) is forward


def tag_causal_lm_losses(model: nn.Module) -> list[str]:
    """Tag ``model``'s ``*ForCausalLM`` classes so that `kernelize` fuses their training loss.

    transformers computes a causal LM's loss from logits it materialises in full (and copies
    to fp32): tokens x vocabulary, gigabytes per step for Llama 3, Qwen3 or Gemma vocabularies.
    This tags, through `use_kernel_forward_from_hub`, every class of ``model`` (the model
    itself, usually) whose ``forward`` is exactly ``LlamaForCausalLM.forward`` of transformers
    4.57 or 5.24 (shared by Mistral, Qwen2, Qwen3, Phi3, Gemma, Olmo2 and others), tagged
    ``"CausalLMFusedLoss"``, ``Gemma2ForCausalLM.forward`` (Gemma 2 and 3, with final-logit
    soft-capping), tagged ``"GemmaCausalLMFusedLoss"``, ``MixtralForCausalLM.forward`` (MoE
    models that add the router's load-balancing loss: Qwen2Moe, Qwen3Moe, OlMoE, ...), tagged
    ``"MoeCausalLMFusedLoss"``, or 5.24's ``DeepseekV3ForCausalLM.forward`` (MoE models that
    return their router logits without a loss of them: DeepseekV2, Glm4Moe, Dots1, ...), tagged
    ``"MoeRouterCausalLMFusedLoss"``; it reads the source, and leaves any other forward alone
    (INFO log line): other MoE forwards, encoder-decoder decoders, models with their own loss.
    The two transformers lines differ in the forward's signature (5.24: ``cache`` for
    ``past_key_values``, no ``cache_position``) and output (``cache=``); the loss repository
    gives each layer name the layer that fits the installed transformers.

    `library_mapping()` serves the four names with layers of our ``loss`` repository. After
    `kernelize`, a forward with ``labels`` in training mode (``model.train()``) computes the
    loss with the fused linear cross-entropy and returns ``logits=None``: the logits are never
    held. Everything else calls the model's own forward: ``labels=None`` (generation,
    inference), evaluation mode (``model.eval()``, e.g. a Trainer computing metrics from the
    logits), ``logits_to_keep`` other than 0, a ``loss_function`` of your own, an ``lm_head``
    with hooks or that is not a plain ``torch.nn.Linear`` (LoRA, quantized, ZeRO-3), CPU
    tensors without the Triton interpreter. The tag's condition leaves subclasses that define
    their own ``forward`` alone. `tag_on_kernelize` (which `register_library_kernels` calls)
    has `kernelize` call this on every model.

    Returns:
        The names of the classes tagged by this call, in the order first met.

    Example:
        ```python
        from kernels import Mode, kernelize, library_mapping, use_kernel_mapping
        from kernels.library import tag_causal_lm_losses

        tag_causal_lm_losses(model)  # e.g. ["LlamaForCausalLM"]
        with use_kernel_mapping(library_mapping()):
            kernelize(model, mode=Mode.TRAINING)
        model(input_ids, labels=input_ids).loss.backward()  # no logits held
        ```
    """
    tagged: list[str] = []
    for name, cls in _untagged_classes(model, lambda module: hasattr(module, "lm_head")):
        layer_name = _causal_lm_layer(cls)
        if layer_name is None:
            logger.info(
                "%s (%s.%s) has an lm_head but its forward is not transformers' (4.57 or 5.24) "
                "LlamaForCausalLM, Gemma2ForCausalLM, MixtralForCausalLM or (5.24) "
                "DeepseekV3ForCausalLM forward; its loss is not fused",
                name or "<model>",
                cls.__module__,
                cls.__qualname__,
            )
            continue
        condition = functools.partial(_runs_forward, cls.forward)
        use_kernel_forward_from_hub(layer_name, condition=condition)(cls)
        _undo.append(functools.partial(_remove_class_attributes, cls, _TAG_ATTRIBUTES))
        tagged.append(cls.__name__)
    return tagged
