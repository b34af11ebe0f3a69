"""Kernel layers: each replaces the ``forward`` of a tagged module and keeps its signature.

A kernel layer has no state and no ``__init__``: ``kernelize`` binds ``forward`` to the original
module instance, so ``self`` is e.g. a transformers ``LlamaForCausalLM`` and the layer reads that
module's own ``model``, ``lm_head``, ``config`` and ``loss_function``.

- ``ForCausalLMLoss`` stands for transformers' loss function of that name (transformers 5.x
  maps the layer name ``"ForCausalLMLoss"``); its signature is the function's, the same in
  4.57 and 5.24.
- ``CausalLMFusedLoss`` and ``GemmaCausalLMFusedLoss`` replace the whole ``forward`` of a
  ``*ForCausalLM`` model whose forward is, word for word, ``LlamaForCausalLM.forward`` or
  ``Gemma2ForCausalLM.forward`` (soft-capping) of transformers 4.57 or 5.24;
  ``kernels.library.tag_causal_lm_losses`` reads the source before it tags a class. In
  training with labels they compute the loss fused and return no logits; otherwise they call
  the model's own forward.
- ``MoeCausalLMFusedLoss`` does the same for ``MixtralForCausalLM.forward`` (4.57 or 5.24)
  and its copies (Qwen2Moe, Qwen3Moe, OlMoE, ...): the fused cross-entropy plus
  ``router_aux_loss_coef`` times the model's own ``load_balancing_loss_func`` of the router
  logits (when they are output), ``aux_loss`` and ``router_logits`` returned as the model does.
- ``MoeRouterCausalLMFusedLoss`` does the same for transformers 5.24's
  ``DeepseekV3ForCausalLM.forward`` and its copies (DeepseekV2, Glm4Moe, Dots1, ...): Llama's
  forward over an MoE base model, returning ``MoeCausalLMOutputWithPast`` with the router
  logits and no auxiliary loss. 4.57 has no such forward (those classes had Llama's there).

The two transformers lines give those forwards different signatures (5.24: ``cache`` for
``past_key_values``, no ``cache_position``, and for Gemma 2 no ``output_attentions`` /
``output_hidden_states``), and ``kernelize`` accepts a layer only with the exact signature of
the forward it replaces. So each of the names has a layer per line that has the forward, and
the name resolves, on first look-up (``layers.CausalLMFusedLoss``, which is how ``kernels``
loads a layer), to the one whose signature fits the transformers in the process: decided by the
fields of its ``CausalLMOutputWithPast`` (`cache_output_field`), which importing transformers
is needed for and nothing else here imports. Without transformers the names are the 4.57
layers.
"""

import functools

import torch

from .causal_lm import (
    cache_output_field,
    for_causal_lm_loss,
    fused_causal_lm_forward,
    fused_moe_causal_lm_forward,
    takes_fused_loss,
)


class ForCausalLMLoss(torch.nn.Module):
    """transformers' ``ForCausalLMLoss(logits, labels, vocab_size, num_items_in_batch=None,
    ignore_index=-100, shift_labels=None, **kwargs)``: fused when called with
    ``hidden_states=`` and ``lm_head_weight=`` (Liger's contract for this layer name),
    otherwise the loss of ``logits`` through our kernels (no fp32 copy of them)."""

    has_backward = True
    can_torch_compile = True

    def forward(
        self,
        logits,
        labels,
        vocab_size,
        num_items_in_batch=None,
        ignore_index=-100,
        shift_labels=None,
        **kwargs,
    ):
        return for_causal_lm_loss(
            logits, labels, vocab_size, num_items_in_batch, ignore_index, shift_labels, **kwargs
        )


# ---- transformers 4.57 ------------------------------------------------------------------------


class _CausalLMFusedLoss457(torch.nn.Module):
    """transformers 4.57 ``LlamaForCausalLM.forward`` (and the 31 other ``*ForCausalLM``
    classes with the same forward: Mistral, Qwen2, Qwen3, Phi3, Gemma, Olmo2, ...), with the
    training loss fused: ``logits`` is None then (see ``takes_fused_loss``)."""

    has_backward = True
    can_torch_compile = True

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        inputs_embeds=None,
        labels=None,
        use_cache=None,
        cache_position=None,
        logits_to_keep=0,
        **kwargs,
    ):
        if not takes_fused_loss(self, labels, logits_to_keep):
            return type(self).forward(
                self, input_ids, attention_mask, position_ids, past_key_values, inputs_embeds,
                labels, use_cache, cache_position, logits_to_keep, **kwargs,
            )  # fmt: skip
        inputs = dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            cache_position=cache_position,
        )
        return fused_causal_lm_forward(self, inputs, labels, kwargs, softcap=None)


