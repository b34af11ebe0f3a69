"""RMSNorm's one-pass forward (bf16 rows of 4096) against Liger's, timed as ``ops.py`` times its
CUDA-graph tables (alone after an L2 clear, contenders alternating round by round; H200 probe,
2026-11-24; results in benchmarks/results/ops-2026-11-24d-h200/probe-one-pass-rms.txt).

    python benchmarks/probe_one_pass_rms.py
    PROBE_W_EARLY=1 python benchmarks/probe_one_pass_rms.py  # the weight early, more shapes
    PROBE_W_EARLY=1 PROBE_CASES=GemmaRMSNorm:16384x3584,... python benchmarks/probe_one_pass_rms.py

Both run one row of 4096 a program with 8 warps, and sit at ~98% of a copy of the same bytes at
16384x4096. The variants: the row read with an evict-first hint (nothing re-reads it), the
output written with a streaming store (``.cs``), the weight loaded beside the row (Liger's
order), and other launch shapes. With PROBE_W_EARLY set: the weight loaded early alone, at
more shapes and for more rounds (probe-w-early.txt).
"""

from __future__ import annotations

import functools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ops  # noqa: E402
from probe_forward_variants import RMS_W_EARLY, source_variant  # noqa: E402
from probe_layer_norm_flushed import flushed_rounds, print_times  # noqa: E402

X_EVICT_FIRST = [
    ('            True,\n            "",\n', '            True,\n            "evict_first",\n')
]
Y_STREAMING = [
    (
        "        tl.store(Y + offsets, y.to(Y.dtype.element_ty), mask=mask)\n",
        '        tl.store(Y + offsets, y.to(Y.dtype.element_ty), mask=mask, cache_modifier=".cs")\n',
    )
]
SOURCES = {
    "x evict_first": X_EVICT_FIRST,
    "y streaming": Y_STREAMING,
    "x evict_first, y streaming": X_EVICT_FIRST + Y_STREAMING,
    "w early": RMS_W_EARLY,
    "w early, x evict_first": RMS_W_EARLY + X_EVICT_FIRST,
}
# (one_pass, block_n, rows, num_warps) in place of the kept (True, 4096, 1, 8)
CONFIGS = [(True, 4096, 1, 4), (True, 4096, 1, 16), (True, 4096, 2, 16), (True, 4096, 2, 8)]
CASES = [
    ("RMSNorm", (16384, 4096)),
    ("GemmaRMSNorm", (16384, 4096)),
    ("FusedAddRMSNorm", (16384, 4096)),
    ("RMSNorm", (4096, 4096)),
    ("FusedAddRMSNorm", (4096, 4096)),
    ("RMSNorm", (32768, 4096)),
]
# Shapes that take the one-pass branch: packed narrow rows, one row of 4096 and of 5120.
W_EARLY_CASES = [
    (op, shape)
    for op in ("GemmaRMSNorm", "RMSNorm")
    for shape in ((4096, 4096), (16384, 4096), (32768, 4096), (16384, 5120), (65536, 1024))
]


def main():
    lib = ops.load_library()
    liger = ops.load_liger()
    rms = sys.modules[lib["norm"].__name__ + ".rms_norm"]
    w_early = os.environ.get("PROBE_W_EARLY")
    sources = {"w early": RMS_W_EARLY} if w_early else SOURCES
    variants = {
        name: source_variant(rms._rms_norm_fwd_kernel, r, "v") for name, r in sources.items()
    }
    cases = W_EARLY_CASES if w_early else CASES
    if os.environ.get("PROBE_CASES"):
        cases = [
            (op, tuple(int(n) for n in shape.split("x")))
            for op, shape in (case.split(":") for case in os.environ["PROBE_CASES"].split(","))
        ]
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.no_grad():
        for op, (rows, cols) in cases:
            torch._dynamo.reset()
            inputs, _, fns, moved, _ = ops.norm_case(op, lib, liger, rows, cols)
            ours = functools.partial(fns["ours"], *inputs)
            expected = ours()
            calls = {"ours": (ours, {}), "liger": (functools.partial(fns["liger"], *inputs), {})}
            for name, kernel in variants.items():
                calls[name] = (ours, {"_rms_norm_fwd_kernel": kernel})
            for config in [] if w_early else CONFIGS:
                calls[f"rows {config[2]}, {config[3]} warps"] = (
                    ours, {"_fwd_block": lambda *_, c=config: c}
                )  # fmt: skip
            calls["copy of the same bytes"] = (ops.same_bytes_calls(moved, 1)[0], {})
            checked = [name for name, (_, swap) in calls.items() if swap]
            times = flushed_rounds(
                calls, rms, stream, checked, expected, rounds=15 if w_early else 7
            )
            print_times(f"{op} fwd {rows}x{cols}", times, moved, 28)
            del inputs, fns, calls
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
