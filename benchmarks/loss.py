"""Benchmark the fused lm_head + cross-entropy (library/loss) beside Liger-Kernel, torch.compile and
eager PyTorch: forward + backward time and peak memory.

    python -m benchmarks.loss     # writes benchmarks/results/<device>/loss

For each hidden size, vocabulary and token count (bf16), the loss of ``tokens`` hidden states
through an ``lm_head`` weight ``[vocab, hidden]``, and its gradients with respect to both:

- ``eager``: transformers' formula, ``F.cross_entropy(F.linear(h, w).float(), y)``;
- ``compile``: ``torch.compile`` of that same function;
- ``liger``: Liger-Kernel's ``LigerFusedLinearCrossEntropyFunction`` (its defaults: gradients made
  in the forward, weight gradient accumulated in the weight's dtype), when installed;
- ``ours``: ``fused_linear_cross_entropy`` of library/loss (default chunk size);
- with ``--variants``, ours with its plan forced: ``ours-chunks-only`` (its chunks without the
  resident first chunk), ``ours-one-pass`` (chunks of tokens over the whole vocabulary, as
  many as ``chunk_rows`` gives: logits up to the weight gradient's size, at least Liger's
  chunk) and ``ours-one-pass-x4`` (chunks of four times as many tokens: what more memory buys
  in speed) and
  ``ours-two-kernels`` (chunks of whole rows through the statistics and gradient kernels, never
  the one-kernel row path); ``--variants NAME ...`` times only those named; ``ours``
  holds its first tokens' logits in the weight gradient's buffer and picks one pass or two
  passes over vocabulary tiles for the rest by itself.

Timing: ``timing.interleaved_samples`` (rounds that run every contender in rotating order, a
block of calls each, L2 cleared before every call, CUDA events), median over the rounds; the
calls are forward + ``torch.autograd.grad`` for the hidden states and the weight. Peak memory:
the most allocated during one such call beyond what was allocated before it (the inputs, the
weight and the other contenders' state), the returned gradients included. A contender that runs
out of memory is recorded as such.

Writes ``results.md`` and ``results.json`` into ``--out``. A run of every shape may take longer
than one command on the GPU machine may: select shapes (``--hidden``, ``--vocab``, ``--tokens``)
and run several times into the same ``--out`` (rows are merged by shape and contender), or into
several folders joined with ``--merge``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F
import triton

from benchmarks import cases, timing
from benchmarks.results_io import default_out, save_results

HIDDEN = [2048, 4096]
VOCAB = [32000, 128256, 151936, 262144]
TOKENS = [4096, 16384]
DTYPE = torch.bfloat16
IMPLS = [
    "eager",
    "compile",
    "liger",
    "ours",
    "ours-chunks-only",
    "ours-one-pass",
    "ours-one-pass-x4",
    "ours-two-kernels",
]
VARIANTS = IMPLS[4:]
GiB = 2**30


def load_ours():
    from kernels.library import load_library_package

    return load_library_package("loss")


def load_liger():
    """(LigerFusedLinearCrossEntropyFunction, version) or None when Liger-Kernel is missing."""
    peer = cases.load_liger()  # Liger's other ops, and its version
    if peer is None:
        return None
    try:
        from liger_kernel.ops.fused_linear_cross_entropy import (
            LigerFusedLinearCrossEntropyFunction,
        )
    except Exception as exc:  # noqa: BLE001  (report and go on without the peer)
        print(f"Liger-Kernel's fused linear cross-entropy unavailable: {exc}")
        return None
    return LigerFusedLinearCrossEntropyFunction, peer.version


def plain_loss(h, w, y):
    """transformers' ForCausalLMLoss on lm_head's logits (labels already shifted)."""
    return F.cross_entropy(F.linear(h, w).float(), y, ignore_index=-100)


def contenders(ours, liger, tokens, hidden, vocab, variants) -> dict:
    """{name: loss function of (h, w, y)}; ``variants`` names which of VARIANTS to add."""
    fns = {"eager": plain_loss, "compile": torch.compile(plain_loss, dynamic=False)}
    if liger is not None:
        function = liger[0]

        def liger_loss(h, w, y):
            # (input, weight, target, bias, ce_weight, ignore_index, lse_square_scale,
            #  label_smoothing, reduction): Liger's defaults otherwise.
            out = function.apply(h, w, y, None, None, -100, 0.0, 0.0, "mean")
            return out[0] if isinstance(out, tuple) else out

        fns["liger"] = liger_loss
    fns["ours"] = ours.fused_linear_cross_entropy
    variant = {}
    if variants:
        rows = ours.chunk_rows(tokens, hidden, vocab, 2, torch.device("cuda"))

        def one_pass(h, w, y):
            return ours.fused_linear_cross_entropy(h, w, y, chunk_size=rows)

        def one_pass_x4(h, w, y):
            return ours.fused_linear_cross_entropy(h, w, y, chunk_size=4 * rows)

        plan = ours.chunk_plan(tokens, hidden, vocab, 2, torch.device("cuda"), fp32_rows=True)

        def chunks_only(h, w, y):  # the plan without its resident first chunk
            return ours.fused_linear_cross_entropy(h, w, y, chunk_size=plan[0], vocab_chunk=plan[1])

        op_module = sys.modules[f"{ours.__name__}.fused_linear_cross_entropy"]

        def two_kernels(h, w, y):  # chunks of whole rows through the split row kernels only
            fused = op_module.FUSED_ROWS_PER_SM
            op_module.FUSED_ROWS_PER_SM = 2**62
            try:
                return ours.fused_linear_cross_entropy(h, w, y)
            finally:
                op_module.FUSED_ROWS_PER_SM = fused

        variant = {
            "ours-chunks-only": chunks_only,
            "ours-one-pass": one_pass,
            "ours-one-pass-x4": one_pass_x4,
            "ours-two-kernels": two_kernels,
        }
    fns.update((name, variant[name]) for name in VARIANTS if name in variants)
    return fns


def liger_chunk_rows(tokens: int, hidden: int, vocab: int) -> int:
    """Liger-Kernel's chunk (0.8.5, ``chunk_mem_const=1``), for the tables."""
    inc_factor = triton.cdiv(vocab, hidden)
    return min(triton.next_power_of_2(triton.cdiv(tokens, inc_factor)), tokens)