class _GemmaCausalLMFusedLoss457(torch.nn.Module):
    """transformers 4.57 ``Gemma2ForCausalLM.forward`` (Gemma 3, Gemma 3n and VaultGemma have
    the same), with the training loss fused, the final-logit soft-capping
    (``config.final_logit_softcapping``) included: ``logits`` is None then."""

    has_backward = True
    can_torch_compile = True

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        inputs_embeds=None,
        labels=None,
        use_cache=None,
        output_attentions=None,
        output_hidden_states=None,
        cache_position=None,
        logits_to_keep=0,
        **kwargs,
    ):
        if not takes_fused_loss(self, labels, logits_to_keep):
            return type(self).forward(
                self, input_ids, attention_mask, position_ids, past_key_values, inputs_embeds,
                labels, use_cache, output_attentions, output_hidden_states, cache_position,
                logits_to_keep, **kwargs,
            )  # fmt: skip
        config = self.config
        if output_attentions is None:
            output_attentions = config.output_attentions
        if output_hidden_states is None:
            output_hidden_states = config.output_hidden_states
        inputs = dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            cache_position=cache_position,
        )
        softcap = config.final_logit_softcapping
        return fused_causal_lm_forward(self, inputs, labels, kwargs, softcap=softcap)


class _MoeCausalLMFusedLoss457(torch.nn.Module):
    """transformers 4.57 ``MixtralForCausalLM.forward`` (and the ``*ForCausalLM`` MoE classes
    with the same forward: Qwen2Moe, Qwen3Moe, OlMoE, ...), with the training loss fused,
    the router's load-balancing loss added as the model adds it: ``logits`` is None then."""

    has_backward = True
    can_torch_compile = True

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        past_key_values=None,
        inputs_embeds=None,
        labels=None,
        use_cache=None,
        output_router_logits=None,
        cache_position=None,
        logits_to_keep=0,
        **kwargs,
    ):
        if not takes_fused_loss(self, labels, logits_to_keep):
            return type(self).forward(
                self, input_ids, attention_mask, position_ids, past_key_values, inputs_embeds,
                labels, use_cache, output_router_logits, cache_position, logits_to_keep,
                **kwargs,
            )  # fmt: skip
        if output_router_logits is None:
            output_router_logits = self.config.output_router_logits
        inputs = dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_router_logits=output_router_logits,
            cache_position=cache_position,
        )
        return fused_moe_causal_lm_forward(
            self, inputs, labels, kwargs, attention_mask, output_router_logits
        )


# ---- transformers 5.24 ------------------------------------------------------------------------


@functools.cache
def _with_transformers_deprecation(forward):
    # transformers' own decorator, with the arguments the tagged forwards carry (the tagger
    # compares them), so that renaming, warnings (only ``past_key_values``: a FutureWarning
    # while transformers is older than 5.40; both names: ``cache`` wins, always warned) and
    # their messages are transformers' own, not a copy that could drift from them.
    from transformers.utils.deprecation import deprecate_kwarg

    return deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")(forward)


def _renames_past_key_values(forward):
    """transformers 5.24's ``@deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")``
    around ``forward``.

    The forwards these layers replace carry that decorator, and ``kernelize`` binds the
    layer's forward in place of the decorated one, so the layer must rename the old keyword
    itself. Calls that pass ``past_key_values=`` go through transformers' decorator (built on
    the first such call, so that this repository imports transformers only when a
    transformers model runs it); every other call goes straight to ``forward``.
    """

    @functools.wraps(forward)  # keeps forward's signature for kernelize's check (__wrapped__)
    def renaming(self, *args, **kwargs):
        if "past_key_values" in kwargs:
            return _with_transformers_deprecation(forward)(self, *args, **kwargs)
        return forward(self, *args, **kwargs)

    return renaming


