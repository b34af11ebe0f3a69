"""transformers' causal-LM loss (``ForCausalLMLoss``) on top of the fused kernel, and the
forward of a ``*ForCausalLM`` model that computes its training loss without logits.

transformers scores position t of a sequence against label t + 1 (the labels are shifted, the
last position of each sequence is ignored), averages over the labels that are not
``ignore_index`` or, when given ``num_items_in_batch`` (gradient accumulation), divides the
summed loss by it. The logits are upcast to fp32 before the loss; here they are read in their
own dtype and every reduction is done in fp32, which computes the same.
"""

import torch
import torch.nn.functional as F

from ._library import SUPPORTED_DTYPES
from .fused_linear_cross_entropy import _runs_kernels, cross_entropy, fused_linear_cross_entropy


def shift_labels(labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """transformers' shift: position t is scored against ``labels[..., t + 1]``; the last
    position of each sequence gets ``ignore_index``. Same shape as ``labels``."""
    return F.pad(labels, (0, 1), value=ignore_index)[..., 1:]


def _targets(labels, shifted, ignore_index, rows: int, device, what: str) -> torch.Tensor:
    targets = shift_labels(labels, ignore_index) if shifted is None else shifted
    targets = targets.reshape(-1).to(device)
    if targets.numel() != rows:
        raise ValueError(
            f"{what}: {targets.numel()} labels for {rows} positions (labels of shape "
            f"{tuple((labels if shifted is None else shifted).shape)}); give one label a position"
        )
    return targets


def causal_lm_loss(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor | None,
    bias: torch.Tensor | None = None,
    *,
    num_items_in_batch: int | float | torch.Tensor | None = None,
    ignore_index: int = -100,
    shift_labels: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
    softcap: float | None = None,
    chunk_size: int | None = None,
    vocab_chunk: int | None = None,
    fp32_weight_grad: bool = False,
) -> torch.Tensor:
    """transformers' ``ForCausalLMLoss(lm_head(hidden_states), labels, ...)``, fused.

    ``hidden_states`` are the last hidden states (``[batch, seq, hidden]``, before
    ``lm_head``), ``weight`` and ``bias`` the ``lm_head``'s. ``labels`` are shifted as
    transformers shifts them, unless ``shift_labels`` (already shifted) is given. ``softcap``
    is the model's ``final_logit_softcapping`` (Gemma 2 and 3). Returns the fp32 scalar loss;
    the other arguments are `fused_linear_cross_entropy`'s.
    """
    hidden = hidden_states.reshape(-1, hidden_states.shape[-1])
    if labels is None and shift_labels is None:
        raise ValueError("causal_lm_loss: give labels (or shift_labels)")
    targets = _targets(
        labels, shift_labels, ignore_index, hidden.shape[0], hidden.device, "causal_lm_loss"
    )
    return fused_linear_cross_entropy(
        hidden, weight, targets, bias, ignore_index=ignore_index,
        num_items_in_batch=num_items_in_batch, label_smoothing=label_smoothing, softcap=softcap,
        chunk_size=chunk_size, vocab_chunk=vocab_chunk, fp32_weight_grad=fp32_weight_grad,
    )  # fmt: skip


def causal_lm_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor | None,
    *,
    num_items_in_batch: int | float | torch.Tensor | None = None,
    ignore_index: int = -100,
    shift_labels: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """transformers' ``ForCausalLMLoss(logits, labels, ...)`` on logits that exist, through
    our kernels: no fp32 copy of the logits, and their gradient made in the forward in their
    own dtype (a model returns its logits, so they are not overwritten)."""
    rows = logits.reshape(-1, logits.shape[-1])
    if labels is None and shift_labels is None:
        raise ValueError("causal_lm_cross_entropy: give labels (or shift_labels)")
    what = "causal_lm_cross_entropy"
    targets = _targets(labels, shift_labels, ignore_index, rows.shape[0], rows.device, what)
    return cross_entropy(
        rows, targets, ignore_index=ignore_index, num_items_in_batch=num_items_in_batch,
        label_smoothing=label_smoothing,
    )  # fmt: skip


def _softcapped(logits: torch.Tensor, softcap: float | None) -> torch.Tensor:
    # As Gemma 2 and 3 write it: divide, tanh, multiply.
    if softcap is None:
        return logits
    return torch.tanh(logits / softcap) * softcap


def lm_head_and_loss(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    *,
    return_logits: bool = False,
    softcap: float | None = None,
    num_items_in_batch: int | float | torch.Tensor | None = None,
    ignore_index: int = -100,
    shift_labels: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(loss, logits)`` of a causal LM head, the logits made only when they are wanted.

    - no labels: ``(None, logits)``, plain ``lm_head`` (and soft-capping);
    - labels, ``return_logits=False`` (training): ``(causal_lm_loss(...), None)``, fused;
    - labels and ``return_logits=True`` (evaluation with metrics): the logits as without
      labels, and their loss through `causal_lm_cross_entropy`.
    """
    has_labels = labels is not None or shift_labels is not None
    if has_labels and not return_logits:
        loss = causal_lm_loss(
            hidden_states, weight, labels, bias, num_items_in_batch=num_items_in_batch,
            ignore_index=ignore_index, shift_labels=shift_labels, label_smoothing=label_smoothing,
            softcap=softcap, chunk_size=chunk_size,
        )  # fmt: skip
        return loss, None
    logits = _softcapped(F.linear(hidden_states, weight, bias), softcap)
    if not has_labels:
        return None, logits
    loss = causal_lm_cross_entropy(
        logits, labels, num_items_in_batch=num_items_in_batch, ignore_index=ignore_index,
        shift_labels=shift_labels, label_smoothing=label_smoothing,
    )  # fmt: skip
    return loss, logits


# ---- transformers' ForCausalLMLoss, as the "ForCausalLMLoss" layer sees it --------------------


def _torch_for_causal_lm_loss(logits, labels, vocab_size, num_items_in_batch, ignore_index,
                              shift_labels):  # fmt: skip
    """transformers 4.57 / 5.x ``ForCausalLMLoss``, for logits our kernels do not take."""
    logits = logits.float()
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    logits = logits.view(-1, vocab_size)
    shift_labels = shift_labels.reshape(-1).to(logits.device)
    if num_items_in_batch is None:
        return F.cross_entropy(logits, shift_labels, ignore_index=ignore_index, reduction="mean")
    loss = F.cross_entropy(logits, shift_labels, ignore_index=ignore_index, reduction="sum")
    if isinstance(num_items_in_batch, torch.Tensor):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


def for_causal_lm_loss(
    logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None,
    **kwargs,
):  # fmt: skip
    """What the ``"ForCausalLMLoss"`` layer computes; transformers' ``ForCausalLMLoss``
    signature.

    - ``hidden_states=`` and ``lm_head_weight=`` given (the keyword contract of Liger's
      ``LigerForCausalLMLossLayer``, which transformers 5.x maps this name to; ``logits`` may
      then be None): the fused loss, without logits. Also read: ``lm_head_bias``,
      ``final_logit_softcapping``; ``hidden_size`` is accepted and not needed.
    - otherwise ``logits``: the loss of those logits through our kernels
      (`causal_lm_cross_entropy`), or transformers' formula for logits the kernels do not
      take (a dtype they lack, CPU tensors without the Triton interpreter).

    Other keyword arguments (transformers passes the model's ``**kwargs`` along) are ignored,
    as transformers' function ignores them.
    """
    hidden_states = kwargs.get("hidden_states")
    weight = kwargs.get("lm_head_weight")
    if hidden_states is not None and weight is not None:
        return causal_lm_loss(
            hidden_states, weight, labels, kwargs.get("lm_head_bias"),
            num_items_in_batch=num_items_in_batch, ignore_index=ignore_index,
            shift_labels=shift_labels, softcap=kwargs.get("final_logit_softcapping"),
        )  # fmt: skip
    if logits is None:
        raise ValueError(
            "ForCausalLMLoss: no logits, and not both hidden_states= and lm_head_weight= (the "
            "fused loss needs the last hidden states and the lm_head weight)"
        )
    if logits.dtype in SUPPORTED_DTYPES and _runs_kernels(logits.device):
        return causal_lm_cross_entropy(
            logits, labels, num_items_in_batch=num_items_in_batch, ignore_index=ignore_index,
            shift_labels=shift_labels,
        )  # fmt: skip
    return _torch_for_causal_lm_loss(
        logits, labels, vocab_size, num_items_in_batch, ignore_index, shift_labels
    )


# ---- a *ForCausalLM model's forward with the fused loss ---------------------------------------


def _has_hooks(module: torch.nn.Module) -> bool:
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or module._backward_hooks
        or module._backward_pre_hooks
    )


def _global_hooks() -> bool:
    module = torch.nn.modules.module
    return bool(
        module._global_forward_hooks
        or module._global_forward_pre_hooks
        or module._global_backward_hooks
        or module._global_backward_pre_hooks
    )


def _is_transformers_causal_lm_loss(fn) -> bool:
    # The model's loss_function, unless a user or a library set their own.
    return (
        getattr(fn, "__name__", None) == "ForCausalLMLoss"
        and getattr(fn, "__module__", None) == "transformers.loss.loss_utils"
    )


def takes_fused_loss(model: torch.nn.Module, labels, logits_to_keep) -> bool:
    """Whether a ``*ForCausalLM`` forward may compute its loss fused, returning no logits:
    training (``model.training``) with labels and every position kept; the model's own loss
    function transformers' ``ForCausalLMLoss``; a plain ``torch.nn.Linear`` ``lm_head``
    (not a subclass, LoRA or quantized wrapper), without hooks (ZeRO-3 and FSDP gather its
    weight in them), nor global module hooks, of a dtype and on a device the kernels take.
    Anything else (evaluation, ``labels=None``, generation) runs the model's own forward."""
    if labels is None or not model.training:
        return False
    if type(logits_to_keep) is not int or logits_to_keep != 0:
        return False
    if not _is_transformers_causal_lm_loss(model.loss_function):
        return False
    head = getattr(model, "lm_head", None)
    if type(head) is not torch.nn.Linear or _has_hooks(head) or "forward" in head.__dict__:
        return False
    if _global_hooks():
        return False
    weight = head.weight
    return (
        type(weight) is torch.nn.Parameter
        and weight.dtype in SUPPORTED_DTYPES
        and _runs_kernels(weight.device)
    )


def cache_output_field() -> str:
    """The field of the installed transformers' ``CausalLMOutputWithPast`` that holds the KV
    cache: ``"past_key_values"`` (4.57) or ``"cache"`` (5.24, which renamed it together with the
    forwards' ``past_key_values`` argument). Read from the class itself, not from a version
    number, so that the layers take the signature and output of the transformers in the
    process. Raises ImportError without transformers."""
    import dataclasses

    from transformers.modeling_outputs import CausalLMOutputWithPast

    fields = {field.name for field in dataclasses.fields(CausalLMOutputWithPast)}
    return "cache" if "cache" in fields else "past_key_values"


def _detach_cache(cache) -> None:
    """Detach the keys and values a transformers cache returns from the training step's graph.

    The attention has read them already (and saved what its backward needs), and nothing of the
    fused loss reads them; attached, under torch.compile each is an output of the compiled graph
    that needs a gradient, and AOTAutograd makes a zero one for each in the backward (two
    ``[tokens, kv width]`` tensors a layer above the step's peak). Caches without per-layer
    ``keys`` and ``values`` tensors are left as they are."""
    for layer in getattr(cache, "layers", None) or ():
        for name in ("keys", "values"):
            value = getattr(layer, name, None)
            if isinstance(value, torch.Tensor) and value.requires_grad:
                setattr(layer, name, value.detach())


def _base_model_and_loss(model, model_inputs: dict, labels, kwargs: dict, softcap):
    """The base model on ``model_inputs`` and ``kwargs``, then ``causal_lm_loss`` of its last
    hidden state: ``(outputs, loss, return_dict)``, ``return_dict`` as transformers'
    ``can_return_tuple`` reads it (``kwargs``' ``return_dict`` popped)."""
    return_dict = model.config.return_dict if hasattr(model, "config") else True
    passed = kwargs.pop("return_dict", return_dict)
    if passed is not None:
        return_dict = passed
    outputs = model.model(**model_inputs, **kwargs)
    for name in ("cache", "past_key_values"):
        _detach_cache(getattr(outputs, name, None))
    head = model.lm_head
    loss = causal_lm_loss(
        outputs.last_hidden_state, head.weight, labels, head.bias,
        num_items_in_batch=kwargs.get("num_items_in_batch"),
        ignore_index=kwargs.get("ignore_index", -100), shift_labels=kwargs.get("shift_labels"),
        softcap=softcap,
    )  # fmt: skip
    return outputs, loss, return_dict


def fused_causal_lm_forward(
    model, model_inputs: dict, labels, kwargs: dict, softcap, cache_field: str = "past_key_values"
):
    """The rest of a Llama-style ``*ForCausalLM.forward`` with the fused loss: the base model on
    ``model_inputs`` and ``kwargs``, then ``causal_lm_loss`` of its last hidden state. Returns
    ``CausalLMOutputWithPast(loss=..., logits=None, <cache_field>=..., ...)`` (``cache_field``:
    the name of the cache in the base model's output and in the returned one, which
    transformers 5.24 renamed from ``past_key_values`` to ``cache``), or its tuple where
    transformers' ``can_return_tuple`` would (``return_dict=False``, or a config that says so)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    outputs, loss, return_dict = _base_model_and_loss(model, model_inputs, labels, kwargs, softcap)
    output = CausalLMOutputWithPast(
        loss=loss,
        logits=None,
        hidden_states=outputs.hidden_states,
        attentions=outputs.attentions,
        **{cache_field: getattr(outputs, cache_field)},
    )
    return output if return_dict else output.to_tuple()


def _model_global(model, name: str):
    """What the module that defines ``type(model).forward`` binds to ``name`` (the forward's
    own globals, read through transformers' decorators): e.g. Mixtral's
    ``load_balancing_loss_func``, which each MoE modelling module defines for itself."""
    import inspect

    return inspect.unwrap(type(model).forward).__globals__[name]


def fused_moe_causal_lm_forward(
    model, model_inputs: dict, labels, kwargs: dict, attention_mask, add_aux_loss,
    cache_field: str = "past_key_values",
):  # fmt: skip
    """The rest of an MoE ``*ForCausalLM.forward`` with the fused loss. The cross-entropy is
    `causal_lm_loss`'s. With ``add_aux_loss`` (``MixtralForCausalLM.forward`` and its copies,
    where they output the router logits: the resolved ``output_router_logits``, which
    ``model_inputs`` hold already), the load-balancing loss is the model's own
    ``load_balancing_loss_func`` (from its modelling module) of them, added to the loss times
    ``router_aux_loss_coef``, as the model adds it. Without, ``aux_loss`` is None: Mixtral's
    forward without router logits, and 5.24's ``DeepseekV3ForCausalLM.forward`` and its copies,
    which return the router logits and add no loss of them. Returns
    ``MoeCausalLMOutputWithPast(loss=..., aux_loss=..., logits=None, router_logits=..., ...)``,
    or its tuple where ``can_return_tuple`` would."""
    from transformers.modeling_outputs import MoeCausalLMOutputWithPast

    outputs, loss, return_dict = _base_model_and_loss(model, model_inputs, labels, kwargs, None)
    aux_loss = None
    if add_aux_loss:
        load_balancing_loss_func = _model_global(model, "load_balancing_loss_func")
        aux_loss = load_balancing_loss_func(
            outputs.router_logits, model.num_experts, model.num_experts_per_tok, attention_mask
        )
        loss = loss + model.router_aux_loss_coef * aux_loss.to(loss.device)
    output = MoeCausalLMOutputWithPast(
        loss=loss,
        aux_loss=aux_loss,
        logits=None,
        hidden_states=outputs.hidden_states,
        attentions=outputs.attentions,
        router_logits=outputs.router_logits,
        **{cache_field: getattr(outputs, cache_field)},
    )
    return output if return_dict else output.to_tuple()
