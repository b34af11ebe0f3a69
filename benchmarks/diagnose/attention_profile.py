"""Our attention and cuDNN's, each run once inside a profiler range, for Nsight Compute.

    ncu --profile-from-start off --clock-control none --set full -o attention \\
        python -m benchmarks.diagnose.attention_profile [--dense 4x4096] [--dims 64,128]
        [--decode 1,8]

Every call is made (and compiled) once before the range opens, so the range holds exactly one
forward, one backward and one decode step of each contender, in the order printed: ours
(``library/attention``) and SDPA's cuDNN backend at the shapes of ``benchmarks.attention``
(32 query and 8 key/value heads, bf16, causal; decode over a 4096-token cache). Read the report
with ``ncu --import attention.ncu-rep --page details`` (or ``--page raw --csv``): what bounds
each kernel (tensor pipes, issue slots, memory), its occupancy and its stall reasons. Needs a
CUDA GPU.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch

from benchmarks import attention as bench


def dense_calls(attn, batch: int, seqlen: int, dim: int) -> dict:
    """{label: call} for ours and cuDNN: the forward, then the backward of a kept forward."""
    q, k, v = bench.attention_inputs(batch, seqlen, seqlen, dim)
    mode, why = bench.gqa_mode("cudnn", dim, True)
    contenders: dict[str, tuple[Callable, list]] = {
        "ours": (lambda q, k, v: attn.flash_attn_func(q, k, v, causal=True), [q, k, v])
    }
    if mode is None:
        print(f"cuDNN left out at d{dim}: {why}")
    else:
        sdpa = [t.transpose(1, 2).contiguous() for t in (q, k, v)]
        contenders["cudnn"] = (bench.sdpa_function("cudnn", mode, True), sdpa)
    calls = {}
    for name, (fn, inputs) in contenders.items():
        leaves = [t.detach().requires_grad_(True) for t in inputs]
        out = fn(*leaves)
        seed = torch.randn_like(out)

        def forward(fn=fn, leaves=leaves):
            with torch.no_grad():
                fn(*leaves)

        def backward(out=out, leaves=leaves, seed=seed):
            torch.autograd.grad(out, leaves, seed, retain_graph=True)

        label = f"{name} {batch}x{seqlen} d{dim} causal"
        calls[f"{label} forward"] = forward
        calls[f"{label} backward"] = backward
    return calls


def decode_calls(attn, batch: int) -> dict:
    """{label: call} for ours and cuDNN: one decode step over a full cache."""
    dim, context = bench.DECODE_DIM, bench.DECODE_CONTEXT
    q, k_cache, v_cache = bench.attention_inputs(batch, 1, context, dim)
    used = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    label = f"batch {batch} context {context} decode"
    calls = {
        f"ours {label}": lambda: attn.flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=used, causal=True
        )
    }
    mode, why = bench.gqa_mode("cudnn", dim, False)
    if mode is None:
        print(f"cuDNN decode left out: {why}")
        return calls
    sdpa = [t.transpose(1, 2).contiguous() for t in (q, k_cache, v_cache)]
    step = bench.sdpa_function("cudnn", mode, False)
    calls[f"cudnn {label}"] = lambda: step(*sdpa)
    return calls


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dense", type=bench.parse_shapes, default=[(4, 4096)])
    parser.add_argument("--dims", default="64,128")
    parser.add_argument("--decode", default="1,8", help="decode batch sizes")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("benchmarks.diagnose.attention_profile needs a CUDA GPU")
    attn = bench.load_ours()
    calls: dict = {}
    for batch, seqlen in args.dense:
        for dim in map(int, args.dims.split(",")):
            calls.update(dense_calls(attn, batch, seqlen, dim))
    for batch in filter(None, args.decode.split(",")):
        calls.update(decode_calls(attn, int(batch)))
    for call in calls.values():  # compile, autotune and warm every call outside the range
        call()
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for label, call in calls.items():
        torch.cuda.nvtx.range_push(label)
        call()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        print(f"profiled: {label}", flush=True)
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