def _llama_forward_5_24(fused):
    """A ``forward`` with the signature of transformers 5.24's ``LlamaForCausalLM.forward``,
    which Gemma 2's and DeepSeek-V3's forwards have too: where `takes_fused_loss` allows it,
    ``fused(model, inputs, labels, kwargs)``, the rest of the forward with the fused loss
    (``inputs``: what the forward passes its base model besides ``kwargs``); else the model's
    own forward. One definition of the signature for the three layers that take it."""

    @_renames_past_key_values
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        cache=None,
        inputs_embeds=None,
        labels=None,
        use_cache=None,
        logits_to_keep=0,
        **kwargs,
    ):
        if not takes_fused_loss(self, labels, logits_to_keep):
            return type(self).forward(
                self, input_ids, attention_mask, position_ids, cache, inputs_embeds, labels,
                use_cache, logits_to_keep, **kwargs,
            )  # fmt: skip
        inputs = dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
        )
        return fused(self, inputs, labels, kwargs)

    return forward


def _fused_llama_5_24(model, inputs, labels, kwargs):
    return fused_causal_lm_forward(model, inputs, labels, kwargs, softcap=None, cache_field="cache")


def _fused_gemma2_5_24(model, inputs, labels, kwargs):
    softcap = model.config.final_logit_softcapping
    return fused_causal_lm_forward(
        model, inputs, labels, kwargs, softcap=softcap, cache_field="cache"
    )


def _fused_deepseek_v3_5_24(model, inputs, labels, kwargs):
    # MoeCausalLMOutputWithPast with the base model's router logits (recorded when
    # output_router_logits travels in kwargs), and no loss of them added: aux_loss stays None.
    return fused_moe_causal_lm_forward(
        model, inputs, labels, kwargs, attention_mask=None, add_aux_loss=False, cache_field="cache"
    )


class _CausalLMFusedLoss524(torch.nn.Module):
    """transformers 5.24 ``LlamaForCausalLM.forward`` (and the 32 other ``*ForCausalLM``
    classes with the same forward: Mistral, Qwen2, Qwen3, Qwen3.5, Phi3, Gemma, Olmo2, ...),
    with the training loss fused: ``logits`` is None then (see ``takes_fused_loss``)."""

    has_backward = True
    can_torch_compile = True

    forward = _llama_forward_5_24(_fused_llama_5_24)


class _GemmaCausalLMFusedLoss524(torch.nn.Module):
    """transformers 5.24 ``Gemma2ForCausalLM.forward`` (Gemma 3, Gemma 3n, VaultGemma and
    NanoChat have the same), with the training loss fused, the final-logit soft-capping
    (``config.final_logit_softcapping``) included: ``logits`` is None then."""

    has_backward = True
    can_torch_compile = True

    forward = _llama_forward_5_24(_fused_gemma2_5_24)


class _MoeCausalLMFusedLoss524(torch.nn.Module):
    """transformers 5.24 ``MixtralForCausalLM.forward`` (and the 19 other ``*ForCausalLM`` MoE
    classes with the same forward: Qwen2Moe, Qwen3Moe, Qwen3.5Moe, Qwen3Next, OlMoE, PhiMoE,
    GptOss, MiniMax, Jamba, ...), with the training loss fused, the router's load-balancing
    loss added as the model adds it: ``logits`` is None then (see ``takes_fused_loss``)."""

    has_backward = True
    can_torch_compile = True

    @_renames_past_key_values
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        cache=None,
        inputs_embeds=None,
        labels=None,
        use_cache=None,
        output_router_logits=None,
        logits_to_keep=0,
        **kwargs,
    ):
        if not takes_fused_loss(self, labels, logits_to_keep):
            return type(self).forward(
                self, input_ids, attention_mask, position_ids, cache, inputs_embeds, labels,
                use_cache, output_router_logits, logits_to_keep, **kwargs,
            )  # fmt: skip
        if output_router_logits is None:
            output_router_logits = self.config.output_router_logits
        inputs = dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_router_logits=output_router_logits,
        )
        return fused_moe_causal_lm_forward(
            self, inputs, labels, kwargs, attention_mask, output_router_logits, cache_field="cache"
        )