def make_inputs(tokens, hidden, vocab):
    torch.manual_seed(0)
    h = (torch.randn(tokens, hidden, device="cuda") * 0.5).to(DTYPE).requires_grad_()
    w = (torch.randn(vocab, hidden, device="cuda") * hidden**-0.5).to(DTYPE).requires_grad_()
    y = torch.randint(0, vocab, (tokens,), device="cuda")
    y[torch.rand(tokens, device="cuda") < 0.05] = -100  # a few ignored positions (padding)
    return h, w, y


def fwd_bwd_call(fn, h, w, y):
    def call():
        torch.autograd.grad(fn(h, w, y), (h, w))

    return call


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    # Norms reduced in fp32 without an fp32 copy of weight-sized gradients.
    difference = torch.linalg.vector_norm(a - b, dtype=torch.float32)
    return (difference / torch.linalg.vector_norm(b, dtype=torch.float32).clamp_min(1e-30)).item()


def spot_check(fns, h, w, y) -> dict:
    """{name: relative errors of (loss, hidden-state gradient, weight gradient)} against the
    first contender (eager, unless it ran out of memory); None for a contender that ran out
    of memory here. Raises when ours is off by more than bf16 allows."""
    results = {}
    reference = None
    for name, fn in fns.items():
        try:
            loss = fn(h, w, y).float()
            gh, gw = torch.autograd.grad(loss, (h, w))
        except torch.cuda.OutOfMemoryError:
            results[name] = None
            torch.cuda.empty_cache()
            continue
        if reference is None:
            reference, results[name] = (loss, gh, gw), (0.0, 0.0, 0.0)
            continue
        results[name] = tuple(
            _relative_error(a, b) for a, b in zip((loss, gh, gw), reference, strict=True)
        )
        del loss, gh, gw
    for name in ("ours", *VARIANTS):
        if results.get(name) is not None and not max(results[name]) < 2e-2:
            raise AssertionError(f"{name} differs from {next(iter(results))}: {results[name]}")
    return results


