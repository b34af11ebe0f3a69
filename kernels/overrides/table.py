"""The aten operators we override, and which of them are on by default: the one place where the
per-operator decision is written down, each with the saved result that made it.

An operator is on by default (``faster_than_aten=True``) where our kernel beats PyTorch's own
kernel for that operator on the device at every benchmarked shape, forward and forward+backward,
and no benchmark of the model code it serves ran slower with it. Two benchmarks count:
``benchmarks/ops.py`` (its "eager" contender for LayerNorm is ``nn.LayerNorm``, which runs
``aten::native_layer_norm`` and its backward; for GeluTanh ``F.gelu(approximate="tanh")``) and
``benchmarks/overrides.py`` (every override against PyTorch's kernel for the same operator, and
an untagged Llama block). Host time is the catch: an override runs in Python, about 50 us a call
on the H100 VMs where PyTorch's C++ path takes 14 us (docs/overrides.md), so a model bound by
host time can lose what the kernel wins on the device. Pass ``ops=`` to choose others.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import KernelMappingError
from . import activations, norms
from .loading import activation_kernels, norm_kernels
from .spec import OverrideSpec

# Each operator's evidence (``OverrideSpec.evidence``, which users read) sums up the run of
# benchmarks/overrides.py kept in benchmarks/results/h100/overrides (speeds are PyTorch's time /
# the override's); the numbers per shape and device are there and in the devices' NOTES.md. The
# comments say why each operator is on or off by default.
_OVERRIDES_RUN = "benchmarks/results/h100/overrides (H100, torch 2.11, bf16, 2026-11-24)"

# LayerNorm: on. Faster than PyTorch's kernel forward and backward at every shape under CUDA
# graphs, with and without bias, on both GPUs we ran (benchmarks/ops.py agrees); eager calls of
# small tensors are host-bound. No model with LayerNorm has been benchmarked with the override yet.
_LAYER_NORM_EVIDENCE = (
    f"{_OVERRIDES_RUN}: CUDA graph forward 1.36-1.58x, forward+backward 1.73-2.08x; eager calls "
    "0.29-2.07x (host-bound at 4096x4096); benchmarks/results/h100/ops LayerNorm under CUDA "
    "graphs 1.23-1.56x and 1.53-1.91x"
)
# RMSNorm (nn.RMSNorm -> aten::_fused_rms_norm): off. The kernel is faster under CUDA graphs,
# but the model it serves, the untagged Llama block, ran slower with it where the step is
# host-bound (eager calls of small tensors cost more host time) and only level elsewhere.
_RMS_NORM_EVIDENCE = (
    f"{_OVERRIDES_RUN}: CUDA graph forward 1.22-1.53x, forward+backward 1.78-2.09x, but the "
    "untagged Llama block's training step ran 0.78x at 8x512 (host-bound) and 1.03x at 4x2048"
)
# SiLU: off. Level with PyTorch's kernel under CUDA graphs and slower in eager calls of small
# tensors; with RMSNorm in the Llama block it slowed the host-bound step too.
_SILU_EVIDENCE = (
    f"{_OVERRIDES_RUN}: CUDA graph 0.99-1.02x (level with PyTorch's kernel); eager calls "
    "forward+backward 0.39-1.00x"
)
# GELU (exact and tanh): off. Level with PyTorch's kernel under CUDA graphs on the GPU of the
# overrides run (benchmarks/ops.py has the tanh GELU ahead on the other GPU), and slower in eager
# calls of small tensors.
_GELU_EVIDENCE = (
    f"{_OVERRIDES_RUN}: CUDA graph 0.95-1.08x forward, 0.99-1.02x forward+backward (level); "
    "eager calls forward+backward 0.47-1.00x"
)

#: Every aten operator we can override, forward and backward, in dispatch order.
OVERRIDES: tuple[OverrideSpec, ...] = (
    OverrideSpec(
        op="native_layer_norm",
        family="layer_norm",
        reached_by="F.layer_norm, nn.LayerNorm",
        faster_than_aten=True,
        evidence=_LAYER_NORM_EVIDENCE,
        load=norm_kernels,
        impl=norms.native_layer_norm,
    ),
    OverrideSpec(
        op="native_layer_norm_backward",
        family="layer_norm",
        reached_by="the backward of F.layer_norm, nn.LayerNorm",
        faster_than_aten=True,
        evidence=_LAYER_NORM_EVIDENCE,
        load=norm_kernels,
        impl=norms.native_layer_norm_backward,
    ),
    OverrideSpec(
        op="_fused_rms_norm",
        family="rms_norm",
        reached_by="F.rms_norm, nn.RMSNorm (on CUDA)",
        faster_than_aten=False,
        evidence=_RMS_NORM_EVIDENCE,
        load=norm_kernels,
        impl=norms.fused_rms_norm,
    ),
    OverrideSpec(
        op="_fused_rms_norm_backward",
        family="rms_norm",
        reached_by="the backward of F.rms_norm, nn.RMSNorm (on CUDA)",
        faster_than_aten=False,
        evidence=_RMS_NORM_EVIDENCE,
        load=norm_kernels,
        impl=norms.fused_rms_norm_backward,
    ),
    OverrideSpec(
        op="silu",
        family="silu",
        reached_by="F.silu, nn.SiLU",
        faster_than_aten=False,
        evidence=_SILU_EVIDENCE,
        load=activation_kernels,
        impl=activations.silu,
    ),
    OverrideSpec(
        op="silu_backward",
        family="silu",
        reached_by="the backward of F.silu, nn.SiLU",
        faster_than_aten=False,
        evidence=_SILU_EVIDENCE,
        load=activation_kernels,
        impl=activations.silu_backward,
    ),
    OverrideSpec(
        op="gelu",
        family="gelu",
        reached_by="F.gelu, nn.GELU (approximate 'none' and 'tanh')",
        faster_than_aten=False,
        evidence=_GELU_EVIDENCE,
        load=activation_kernels,
        impl=activations.gelu,
    ),
    OverrideSpec(
        op="gelu_backward",
        family="gelu",
        reached_by="the backward of F.gelu, nn.GELU",
        faster_than_aten=False,
        evidence=_GELU_EVIDENCE,
        load=activation_kernels,
        impl=activations.gelu_backward,
    ),
)

#: The families ``ops=`` accepts beside operator names: each names an operator and its backward.
FAMILIES: tuple[str, ...] = tuple(dict.fromkeys(spec.family for spec in OVERRIDES))


def default_overrides() -> tuple[OverrideSpec, ...]:
    """The overrides enabled when ``ops`` is not given: those faster than PyTorch's kernels."""
    return tuple(spec for spec in OVERRIDES if spec.faster_than_aten)


