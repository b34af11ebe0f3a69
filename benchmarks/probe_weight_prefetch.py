"""The norm forwards with their weight (and bias) prefetched into L2 at the start of each program,
timed as ``ops.py`` times its CUDA-graph tables (alone after an L2 clear; H200 probe,
2026-11-24; results in benchmarks/results/ops-2026-11-24c-h200/probe-weight-prefetch.txt).

    python benchmarks/probe_weight_prefetch.py
    PROBE_RMS_UNROLLED=1 python benchmarks/probe_weight_prefetch.py   # RMSNorm's loops unrolled

After an L2 clear (as in a model, where other layers' data passes through L2 between two calls
of a norm) the first programs' weight loads miss L2. Ours load the weight after the row's
reductions, so that miss is exposed; Liger's RMSNorm loads it beside the row. A ``prefetch``
(PTX ``prefetch.global.L2``) at each program's start costs no registers, unlike loading early.
"""

from __future__ import annotations

import functools
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ops  # noqa: E402
from probe_forward_variants import RMS_W_EARLY, source_variant  # noqa: E402
from probe_layer_norm_flushed import flushed_rounds, print_times  # noqa: E402


@triton.jit
def _prefetch_l2(P, n):
    # One prefetch per 128 bytes of bf16 (64 elements) of the first n elements at P, clamped to
    # the last one: 256 prefetches cover 16384 elements.
    offsets = tl.minimum(tl.arange(0, 256) * 64, n - 1)
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [P + offsets], dtype=tl.int32,
        is_pure=False, pack=1,
    )  # fmt: skip


RMS_PREFETCH = [
    (
        "    IN_DTYPE: tl.constexpr = S.dtype.element_ty\n",
        "    IN_DTYPE: tl.constexpr = S.dtype.element_ty\n    _prefetch_l2(W, n_cols)\n",
    )
]
LN_PREFETCH = [
    (
        "    if ONE_PASS:\n        rows = tl.program_id(0)",
        "    if HAS_WEIGHT:\n        _prefetch_l2(W, n_cols)\n"
        "    if HAS_BIAS:\n        _prefetch_l2(B, n_cols)\n"
        "    if ONE_PASS:\n        rows = tl.program_id(0)",
    )
]
CASES = [
    ("RMSNorm", (16384, 4096)),
    ("GemmaRMSNorm", (16384, 4096)),
    ("RMSNorm", (4096, 4096)),
    ("RMSNorm", (8192, 8192)),
    ("LayerNorm", (8192, 8192)),
    ("LayerNorm", (16384, 4096)),
    ("LayerNorm", (32768, 8192)),
    ("LayerNorm", (4096, 4096)),
]


RMS_UNROLLED = [
    (
        "        tl.store(RSTD + row, rstd)\n        for start in range(0, CHUNKED_COLS, BLOCK_N):",
        "        tl.store(RSTD + row, rstd)\n"
        "        for start in tl.static_range(0, CHUNKED_COLS, BLOCK_N):",
    )
]
RMS_BOTH_UNROLLED = [
    ("for start in range(0, CHUNKED_COLS, BLOCK_N):",
     "for start in tl.static_range(0, CHUNKED_COLS, BLOCK_N):"),
    *RMS_UNROLLED,
]  # fmt: skip
# RMSNorm's chunked rows (bf16 8192 wide, fp32 4096 and 8192): its loops unrolled, as
# LayerNorm's normalising pass is (PROBE_RMS_UNROLLED).
UNROLLED_CASES = [
    ("RMSNorm", (8192, 8192)),
    ("GemmaRMSNorm", (8192, 8192)),
    ("FusedAddRMSNorm", (8192, 8192)),
    ("RMSNorm", (32768, 8192)),
    ("GemmaRMSNorm", (32768, 8192)),
    ("RMSNorm-fp32", (16384, 4096)),
    ("RMSNorm-fp32", (32768, 8192)),
]


def time_cases(lib, liger, cases, variants):
    """Each case's contenders (ours, Liger, ``variants`` of the op's kernel, a copy of the same
    bytes) timed as ``ops.py`` times its CUDA-graph tables, in five rounds; medians printed."""
    package = lib["norm"].__name__
    rms = sys.modules[package + ".rms_norm"]
    ln = sys.modules[package + ".layer_norm"]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.no_grad():
        for op, (rows, cols) in cases:
            torch._dynamo.reset()
            inputs, _, fns, moved, _ = ops.norm_case(op, lib, liger, rows, cols)
            is_ln = op.startswith("LayerNorm")
            target, attribute = (
                (ln, "_layer_norm_fwd_kernel") if is_ln else (rms, "_rms_norm_fwd_kernel")
            )
            ours = functools.partial(fns["ours"], *inputs)
            expected = ours()
            calls = {"ours": (ours, {})}
            if "liger" in fns:
                calls["liger"] = (functools.partial(fns["liger"], *inputs), {})
            for name, kernel in variants["ln" if is_ln else "rms"].items():
                calls[name] = (ours, {attribute: kernel})
            calls["copy of the same bytes"] = (ops.same_bytes_calls(moved, 1)[0], {})
            checked = [name for name, (_, swap) in calls.items() if swap]
            times = flushed_rounds(calls, target, stream, checked, expected)
            print_times(f"{op} fwd {rows}x{cols}", times, moved, 28)
            del inputs, fns, calls
            torch.cuda.empty_cache()


def main():
    lib = ops.load_library()
    liger = ops.load_liger()
    package = lib["norm"].__name__
    rms = sys.modules[package + ".rms_norm"]
    ln = sys.modules[package + ".layer_norm"]
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    if os.environ.get("PROBE_RMS_UNROLLED"):
        variants = {
            "rms": {
                "second pass unrolled": source_variant(
                    rms._rms_norm_fwd_kernel, RMS_UNROLLED, "u2"
                ),
                "both passes unrolled": source_variant(
                    rms._rms_norm_fwd_kernel, RMS_BOTH_UNROLLED, "u12"
                ),
            },
            "ln": {},
        }
        time_cases(lib, liger, UNROLLED_CASES, variants)
        return
    rms._prefetch_l2 = ln._prefetch_l2 = _prefetch_l2  # found by the variants' sources
    variants = {
        "rms": {
            "weight prefetched": source_variant(rms._rms_norm_fwd_kernel, RMS_PREFETCH, "pf"),
            "weight loaded early": source_variant(rms._rms_norm_fwd_kernel, RMS_W_EARLY, "early"),
        },
        "ln": {
            "weight, bias prefetched": source_variant(ln._layer_norm_fwd_kernel, LN_PREFETCH, "pf")
        },
    }
    time_cases(lib, liger, CASES, variants)


if __name__ == "__main__":
    main()