class _MoeRouterCausalLMFusedLoss524(torch.nn.Module):
    """transformers 5.24 ``DeepseekV3ForCausalLM.forward`` (and the 21 other ``*ForCausalLM``
    MoE classes with the same forward: DeepseekV2, DeepseekV3.2, Glm4Moe, Dots1,
    HunYuanMoEV1, LongcatFlash, Lfm2Moe, Mistral4, ...), with the training loss fused:
    ``logits`` is None then (see ``takes_fused_loss``).

    Its own name, apart from ``MoeCausalLMFusedLoss``, because the forward differs from
    Mixtral's in what matters: it returns the router logits (``MoeCausalLMOutputWithPast``)
    and adds no loss of them (DeepSeek-V3 balances its experts with a bias on the router's
    scores, not with an auxiliary loss), and takes no ``output_router_logits`` argument (the
    base model reads it from ``**kwargs``). transformers 4.57 has no such forward: these
    classes had Llama's there, and are ``CausalLMFusedLoss`` on that line."""

    has_backward = True
    can_torch_compile = True

    forward = _llama_forward_5_24(_fused_deepseek_v3_5_24)


# ---- the layer names ------------------------------------------------------------------------

# The layers of each transformers line, by layer name; keyed by `cache_output_field`.
_CAUSAL_LM_LAYERS = {
    "past_key_values": {
        "CausalLMFusedLoss": _CausalLMFusedLoss457,
        "GemmaCausalLMFusedLoss": _GemmaCausalLMFusedLoss457,
        "MoeCausalLMFusedLoss": _MoeCausalLMFusedLoss457,
    },
    "cache": {
        "CausalLMFusedLoss": _CausalLMFusedLoss524,
        "GemmaCausalLMFusedLoss": _GemmaCausalLMFusedLoss524,
        "MoeCausalLMFusedLoss": _MoeCausalLMFusedLoss524,
        "MoeRouterCausalLMFusedLoss": _MoeRouterCausalLMFusedLoss524,
    },
}
# Every layer name, on either line; `__getattr__` says which line lacks one.
_LAYER_NAMES = frozenset(name for layers in _CAUSAL_LM_LAYERS.values() for name in layers)

for _layers in _CAUSAL_LM_LAYERS.values():
    for _name, _layer in _layers.items():
        # Named as the layer name they serve, which is how kernelize's messages, `kernels
        # explain` and ``kernel_layer_of(module).__name__`` show them.
        _layer.__name__ = _layer.__qualname__ = _name
del _layers, _name, _layer


@functools.cache
def _causal_lm_layers() -> dict:
    try:
        field = cache_output_field()
    except ImportError:  # no transformers: nothing these layers could replace
        field = "past_key_values"
    return _CAUSAL_LM_LAYERS[field]


def __getattr__(name):
    # PEP 562: called for names this module does not define, i.e. the causal-LM layer names.
    if name not in _LAYER_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    layers = _causal_lm_layers()
    if name not in layers:
        # MoeRouterCausalLMFusedLoss under transformers 4.57: nothing there has its forward.
        raise AttributeError(
            f"module {__name__!r} has no layer {name!r} for the transformers in this process "
            f"(4.57's line, or none: its CausalLMOutputWithPast has no 'cache' field): the "
            f"forward it replaces is transformers 5.24's. Layers for this line: "
            f"{', '.join(sorted(layers))}"
        )
    return layers[name]


def __dir__():
    # Only the layers `__getattr__` gives on this transformers line: code that walks
    # ``dir(layers)`` and calls ``getattr`` on each name (``kernels check``, a kernel mapping
    # that lists a repository's layers) must not meet a name it then refuses.
    return sorted({*globals(), *_causal_lm_layers()})


# How ``kernels`` runs each layer when tensor parallelism hands it DTensors (its shard rule, an
# attribute of the forward function so the classes keep only the members kernel layers may
# have): ``"plain"``, the module's own forward. Where only the model's parameters are
# parallelised, ``takes_fused_loss`` sees the hooks on ``lm_head`` and keeps the model's forward.
for _layer in (
    ForCausalLMLoss,
    _CausalLMFusedLoss457,
    _GemmaCausalLMFusedLoss457,
    _CausalLMFusedLoss524,
    _GemmaCausalLMFusedLoss524,
    _MoeCausalLMFusedLoss457,
    _MoeCausalLMFusedLoss524,
    _MoeRouterCausalLMFusedLoss524,
):
    _layer.forward.shard_rule = "plain"
del _layer