def resolve_overrides(ops: Iterable[str] | str | None) -> tuple[OverrideSpec, ...]:
    """The overrides ``ops`` names, in `OVERRIDES` order.

    Args:
        ops: family names (``"layer_norm"``, ``"silu"``: the operator and its backward) and
            operator names (``"native_layer_norm"``, or ``"aten::silu"`` for the operator alone
            where a family has its name); a single string is one name. None:
            `default_overrides`.

    Raises:
        KernelMappingError: for a name that is neither, listing the names there are.
    """
    if ops is None:
        return default_overrides()
    if isinstance(ops, str):
        ops = (ops,)
    wanted: set[str] = set()
    unknown: list[str] = []
    ops_by_name = {spec.op: spec for spec in OVERRIDES}
    for name in ops:
        if not isinstance(name, str):
            raise KernelMappingError(
                f"ops must hold operator or family names (strings), got {name!r}."
            )
        # A family first: "silu" is also the forward operator's name, and asking for F.silu
        # means its backward too. "aten::silu" names the operator alone.
        if name in FAMILIES:
            wanted.update(spec.op for spec in OVERRIDES if spec.family == name)
        elif name.removeprefix("aten::") in ops_by_name:
            wanted.add(name.removeprefix("aten::"))
        else:
            unknown.append(name)
    if unknown:
        raise KernelMappingError(
            f"No aten override for {', '.join(repr(n) for n in unknown)}. Families (an operator "
            f"and its backward): {', '.join(FAMILIES)}; operators: {', '.join(ops_by_name)} "
            "(with or without 'aten::')."
        )
    return tuple(spec for spec in OVERRIDES if spec.op in wanted)
