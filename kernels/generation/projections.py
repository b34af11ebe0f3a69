"""An attention's q, k and v projections as one kernel launch at decode sizes.

A decode step of a grouped-query attention projects one token three times: q (hidden x hidden)
and k and v (hidden x a few heads, 1 MB each for a 1.1B Llama). cuBLAS runs them as three
launches, and the two small ones are bound by launch latency, not by memory: with q and o they
take a large share of a decoded token's GPU time (the decode benchmark's profile,
`benchmarks/results/h100/decode/`). transformers calls the three projections one after the
other on the same hidden states, so for the length of a ``generate()`` call `grouped_projections`
puts a ``forward`` in front of each (an instance attribute, as the generator does with the
model's own): q's call computes all three with our library's ``grouped_linear_decode`` and
keeps k's and v's results, which their calls, on that same input tensor, then return. Any other
call (more than ``DECODE_ROWS`` tokens, a backward needed, another input, k or v first) is
``F.linear``, exactly what ``nn.Linear`` computes.

The grouped kernel rounds each output once from fp32 sums, as cuBLAS does; the sums' order
differs, so a result can differ from cuBLAS's by one rounding.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .attributes import instance_attribute

logger = logging.getLogger(__name__)

PROJECTIONS = ("q_proj", "k_proj", "v_proj")


class _QKVGroup:
    """The q, k and v ``nn.Linear`` of one attention module and the outputs of the last input
    that q's call projected through all three."""

    def __init__(self, linears: tuple[nn.Linear, nn.Linear, nn.Linear], kernels: Any):
        self.linears = linears
        self.kernels = kernels  # the activation library's decode_mlp module
        self.input: torch.Tensor | None = None
        self.outputs: tuple[torch.Tensor, ...] = ()
        # (norm weight, eps, x) while a folded decoder layer (`folded_layers`) hands the
        # attention its un-normalised input x: the projections then normalise it themselves.
        self._norm: tuple[torch.Tensor, float, torch.Tensor] | None = None

    @contextlib.contextmanager
    def normalising(self, weight: torch.Tensor, eps: float, x: torch.Tensor) -> Iterator[None]:
        """For the block, the projections of ``x`` are those of Llama's RMSNorm of ``x``
        (``weight``, ``eps``), computed in the grouped kernel's prologue."""
        self._norm = (weight, eps, x)
        try:
            yield
        finally:
            self._norm = None

    def forward(self, index: int):
        """The ``forward`` that stands in front of projection ``index`` (0 q, 1 k, 2 v)."""
        linear = self.linears[index]

        def forward(x: torch.Tensor) -> torch.Tensor:
            norm = self._norm if self._norm is not None and self._norm[2] is x else None
            if x is not self.input and (index == 0 or norm is not None):
                if self._takes(x):
                    self._project(x, norm)
                elif norm is not None:  # (the folded layer checked `_takes` on this x first)
                    raise RuntimeError(
                        "a folded decoder layer's q, k and v kernel refused its input"
                    )
            if x is self.input:
                out = self.outputs[index]
                if index == len(self.linears) - 1:  # v: the group's last; let go of the input
                    self.input, self.outputs = None, ()
                return out
            return F.linear(x, linear.weight, linear.bias)

        return forward

    def _project(self, x: torch.Tensor, norm: tuple | None) -> None:
        weights = tuple(p.weight for p in self.linears)
        first = self.linears[0]
        biases = None if first.bias is None else tuple(p.bias for p in self.linears)
        self.input = x
        if norm is None:
            self.outputs = self.kernels.grouped_linear_decode(x, weights, biases)
        else:
            self.outputs = self.kernels.grouped_linear_decode(
                x, weights, biases, norm_weight=norm[0], eps=norm[1]
            )

    def _takes(self, x: torch.Tensor) -> bool:
        if type(x) is not torch.Tensor or torch.compiler.is_compiling():
            return False
        if torch.is_grad_enabled() and (
            x.requires_grad or any(p.weight.requires_grad for p in self.linears)
        ):
            return False
        return self.kernels.takes_decode_kernels(x)


def _group_of(module: nn.Module, kernels: Any) -> _QKVGroup | None:
    """A group for ``module``'s q, k and v projections when they are plain ``nn.Linear`` of one
    input size, dtype and device (fp16 or bf16), with no hooks and no forward of their own,
    all with biases or none; else None."""
    q, k, v = (getattr(module, name, None) for name in PROJECTIONS)
    if not (type(q) is nn.Linear and type(k) is nn.Linear and type(v) is nn.Linear):
        return None
    linears = (q, k, v)
    first = q
    for p in linears:
        if (
            "forward" in vars(p)
            or p._forward_hooks
            or p._forward_pre_hooks
            or p.in_features != first.in_features
            or type(p.weight) not in (torch.Tensor, nn.Parameter)  # not a DTensor, a quantized one
            or (p.bias is not None and type(p.bias) not in (torch.Tensor, nn.Parameter))
            or p.weight.dtype not in (torch.float16, torch.bfloat16)
            or p.weight.dtype != first.weight.dtype
            or p.weight.device != first.weight.device
            or (p.bias is None) != (first.bias is None)
            or (p.bias is not None and p.bias.dtype != p.weight.dtype)
        ):
            return None
    return _QKVGroup(linears, kernels)


@contextlib.contextmanager
def grouped_projections(model: nn.Module, kernels: Any) -> Iterator[dict[nn.Module, _QKVGroup]]:
    """For the block, run the q, k and v projections of every attention module of ``model``
    whose three are plain ``nn.Linear`` (`_group_of`) as one launch at decode sizes; yields each
    attention module grouped and its group. ``kernels``: the activation library's ``decode_mlp``
    module (``grouped_linear_decode``, ``takes_decode_kernels``)."""
    if nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
        yield {}  # hooks on every module would see the projections' calls: leave them alone
        return
    groups = [
        (module, group)
        for module in model.modules()
        if (group := _group_of(module, kernels)) is not None
    ]
    with contextlib.ExitStack() as stack:
        for module, group in groups:
            for index, name in enumerate(PROJECTIONS):
                linear = getattr(module, name)
                stack.enter_context(instance_attribute(linear, "forward", group.forward(index)))
        yield dict(groups)
