"""Where a training step's wall time comes from: host or device, contender by contender.

    python benchmarks/probe_step_split.py 1x4096 8x512

The eager-mode contenders of ``e2e.py`` (eager, ours kernelized, Liger without and with fused
cross-entropy) on the same weights, timed as e2e.py times them (``e2e.time_interleaved``: wall
time of each step between CUDA events and the host time to issue a training step), and then,
for each, the device time of a training step summed over all kernels (``torch.profiler``, 3
steps) with the heaviest kernels.

Reading it: when the host time is close to the wall time the step is host-bound, and wall
times compare hosts, not kernels; the device time is the kernels' own. On the H100 VMs we
measure on, the host speed differs from one machine to the next by up to 2x
(benchmarks/results/e2e-2026-11-23f-h100/NOTES.md). A probe for decisions, not the benchmark.
"""

from __future__ import annotations

import sys

import e2e
import torch

EAGER_MODE = ("eager", "ours (kernelized)", "liger (no fused CE)", "liger (fused linear CE)")


def device_ms(model, tokens, steps: int = 3, top: int = 8) -> tuple[float, list[str]]:
    """Kernel time per training step summed over all kernels, and the ``top`` heaviest kernels."""
    from torch.profiler import ProfilerActivity, profile

    model.train()
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


def main(shapes: list[str]) -> None:
    torch.manual_seed(0)
    state = {k: v.detach().clone() for k, v in e2e.build().state_dict().items()}
    module_state = e2e.ModuleState()
    contenders = e2e.build_contenders(e2e.contender_makers(state), EAGER_MODE, module_state)
    for shape in shapes:
        batch, seq = (int(v) for v in shape.split("x"))
        tokens = torch.randint(0, e2e.CONFIG["vocab_size"], (batch, seq), device="cuda")
        print(f"shape {shape}:", flush=True)
        timed = e2e.time_interleaved(contenders, module_state, tokens, rounds=16, warmup=4)
        for row in timed:
            model, own_state = contenders[row["contender"]]
            module_state.restore(own_state)
            total, lines = device_ms(model, tokens)
            print(
                f"  {row['contender']}: wall {row['train_ms']:.2f} ms, host {row['train_host_ms']:.2f}"
                f" ms, device {total:.2f} ms",
                flush=True,
            )
            for line in lines:
                print(f"    {line}")
        module_state.restore()


if __name__ == "__main__":
    main(sys.argv[1:])