def run_shape(ours, liger, tokens, hidden, vocab, rep_ms, block, variants) -> list:
    h, w, y = make_inputs(tokens, hidden, vocab)
    fns = contenders(ours, liger, tokens, hidden, vocab, variants)
    calls, rows, failed = {}, [], {}
    for name, fn in fns.items():
        call = fwd_bwd_call(fn, h, w, y)
        try:
            for _ in range(2):  # compile, allocator warm-up
                call()
            peak = timing.peak_extra(call)
        except torch.cuda.OutOfMemoryError as exc:
            failed[name] = f"out of memory: {str(exc).splitlines()[0]}"[:200]
            print(f"  {name}: {failed[name]}", flush=True)
            torch.cuda.empty_cache()
            continue
        calls[name] = (call, peak)
    checked = spot_check({n: fns[n] for n in calls}, h, w, y)
    try:
        samples = timing.interleaved_samples({n: c for n, (c, _) in calls.items()}, rep_ms, block)
    except torch.cuda.OutOfMemoryError:  # eager's logits beside the others' caches: time without
        torch.cuda.empty_cache()
        failed["eager"] = "out of memory while timed beside the others"
        calls.pop("eager", None)
        samples = timing.interleaved_samples({n: c for n, (c, _) in calls.items()}, rep_ms, block)
    shape = {"tokens": tokens, "hidden": hidden, "vocab": vocab}
    plan = ours.chunk_plan(tokens, hidden, vocab, 2, h.device, fp32_rows=True)
    chunks = {
        "ours_plan": list(plan),
        "ours_resident": ours.resident_rows(tokens, hidden, 2, 2),
        "liger_chunk_rows": liger_chunk_rows(tokens, hidden, vocab),
    }
    for name in fns:
        row = {**shape, **chunks, "impl": name}
        if name in failed:
            row["error"] = failed[name]
        else:
            row["fwd_bwd_ms"] = timing.pooled_median(samples[name])
            row["rounds_ms"] = [round(statistics.median(r), 6) for r in samples[name]]
            row["peak_extra_gib"] = calls[name][1] / GiB
            row["rel_err_vs_first"] = checked.get(name)
        rows.append(row)
        print(
            f"{tokens:6d} x {hidden:5d} -> {vocab:6d}  {name:14s} "
            + (
                row.get("error", "")
                or f"{row['fwd_bwd_ms']:9.2f} ms  peak +{row['peak_extra_gib']:6.2f} GiB"
            ),
            flush=True,
        )
    del calls, fns, h, w, y
    torch.cuda.empty_cache()
    return rows


# ---- tables ---------------------------------------------------------------------------------


def _key(row) -> tuple:
    return row["tokens"], row["hidden"], row["vocab"]


def _ratio(peer, ours) -> str:
    """Speed of ours over the peer (> 1: ours faster), with quartiles over the rounds."""
    if peer is None or "fwd_bwd_ms" not in peer:
        return "—" if peer is None else "peer OOM"
    if "fwd_bwd_ms" not in ours:
        return "ours OOM"
    q1, q2, q3 = timing.ratio_quartiles(
        [[ms] for ms in peer["rounds_ms"]], [[ms] for ms in ours["rounds_ms"]]
    )
    return f"{peer['fwd_bwd_ms'] / ours['fwd_bwd_ms']:.2f}x [{q1:.2f}-{q3:.2f}]"


def _cell(row, key, fmt) -> str:
    if row is None:
        return "—"
    if key not in row:
        return "OOM" if "error" in row else "—"
    return fmt.format(row[key])


