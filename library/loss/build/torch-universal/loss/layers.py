"""Kernel layers: each replaces the ``forward`` of a tagged module and keeps its signature.

A kernel layer has no state and no ``__init__``: ``kernelize`` binds ``forward`` to the original
module instance, so ``self`` is e.g. a transformers ``LlamaForCausalLM`` and the layer reads that
module's own ``model``, ``lm_head``, ``config`` and ``loss_function``.

- ``ForCausalLMLoss`` stands for transformers' loss function of that name (transformers 5.x
  maps the layer name ``"ForCausalLMLoss"``); its signature is the function's.
- ``CausalLMFusedLoss`` and ``GemmaCausalLMFusedLoss`` replace the whole ``forward`` of a
  ``*ForCausalLM`` model whose forward is, word for word, transformers 4.57's
  ``LlamaForCausalLM.forward`` (32 classes) or ``Gemma2ForCausalLM.forward`` (Gemma 2, Gemma 3,
  Gemma 3n, VaultGemma; soft-capping); ``kernels.library.tag_causal_lm_losses`` reads the
  source before it tags a class. In training with labels they compute the loss fused and
  return no logits; otherwise they call the model's own forward.
"""

import torch

from .causal_lm import for_causal_lm_loss, fused_causal_lm_forward, takes_fused_loss


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


class CausalLMFusedLoss(torch.nn.Module):
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


class GemmaCausalLMFusedLoss(torch.nn.Module):
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


# How ``kernels`` runs each layer when tensor parallelism hands it DTensors (its shard rule, an
# attribute of the forward function so the classes keep only the members kernel layers may
# have): ``"plain"``, the module's own forward. Where only the model's parameters are
# parallelised, ``takes_fused_loss`` sees the hooks on ``lm_head`` and keeps the model's forward.
for _layer in (ForCausalLMLoss, CausalLMFusedLoss, GemmaCausalLMFusedLoss):
    _layer.forward.shard_rule = "plain"
del _layer
