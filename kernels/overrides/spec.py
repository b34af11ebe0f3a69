"""What one aten override is: the operator, the model code that reaches it, our kernel for it,
and whether it is on by default."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class OverrideSpec:
    """One aten operator whose CUDA kernel ours can replace.

    Attributes:
        op: the aten operator (its default overload), e.g. ``"native_layer_norm"``.
        family: the group it belongs to, which ``ops=`` also accepts: ``"layer_norm"``,
            ``"rms_norm"``, ``"silu"`` or ``"gelu"`` name an operator and its backward.
        reached_by: the model code whose forward or backward dispatches to ``op``.
        faster_than_aten: whether ours beat PyTorch's kernel in the saved benchmarks; the
            overrides enabled when ``ops`` is not given are those where it is True.
        evidence: the saved result that decided ``faster_than_aten``.
        load: loads our kernels for ``impl`` (the library's repositories, imported once).
        impl: ``impl(kernels, original, keyset, *args, **kwargs)``: the override. ``kernels``
            is what ``load`` returned, ``original`` PyTorch's kernel that the override replaces
            (``torch.library.get_kernel`` of it, called for every input ours does not take),
            ``keyset`` the dispatch key set of the call, and the rest the operator's arguments.
    """

    op: str
    family: str
    reached_by: str
    faster_than_aten: bool
    evidence: str
    load: Callable[[], Any]
    impl: Callable[..., Any]

    @property
    def qualname(self) -> str:
        """The operator's name for the dispatcher, ``aten::<op>``."""
        return f"aten::{self.op}"

    def __str__(self) -> str:
        return self.qualname
