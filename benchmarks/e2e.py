"""End-to-end: a ~1.1B Llama-style transformers model, eager vs torch.compile vs Liger vs ours.

    python benchmarks/e2e.py --shape 8x512 --out benchmarks/results/e2e-<date>-<device>

Liger-Kernel 0.8 needs transformers 5; with transformers 4.57 use Liger-Kernel 0.7.0
(benchmarks/README.md).

One process per shape; inside it every contender runs on the same weights and inputs:
eager transformers, torch.compile(model), ours kernelized (our Triton kernels through
`kernelize`), ours kernelized with Mode.TORCH_COMPILE and then compiled, and Liger-Kernel's
own transformers patching (rope, rms_norm, swiglu) without and with its fused linear
cross-entropy. Liger patches transformers' module-level functions (rope) for the whole
process, so its contenders run last.

Measured: a training step (forward + backward of the causal-LM loss, no optimizer) and
prefill (forward without grad, logits of the last position only); median of CUDA-event
timings after warm-up; peak memory of the training step. Results are appended as JSON lines
to <out>/e2e.jsonl; `--report` turns that file into a markdown table and a plot.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
from pathlib import Path

CONFIG = dict(
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=32000,
    max_position_embeddings=4096,
)


def build(state_dict=None):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**CONFIG, attn_implementation="sdpa", torch_dtype=torch.bfloat16)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    if state_dict is not None:
        model.load_state_dict(state_dict)
    return model


def median_ms(fn, warmup: int, repeat: int) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure(name: str, model, tokens, *, compiled: bool) -> dict:
    import torch

    warmup = 5 if compiled else 3

    def train_step():
        model(input_ids=tokens, labels=tokens).loss.backward()
        model.zero_grad(set_to_none=True)

    def prefill():
        with torch.no_grad():
            model(input_ids=tokens, logits_to_keep=1)

    model.train()
    train_step()  # first call (compilation) before the peak-memory window
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    train = median_ms(train_step, warmup, 10)
    peak = torch.cuda.max_memory_allocated() / 2**30
    model.eval()
    pre = median_ms(prefill, warmup, 10)
    print(
        f"  {name:34s} train {train:8.2f} ms  prefill {pre:8.2f} ms  peak {peak:5.1f} GiB",
        flush=True,
    )
    return {"contender": name, "train_ms": train, "prefill_ms": pre, "train_peak_gib": peak}


def run(shape: str, out: Path, skip: set[str]) -> None:
    import torch
    import transformers

    from kernels import Mode, kernelize, library_mapping, use_kernel_mapping
    from kernels.library import tag_gated_mlps, tag_rotary_embeddings, untag

    batch, seq = (int(v) for v in shape.split("x"))
    torch.manual_seed(0)
    tokens = torch.randint(0, CONFIG["vocab_size"], (batch, seq), device="cuda")
    reference = build()
    state = {k: v.detach().clone() for k, v in reference.state_dict().items()}
    del reference
    results = []

    def contender(name, make, compiled=False):
        if name in skip:
            return
        model = make()
        results.append(measure(name, model, tokens, compiled=compiled))
        del model
        torch._dynamo.reset()
        torch.cuda.empty_cache()

    def ours(compile_mode: bool):
        model = build(state)
        # transformers 4.57 leaves LlamaMLP and apply_rotary_pos_emb untagged: tag them, so that
        # kernelize reaches them (SwiGLUMLP fuses SiLU and the multiply; rotary_pos_emb rotates
        # q and k in one kernel). The rotary tag replaces a module global: untag() puts it
        # back before the next contender.
        untag()
        tag_gated_mlps(model)
        tag_rotary_embeddings(model)
        mode = Mode.TRAINING | Mode.TORCH_COMPILE if compile_mode else Mode.TRAINING
        with use_kernel_mapping(library_mapping(devices=["cuda"])):
            kernelize(model, mode=mode)
        return torch.compile(model) if compile_mode else model

    print(f"shape {shape}:", flush=True)
    contender("eager", lambda: build(state))
    contender("torch.compile", lambda: torch.compile(build(state)), compiled=True)
    contender("ours (kernelized)", lambda: ours(False))
    contender("ours (kernelized + compile)", lambda: ours(True), compiled=True)
    untag()

    from liger_kernel.transformers import apply_liger_kernel_to_llama

    def liger(flce: bool):
        model = build(state)
        apply_liger_kernel_to_llama(
            rope=True,
            rms_norm=True,
            swiglu=True,
            cross_entropy=False,
            fused_linear_cross_entropy=flce,
            model=model,
        )
        return model

    contender("liger (no fused CE)", lambda: liger(False))
    contender("liger (fused linear CE)", lambda: liger(True))

    from importlib.metadata import version

    meta = {
        "shape": shape,
        "device": torch.cuda.get_device_name(),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "triton": version("triton"),
        "liger_kernel": version("liger-kernel"),
        "python": platform.python_version(),
        "config": CONFIG,
    }
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "e2e.jsonl", "a") as f:
        for r in results:
            f.write(json.dumps({**meta, **r}) + "\n")


def report(out: Path) -> None:
    """e2e.jsonl -> e2e.md (speedups over eager per shape) and e2e.png."""
    rows = [json.loads(line) for line in (out / "e2e.jsonl").read_text().splitlines() if line]
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    contenders = list(dict.fromkeys(r["contender"] for r in rows))
    by = {(r["shape"], r["contender"]): r for r in rows}
    meta = rows[0]
    lines = [
        "# End-to-end: Llama-style 1.1B model, bf16",
        "",
        f"{meta['device']}, {meta['date']}; torch {meta['torch']}, transformers {meta['transformers']}, "
        f"triton {meta['triton']}, liger-kernel {meta['liger_kernel']}. Config: {meta['config']}, SDPA attention.",
        "Training step: forward + backward of the causal-LM loss, no optimizer. Prefill: forward without grad,",
        "logits of the last position only. Median of 10 CUDA-event timings after warm-up; speedup over eager.",
        "",
        "| contender | "
        + " | ".join(f"train {s}" for s in shapes)
        + " | "
        + " | ".join(f"prefill {s}" for s in shapes)
        + " | "
        + " | ".join(f"peak GiB {s}" for s in shapes)
        + " |",
        "|---|" + "---|" * (3 * len(shapes)),
    ]
    for c in contenders:
        cells = []
        for key in ("train_ms", "prefill_ms"):
            for s in shapes:
                r, base = by.get((s, c)), by.get((s, "eager"))
                cells.append(
                    "—"
                    if r is None or base is None
                    else f"{r[key]:.1f} ms ({base[key] / r[key]:.2f}x)"
                )
        for s in shapes:
            r = by.get((s, c))
            cells.append("—" if r is None else f"{r['train_peak_gib']:.1f}")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    (out / "e2e.md").write_text("\n".join(lines) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(contenders)
    for ax, key, title in (
        (axes[0], "train_ms", "training step"),
        (axes[1], "prefill_ms", "prefill"),
    ):
        for i, c in enumerate(contenders):
            speedups = [
                by[(s, "eager")][key] / by[(s, c)][key]
                if (s, c) in by and (s, "eager") in by
                else 0
                for s in shapes
            ]
            ax.bar([x + i * width for x in range(len(shapes))], speedups, width, label=c)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(shapes))], shapes)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_title(f"{title}: speedup over eager ({meta['device']})")
        ax.set_xlabel("batch x sequence")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "e2e.png", dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", help="batch x sequence, e.g. 8x512")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--skip", action="append", default=[], help="contender to skip (repeatable)"
    )
    parser.add_argument(
        "--report", action="store_true", help="write e2e.md and e2e.png from e2e.jsonl"
    )
    args = parser.parse_args()
    if args.report:
        report(args.out)
        return 0
    if not args.shape:
        parser.error("--shape is required unless --report")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run(args.shape, args.out, set(args.skip))
    return 0


if __name__ == "__main__":
    sys.exit(main())
