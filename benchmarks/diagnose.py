"""Where the time goes: host (Python) cost per call, and device time per kernel.

    python benchmarks/diagnose.py

1. Host cost: microseconds of CPU per call at a tiny shape (the GPU work is negligible), for a
   bare Triton launch, a launch through the cached compiled kernel, our functions, our layers
   bound to a module, the custom op, forward+backward through autograd, and the peers.
2. Device time: ``torch.profiler`` over a few forward+backward iterations per case, listing each
   kernel's mean device time, so the kernels can be compared with the bytes they must move.
"""

from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ops  # noqa: E402

DT = torch.bfloat16


def host_us(fn, n=3000):
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def host_costs(lib, liger):
    norm = lib["norm"]
    rms = sys.modules[f"{norm.__name__}.rms_norm"]
    x = torch.randn(8, 4096, device="cuda", dtype=DT)
    module = ops.LlamaRMSNorm(4096).to("cuda", DT)
    w = module.weight
    y = torch.empty_like(x)
    rstd = torch.empty(8, device="cuda")
    layer = ops.bound(norm.layers.RMSNorm, module)
    compiled = torch.compile(module, dynamic=False)
    rows = {}

    def launch():
        rms._rms_norm_fwd_kernel[(8,)](
            x, x, w, y, x, rstd, 8, 4096, 4096, 4096, 1e-6,
            MODE=0, HAS_RESIDUAL=False, ONE_PASS=True, ROWS=1, BLOCK_N=4096, num_warps=8,
        )  # fmt: skip

    ck = rms._rms_norm_fwd_kernel[(8,)](
        x, x, w, y, x, rstd, 8, 4096, 4096, 4096, 1e-6,
        MODE=0, HAS_RESIDUAL=False, ONE_PASS=True, ROWS=1, BLOCK_N=4096, num_warps=8,
    )  # fmt: skip
    all_args = (x, x, w, y, x, rstd, 8, 4096, 4096, 4096, 1e-6, 0, False, True, 1, 4096)
    try:
        runner = ck[(8, 1, 1)]
        runner(*all_args)
        torch.cuda.synchronize()
        rows["compiled-kernel runner (ck[grid](*args))"] = host_us(lambda: ck[(8, 1, 1)](*all_args))
        ok = torch.equal(y, y)  # ran without error
        rows["compiled-kernel runner, ok"] = float(ok)
    except Exception as exc:  # noqa: BLE001
        print("compiled-kernel runner failed:", type(exc).__name__, exc)
    rows["torch.empty"] = host_us(lambda: torch.empty((8, 4096), device="cuda", dtype=DT))
    rows["bare triton launch (kernel[grid](...))"] = host_us(launch)
    with torch.no_grad():
        rows["ours rms_norm() no_grad"] = host_us(lambda: norm.rms_norm(x, w, 1e-6))
        rows["ours layer no_grad"] = host_us(lambda: layer(x))
        rows["ours custom op no_grad"] = host_us(lambda: rms.rms_norm_op(x, w, 1e-6, 0))
        rows["compile no_grad"] = host_us(lambda: compiled(x))
        rows["eager no_grad"] = host_us(lambda: module(x))
        if liger:
            rows["liger no_grad"] = host_us(
                lambda: liger.rms_norm.apply(x, w, 1e-6, 0.0, "llama", True)
            )
    xg = x.clone().requires_grad_()
    dy = torch.randn_like(x)
    wrt = (xg, w)
    for name, fn in (
        ("ours", layer),
        ("compile", compiled),
        ("eager", module),
        (
            "liger",
            (lambda t: liger.rms_norm.apply(t, w, 1e-6, 0.0, "llama", False)) if liger else None,
        ),
    ):
        if fn is None:
            continue
        rows[f"{name} fwd+bwd (autograd.grad)"] = host_us(
            lambda fn=fn: torch.autograd.grad(fn(xg), wrt, dy), n=1000
        )
    rows["ours fwd+bwd through custom op"] = host_us(
        lambda: torch.autograd.grad(rms.rms_norm_op(xg, w, 1e-6, 0)[0], wrt, dy), n=1000
    )
    for k, v in rows.items():
        print(f"host {k:45s} {v:8.1f} us")


