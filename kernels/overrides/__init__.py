"""Our Triton kernels as PyTorch's own kernels for the aten operators they implement.

Models nobody tagged (a hand-written block with ``nn.RMSNorm``, ``nn.LayerNorm``, ``F.silu``,
``F.gelu``) cannot be kernelized: there is no layer to swap. These overrides register our
kernels with PyTorch's dispatcher as the CUDA kernels of ``aten::native_layer_norm``,
``aten::_fused_rms_norm``, ``aten::silu``, ``aten::gelu`` and their backward operators, so the
model's code runs them unchanged. Inputs ours do not take run PyTorch's kernel; leaving the
scope restores the dispatcher exactly. See docs/overrides.md.

Example:
    ```python
    import torch.nn as nn
    from kernels.overrides import use_aten_overrides

    block = nn.Sequential(nn.LayerNorm(4096), nn.Linear(4096, 4096)).cuda()
    with use_aten_overrides():           # the operators where ours are faster (LayerNorm)
        block(x).sum().backward()
    with use_aten_overrides(ops=["rms_norm", "silu"]):
        ...
    ```
"""

from __future__ import annotations

from .calls import OURS, aten_override_calls, reset_aten_override_calls
from .scope import (
    active_aten_overrides,
    disable_aten_overrides,
    enable_aten_overrides,
    use_aten_overrides,
)
from .spec import OverrideSpec
from .table import FAMILIES, OVERRIDES, default_overrides

__all__ = [
    "FAMILIES",
    "OURS",
    "OVERRIDES",
    "OverrideSpec",
    "active_aten_overrides",
    "aten_override_calls",
    "default_overrides",
    "disable_aten_overrides",
    "enable_aten_overrides",
    "reset_aten_override_calls",
    "use_aten_overrides",
]
