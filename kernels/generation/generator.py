"""`CudaGraphGenerator` and `fast_generate`: transformers' ``generate()`` with its decode steps
replayed from CUDA graphs, and optionally our kernels, without ``torch.compile``.

``generate()`` runs unchanged (transformers 4.57 and 5.x). For the length of a call the model's
``forward`` is wrapped so that decode steps (one new token per sequence, on the generator's
static cache) go through `kernels.generation.decode.DecodeGraphs`; the prefill, the logits
processors, sampling and stopping run as ``generate()`` runs them. The generator passes a
``StaticCache`` of its own (one per batch size, kept between calls, so graphs are captured once)
and ``disable_compile=True``, so that ``generate()`` does not compile the forward itself.

A plain greedy call (`kernels.generation.fused_rule`) is taken over at its first decode step:
the wrapped forward raises `_HandOver` out of ``generate()``, with the arguments generate()
passed to that step, and `kernels.generation.fused_loop.FusedDecodeLoop` decodes the rest in
blocks of ``fused_steps`` steps per graph replay. The prefill and the first token are therefore
generate()'s own; every other call stays in generate()'s loop.

Example:
    ```python
    from kernels.generation import CudaGraphGenerator

    generator = CudaGraphGenerator(model, kernels=True)  # our Triton kernels, Mode.INFERENCE
    out = generator.generate(input_ids, attention_mask=mask, max_new_tokens=128, do_sample=False)
    print(generator.stats)  # captures, replays, eager steps
    ```
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .attributes import instance_attribute
from .cache import cache_argument, new_static_cache
from .cache_writes import kernel_cache_writes
from .decode import DecodeGraphs, DecodeStats
from .errors import UnsupportedGenerationError
from .folded_layers import FoldKernels, folded_decoder_layers
from .fused_loop import DEFAULT_FUSED_STEPS, FusedDecodeLoop
from .fused_rule import (
    ChoiceSettings,
    GenerateSetup,
    StopSettings,
    choice_settings,
    fused_blocker,
    recording_setup,
    stop_settings,
)
from .graph import EagerBackend, GraphBackend, default_backend
from .inputs import widen_padding_mask
from .projections import grouped_projections
from .step_outputs import StepOutputs, crop_static_cache, generate_output

logger = logging.getLogger(__name__)

#: Cache lengths are rounded up to a multiple of this, so that generations of similar lengths
#: share a cache and the graphs captured on it.
CACHE_LENGTH_STEP = 256

_GENERATOR_ATTRIBUTE = "_kernels_cuda_graph_generator"

#: generate()'s arguments that reach the model's forward though no model reads them.
_GENERATE_ONLY_ARGUMENTS = frozenset({"tokenizer", "assistant_tokenizer"})


@dataclass(frozen=True)
class _FusedPlan:
    """How the fused loop finishes a call: its prompt (one row a sequence, as generate() expanded
    it for ``num_return_sequences``), when it stops, where its first decode step feeds, how many
    tokens are left after that one, that step's arguments as the loop takes them (a 2D padding
    mask widened: `widen_padding_mask`), how its tokens are chosen (None: argmax), its
    streamer, whether it returns generate()'s output class (``return_dict_in_generate``) and
    what the loop keeps of each step for it (None: nothing)."""

    prompt: torch.Tensor
    stop: StopSettings
    position: int
    new_tokens: int
    step: dict[str, Any]
    choice: ChoiceSettings | None = None
    streamer: Any = None
    dict_output: bool = False
    keep: StepOutputs | None = None


class _HandOver(Exception):
    """Raised out of ``generate()`` by the wrapped forward at the first decode step of a call the
    fused loop takes; carries that step's keyword arguments and the plan."""

    def __init__(self, kwargs: dict[str, Any], plan: _FusedPlan):
        super().__init__("the fused loop takes over this generate() call")
        self.kwargs = kwargs
        self.plan = plan


