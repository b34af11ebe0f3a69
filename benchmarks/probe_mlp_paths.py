"""A/B of SwiGLUMLP's two eager training paths, in one process, interleaved with Liger.

    python benchmarks/probe_mlp_paths.py 8x512 1x4096 4x2048

"one-function MLP": ``swiglu_mlp`` (keeps gate and up for backward); "module calls": the
projections called as modules around ``silu_mul`` (also keeps their product). One kernelized
model serves both: the layer module's ``_takes_fused_mlp`` is switched before each step.
Liger-Kernel (rope, rms_norm, swiglu; no fused cross-entropy) is the reference. Rounds run every
contender once in rotating order; 4 warm-up rounds, median of 20; the memory column is the peak
a step allocated beyond what was resident. A probe for decisions, not the benchmark (e2e.py).
"""

import importlib
import statistics
import sys

import e2e
import torch


def main(shapes: list[str]) -> None:
    from kernels.layer.swap import kernel_layer_of

    state = {k: v.detach().clone() for k, v in e2e.build().state_dict().items()}
    module_state = e2e.ModuleState()
    built = e2e.build_contenders(
        e2e.contender_makers(state), ["ours (kernelized)", "liger (no fused CE)"], module_state
    )
    (ours, ours_state), (liger, liger_state) = built.values()
    mlp = next(m for m in ours.modules() if type(m).__name__ == "LlamaMLP")
    layers = importlib.import_module(kernel_layer_of(mlp).__module__)
    fused = layers._takes_fused_mlp
    contenders = {
        "ours, one-function MLP": (ours, ours_state, fused),
        "ours, module calls": (ours, ours_state, lambda *args: False),
        "liger": (liger, liger_state, fused),
    }
    for shape in shapes:
        batch, seq = (int(v) for v in shape.split("x"))
        tokens = torch.randint(0, e2e.CONFIG["vocab_size"], (batch, seq), device="cuda")
        times = {name: [] for name in contenders}
        peaks = dict.fromkeys(contenders, 0.0)
        items = list(contenders.items())
        for r in range(24):
            for name, (model, own_state, check) in items[r % 3 :] + items[: r % 3]:
                module_state.restore(own_state)
                layers._takes_fused_mlp = check
                model.train()
                torch.cuda.synchronize()
                resident = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                start, end = (torch.cuda.Event(enable_timing=True) for _ in "se")
                start.record()
                model(input_ids=tokens, labels=tokens).loss.backward()
                end.record()
                torch.cuda.synchronize()
                extra = (torch.cuda.max_memory_allocated() - resident) / 2**30
                peaks[name] = max(peaks[name], extra)
                model.zero_grad(set_to_none=True)
                if r >= 4:
                    times[name].append(start.elapsed_time(end))
        layers._takes_fused_mlp = fused
        module_state.restore()
        row = "  ".join(
            f"{n} {statistics.median(t):7.2f} ms (+{peaks[n]:.2f} GiB)" for n, t in times.items()
        )
        print(f"{shape} train: {row}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
