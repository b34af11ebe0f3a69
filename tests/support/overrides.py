"""Helpers for the aten override tests: devices, references, dispatch-table snapshots.

The tolerances and float64 comparisons are the kernel library's (tests/support/library.py).
"""

import torch

from kernels.overrides import OVERRIDES, aten_override_calls, use_aten_overrides
from tests.support.library import DTYPES, assert_close, grads, randn

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_GPU = DEVICE == "cuda"
#: The dispatch key our overrides take on this machine's tensors.
DISPATCH_KEY = "CUDA" if ON_GPU else "CPU"

__all__ = ["DEVICE", "DTYPES", "ON_GPU", "assert_close", "grads", "randn"]


def dispatch_tables() -> dict[str, str]:
    """Every overridable operator's computed dispatch table and its registrations, as text:
    equal snapshots mean the dispatcher runs the same kernel for every key."""
    return {
        spec.op: torch._C._dispatch_dump_table(spec.qualname)
        + torch._C._dispatch_dump(spec.qualname)
        for spec in OVERRIDES
    }


def kernel_source(op: str, dispatch_key: str = DISPATCH_KEY) -> str:
    """Where the kernel the dispatcher runs for ``op`` on ``dispatch_key`` was registered."""
    for line in torch._C._dispatch_dump_table(f"aten::{op}").splitlines():
        if line.startswith(f"{dispatch_key}:"):
            return line
    raise AssertionError(f"aten::{op} has no {dispatch_key} entry")


def paths(op: str) -> dict[str, int]:
    """{path: calls} that ``op``'s override took since the last reset."""
    return {path: n for (name, path), n in aten_override_calls().items() if name == op}


class RecordingKernel:
    """A stand-in for PyTorch's kernel (``original``) where the CPU build has none: records the
    call and returns a marker."""

    def __init__(self):
        self.calls = []

    def call_boxed(self, keyset, *args, **kwargs):
        self.calls.append((args, kwargs))
        return "pytorch"


def pytorch_and_override(fn, ops):
    """``fn()`` with PyTorch's kernels, then inside the override of ``ops``."""
    reference = fn()
    with use_aten_overrides(ops=ops):
        overridden = fn()
    return reference, overridden


def assert_bitwise(reference, overridden):
    """The same tensors (or tuples of tensors and Nones): values, dtypes and strides."""
    reference = reference if isinstance(reference, tuple) else (reference,)
    overridden = overridden if isinstance(overridden, tuple) else (overridden,)
    for r, o in zip(reference, overridden, strict=True):
        assert (r is None) == (o is None)
        if r is not None:
            assert torch.equal(r, o) and r.dtype == o.dtype and r.stride() == o.stride()
