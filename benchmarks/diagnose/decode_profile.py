"""Where a decoded token's GPU time goes: device time per kernel of the fused loop.

    python -m benchmarks.diagnose.decode_profile [--batches 1 8] [--unfolded]

The 1.1B model of `benchmarks.llama`, kernelized, decoding 128 tokens after a prompt of 128
through `CudaGraphGenerator`'s fused loop (one warm call first, which captures): each kernel's
device time and launches per new token, largest first, from ``torch.profiler`` (which records
the kernels a CUDA graph replays). ``--unfolded`` profiles ``fold_layers=False`` beside the
default. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch

from benchmarks import llama

PROMPT, NEW_TOKENS = 128, 128


def profile(model, fold_layers: bool, batch: int, top: int) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from kernels.generation import CudaGraphGenerator

    generator = CudaGraphGenerator(model, kernels=True, fold_layers=fold_layers)
    generator_ids = torch.randint(1, llama.CONFIG["vocab_size"], (batch, PROMPT), device="cuda")
    options = dict(attention_mask=torch.ones_like(generator_ids), max_new_tokens=NEW_TOKENS)
    generator.generate(generator_ids, **options)  # compiles and captures
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        generator.generate(generator_ids, **options)
        torch.cuda.synchronize()
    times: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name] += event.device_time_total
            calls[event.name] += 1
    total_ms = sum(times.values()) / 1000
    print(
        f"\nbatch {batch}, fold_layers={fold_layers}: GPU {total_ms:.1f} ms for {NEW_TOKENS} "
        f"tokens ({total_ms / NEW_TOKENS:.3f} ms/token, prefill included), "
        f"{sum(calls.values()) / NEW_TOKENS:.1f} kernels/token"
    )
    for name, us in sorted(times.items(), key=lambda kv: -kv[1])[:top]:
        print(
            f"  {us / 1000 / NEW_TOKENS:.4f} ms/token  x{calls[name] / NEW_TOKENS:.1f}  {name[:90]}"
        )
    generator.reset()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--unfolded", action="store_true", help="also fold_layers=False")
    parser.add_argument("--top", type=int, default=16)
    args = parser.parse_args()
    model = llama.build().eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    for batch in args.batches:
        for fold in (True, False) if args.unfolded else (True,):
            profile(model, fold, batch, args.top)


if __name__ == "__main__":
    main()
