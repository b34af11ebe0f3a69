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
    import transformers.models.llama.modeling_llama as modeling
    from liger_kernel.transformers import apply_liger_kernel_to_llama

    from kernels import Mode, kernelize, library_mapping, use_kernel_mapping
    from kernels.layer.swap import kernel_layer_of
    from kernels.library import tag_gated_mlps, tag_rotary_embeddings, untag

    state = {k: v.detach().clone() for k, v in e2e.build().state_dict().items()}
    original_rope = modeling.apply_rotary_pos_emb
    ours = e2e.build(state)
    untag()
    tag_gated_mlps(ours)
    tag_rotary_embeddings(ours)
    with use_kernel_mapping(library_mapping(devices=["cuda"])):
        kernelize(ours, mode=Mode.TRAINING)
    mlp = next(m for m in ours.modules() if type(m).__name__ == "LlamaMLP")
    layers = importlib.import_module(kernel_layer_of(mlp).__module__)
    fused = layers._takes_fused_mlp
    ours_rope, modeling.apply_rotary_pos_emb = modeling.apply_rotary_pos_emb, original_rope
    liger = e2e.build(state)
    apply_liger_kernel_to_llama(
        rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
        fused_linear_cross_entropy=False, model=liger,
    )  # fmt: skip
    contenders = {
        "ours, one-function MLP": (ours, ours_rope, fused),
        "ours, module calls": (ours, ours_rope, lambda *args: False),
        "liger": (liger, modeling.apply_rotary_pos_emb, fused),
    }
    for shape in shapes:
        batch, seq = (int(v) for v in shape.split("x"))
        tokens = torch.randint(0, e2e.CONFIG["vocab_size"], (batch, seq), device="cuda")
        times = {name: [] for name in contenders}
        peaks = dict.fromkeys(contenders, 0.0)
        items = list(contenders.items())
        for r in range(24):
            for name, (model, rope, check) in items[r % 3 :] + items[: r % 3]:
                modeling.apply_rotary_pos_emb = rope
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
        row = "  ".join(
            f"{n} {statistics.median(t):7.2f} ms (+{peaks[n]:.2f} GiB)" for n, t in times.items()
        )
        print(f"{shape} train: {row}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
