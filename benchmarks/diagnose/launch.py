"""What the launch-configuration sweeps of this folder share.

Each sweep loads the library and Liger-Kernel as ``benchmarks.ops`` does (``benchmarks.cases``), swaps one module-level
function of a kernel module (the rule that picks its launch configuration) for a fixed
configuration while it times it (``swapped``), and puts the rule back afterwards.
"""

from __future__ import annotations

import contextlib
import sys

import torch

from benchmarks import cases

DT = torch.bfloat16


@contextlib.contextmanager
def swapped(module, **attributes):
    """Set ``module``'s ``attributes`` (a launch configuration under test) while the block runs,
    and put the previous values back after it, also when it raises."""
    previous = {name: getattr(module, name) for name in attributes}
    for name, value in attributes.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in previous.items():
            setattr(module, name, value)


def norm_modules(lib):
    """(op, module) of each norm in the loaded library: RMSNorm's and LayerNorm's."""
    norm = lib["norm"].__name__
    return [(op, sys.modules[f"{norm}.{name}"]) for op, name in
            (("RMSNorm", "rms_norm"), ("LayerNorm", "layer_norm"))]  # fmt: skip


def norm_forward_call(op, m, rows, cols):
    """(x, ours): a bf16 input and a closure that runs the norm's forward launcher on it alone."""
    x = torch.randn(rows, cols, device="cuda", dtype=DT)
    w = torch.randn(cols, device="cuda", dtype=DT)

    def ours():
        if op == "RMSNorm":
            m._forward(x, None, w, 1e-6, 0)
        else:
            m._forward(x, [cols], w, w, 1e-5)

    return x, ours


def load():
    """(lib, liger): the library's packages and Liger-Kernel (None when absent), as benchmarks.ops
    loads them; exits when there is no CUDA GPU."""
    if not torch.cuda.is_available():
        sys.exit("the launch-configuration sweeps need a CUDA GPU")
    return cases.load_library(), cases.load_liger()
