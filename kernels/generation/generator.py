"""`CudaGraphGenerator` and `fast_generate`: transformers' ``generate()`` with its decode steps
replayed from CUDA graphs, and optionally our kernels, without ``torch.compile``.

``generate()`` runs unchanged (transformers 4.57 and 5.x). For the length of a call the model's
``forward`` is wrapped so that decode steps (one new token per sequence, on the generator's
static cache) go through `kernels.generation.decode.DecodeGraphs`; the prefill, the logits
processors, sampling and stopping run as ``generate()`` runs them. The generator passes a
``StaticCache`` of its own (one per batch size, kept between calls, so graphs are captured once)
and ``disable_compile=True``, so that ``generate()`` does not compile the forward itself.

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
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from .cache import cache_argument, new_static_cache
from .decode import DecodeGraphs, DecodeStats
from .errors import UnsupportedGenerationError
from .graph import EagerBackend, GraphBackend, default_backend

logger = logging.getLogger(__name__)

#: Cache lengths are rounded up to a multiple of this, so that generations of similar lengths
#: share a cache and the graphs captured on it.
CACHE_LENGTH_STEP = 256

_GENERATOR_ATTRIBUTE = "_kernels_cuda_graph_generator"


class CudaGraphGenerator:
    """Generates with ``model.generate()``, replaying its decode steps from CUDA graphs.

    Each batch size gets a ``transformers.StaticCache`` and, after ``warmup_steps`` eager
    decode steps, one CUDA graph of the decode step; the graphs share one memory pool and are
    kept for later calls of `generate` with that batch size (and a cache long enough). The
    prefill and any step the graphs do not cover run eagerly. On a device other than CUDA the
    decode steps run eagerly (logged once), through the same static cache and buffers.

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
        self.model = model
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
        self._graphs = DecodeGraphs(
            backend,
            cache_argument=cache_argument(model),
            device=self.device,
            warmup_steps=warmup_steps,
        )
        self._caches: dict[int, tuple[Any, int]] = {}  # batch size -> (cache, length)
        if kernels is not False:
            self.use_kernels(None if kernels is True else kernels)

    @property
    def stats(self) -> DecodeStats:
        """What the decode steps so far ran as: eager steps, captures, replays, failures."""
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
        self.reset()

    def generate(self, inputs: torch.Tensor | None = None, **generate_kwargs: Any) -> Any:
        """``model.generate(inputs, **generate_kwargs)`` with decode steps from CUDA graphs.

        Takes what ``generate()`` takes, except a cache of your own (``past_key_values`` or
        ``cache``), a ``cache_implementation`` other than ``"static"``, ``use_cache=False``,
        beam search, assisted decoding and ``output_attentions`` / ``output_hidden_states``
        (the captured outputs are overwritten at every step). Greedy decoding gives the tokens
        of ``model.generate()``; sampling works (it runs outside the graph).

        Raises:
            UnsupportedGenerationError: for the settings above, or without a prompt.
        """
        _check_supported(self.model, generate_kwargs)
        batch, prompt = _prompt_shape(inputs, generate_kwargs)
        batch *= _setting(self.model, generate_kwargs, "num_return_sequences", 1) or 1
        cache = self._cache_for(batch, _needed_length(self.model, prompt, generate_kwargs))
        cache.reset()
        generate_kwargs[self._graphs.cache_argument] = cache
        # Our cache replaces the one cache_implementation would make (transformers refuses
        # both at once), and generate() must not torch.compile the forward we stand in front of.
        generate_kwargs["cache_implementation"] = None
        generate_kwargs["disable_compile"] = True
        with self._decode_through_graphs():
            return self.model.generate(inputs, **generate_kwargs)

    def reset(self) -> None:
        """Drop every graph and cache; the next calls capture again."""
        self._graphs.clear()
        self._caches.clear()

    def __enter__(self) -> CudaGraphGenerator:
        return self

    def __exit__(self, *exc_info) -> None:
        self.reset()

    def _cache_for(self, batch: int, needed: int) -> Any:
        held = self._caches.get(batch)
        if held is not None and held[1] >= needed:
            return held[0]
        if held is not None:
            self._graphs.remove_cache(held[0])
        length = self.max_cache_len
        if length is None:
            length = -(-needed // CACHE_LENGTH_STEP) * CACHE_LENGTH_STEP
        elif length < needed:
            raise UnsupportedGenerationError(
                f"this generation needs {needed} tokens of cache (prompt plus new tokens) but "
                f"max_cache_len is {length}: pass a larger max_cache_len or fewer max_new_tokens"
            )
        cache = new_static_cache(self.model, length)
        self._caches[batch] = (cache, length)
        self._graphs.add_cache(cache)
        return cache

    @contextlib.contextmanager
    def _decode_through_graphs(self) -> Iterator[None]:
        """For the block, route the model's forward through the decode graphs."""
        model, graphs = self.model, self._graphs
        own = vars(model).get("forward")  # an instance attribute someone set, if any
        forward = model.forward

        @functools.wraps(forward)  # keeps forward's signature, which generate() inspects
        def decode_through_graphs(*args, **kwargs):
            return graphs.run(forward, args, kwargs)

        model.forward = decode_through_graphs
        try:
            yield
        finally:
            if own is None:
                del model.forward
            else:
                model.forward = own


def fast_generate(
    model: nn.Module,
    inputs: torch.Tensor | None = None,
    *,
    kernels: bool | Mapping = False,
    **generate_kwargs: Any,
) -> Any:
    """``model.generate(...)`` with decode steps replayed from CUDA graphs.

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
    for name in ("output_attentions", "output_hidden_states"):
        if _setting(model, kwargs, name):
            raise UnsupportedGenerationError(
                f"{name}=True: a graph's outputs are overwritten at every step, so the "
                "per-step tensors generate() keeps would all hold the last step; use "
                "model.generate() for them"
            )


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


def _device_of(model: nn.Module) -> torch.device:
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    for tensor in model.parameters():
        return tensor.device
    return torch.device("cpu")
