"""The rotary forward over its launch configuration: where ``_launch_config`` comes from.

    python -m benchmarks.diagnose.rotary_launch

At the benchmark's shapes (``cases.ROTARY_SHAPES``), Liger's rotary, ours as configured and ours
over heads per block and ``num_warps``, each timed back to back under CUDA graphs (device time;
L2 is not cleared, so inputs smaller than L2 can stay there between replays). The rule under
test is ``_launch_config`` of the rotary package's ``rotary.py`` (cached per head counts); the
sweep swaps it and puts it back. Needs a CUDA GPU.
"""

from __future__ import annotations

import sys

import torch

from benchmarks import cases
from benchmarks.diagnose.launch import load, swapped


def _sweep_rotary_shape(lib, liger, rotary, batch, seq):
    from triton.testing import do_bench_cudagraph

    (q, k), _, fns, moved, _ = cases.rotary_case(lib, liger, batch, seq)

    def timed(label, fn, rep):
        fn(q, k)  # compile outside the graph capture
        ms = do_bench_cudagraph(lambda: fn(q, k), rep=rep)
        print(f"rotary {batch}x{seq} {label}: {ms * 1e3:7.1f} us {moved / ms / 1e6:6.0f} GB/s")

    if "liger" in fns:
        timed("liger", fns["liger"], 30)
    timed("ours as configured", fns["ours"], 30)
    launch_config = rotary._launch_config
    for heads in (32, 16, 8):
        for warps in (1, 2, 4, 8, 16):

            def config(n_q, n_k, d, heads=heads, warps=warps):
                block_half, block_hq, block_hk, _, _ = launch_config(n_q, n_k, d)
                block_hq, block_hk = min(block_hq, heads), min(block_hk, heads)
                return block_half, block_hq, block_hk, n_q <= block_hq and n_k <= block_hk, warps

            with swapped(rotary, _launch_config=config):
                timed(f"  ours, heads per block {heads:2d}, {warps:2d} warps", fns["ours"], 20)


def sweep_rotary(lib, liger):
    """Device time (CUDA graphs) of the rotary forward over heads per block and ``num_warps``,
    beside Liger's, at the benchmark's shapes. The configuration lives in
    ``rotary._launch_config`` (cached per head counts); the sweep swaps it and puts it back."""
    rotary = sys.modules[f"{lib['rotary'].__name__}.rotary"]
    stream = torch.cuda.Stream()  # graphs cannot be captured on the default stream
    with torch.cuda.stream(stream):
        for batch, seq in cases.ROTARY_SHAPES:
            _sweep_rotary_shape(lib, liger, rotary, batch, seq)


if __name__ == "__main__":
    sweep_rotary(*load())
