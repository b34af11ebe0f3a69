"""A training step of the 1.1B Llama-style model of benchmarks/e2e.py under FSDP2 on N GPUs:
eager transformers against ours kernelized and Liger-Kernel.

    torchrun --nproc-per-node 2 -m benchmarks.distributed --shape 8x512 \\
        --out benchmarks/results/<device>/distributed
    python -m benchmarks.distributed --report --out benchmarks/results/<device>/distributed

``--shape`` is each rank's batch x sequence: N ranks train on N times its tokens (data
parallel, every rank its own batch). Each contender is the e2e model (bf16 weights, SDPA
attention) built on every rank from the same weights and set up as e2e.py sets it up (ours:
tagged and kernelized for training before sharding, without and with the fused lm_head and
cross-entropy; Liger: ``apply_liger_kernel_to_llama``, without and with its fused CE),
then sharded with FSDP2: ``fully_shard`` on every decoder layer and on the root, bf16 all the
way (``--no-reshard``: the gathered weights stay from forward to backward). torch.compile'd
contenders are left out: compiling FSDP2 models is its own study.

Measured, in interleaved rounds as in e2e.py (each round runs every contender once, in
rotating order, the same on every rank): the wall time of a training step (forward and
backward of the causal-LM loss with FSDP2's all-gathers and reduce-scatters; no optimizer)
between CUDA events, the slowest rank's in each round, its median after warm-up; tokens per
second over all ranks; the peak memory of a step on the rank that needed most (its shard of
the weights and gradients, plus what the step allocated); and the loss of the first step, so
that the contenders are seen to train the same model. Rank 0 appends JSON lines to
<out>/distributed.jsonl; ``--report`` writes distributed.md and distributed.png from them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from benchmarks import e2e  # the model, its contenders and the module-state bookkeeping

#: The contenders timed by default (e2e.py's names); the compiled ones are not run here.
CONTENDERS = (
    "eager",
    "ours (kernelized)",
    "ours (kernelized, fused CE)",
    "liger (no fused CE)",
    "liger (fused linear CE)",
)


def shard(model, mesh, reshard_after_forward: bool = True):
    """FSDP2 as its documentation applies it to a transformer: every decoder layer, then the root."""
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model


def local_bytes(model) -> int:
    """Bytes of this rank's shards of the model's parameters and buffers."""
    from torch.distributed.tensor import DTensor

    tensors = [*model.parameters(), *model.buffers()]
    tensors = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
    return sum(t.numel() * t.element_size() for t in tensors)


def _reduce(value: float, op, device) -> float:
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=op)
    return tensor.item()


def time_interleaved(contenders: dict, module_state, tokens, rounds: int, warmup: int) -> list:
    """Time every contender's training step in rounds that run each once in rotating order;
    [{contender, step_ms, step_ms_rank_spread, peak_gib, first_loss}], the same on every rank."""
    import torch
    import torch.distributed as dist

    device = tokens.device
    on_gpu = device.type == "cuda"
    world = dist.get_world_size()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    spreads: dict[str, list[float]] = {name: [] for name in contenders}
    peaks = dict.fromkeys(contenders, 0.0)
    losses: dict[str, float] = {}
    names = list(contenders)
    for r in range(warmup + rounds):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            model, own_state = contenders[name]
            module_state.restore(own_state)
            dist.barrier()
            if on_gpu:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                resident = torch.cuda.memory_allocated()
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
            began = time.perf_counter()
            loss = model(input_ids=tokens, labels=tokens).loss
            loss.backward()
            if on_gpu:
                end.record()
                torch.cuda.synchronize()
                ms = start.elapsed_time(end)
            else:
                ms = (time.perf_counter() - began) * 1e3
            model.zero_grad(set_to_none=True)
            if name not in losses:
                losses[name] = _reduce(loss.item(), dist.ReduceOp.SUM, device) / world
            slowest = _reduce(ms, dist.ReduceOp.MAX, device)
            fastest = _reduce(ms, dist.ReduceOp.MIN, device)
            if r < warmup:  # first-call allocations, autotuning, NCCL communicators
                continue
            times[name].append(slowest)
            spreads[name].append(slowest - fastest)
            if on_gpu:
                peak = torch.cuda.max_memory_allocated() - resident + local_bytes(model)
                peak = _reduce(peak / 2**30, dist.ReduceOp.MAX, device)
                peaks[name] = max(peaks[name], peak)
    module_state.restore()
    results = []
    for name in names:
        step = statistics.median(times[name])
        results.append(
            {
                "contender": name,
                "step_ms": step,
                "step_ms_rank_spread": statistics.median(spreads[name]),
                "tokens_per_s": tokens.numel() * world / (step / 1e3),
                "peak_gib": peaks[name],
                "first_loss": losses[name],
            }
        )
        if dist.get_rank() == 0:
            print(
                f"  {name:26s} step {step:8.2f} ms  {results[-1]['tokens_per_s']:10.0f} tok/s  "
                f"peak {peaks[name]:5.1f} GiB  loss {losses[name]:.4f}",
                flush=True,
            )
    return results


def run(
    shape: str,
    out: Path,
    names,
    *,
    rounds: int = 10,
    warmup: int = 3,
    reshard_after_forward: bool = True,
    makers=None,
) -> list[dict]:
    """Build, shard and time the contenders `names` on this rank (a process group is set up);
    rank 0 appends the results to <out>/distributed.jsonl. `makers`: {name: build function}
    (default e2e.py's, on the e2e model and this rank's GPU)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from kernels.library import untag

    batch, seq = (int(v) for v in shape.split("x"))
    if makers is None:
        state = {k: v.detach().clone() for k, v in e2e.build().state_dict().items()}
        makers = e2e.contender_makers(state)
    available = {}
    for name in names:
        if name.startswith("liger"):
            try:
                import liger_kernel  # noqa: F401
            except ImportError:
                print(f"  {name}: skipped (liger_kernel is not installed)", flush=True)
                continue
        available[name] = makers[name]
    module_state = e2e.ModuleState()
    contenders = e2e.build_contenders(available, list(available), module_state)
    config = next(iter(contenders.values()))[0].config
    device = next(next(iter(contenders.values()))[0].parameters()).device
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for model, _ in contenders.values():
        shard(model, mesh, reshard_after_forward)
    generator = torch.Generator().manual_seed(dist.get_rank())  # every rank its own batch
    tokens = torch.randint(0, config.vocab_size, (batch, seq), generator=generator).to(device)
    if dist.get_rank() == 0:
        print(f"per-rank shape {shape} on {dist.get_world_size()} ranks:", flush=True)
    results = time_interleaved(contenders, module_state, tokens, rounds, warmup)
    untag()
    if dist.get_rank() != 0:
        return results

    from importlib.metadata import PackageNotFoundError, version

    import transformers

    def installed(package):
        try:
            return version(package)
        except PackageNotFoundError:
            return None

    meta = {
        "shape": shape,
        "world_size": dist.get_world_size(),
        "backend": dist.get_backend(),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else device.type,
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "triton": installed("triton"),
        "liger_kernel": installed("liger-kernel"),
        "python": platform.python_version(),
        "config": {k: getattr(config, k) for k in e2e.CONFIG},
        "fsdp2": {"reshard_after_forward": reshard_after_forward, "dtype": "bf16 throughout"},
        "timing": f"interleaved rounds: {warmup} warm-up, median of {rounds}, slowest rank",
    }
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "distributed.jsonl", "a") as f:
        for row in results:
            f.write(json.dumps({**meta, **row}) + "\n")
    return results


