"""Generation with transformers' ``generate()``, its decode steps replayed from CUDA graphs.

Decoding a token reads every weight once and launches hundreds of small kernels; eager
PyTorch spends longer issuing those launches than the GPU spends running them. transformers'
own remedy, the static cache with ``torch.compile``, takes minutes to compile. Here the decode
step is captured in a CUDA graph instead (seconds), one graph per batch size, and replayed at
every step; ``generate()`` itself runs unchanged, and our kernels can be swapped in first.

- `CudaGraphGenerator` (`generator`): the helper; `fast_generate` is its one-call form.
- `DecodeGraphs` (`decode`): which calls are decode steps, when to capture, which graph to replay.
- `FusedDecodeLoop` (`fused_loop`): greedy and sampled calls decoded K steps per graph replay,
  their tokens chosen (`token_choice`, `stop_strings`) and next inputs made on the device
  (`decode_steps`); `fused_rule` says which calls it takes; `step_outputs` makes
  ``return_dict_in_generate``'s output (per-step scores and logits, the cache).
- `inputs`: the key a call must match to reuse a graph, and the static buffers graphs read.
- `graph`: CUDA-graph capture, and its stand-in off CUDA (plain calls).
- `cache`: transformers' ``StaticCache`` across 4.57 and 5.x.
- `attributes`: the instance attributes set on the model for the length of a call.

See docs/generation.md.

Example:
    ```python
    from kernels.generation import CudaGraphGenerator

    generator = CudaGraphGenerator(model, kernels=True)
    tokens = generator.generate(input_ids, attention_mask=mask, max_new_tokens=128)
    ```
"""

from __future__ import annotations

from .decode import DecodeGraphs, DecodeStats
from .errors import UnsupportedGenerationError
from .fused_loop import DEFAULT_FUSED_STEPS, FusedDecodeLoop
from .generator import CACHE_LENGTH_STEP, CudaGraphGenerator, fast_generate
from .graph import CudaGraphBackend, EagerBackend, GraphBackend, default_backend

#: The name of `FusedDecodeLoop` before it took sampled calls (0.19.1), kept for code that uses it.
FusedGreedyLoop = FusedDecodeLoop

__all__ = [
    "CACHE_LENGTH_STEP",
    "CudaGraphBackend",
    "CudaGraphGenerator",
    "DEFAULT_FUSED_STEPS",
    "DecodeGraphs",
    "DecodeStats",
    "EagerBackend",
    "FusedDecodeLoop",
    "GraphBackend",
    "UnsupportedGenerationError",
    "default_backend",
    "fast_generate",
]
