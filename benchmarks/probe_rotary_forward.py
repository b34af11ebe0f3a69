"""The rotary forward at the benchmark's shapes against Liger's, timed as ``ops.py`` times its
CUDA-graph tables (alone after an L2 clear, contenders alternating round by round; H200 probe,
2026-11-24; results in benchmarks/results/ops-2026-11-24d-h200/probe-rotary.txt).

    python benchmarks/probe_rotary_forward.py
    PROBE_OPS_HARNESS=1 python benchmarks/probe_rotary_forward.py  # as ops.py times, in place too

Two interleaved ops runs put ours at 0.985 and 0.980 of Liger at 4x2048 (quartiles over rounds
0.98-1.00), level at 1x4096 and ahead at 8x4096. Liger rotates q and k in place; ours returns
new tensors, as transformers' function does. The contenders: ours; our kernel writing in place
(what Liger's approach is worth to our kernel, not a candidate: it would overwrite the caller's
q and k); other warps; q and k read with an evict-first hint, or the outputs stored streaming.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ops  # noqa: E402
from probe_forward_variants import source_variant  # noqa: E402
from probe_layer_norm_flushed import flushed_rounds, print_times  # noqa: E402

HALVES_EVICT_FIRST = [
    (
        "    x1 = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)\n"
        "    x2 = tl.load(ptr + HALF, mask=mask, other=0.0).to(tl.float32)\n",
        '    x1 = tl.load(ptr, mask=mask, other=0.0, eviction_policy="evict_first")\n'
        '    x2 = tl.load(ptr + HALF, mask=mask, other=0.0, eviction_policy="evict_first")\n'
        "    x1 = x1.to(tl.float32)\n    x2 = x2.to(tl.float32)\n",
    )
]
STORE_STREAMING = [
    (
        "    tl.store(ptr, o1.to(XO.dtype.element_ty), mask=mask)\n"
        "    tl.store(ptr + HALF, o2.to(XO.dtype.element_ty), mask=mask)\n",
        '    tl.store(ptr, o1.to(XO.dtype.element_ty), mask=mask, cache_modifier=".cs")\n'
        '    tl.store(ptr + HALF, o2.to(XO.dtype.element_ty), mask=mask, cache_modifier=".cs")\n',
    )
]
HELPERS = {  # name: (helper, its replacements, the kernel's call to rename)
    "q, k evict_first": ("_load_halves", HALVES_EVICT_FIRST),
    "outputs streaming": ("_rotate_store", STORE_STREAMING),
}
SHAPES = [(1, 4096), (4, 2048), (8, 4096)]
WARPS = [4, 16]


def contenders(lib, liger, rotary, batch, seq):
    """(q, k, moved bytes, {name: call}): ours, Liger and ours in place, and the copy of the same
    bytes. Liger's and the in-place calls rotate their q and k round after round: each gets its
    own clones, so that ours keeps reading the original q and k."""
    (q, k), _, fns, moved, _ = ops.rotary_case(lib, liger, batch, seq)
    cos, sin = ops.rotary_tables(batch, seq)
    q_liger, k_liger, q_in_place, k_in_place = q.clone(), k.clone(), q.clone(), k.clone()
    calls = {
        "ours": functools.partial(fns["ours"], q, k),
        "liger": functools.partial(fns["liger"], q_liger, k_liger),
        "ours in place": functools.partial(
            rotary._launch, q_in_place, k_in_place, cos, sin, q_in_place, k_in_place, 1, False
        ),
        "copy of the same bytes": ops.same_bytes_calls(moved, 1)[0],
    }
    return q, k, moved, calls


def ops_harness(lib, liger, rotary, stream):
    """The contenders timed as ``ops.time_cases`` times the forward's CUDA graphs."""
    for batch, seq in SHAPES:
        torch._dynamo.reset()
        _, _, moved, calls = contenders(lib, liger, rotary, batch, seq)
        replays = {name: ops.captured(call, stream) for name, call in calls.items()}
        samples = ops.interleaved_samples(replays, 100)
        times = {name: ops.pooled_median(rounds) for name, rounds in samples.items()}
        print_times(f"rotary fwd {batch}x{seq}", times, moved, 24)
        for name in ("liger", "ours in place"):
            q1, median, q3 = ops.ratio_quartiles(samples[name], samples["ours"])
            print(f"    {name} ms / ours ms per round: {q1:.3f} {median:.3f} {q3:.3f}")
        del calls, replays
        torch.cuda.empty_cache()


def flushed_harness(lib, liger, rotary, stream):
    """The contenders, the kernel variants and other warps, each timed alone after an L2 clear
    (``flushed_rounds``); the variants' outputs checked against ours."""
    kernels = {}
    for i, (name, (helper, replacements)) in enumerate(HELPERS.items()):
        alias = f"{helper}_v{i}"
        setattr(rotary, alias, source_variant(getattr(rotary, helper), replacements, f"v{i}"))
        # The kernel's source with each call of the helper renamed to the variant.
        count = inspect.getsource(rotary._rotary_kernel.fn).count(f"{helper}(")
        renamed = [(f"{helper}(", f"{alias}(")] * count
        kernels[name] = source_variant(rotary._rotary_kernel, renamed, f"k{i}")
    for batch, seq in SHAPES:
        torch._dynamo.reset()
        q, k, moved, plain = contenders(lib, liger, rotary, batch, seq)
        ours = plain["ours"]
        expected = ours()
        calls = {name: (call, {}) for name, call in plain.items()}
        for name, kernel in kernels.items():
            calls[name] = (ours, {"_rotary_kernel": kernel})
        config = rotary._launch_config(q.shape[1], k.shape[1], q.shape[-1])
        for warps in WARPS:
            swap = {"_launch_config": lambda *_, c=(*config[:4], warps): c}
            calls[f"{warps} warps"] = (ours, swap)
        checked = [name for name, (_, swap) in calls.items() if swap]
        times = flushed_rounds(calls, rotary, stream, checked, expected, rounds=9)
        print_times(f"rotary fwd {batch}x{seq}", times, moved, 24)
        del q, k, plain, calls
        torch.cuda.empty_cache()


def main():
    lib = ops.load_library()
    liger = ops.load_liger()
    rotary = sys.modules[lib["rotary"].__name__ + ".rotary"]
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    harness = ops_harness if os.environ.get("PROBE_OPS_HARNESS") else flushed_harness
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.no_grad():
        harness(lib, liger, rotary, stream)


if __name__ == "__main__":
    main()