class CudaGraphGenerator:
    """Generates with ``model.generate()``, replaying its decode steps from CUDA graphs.

    Each batch size gets a ``transformers.StaticCache`` and, after ``warmup_steps`` eager
    decode steps, one CUDA graph of the decode step; the graphs share one memory pool and are
    kept for later calls of `generate` with that batch size (and a cache long enough). The
    prefill and any step the graphs do not cover run eagerly. On a device other than CUDA the
    decode steps run eagerly (logged once), through the same static cache and buffers.

    Plain greedy calls (no sampling, no logits processor, no streamer, ...: see
    `kernels.generation.fused_rule`) skip ``generate()``'s per-step Python: after its prefill
    and first token, ``fused_steps`` decode steps at a time run from one graph, each step's
    argmax, end-token update and next inputs made on the device, and the host checks once per
    block whether every sequence has finished. The tokens are ``model.generate()``'s.

    Args:
        model: a transformers causal LM (decoder-only) whose layers use full attention.
        kernels: ``True`` to kernelize ``model`` with our Triton kernels (`library_mapping`,
            ``Mode.INFERENCE``, after tagging its gated MLPs and rotary embeddings), or a kernel
            mapping to kernelize with; ``False`` (default) leaves the model as it is.
        max_cache_len: the static cache's length in tokens (prompt plus new tokens). By
            default each call's need rounded up to a multiple of `CACHE_LENGTH_STEP`; a call
            needing more than a cache holds gets a new cache (and new graphs).
        warmup_steps: eager decode steps per batch size before its capture.
        backend: how steps are captured; by default CUDA graphs on CUDA, plain calls elsewhere
            (`kernels.generation.graph`).
        fused_steps: decode steps per graph of the fused loop (K), default
            `DEFAULT_FUSED_STEPS`; 0 turns the loop off, so that greedy calls too run through
            ``generate()``'s loop with one graph per step. With the loop on, the caches the
            generator sizes hold up to K - 1 more tokens (room for the steps a last block runs
            past the end).
        fold_layers: with our kernels (``kernels=True``), decode Llama-style decoder layers
            (Llama, Mistral, Qwen2, Qwen3 and their copies) with their RMSNorms and residual
            adds folded into the projections around them (`kernels.generation.folded_layers`):
            four fewer launches a layer, the same roundings but for the order in which a row's
            squares are summed. ``False`` decodes them as kernelized, module by module.

    Changing the model after a capture (new weights' tensors, kernelize, ``.to()``) leaves the
    graphs running the old code and memory: call `reset` then.

    Example:
        ```python
        from kernels.generation import CudaGraphGenerator

        with CudaGraphGenerator(model) as generator:
            for prompt in prompts:  # captured once per batch size, replayed after
                ids = generator.generate(**tokenizer(prompt, return_tensors="pt").to("cuda"),
                                         max_new_tokens=64)
        ```
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        kernels: bool | Mapping = False,
        max_cache_len: int | None = None,
        warmup_steps: int = 1,
        backend: GraphBackend | None = None,
        fused_steps: int = DEFAULT_FUSED_STEPS,
        fold_layers: bool = True,
    ):
        if not hasattr(model, "generate") or not hasattr(model, "config"):
            raise UnsupportedGenerationError(
                f"{type(model).__name__} has no generate(): pass a transformers causal LM "
                "(e.g. LlamaForCausalLM)"
            )
        if getattr(model.config, "is_encoder_decoder", False):
            raise UnsupportedGenerationError(
                f"{type(model).__name__} is an encoder-decoder model; CudaGraphGenerator "
                "captures decoder-only models: use model.generate() for it"
            )
        if max_cache_len is not None and max_cache_len < 2:
            raise ValueError(f"max_cache_len must be at least 2 tokens, got {max_cache_len}")
        if fused_steps < 0:
            raise ValueError(f"fused_steps must be >= 0 (0: no fused loop), got {fused_steps}")
        # Any: a transformers causal LM (checked above), whose generate() and config the
        # nn.Module annotation cannot show.
        self.model: Any = model
        self.device = _device_of(model)
        if backend is None:
            backend = default_backend(self.device)
            if isinstance(backend, EagerBackend):
                logger.warning(
                    "%s is on %s: CUDA graphs need a CUDA device, so its decode steps run "
                    "eagerly (through the static cache, with the same tokens)",
                    type(model).__name__,
                    self.device,
                )
        self.max_cache_len = max_cache_len
        self.kernelized = False
        self._projection_kernels = None  # the activation library's decode_mlp, with our kernels
        self._cache_kernels = None  # the rotary library (write_kv_cache), with our kernels
        self._fold_kernels: FoldKernels | None = None  # norms and adds folded, with our kernels
        self._graphs = DecodeGraphs(
            backend,
            cache_argument=cache_argument(model),
            device=self.device,
            warmup_steps=warmup_steps,
        )
        self.fused_steps = fused_steps
        self._fused = None
        if fused_steps:
            self._fused = FusedDecodeLoop(self._graphs, steps=fused_steps)
        self._caches: dict[int, tuple[Any, int]] = {}  # batch size -> (cache, length)
        self._logged: set[str] = set()
        self.fold_layers = fold_layers
        if kernels is not False:
            self.use_kernels(None if kernels is True else kernels)

    @property
    def stats(self) -> DecodeStats:
        """What the decode steps so far ran as: eager steps, captures, replays, failures, and
        the calls and tokens of the fused loop."""
        return self._graphs.stats_snapshot()

    def use_kernels(self, mapping: Mapping | None = None) -> None:
        """Kernelize the model for inference: with ``mapping``, or our Triton kernels
        (`library_mapping`) when None. Gated MLPs and rotary embeddings are tagged first
        (`tag_gated_mlps`, `tag_rotary_embeddings`), so that the kernels reach them. Drops the
        graphs captured so far, which ran the previous forwards."""
        from ..layer.kernelize import kernelize
        from ..library import library_mapping, tag_gated_mlps, tag_rotary_embeddings
        from ..mapping.mode import Mode
        from ..mapping.registry import use_kernel_mapping

        tag_gated_mlps(self.model)
        tag_rotary_embeddings(self.model)
        with use_kernel_mapping(library_mapping() if mapping is None else dict(mapping)):
            kernelize(self.model, mode=Mode.INFERENCE, device=self.device)
        self.kernelized = True
        if mapping is None:  # our kernels: attention's q, k and v and the cache writes too
            self._projection_kernels = _decode_kernels()
            self._cache_kernels = _library_package("rotary")
            self._fold_kernels = _fold_kernels() if self.fold_layers else None
        self.reset()

    def generate(self, inputs: torch.Tensor | None = None, **generate_kwargs: Any) -> Any:
        """``model.generate(inputs, **generate_kwargs)`` with decode steps from CUDA graphs.

        Takes what ``generate()`` takes, except a cache of your own (``past_key_values`` or
        ``cache``), a ``cache_implementation`` other than ``"static"``, ``use_cache=False``,
        beam search and assisted decoding. A call with ``output_attentions`` or
        ``output_hidden_states`` (per-step tensors of every layer, which a graph overwrites at
        every step) runs as ``model.generate()`` itself, logged. Greedy decoding gives the tokens
        of ``model.generate()``, sampling those it draws from the same seed. With
        ``return_dict_in_generate=True`` the output is ``generate()``'s output class, its
        ``scores`` and ``logits`` (where asked) those ``generate()`` keeps, its cache the
        generator's static cache for the batch size holding the positions ``generate()`` fed
        (the next call of that batch size resets it).

        Raises:
            UnsupportedGenerationError: for the settings above, or without a prompt.
        """
        _check_supported(self.model, generate_kwargs)
        per_layer = _per_layer_outputs(self.model, generate_kwargs)
        if per_layer is not None:
            self._log_once(
                f"generate(): runs as model.generate() itself, without graphs or the "
                f"generator's cache: {per_layer}=True keeps per-step tensors of every layer, "
                "which a graph overwrites at every step"
            )
            return self.model.generate(inputs, **generate_kwargs)
        batch, prompt = _prompt_shape(inputs, generate_kwargs)
        batch *= _setting(self.model, generate_kwargs, "num_return_sequences", 1) or 1
        needed = _needed_length(self.model, prompt, generate_kwargs)
        cache = self._cache_for(batch, needed, prompt)
        cache.reset()
        user_kwargs = dict(generate_kwargs)
        generate_kwargs[self._graphs.cache_argument] = cache
        # Our cache replaces the one cache_implementation would make (transformers refuses
        # both at once), and generate() must not torch.compile the forward we stand in front of.
        generate_kwargs["cache_implementation"] = None
        generate_kwargs["disable_compile"] = True

        def first_decode_step(kwargs: dict[str, Any]) -> None:
            plan = self._fused_plan(setup, inputs, user_kwargs, kwargs, cache)
            if plan is not None:
                raise _HandOver(plan.step, plan)

        with self._decode_projections(), self._kernel_cache_writes(cache):
            with (
                recording_setup(self.model) as setup,
                self._decode_through_graphs(first_decode_step),
            ):
                try:
                    return self.model.generate(inputs, **generate_kwargs)
                except _HandOver as handover:
                    step, plan = handover.kwargs, handover.plan
            # generate() has stopped at its first decode step (the forward raised before running
            # it): the prefill and the first token are its own; the fused loop makes the rest.
            assert self._fused is not None  # _fused_plan makes a plan only with the loop on
            with torch.no_grad():
                new = self._fused.decode(
                    self.model.forward,
                    step,
                    cache,
                    position=plan.position,
                    new_tokens=plan.new_tokens,
                    stop=plan.stop,
                    additive_mask=_sdpa_mask_dtype(self.model),
                    choice=plan.choice,
                    streamer=plan.streamer,
                    keep=plan.keep,
                )
        device = plan.prompt.device
        sequences = torch.cat(
            [plan.prompt, step["input_ids"].to(device), new.tokens.to(device)], dim=-1
        )
        if not plan.dict_output:
            return sequences
        # generate() fed every position but the last token's; the last block may have fed
        # more, which the cache returned must not hold.
        crop_static_cache(cache, sequences.shape[1] - 1)
        scores, logits = None, None
        if plan.keep is not None:
            # The first token's are generate()'s own, recorded as it made them (`_kept_outputs`
            # keeps nothing without them).
            assert setup.first_step is not None
            first_logits, first_scores = setup.first_step
            if new.scores is not None:
                scores = (first_scores, *new.scores)
            if new.logits is not None:
                logits = (first_logits, *new.logits)
        return generate_output(sequences, scores=scores, logits=logits, cache=cache)

    def reset(self) -> None:
        """Drop every graph and cache; the next calls capture again."""
        self._graphs.clear()
        if self._fused is not None:
            self._fused.clear()
        self._caches.clear()

    def __enter__(self) -> CudaGraphGenerator:
        return self

    def __exit__(self, *exc_info) -> None:
        self.reset()

    def _cache_for(self, batch: int, needed: int, prompt: int) -> Any:
        wanted = needed
        if self.fused_steps and self.max_cache_len is None:
            # The fused loop runs whole blocks: after the prompt and the prefill's token, its
            # last block may feed up to K - 1 positions past the end. A fixed max_cache_len
            # need only hold the call: the loop leaves a call it has no room for to generate().
            blocks = -(-(needed - prompt - 1) // self.fused_steps)
            wanted = max(needed, prompt + blocks * self.fused_steps)
        held = self._caches.get(batch)
        if held is not None and held[1] >= wanted:
            return held[0]
        if held is not None:
            self._graphs.remove_cache(held[0])
            if self._fused is not None:
                self._fused.remove_cache(held[0])
        length = self.max_cache_len
        if length is None:
            length = -(-wanted // CACHE_LENGTH_STEP) * CACHE_LENGTH_STEP
        elif length < needed:
            raise UnsupportedGenerationError(
                f"this generation needs {needed} tokens of cache (prompt plus new tokens) but "
                f"max_cache_len is {length}: pass a larger max_cache_len or fewer max_new_tokens"
            )
        cache = new_static_cache(self.model, length)
        self._caches[batch] = (cache, length)
        self._graphs.add_cache(cache, length)
        return cache

    def _fused_plan(
        self,
        setup: GenerateSetup,
        inputs: torch.Tensor | None,
        user_kwargs: dict[str, Any],
        step: dict[str, Any],
        cache: Any,
    ) -> _FusedPlan | None:
        """How the fused loop finishes the call whose first decode step gets ``step``, or None
        when generate()'s own loop must; which path runs, and why, is logged once."""
        prompt = inputs if inputs is not None else user_kwargs.get("input_ids")
        plan = None
        reason: str | None
        if self._fused is None:
            reason = "the fused loop is off (fused_steps=0)"
        elif not isinstance(prompt, torch.Tensor) or prompt.dim() != 2:
            reason = "the prompt is not a [batch, length] tensor of input ids"
        else:
            reason = fused_blocker(setup, user_kwargs)
            batch = step["input_ids"].shape[0]
            if reason is None and batch % prompt.shape[0]:
                reason = f"{batch} sequences do not expand a prompt of {prompt.shape[0]}"
            if reason is None:
                # num_return_sequences: generate() repeats each prompt row that many times.
                prompt = prompt.repeat_interleave(batch // prompt.shape[0], dim=0)
                stop = stop_settings(setup)
                position = prompt.shape[1]  # the first generated token's place in the cache
                capacity = self._caches[batch][1]
                choice = choice_settings(setup, prompt, step["input_ids"], capacity, stop)
                step = widen_padding_mask(step, position, capacity)
                dict_output = bool(setup.generation_config.return_dict_in_generate)
                plan = _FusedPlan(
                    prompt,
                    stop,
                    position,
                    stop.max_length - position - 1,
                    step,
                    choice,
                    user_kwargs.get("streamer"),
                    dict_output,
                    _kept_outputs(setup) if dict_output else None,
                )
                reason = self._fused.blocker(
                    step,
                    cache,
                    position=position,
                    new_tokens=plan.new_tokens,
                    capacity=capacity,
                    stop=stop,
                    choice=choice,
                    keep=plan.keep,
                )
        if reason is not None:
            self._log_once(f"generate(): decoding step by step through generate(): {reason}")
            return None
        assert plan is not None
        self._log_once(
            f"generate(): the fused loop decodes ({_describe_choice(plan.choice)}), "
            f"{self.fused_steps} steps per graph"
        )
        return plan

    def _log_once(self, message: str) -> None:
        if message not in self._logged:
            self._logged.add(message)
            logger.info(message)

    @contextlib.contextmanager
    def _kernel_cache_writes(self, cache: Any) -> Iterator[None]:
        """With our kernels, each decode step's keys and values written into ``cache`` in one
        launch a layer for the block (`kernels.generation.cache_writes`)."""
        if self._cache_kernels is None:
            yield
            return
        with kernel_cache_writes(cache, self._cache_kernels) as layers:
            self._log_once(
                f"generate(): {layers} cache layers write a decode step's keys and values in "
                "one kernel"
            )
            yield

    @contextlib.contextmanager
    def _decode_projections(self) -> Iterator[None]:
        """With our kernels, for the block: the attention modules' q, k and v projections as
        one launch at decode sizes (`kernels.generation.projections`), and Llama-style decoder
        layers' norms and residual adds folded into the projections around them
        (`kernels.generation.folded_layers`)."""
        if self._projection_kernels is None:
            yield
            return
        with grouped_projections(self.model, self._projection_kernels) as grouped:
            self._log_once(
                f"generate(): the q, k and v projections of {len(grouped)} attention modules run "
                "as one kernel at decode sizes"
            )
            if self._fold_kernels is None:
                yield
                return
            with folded_decoder_layers(self.model, grouped, self._fold_kernels) as folded:
                self._log_once(
                    f"generate(): {len(folded)} decoder layers decode with their norms and "
                    "residual adds folded into their projections"
                )
                yield

    @contextlib.contextmanager
    def _decode_through_graphs(
        self, first_decode_step: Callable[[dict[str, Any]], None] | None = None
    ) -> Iterator[None]:
        """For the block, route the model's forward through the decode graphs; the first decode
        step is shown to ``first_decode_step`` first (which may raise to end generate())."""
        graphs = self._graphs
        forward = self.model.forward
        pending = [first_decode_step] if first_decode_step is not None else []

        @functools.wraps(forward)  # keeps forward's signature, which generate() inspects
        def decode_through_graphs(*args, **kwargs):
            if graphs.is_decode_step(args, kwargs):
                # generate()'s own arguments that it leaves among the model's keyword arguments
                # (transformers 4.57 passes the tokenizer of stop_strings= to every forward):
                # the model ignores them, and no graph can take them as inputs.
                kwargs = {k: v for k, v in kwargs.items() if k not in _GENERATE_ONLY_ARGUMENTS}
                if pending:
                    pending.pop()(kwargs)
            return graphs.run(forward, args, kwargs)

        with instance_attribute(self.model, "forward", decode_through_graphs):
            yield


def fast_generate(
    model: nn.Module,
    inputs: torch.Tensor | None = None,
    *,
    kernels: bool | Mapping = False,
    **generate_kwargs: Any,
) -> Any:
    """``model.generate(...)`` with decode steps replayed from CUDA graphs (plain greedy calls
    K steps per replay, through the fused loop).

    The `CudaGraphGenerator` it uses is kept on the model (attribute
    ``_kernels_cuda_graph_generator``), so later calls reuse its caches and graphs; ``kernels``
    kernelizes the model once (see `CudaGraphGenerator`). Delete the attribute, or call its
    ``reset()``, to free them.

    Example:
        ```python
        from kernels.generation import fast_generate

        out = fast_generate(model, input_ids, attention_mask=mask, max_new_tokens=128,
                            kernels=True)
        ```
    """
    generator = vars(model).get(_GENERATOR_ATTRIBUTE)
    if generator is None:
        generator = CudaGraphGenerator(model, kernels=kernels)
        setattr(model, _GENERATOR_ATTRIBUTE, generator)
    elif kernels is not False and not generator.kernelized:
        generator.use_kernels(None if kernels is True else kernels)
    return generator.generate(inputs, **generate_kwargs)


# ---- generate() settings ----------------------------------------------------------------------


def _kept_outputs(setup: GenerateSetup) -> StepOutputs | None:
    """What the fused loop keeps of each step for a ``return_dict_in_generate`` call: the
    scores and logits its generation config asks for (None when neither)."""
    config = setup.generation_config
    scores = bool(config.output_scores)
    logits = bool(getattr(config, "output_logits", False))
    if not (scores or logits) or setup.first_step is None:
        return None
    return StepOutputs(scores, logits, vocab=setup.first_step[0].shape[-1])


def _describe_choice(choice: ChoiceSettings | None) -> str:
    if choice is None:
        return "greedy"
    how = "sampling" if choice.do_sample else "greedy"
    names = ", ".join(type(p).__name__ for p in choice.processors)
    return f"{how}, {names}" if names else how


def _setting(model: nn.Module, kwargs: dict, name: str, default: Any = None) -> Any:
    """A generation setting as generate() will see it: the keyword argument, else the
    ``generation_config`` passed, else the model's."""
    if name in kwargs:
        return kwargs[name]
    config = kwargs.get("generation_config") or getattr(model, "generation_config", None)
    return getattr(config, name, default)


def _check_supported(model: nn.Module, kwargs: dict) -> None:
    for name in ("past_key_values", "cache"):
        if kwargs.get(name) is not None:
            raise UnsupportedGenerationError(
                f"{name}= was passed: CudaGraphGenerator brings its own static cache (one per "
                "batch size, reused by its graphs); leave it out, or use model.generate()"
            )
    implementation = kwargs.get("cache_implementation")
    if implementation not in (None, "static"):
        raise UnsupportedGenerationError(
            f"cache_implementation={implementation!r}: decode graphs need the static cache; "
            "leave it out (or pass 'static')"
        )
    if _setting(model, kwargs, "use_cache", True) is False:
        raise UnsupportedGenerationError(
            "use_cache=False: decode graphs replay steps that read and write the KV cache; "
            "leave use_cache at True"
        )
    if (_setting(model, kwargs, "num_beams", 1) or 1) > 1:
        raise UnsupportedGenerationError(
            "beam search (num_beams > 1) reorders the cache at every step, which moves the "
            "tensors a graph writes; use model.generate() for it"
        )
    if kwargs.get("assistant_model") is not None or _setting(
        model, kwargs, "prompt_lookup_num_tokens"
    ):
        raise UnsupportedGenerationError(
            "assisted decoding feeds several tokens per step; use model.generate() for it"
        )


def _per_layer_outputs(model: nn.Module, kwargs: dict) -> str | None:
    """The setting that asks for per-step attentions or hidden states (a graph's outputs are
    overwritten at every step, so the tensors generate() keeps would all hold the last step),
    or None."""
    for name in ("output_attentions", "output_hidden_states"):
        if _setting(model, kwargs, name):
            return name
    return None


def _prompt_shape(inputs: torch.Tensor | None, kwargs: dict) -> tuple[int, int]:
    """(batch size, prompt length) of the call."""
    for prompt in (inputs, kwargs.get("input_ids"), kwargs.get("inputs_embeds")):
        if isinstance(prompt, torch.Tensor) and prompt.dim() >= 2:
            return prompt.shape[0], prompt.shape[1]
    raise UnsupportedGenerationError(
        "no prompt: pass input ids (positionally or as input_ids=, shape [batch, length]) or "
        "inputs_embeds= to generate()"
    )


def _needed_length(model: nn.Module, prompt: int, kwargs: dict) -> int:
    """Tokens the cache must hold: generate() stops at max_new_tokens past the prompt when it
    is set, else at max_length tokens in all."""
    max_new_tokens = _setting(model, kwargs, "max_new_tokens")
    if max_new_tokens is not None:
        return prompt + max_new_tokens
    max_length = _setting(model, kwargs, "max_length", 20) or 20
    return max(max_length, prompt + 1)


def _sdpa_mask_dtype(model: nn.Module) -> torch.dtype | None:
    """The dtype in which the fused loop feeds ``model`` an additive attention mask: the
    model's own, when its attention is PyTorch's SDPA (which turns a boolean mask into that
    additive one in every layer otherwise); None for other attention implementations."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return None
    dtype = getattr(model, "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else None


def _library_package(name: str) -> Any:
    """Our library's kernel package ``name`` (``library/<name>``), loaded as kernelize loads it."""
    from ..library import load_library_package

    return load_library_package(name)


def _fold_kernels() -> FoldKernels:
    """What `kernels.generation.folded_layers` needs from our activation and norm libraries."""
    activation = _library_package("activation")
    return FoldKernels(
        decode=activation.decode_mlp,
        mlp_activation=activation.layers.decode_activation,
        gated_mlps=(activation.layers.SwiGLUMLP, activation.layers.GeGLUMLP),
        rms_norm=_library_package("norm").layers.RMSNorm,
    )


def _decode_kernels() -> Any:
    """The decode-size kernels of our activation library (``grouped_linear_decode``)."""
    return _library_package("activation").decode_mlp


def _device_of(model: nn.Module) -> torch.device:
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    for tensor in model.parameters():
        return tensor.device
    return torch.device("cpu")