def markdown(rows: list[dict]) -> str:
    """distributed.md: per run (shape, ranks, resharding), each contender's step time and its
    speedup over eager, tokens per second, peak memory and first-step loss."""
    meta = rows[0]
    lines = [
        "# FSDP2: Llama-style 1.1B model, bf16, a training step",
        "",
        f"{meta['device']}, {meta['date']}; torch {meta['torch']}, transformers "
        f"{meta['transformers']}, triton {meta['triton']}, liger-kernel {meta['liger_kernel']}. "
        f"Config: {meta['config']}, SDPA attention.",
        "Forward + backward of the causal-LM loss (no optimizer) under FSDP2 (`fully_shard` per "
        "decoder layer and root), each rank its own batch of the given shape; the slowest "
        f"rank's step between CUDA events ({meta['timing']}).",
        "",
        "| shape per rank | ranks | reshard | contender | step | tokens/s | peak GiB | "
        "first loss |",
        "|---|---|---|---|---|---|---|---|",
    ]
    runs: dict[tuple, dict] = {}
    for row in rows:
        key = (row["shape"], row["world_size"], row["fsdp2"]["reshard_after_forward"])
        runs.setdefault(key, {})[row["contender"]] = row
    for (shape, world, reshard), contenders in runs.items():
        base = contenders.get("eager")
        for name, row in contenders.items():
            speedup = "" if base is None else f" ({base['step_ms'] / row['step_ms']:.2f}x)"
            lines.append(
                f"| {shape} | {world} | {'yes' if reshard else 'no'} | {name} | "
                f"{row['step_ms']:.1f} ms{speedup} | {row['tokens_per_s']:.0f} | "
                f"{row['peak_gib']:.1f} | {row['first_loss']:.4f} |"
            )
    return "\n".join(lines) + "\n"


def report(out: Path) -> None:
    """distributed.jsonl -> distributed.md and distributed.png (speedup over eager per run)."""
    rows = [
        json.loads(line) for line in (out / "distributed.jsonl").read_text().splitlines() if line
    ]
    (out / "distributed.md").write_text(markdown(rows))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = list(dict.fromkeys((r["shape"], r["world_size"]) for r in rows))
    contenders = list(dict.fromkeys(r["contender"] for r in rows))
    by = {(r["shape"], r["world_size"], r["contender"]): r for r in rows}
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(contenders)
    for i, name in enumerate(contenders):
        speedups = [
            by[(*run, "eager")]["step_ms"] / by[(*run, name)]["step_ms"]
            if (*run, name) in by and (*run, "eager") in by
            else 0
            for run in runs
        ]
        ax.bar([x + i * width for x in range(len(runs))], speedups, width, label=name)
    ax.set_xticks(
        [x + 0.4 - width / 2 for x in range(len(runs))], [f"{s} x {n} ranks" for s, n in runs]
    )
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_title(f"FSDP2 training step: speedup over eager ({rows[0]['device']})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "distributed.png", dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", help="each rank's batch x sequence, e.g. 8x512")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--skip", action="append", default=[], help="contender to skip")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--no-reshard", action="store_true", help="reshard_after_forward=False in fully_shard"
    )
    parser.add_argument(
        "--report", action="store_true", help="write distributed.md and .png from the JSON lines"
    )
    args = parser.parse_args()
    if args.report:
        report(args.out)
        return 0
    if not args.shape:
        parser.error("--shape is required unless --report")

    import torch
    import torch.distributed as dist

    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl")
    try:
        names = [name for name in CONTENDERS if name not in args.skip]
        run(
            args.shape,
            args.out,
            names,
            rounds=args.rounds,
            warmup=args.warmup,
            reshard_after_forward=not args.no_reshard,
        )
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