def profile(label, inputs, params, fn, iters=10):
    for t in inputs:
        t.requires_grad_(True)
    wrt = [*inputs, *params]
    out = ops._outputs(fn(*inputs))
    seeds = [torch.randn_like(o) for o in out]
    for _ in range(3):
        torch.autograd.grad(ops._outputs(fn(*inputs)), wrt, seeds)
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    with prof(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(iters):
            torch.autograd.grad(ops._outputs(fn(*inputs)), wrt, seeds)
        torch.cuda.synchronize()
    print(f"--- {label}: device time per iteration by kernel")
    for e in sorted(p.key_averages(), key=lambda e: -e.device_time_total):
        if e.device_time_total <= 0:
            continue
        print(f"    {e.device_time_total / iters:9.1f} us  x{e.count // iters:<3d} {e.key[:90]}")


class _Launch:
    """A Triton kernel stand-in that adds launch options (num_warps, num_stages)."""

    def __init__(self, kernel, **options):
        self.kernel, self.options = kernel, options

    def __getitem__(self, grid):
        run = self.kernel[grid]
        return lambda *args, **kwargs: run(*args, **{**kwargs, **self.options})


def sweep_backward(lib):
    """Device time of the norm backward launchers alone, over launch options."""
    from triton.testing import do_bench

    norm = lib["norm"]
    for op, mod, kname, shape in (
        ("RMSNorm", "rms_norm", "_rms_norm_bwd_kernel", (16384, 4096)),
        ("RMSNorm", "rms_norm", "_rms_norm_bwd_kernel", (4096, 4096)),
        ("LayerNorm", "layer_norm", "_layer_norm_bwd_kernel", (8192, 8192)),
    ):
        m = sys.modules[f"{norm.__name__}.{mod}"]
        rows, cols = shape
        x = torch.randn(rows, cols, device="cuda", dtype=DT)
        dy = torch.randn_like(x)
        w = torch.randn(cols, device="cuda", dtype=DT)
        if op == "RMSNorm":
            _, _, rstd = m._forward(x, None, w, 1e-6, 0)

            def call():
                m._backward(dy, None, x, w, rstd, 0, True)  # noqa: B023 (used in this iteration)
        else:
            _, mean, rstd = m._forward(x, [cols], w, w, 1e-5)

            def call():
                m._backward(dy, x, [cols], w, mean, rstd, True, True)  # noqa: B023

        kernel, row_block, per_sm0 = getattr(m, kname), m.row_block, m.BWD_PROGRAMS_PER_SM
        moved = 3 * rows * cols * 2
        for warps in (4, 8, 16):
            for stages in (1, 2, 3):
                for per_sm in (1, 2, 4, 8):
                    setattr(m, kname, _Launch(kernel, num_warps=warps, num_stages=stages))
                    m.BWD_PROGRAMS_PER_SM = per_sm
                    ms = do_bench(call, warmup=10, rep=30, return_mode="median")
                    print(
                        f"bwd {op} {shape} warps {warps:2d} stages {stages} programs/SM {per_sm}: "
                        f"{ms * 1e3:7.1f} us {moved / ms / 1e6:6.0f} GB/s",
                        flush=True,
                    )
        setattr(m, kname, kernel)
        m.row_block, m.BWD_PROGRAMS_PER_SM = row_block, per_sm0


def main():
    lib = ops.load_library()
    liger = ops.load_liger()
    host_costs(lib, liger)
    sweep_backward(lib)
    for op, shape in (
        ("RMSNorm", (4096, 4096)),
        ("RMSNorm", (16384, 4096)),
        ("RMSNorm", (8192, 8192)),
        ("LayerNorm", (8192, 8192)),
    ):
        inputs, params, fns, b_fwd, b_bwd = ops.norm_case(op, lib, liger, *shape)
        for impl in ("ours", "liger", "compile"):
            if impl in fns:
                profile(
                    f"{op} {shape} {impl} (fwd {b_fwd / 1e6:.0f} MB, bwd {b_bwd / 1e6:.0f} MB)",
                    inputs,
                    params,
                    fns[impl],
                )
    inputs, params, fns, b_fwd, b_bwd = ops.gelu_tanh_case(lib, liger, 8192, 8192)
    profile(f"GeluTanh 8192x8192 ours (fwd {b_fwd / 1e6:.0f} MB)", inputs, params, fns["ours"])
    for shape in ((1, 4096), (8, 4096)):
        inputs, params, fns, b_fwd, b_bwd = ops.rotary_case(lib, liger, *shape)
        for impl in ("ours", "liger", "compile"):
            profile(f"rotary {shape} {impl} (fwd {b_fwd / 1e6:.0f} MB)", inputs, params, fns[impl])


if __name__ == "__main__":
    main()