def card_table(results) -> str:
    """The model card's table: per shape, ours and each peer's time and peak memory, and the
    speed ratios of ours against Liger and torch.compile."""
    by = {(_key(r), r["impl"]): r for r in results}
    impls = [i for i in IMPLS if any(r["impl"] == i for r in results)]
    lines = [
        "| tokens x hidden -> vocab | "
        + " | ".join(f"{i} ms" for i in impls)
        + " | "
        + " | ".join(f"{i} peak GiB" for i in impls)
        + " | ours vs liger | ours vs compile |",
        "|---|" + "---|" * (2 * len(impls) + 2),
    ]
    for key in sorted({_key(r) for r in results}, key=lambda k: (k[1], k[2], k[0])):
        tokens, hidden, vocab = key
        ours = by.get((key, "ours"), {})
        cells = [_cell(by.get((key, i)), "fwd_bwd_ms", "{:.2f}") for i in impls]
        cells += [_cell(by.get((key, i)), "peak_extra_gib", "{:.2f}") for i in impls]
        cells += [_ratio(by.get((key, "liger")), ours), _ratio(by.get((key, "compile")), ours)]
        lines.append(f"| {tokens} x {hidden} -> {vocab} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_markdown(meta, results, path) -> None:
    lines = [
        "# Fused linear cross-entropy: forward + backward",
        "",
        f"- device: {meta['device']}",
        f"- date: {meta['date']}",
        f"- torch {meta['torch']}, triton {meta['triton']}, liger-kernel {meta['liger']}",
        f"- dtype: {meta['dtype']}; 5% of the labels are ignore_index",
        f"- timing: {meta['timing']}",
        f"- memory: {meta['memory']}",
        "",
        "Speed ratios are peer ms / ours ms (> 1: ours faster), quartiles over the rounds in "
        "brackets.",
        "",
        card_table(results),
        "",
        "Chunks: ours (the resident first chunk, whose logits the weight gradient's buffer "
        "holds, then tokens x vocabulary columns; fewer columns than the vocabulary is two "
        "passes over tiles), and Liger's (tokens over the whole vocabulary).",
        "",
        "| tokens x hidden -> vocab | ours | liger |",
        "|---|---|---|",
    ]
    seen = set()
    for r in sorted(results, key=lambda r: (r["hidden"], r["vocab"], r["tokens"])):
        if _key(r) in seen:
            continue
        seen.add(_key(r))
        lines.append(
            f"| {r['tokens']} x {r['hidden']} -> {r['vocab']} | {_ours_chunks(r)} | "
            f"{r['liger_chunk_rows']} x {r['vocab']} |"
        )
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def _ours_chunks(r: dict) -> str:
    resident, rest = r.get("ours_resident", 0), r["tokens"] - r.get("ours_resident", 0)
    chunks = f"{r['ours_plan'][0]} x {r['ours_plan'][1]}"
    if not resident:
        return chunks
    return f"{resident} resident" + (f", then {chunks}" if rest else "")


def _merge(previous: list, new: list) -> list:
    fresh = {(_key(r), r["impl"]) for r in new}
    return [r for r in previous if (_key(r), r["impl"]) not in fresh] + new


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        help="folder for results.md and results.json (default benchmarks/results/<device>/loss; "
        "required with --card and --merge)",
    )
    parser.add_argument("--hidden", default=",".join(map(str, HIDDEN)))
    parser.add_argument("--vocab", default=",".join(map(str, VOCAB)))
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    parser.add_argument(
        "--rep-ms", type=float, default=2000.0, help="time each shape's rounds may take"
    )
    parser.add_argument("--block", type=int, default=3, help="calls a contender makes a round")
    parser.add_argument(
        "--variants",
        nargs="*",
        choices=VARIANTS,
        help="also time these variants of ours (all of them when none is named)",
    )
    parser.add_argument(
        "--card", action="store_true", help="print the model-card table from --out (no GPU)"
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="DIR",
        help="write --out's results.json and results.md from these runs' results.json (no GPU)",
    )
    args = parser.parse_args()
    if args.out is None and (args.card or args.merge):
        parser.error("--out is required with --card and --merge")
    if not (args.card or args.merge) and not torch.cuda.is_available():
        sys.exit("python -m benchmarks.loss needs a CUDA GPU (--card and --merge do not)")
    args.out = args.out or str(default_out("loss"))
    path = os.path.join(args.out, "results.json")
    if args.merge:
        meta, results = None, []
        for folder in args.merge:
            with open(os.path.join(folder, "results.json")) as f:
                data = json.load(f)
            meta = meta or data["meta"]
            results = _merge(results, data["results"])
        os.makedirs(args.out, exist_ok=True)
        save_results(args.out, meta, results, write_markdown)
        return
    if args.card:
        with open(path) as f:
            print(card_table(json.load(f)["results"]))
        return
    os.makedirs(args.out, exist_ok=True)
    ours, liger = load_ours(), load_liger()
    torch._dynamo.config.cache_size_limit = 64
    meta = {
        "device": torch.cuda.get_device_name(),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "liger": liger[1] if liger else None,
        "dtype": "bfloat16",
        "timing": f"timing.interleaved_samples: rounds of every contender in rotating order, "
        f"{args.block} calls each (the first not counted), L2 cleared before each call, "
        "CUDA events; median over every counted call",
        "memory": "torch.cuda.max_memory_allocated() during one forward + backward (gradients "
        "of the hidden states and the weight returned) minus what was allocated before it",
    }
    results = []
    if os.path.exists(path):
        with open(path) as f:
            results = json.load(f)["results"]
    variants = VARIANTS if args.variants == [] else args.variants or []
    for hidden in map(int, args.hidden.split(",")):
        for vocab in map(int, args.vocab.split(",")):
            for tokens in map(int, args.tokens.split(",")):
                torch._dynamo.reset()
                rows = run_shape(
                    ours, liger, tokens, hidden, vocab, args.rep_ms, args.block, variants
                )
                results = _merge(results, rows)
                save_results(args.out, meta, results, write_markdown)
    with open(os.path.join(args.out, "results.md")) as f:
        print(f.read())


if __name__ == "__main__":
    main()
