"""transformers' causal-mask skip under ``torch.compile``, on torch releases that lose it.

transformers 5.x builds no attention mask for SDPA when none is needed (no padding, as long a
query as its keys): it calls SDPA with ``is_causal=True``, which runs the flash or cuDNN
kernels. It skips the mask only where ``masking_utils.is_torchdynamo_exporting()`` is False,
since an exported graph must not bake ``is_causal`` in. Before torch 2.13, Dynamo replaced
``torch.compiler.is_exporting()`` by the constant True in every compiled graph, so under
``torch.compile`` the mask was never skipped: every layer got a materialised (query x key)
mask and SDPA its memory-efficient kernel instead (on an H100 a compiled 1.1B Llama's
training step at 4x2048 took 140 ms instead of 119; benchmarks/results/h100/NOTES.md).

`restore_causal_mask_skip` gives transformers' mask code the answer torch 2.13's Dynamo gives:
the flag ``torch.export`` sets while it traces (``torch.compiler._is_exporting_flag``), which
Dynamo reads as a guarded constant. Exported graphs keep their explicit mask; eager calls are
unchanged. `kernelize` calls it for ``Mode.TORCH_COMPILE``.
"""

from __future__ import annotations

import logging
import sys

import torch
from packaging.version import Version

logger = logging.getLogger(__name__)

#: The first torch release whose Dynamo answers ``is_exporting()`` by the export flag.
FIXED_IN = Version("2.13")

#: transformers' module whose mask functions ask ``is_torchdynamo_exporting``.
MASKING_MODULE = "transformers.masking_utils"


def is_exporting() -> bool:
    """Whether ``torch.export`` is tracing: its flag, read (and guarded on) by Dynamo."""
    return bool(torch.compiler._is_exporting_flag)


def torch_needs_it() -> bool:
    """Whether the installed torch's Dynamo folds ``torch.compiler.is_exporting()`` to True."""
    if not hasattr(torch.compiler, "_is_exporting_flag"):
        return False  # nothing to read instead
    return Version(Version(torch.__version__).base_version) < FIXED_IN


def restore_causal_mask_skip() -> bool:
    """Have transformers' mask functions skip the causal mask under ``torch.compile`` as they do
    in eager mode, where the installed torch needs it (before 2.13) and transformers is imported
    with the function to fix (5.x; 4.57 never skips while compiling, by design). Process-wide
    and idempotent; a function someone else put there is left alone. Returns whether transformers'
    mask code now asks `is_exporting`."""
    masking = sys.modules.get(MASKING_MODULE)
    current = getattr(masking, "is_torchdynamo_exporting", None)
    if current is None:
        return False
    if current is is_exporting:
        return True
    from transformers.utils import import_utils

    if current is not getattr(import_utils, "is_torchdynamo_exporting", None):
        return False
    if not torch_needs_it():
        return False
    masking.is_torchdynamo_exporting = is_exporting  # type: ignore[union-attr]
    logger.info(
        "torch.compile on torch < %s: transformers' SDPA masks now skip the causal mask as in "
        "eager mode (is_causal=True) where nothing is padded (kernels.compile.causal_mask)",
        FIXED_IN,
    )
    return True
