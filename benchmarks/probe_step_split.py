"""Where a training step's wall time comes from: host or device, contender by contender.

    python benchmarks/probe_step_split.py 1x4096 8x512 [--profile]

The eager-mode contenders of ``e2e.py`` (eager, ours kernelized, Liger without and with fused
cross-entropy) on the same weights, timed in interleaved rounds as e2e.py times them (4 warm-up,
median of 16). For each: the wall time of a training step between CUDA events; the host time
of its forward and of its backward call (``time.perf_counter`` around each, no synchronisation
in between, so it is the time to enqueue the work); and the cudaMalloc calls made during the
timed steps. With ``--profile``: the device time per step summed over all kernels
(``torch.profiler``, 3 steps) and the heaviest kernels.

Reading it: when the host time of forward + backward is close to the wall time the step is
host-bound, and wall times compare hosts, not kernels; the device time is the kernels' own. On
the H100 VMs we measure on, the host speed differs from one machine to the next by up to 2x
(benchmarks/results/e2e-2026-11-23f-h100/NOTES.md). A probe for decisions, not the benchmark.
"""

from __future__ import annotations

import statistics
import sys
import time

import e2e
import torch

EAGER_MODE = ("eager", "ours (kernelized)", "liger (no fused CE)", "liger (fused linear CE)")


def train_step(model, tokens) -> tuple[float, float, float]:
    """(wall ms, host ms of forward, host ms of backward) of one training step."""
    torch.cuda.synchronize()
    start, end = (torch.cuda.Event(enable_timing=True) for _ in "se")
    t0 = time.perf_counter()
    start.record()
    loss = model(input_ids=tokens, labels=tokens).loss
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    end.record()
    torch.cuda.synchronize()
    model.zero_grad(set_to_none=True)
    return start.elapsed_time(end), (t1 - t0) * 1e3, (t2 - t1) * 1e3


def device_ms(model, tokens, steps: int = 3, top: int = 8) -> tuple[float, list[str]]:
    """Kernel time per step summed over all kernels, and the ``top`` heaviest kernels."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            model(input_ids=tokens, labels=tokens).loss.backward()
            model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    kernels.sort(key=lambda e: -e.self_device_time_total)
    total = sum(e.self_device_time_total for e in kernels) / steps / 1e3
    lines = [
        f"{e.self_device_time_total / steps / 1e3:7.3f} ms x{e.count // steps:<4d} {e.key[:90]}"
        for e in kernels[:top]
    ]
    return total, lines


def main(shapes: list[str], with_profile: bool, rounds: int = 16, warmup: int = 4) -> None:
    torch.manual_seed(0)
    state = {k: v.detach().clone() for k, v in e2e.build().state_dict().items()}
    module_state = e2e.ModuleState()
    contenders = e2e.build_contenders(e2e.contender_makers(state), EAGER_MODE, module_state)
    names = list(contenders)
    for shape in shapes:
        batch, seq = (int(v) for v in shape.split("x"))
        tokens = torch.randint(0, e2e.CONFIG["vocab_size"], (batch, seq), device="cuda")
        times = {name: [] for name in names}
        mallocs = dict.fromkeys(names, 0)
        for r in range(warmup + rounds):
            for i in range(len(names)):
                name = names[(r + i) % len(names)]
                model, own_state = contenders[name]
                module_state.restore(own_state)
                model.train()
                before = torch.cuda.memory_stats().get("num_device_alloc", 0)
                split = train_step(model, tokens)
                if r >= warmup:
                    times[name].append(split)
                    mallocs[name] += torch.cuda.memory_stats().get("num_device_alloc", 0) - before
        for name in names:
            wall, fwd, bwd = (statistics.median(t[j] for t in times[name]) for j in range(3))
            print(
                f"{shape} {name:26s} wall {wall:7.2f} ms  host: forward {fwd:6.2f} ms, "
                f"backward {bwd:6.2f} ms  cudaMallocs {mallocs[name]}",
                flush=True,
            )
        for name in names if with_profile else ():
            model, own_state = contenders[name]
            module_state.restore(own_state)
            total, lines = device_ms(model, tokens)
            print(f"{shape} {name}: device time per step {total:.2f} ms", flush=True)
            for line in lines:
                print(f"    {line}")
    module_state.restore()


if __name__ == "__main__":
    args = sys.argv[1:]
    main([a for a in args if a != "--profile"], "--profile" in args)
