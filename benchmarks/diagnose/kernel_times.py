"""Device time per kernel, from ``torch.profiler``, of forward+backward iterations.

    python -m benchmarks.diagnose.kernel_times

For the norms (ours, Liger and ``torch.compile``), GeluTanh (ours) and rotary (all three) at a
few shapes: each kernel's mean device time per iteration and its calls, so the kernels can be
compared with the bytes each must move (printed beside each case). Needs a CUDA GPU.
"""

from __future__ import annotations

import torch

from benchmarks import cases, timing
from benchmarks.diagnose.launch import load


def profile(label, inputs, params, fn, iters=10):
    """Print each kernel's device time per forward+backward iteration of ``fn`` on ``inputs``
    (gradients for the inputs and ``params``), slowest first, after three warm-up iterations."""
    for t in inputs:
        t.requires_grad_(True)
    wrt = [*inputs, *params]
    out = timing.outputs(fn(*inputs))
    seeds = [torch.randn_like(o) for o in out]
    for _ in range(3):
        torch.autograd.grad(timing.outputs(fn(*inputs)), wrt, seeds)
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    with prof(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(iters):
            torch.autograd.grad(timing.outputs(fn(*inputs)), wrt, seeds)
        torch.cuda.synchronize()
    print(f"--- {label}: device time per iteration by kernel")
    for e in sorted(p.key_averages(), key=lambda e: -e.device_time_total):
        if e.device_time_total <= 0:
            continue
        print(f"    {e.device_time_total / iters:9.1f} us  x{e.count // iters:<3d} {e.key[:90]}")


def device_profiles(lib, liger):
    """torch.profiler device time per kernel for the norms, GeluTanh and rotary."""
    for op, shape in (
        ("RMSNorm", (4096, 4096)),
        ("RMSNorm", (16384, 4096)),
        ("RMSNorm", (8192, 8192)),
        ("LayerNorm", (8192, 8192)),
    ):
        inputs, params, fns, b_fwd, b_bwd = cases.norm_case(op, lib, liger, *shape)
        for impl in ("ours", "liger", "compile"):
            if impl in fns:
                profile(
                    f"{op} {shape} {impl} (fwd {b_fwd / 1e6:.0f} MB, bwd {b_bwd / 1e6:.0f} MB)",
                    inputs,
                    params,
                    fns[impl],
                )
    inputs, params, fns, b_fwd, b_bwd = cases.gelu_tanh_case(lib, liger, 8192, 8192)
    profile(f"GeluTanh 8192x8192 ours (fwd {b_fwd / 1e6:.0f} MB)", inputs, params, fns["ours"])
    for shape in ((1, 4096), (8, 4096)):
        inputs, params, fns, b_fwd, b_bwd = cases.rotary_case(lib, liger, *shape)
        for impl in ("ours", "liger", "compile"):
            profile(f"rotary {shape} {impl} (fwd {b_fwd / 1e6:.0f} MB)", inputs, params, fns[impl])


if __name__ == "__main__":
    device_profiles(*load())
