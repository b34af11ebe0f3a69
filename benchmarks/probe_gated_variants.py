"""The gated activations' kernels (SwiGLU: two tensors; SiluAndMul: halves of one) against
torch.compile's, timed as ``ops.py`` times its CUDA-graph tables (alone after an L2 clear,
contenders alternating round by round; H200 probe, 2026-11-24; results in
benchmarks/results/ops-2026-11-24d-h200/probe-gated.txt).

    python benchmarks/probe_gated_variants.py

In the interleaved ops run of 2026-11-24 inductor's SwiGLU kernels were 0.2-0.8% ahead of ours
at every shape, forward and forward+backward, with tight quartiles; SiluAndMul's forward
0.2-0.4% at 64M elements. Inductor's pointwise kernels index one flat range, unmasked where the
size divides the block; ours address rows and columns (strided rows are legal) with 64-bit row
offsets and masks. The variants: masks dropped (valid at these shapes only), 32-bit row offsets,
and both; and other launch shapes (``probe-gated-configs.txt``).
"""

from __future__ import annotations

import functools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ops  # noqa: E402
from probe_forward_variants import source_variant  # noqa: E402
from probe_layer_norm_flushed import flushed_rounds, print_times  # noqa: E402


def _unmasked(loads: int, stores: int) -> list:
    return [(", mask=mask, other=0.0)", ")")] * loads + [(", mask=mask)", ")")] * stores


INT32_ROWS = [("(pid // col_blocks).to(tl.int64) * ROWS", "(pid // col_blocks) * ROWS")]
VARIANTS = {  # name: (forward replacements, backward replacements)
    "no masks": (_unmasked(2, 1), _unmasked(3, 3)),
    "int32 rows": (INT32_ROWS, INT32_ROWS),
    "no masks, int32 rows": (_unmasked(2, 1) + INT32_ROWS, _unmasked(3, 3) + INT32_ROWS),
}
# (rows, block_d, num_warps) in place of the kept (1, 2048, 4) at these widths
CONFIGS = [(1, 1024, 4), (1, 1024, 2), (1, 4096, 8), (1, 2048, 8), (1, 4096, 4)]
CASES = [
    ("SwiGLU", (4096, 4096)),
    ("SwiGLU", (16384, 4096)),
    ("SwiGLU", (32768, 8192)),
    ("SiluAndMul", (16384, 4096)),
    ("SiluAndMul", (32768, 8192)),
]


def _fwd(fn, inputs):
    with torch.no_grad():
        return fn(*inputs)


def _fwd_bwd(fn, inputs, seed):
    return torch.autograd.grad(fn(*inputs), inputs, seed)


def main():
    lib = ops.load_library()
    gated = sys.modules[lib["activation"].__name__ + ".gated"]
    kernels = {
        name: {
            "_gated_fwd_kernel": source_variant(gated._gated_fwd_kernel, fwd, "v"),
            "_gated_bwd_kernel": source_variant(gated._gated_bwd_kernel, bwd, "v"),
        }
        for name, (fwd, bwd) in VARIANTS.items()
    }
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for op, shape in CASES:
            torch._dynamo.reset()
            inputs, _, fns, b_fwd, b_bwd = ops.make_case(op, lib, None, shape)
            for t in inputs:
                t.requires_grad_(True)
            seed = torch.randn_like(_fwd(fns["ours"], inputs))
            phases = (
                ("fwd", _fwd, (inputs,), b_fwd),
                ("fwd+bwd", _fwd_bwd, (inputs, seed), b_fwd + b_bwd),
            )
            for phase, run, args, moved in phases:
                ours = functools.partial(run, fns["ours"], *args)
                expected = ours()
                calls = {
                    "ours": (ours, {}),
                    "compile": (functools.partial(run, fns["compile"], *args), {}),
                }
                for name, swap in kernels.items():
                    calls[name] = (ours, swap)
                for config in CONFIGS:
                    swap = {"_launch_config": lambda *_, c=config: c}
                    calls["{} rows of {}, {} warps".format(*config)] = (ours, swap)
                calls["copy of the same bytes"] = (ops.same_bytes_calls(moved, 1)[0], {})
                checked = [name for name, (_, swap) in calls.items() if swap]
                times = flushed_rounds(calls, gated, stream, checked, expected, rounds=9)
                print_times(f"{op} {phase} {shape[0]}x{shape[1]}", times, moved, 24)
            del inputs, fns, calls, phases, seed
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
