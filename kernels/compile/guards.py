"""Whether an entry's kernel may replace a match: the devices, dtypes and result it would see.

Each test reads the traced values of the match's arguments (fake tensors carrying dtype,
device and shape) and answers with the reason the original ops stay, or None. A pattern found
on inputs a kernel does not take (float64, a CPU tensor without Triton's interpreter, a GPU
older than the kernel) keeps its ops, and the graph computes what it computed before.

The last test runs the kernel's fake implementation on the traced values and compares its
result with the value the matched ops produced: a kernel must give the graph a tensor of the
same shape and dtype, whatever the spelling of the ops it replaces (an RMSNorm formula whose
weight is float32 over a bfloat16 input produces float32; the library's kernel would not).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx
from torch._guards import detect_fake_mode

from . import fx_nodes as fxn
from .entry import KernelEntry
from .patterns import AttrRef, Match


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def resolve(arg: Any, gm: fx.GraphModule) -> Any:
    """An argument's traced value: a node's, a parameter's (`AttrRef`), or the constant."""
    if isinstance(arg, AttrRef):
        module_path, _, name = arg.path.rpartition(".")
        return getattr(gm.get_submodule(module_path), name)
    if isinstance(arg, fx.Node):
        return fxn.value(arg)
    if isinstance(arg, (list, tuple)):
        return type(arg)(resolve(a, gm) for a in arg)
    return arg


def _tensors(values: Sequence) -> list[torch.Tensor]:
    return [v for v in values if isinstance(v, torch.Tensor)]


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def input_problem(entry: KernelEntry, match: Match, values: tuple) -> str | None:
    """Why ``entry``'s kernel cannot take the match's inputs (device, dtype), or None."""
    tensors = _tensors(values)
    if not tensors:
        return "its inputs have no traced values"
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        return f"its inputs are on several devices ({', '.join(sorted(map(str, devices)))})"
    device = next(iter(devices))
    allowed = entry.resolved_device_types()
    if device.type not in allowed:
        hint = (
            " (set TRITON_INTERPRET=1 to run Triton kernels on the CPU)"
            if device.type == "cpu" and entry.device_types is None
            else ""
        )
        return f"its inputs are on {device.type}; the kernel runs on {', '.join(allowed)}{hint}"
    for t in tensors:
        if t.dtype not in entry.dtypes:
            return (
                f"dtype {_dtype_name(t.dtype)} is not one the kernel takes "
                f"({', '.join(_dtype_name(d) for d in entry.dtypes)})"
            )
    if device.type == "cuda" and entry.min_cuda_capability is not None:
        index = device.index if device.index is not None else torch.cuda.current_device()
        found = _capability(index)
        if found < entry.min_cuda_capability:
            major, minor = entry.min_cuda_capability
            return (
                f"the GPU's compute capability {found[0]}.{found[1]} is below the kernel's "
                f"{major}.{minor}"
            )
    if entry.check is not None:
        return entry.check(match, values)
    return None


def result_problem(entry: KernelEntry, match: Match, values: tuple, call) -> str | None:
    """Why the kernel's result would not stand in for the match's output (shape or dtype),
    from the kernel's fake implementation run on the traced values; or None."""
    expected = fxn.tensor_value(match.output)
    if expected is None:
        return f"{match.output.name} has no traced tensor value"
    # The traced values' own fake mode: Dynamo calls a backend under a tracing context of
    # another fake mode (sharing the shape environment), which its values do not belong to.
    mode = getattr(expected, "fake_mode", None) or detect_fake_mode(_tensors(values))
    if mode is None:  # real tensors as traced values: fake copies of them, in a mode of our own
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = FakeTensorMode()
    fake_values = tuple(
        mode.from_tensor(v) if isinstance(v, torch.Tensor) and not _is_fake(v) else v
        for v in values
    )
    try:
        with mode, torch.no_grad():
            out = call(*fake_values)
    except Exception as error:  # noqa: BLE001  (the kernel's own check refused these inputs)
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return f"the kernel refuses these inputs: {type(error).__name__}: {first_line}"
    if not isinstance(out, torch.Tensor):
        return f"the kernel's fake implementation returned {type(out).__name__}"
    if out.dtype != expected.dtype or not fxn.same_shape(out, expected):
        return (
            f"the kernel would return {_dtype_name(out.dtype)} {list(out.shape)} where the "
            f"graph has {_dtype_name(expected.dtype)} {list(expected.shape)}"
        )
    return None


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)
