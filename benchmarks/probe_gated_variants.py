"""The gated activations' kernels (SwiGLU: two tensors; SiluAndMul: halves of one) against
torch.compile's, timed as ``ops.py`` times its CUDA-graph tables (alone after an L2 clear,
contenders alternating round by round; H200 probe, 2026-11-24; results in
benchmarks/results/ops-2026-11-24d-h200/probe-gated.txt).

    python benchmarks/probe_gated_variants.py
    PROBE_SMALL=1 python benchmarks/probe_gated_variants.py  # 4096x4096 beside Liger, 15 rounds

In the interleaved ops run of 2026-11-24 inductor's SwiGLU kernels were 0.2-0.8% ahead of ours
at every shape, forward and forward+backward, with tight quartiles; SiluAndMul's forward
0.2-0.4% at 64M elements. Inductor's pointwise kernels index one flat range, unmasked where the
size divides the block; ours address rows and columns (strided rows are legal) with 64-bit row
offsets and masks. The variants: masks dropped (valid at these shapes only), 32-bit row offsets,
and both; and other launch shapes (``probe-gated-configs.txt``). With PROBE_SMALL set: launch
shapes at 4096x4096, where Liger's forward led ours by 1-2% in both interleaved ops runs, with
Liger among the contenders (``probe-gated-small.txt``).
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
SMALL_CONFIGS = [(1, 4096, 8), (1, 4096, 16), (1, 1024, 4), (2, 2048, 16), (1, 2048, 4)]
SMALL_CASES = [("SwiGLU", (4096, 4096)), ("SiluAndMul", (4096, 4096)), ("SwiGLU", (16384, 4096))]
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
    small = os.environ.get("PROBE_SMALL")
    lib = ops.load_library()
    liger = ops.load_liger() if small else None
    gated = sys.modules[lib["activation"].__name__ + ".gated"]
    kernels = {
        name: {
            "_gated_fwd_kernel": source_variant(gated._gated_fwd_kernel, fwd, "v"),
            "_gated_bwd_kernel": source_variant(gated._gated_bwd_kernel, bwd, "v"),
        }
        for name, (fwd, bwd) in ({} if small else VARIANTS).items()
    }
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for op, shape in SMALL_CASES if small else CASES:
            torch._dynamo.reset()
            inputs, _, fns, b_fwd, b_bwd = ops.make_case(op, lib, liger, shape)
            for t in inputs:
                t.requires_grad_(True)
            seed = torch.randn_like(_fwd(fns["ours"], inputs))
            # Liger's backward writes its gradients into the tensors it saved: its own copies.
            liger_inputs = [t.detach().clone().requires_grad_(True) for t in inputs]
            phases = (
                ("fwd", _fwd, (inputs,), (liger_inputs,), b_fwd),
                ("fwd+bwd", _fwd_bwd, (inputs, seed), (liger_inputs, seed), b_fwd + b_bwd),
            )
            for phase, run, args, liger_args, moved in phases:
                ours = functools.partial(run, fns["ours"], *args)
                expected = ours()
                calls = {
                    "ours": (ours, {}),
                    "compile": (functools.partial(run, fns["compile"], *args), {}),
                }
                if "liger" in fns:
                    calls["liger"] = (functools.partial(run, fns["liger"], *liger_args), {})
                for name, swap in kernels.items():
                    calls[name] = (ours, swap)
                for config in SMALL_CONFIGS if small else CONFIGS:
                    swap = {"_launch_config": lambda *_, c=config: c}
                    calls["{} rows of {}, {} warps".format(*config)] = (ours, swap)
                calls["copy of the same bytes"] = (ops.same_bytes_calls(moved, 1)[0], {})
                checked = [name for name, (_, swap) in calls.items() if swap]
                times = flushed_rounds(
                    calls, gated, stream, checked, expected, rounds=15 if small else 9
                )
                print_times(f"{op} {phase} {shape[0]}x{shape[1]}", times, moved, 24)
            del inputs, liger_inputs, fns, calls, phases, seed
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
