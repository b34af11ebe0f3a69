"""Benchmark the aten overrides (``kernels.overrides``): each overridden operator, and an untagged
Llama block, with PyTorch's kernels and with ours in their place.

    python -m benchmarks.overrides     # writes benchmarks/results/<device>/overrides
    TRITON_INTERPRET=1 python -m benchmarks.overrides --quick --out /tmp/overrides  # CPU check

Contenders, on the same unchanged model code:

- ``aten``: PyTorch's kernels (no override registered);
- ``override``: inside ``use_aten_overrides(ops=...)``, our kernels for the operators named.

Operators (``OP_CASES``, bf16, at ``benchmarks.cases.NORM_SHAPES``): ``nn.LayerNorm`` (``native_layer_norm``
and its backward), ``nn.RMSNorm`` (``_fused_rms_norm``), ``F.silu``, ``F.gelu`` and
``F.gelu(approximate="tanh")``; forward and forward+backward, as eager calls and as CUDA-graph
replays (device time), timed as ``benchmarks.timing`` times (L2 cleared by reading before every call, CUDA
events, interleaved rounds, median; quartiles of the per-round ratio). The override is
process-wide, so the rounds switch it on or off before each contender's block of calls, outside
the timed calls; a graph is captured under its contender's state and replays its kernels
whatever the state.

The Llama block (``LlamaBlock``): ``BLOCK_LAYERS`` hand-written Llama decoder layers (nothing
tagged: ``nn.RMSNorm``, q/k/v/o projections, ``F.scaled_dot_product_attention`` with grouped
heads, and the MLP ``down(F.silu(gate(h)) * up(h))``) at TinyLlama-1.1B's sizes, bf16: a
training step (forward and ``torch.autograd.grad`` of a loss for the input and every parameter)
and inference (forward under ``torch.inference_mode``), at 8x512 and 4x2048 tokens, for
``aten`` and the overrides of ``BLOCK_OVERRIDES``, timed in interleaved rounds of eager calls.

Every override row also records which path its calls took (``aten_override_calls``: our kernel,
or PyTorch's and why), so a table cannot show an "override" that never ran ours.

``--quick`` runs small shapes on the CPU through Triton's interpreter (``TRITON_INTERPRET=1``):
wall-clock times of interpreted kernels mean nothing; it proves the benchmark runs end to end
(``tests/test_overrides_benchmark.py``). On the CPU, ``_fused_rms_norm`` is not overridden
(PyTorch has no CPU kernel for it; docs/overrides.md), so the block's override there is SiLU's.

Writes ``results.md`` and ``results.json`` into ``--out`` (after each case, so that a run cut
short keeps what it measured).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks import timing
from benchmarks.cases import NORM_SHAPES
from benchmarks.results_io import default_out, save_results
from kernels.overrides import (
    aten_override_calls,
    reset_aten_override_calls,
    use_aten_overrides,
)

DTYPE = torch.bfloat16
#: Each operator case: the families ``use_aten_overrides`` is given for it.
OP_CASES = {
    "LayerNorm": ("layer_norm",),
    "RMSNorm": ("rms_norm",),
    "SiLU": ("silu",),
    "GELU": ("gelu",),
    "GeluTanh": ("gelu",),
}
ATEN, OVERRIDE = "aten", "override"
TIMED_KEYS = timing.TIMED_KEYS  # fwd, fwd_bwd, graph_fwd, graph_fwd_bwd
# TinyLlama-1.1B's layer sizes (hidden 2048, 32 query heads and 4 key/value heads of 64,
# MLP 5632); four layers keep a step in tens of milliseconds.
BLOCK_CONFIG = dict(hidden=2048, heads=32, kv_heads=4, intermediate=5632, layers=4)
BLOCK_SHAPES = [(8, 512), (4, 2048)]  # (batch, sequence), as e2e.py
#: The Llama block's override contenders: name -> families.
BLOCK_OVERRIDES = {
    "override rms_norm": ("rms_norm",),
    "override rms_norm+silu": ("rms_norm", "silu"),
}
# --quick (CPU, Triton's interpreter): shapes small enough for interpreted kernels.
QUICK_SHAPES = [(6, 96)]
QUICK_BLOCK_CONFIG = dict(hidden=64, heads=4, kv_heads=2, intermediate=96, layers=1)
QUICK_BLOCK_SHAPES = [(2, 8)]


# ---- the untagged model ---------------------------------------------------------------------


class LlamaLayer(nn.Module):
    """A Llama decoder layer written out by hand, as in a model nobody tagged: pre-norm
    attention (no rotary embedding: it changes no operator the overrides touch) and a SiLU-gated
    MLP, with residual adds."""

    def __init__(self, hidden, heads, kv_heads, intermediate, eps=1e-6):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.input_norm = nn.RMSNorm(hidden, eps=eps)
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=False)
        self.post_norm = nn.RMSNorm(hidden, eps=eps)
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.input_norm(x)
        q = self.q_proj(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        # Grouped heads the portable way (enable_gqa needs torch 2.5's flash/math paths to agree).
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, s, -1))
        h = self.post_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class LlamaBlock(nn.Module):
    """``layers`` `LlamaLayer`s and a final ``nn.RMSNorm``: the body of a Llama model."""

    def __init__(self, hidden, heads, kv_heads, intermediate, layers, eps=1e-6):
        super().__init__()
        self.layers = nn.ModuleList(
            LlamaLayer(hidden, heads, kv_heads, intermediate, eps) for _ in range(layers)
        )
        self.norm = nn.RMSNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def build_block(config: dict, device, dtype=DTYPE, seed: int = 0) -> LlamaBlock:
    """A `LlamaBlock` with small random weights (and norm weights near 1, not exactly 1)."""
    torch.manual_seed(seed)
    block = LlamaBlock(**config).to(device=device, dtype=dtype)
    with torch.no_grad():
        for name, p in block.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0, 0.02)
    return block


# ---- operator cases -------------------------------------------------------------------------


def op_case(case: str, rows: int, cols: int, device) -> tuple:
    """(inputs, params, fn) of ``case`` at ``rows x cols``: the model code the override serves."""
    x = torch.randn(rows, cols, device=device, dtype=DTYPE)
    params = []
    if case in ("LayerNorm", "RMSNorm"):
        module = nn.LayerNorm(cols) if case == "LayerNorm" else nn.RMSNorm(cols, eps=1e-6)
        fn = module.to(device=device, dtype=DTYPE)
        params = [p for p in fn.parameters()]
        with torch.no_grad():
            for p in params:
                p.add_(torch.randn_like(p) * 0.1)
    elif case == "SiLU":
        fn = F.silu
    elif case == "GELU":
        fn = F.gelu
    else:
        fn = functools.partial(F.gelu, approximate="tanh")
    return [x], params, fn


def _state(families):
    """The context a contender runs in: PyTorch's kernels (None) or the override of ``families``."""
    if families is None:
        return contextlib.nullcontext
    return functools.partial(use_aten_overrides, ops=families)


def _paths(call, state) -> dict:
    """{"op: path": calls} of one ``call`` run under ``state`` (``aten_override_calls``)."""
    reset_aten_override_calls()
    with state():
        call()
    return {f"{op}: {path}": n for (op, path), n in sorted(aten_override_calls().items())}


# ---- timing ---------------------------------------------------------------------------------


def _timed_call_ms(call, on_gpu: bool):
    """A function that runs ``call`` once, timed: CUDA events after clearing L2 on the GPU
    (``benchmarks.timing``'s method; read with ``.elapsed_time`` after a synchronisation), the wall clock
    on the CPU."""
    if on_gpu:

        def run():
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            timing.clear_l2()
            start.record()
            call()
            end.record()
            return start, end

        return run

    def run_cpu():
        start = time.perf_counter()
        call()
        return (time.perf_counter() - start) * 1e3

    return run_cpu


def interleaved_state_samples(contenders: dict, rounds: int, block: int = 6) -> dict:
    """{name: [[ms of each counted call] for each round]}: ``timing.interleaved_samples`` for
    contenders that need a state around their calls.

    ``contenders``: {name: (call, state)}; ``state()`` is a context manager entered before the
    contender's block of calls and left after it, outside the timed calls (switching an override
    costs dispatcher registrations, milliseconds). Each round runs every contender (the order
    rotating) for ``block`` calls, the first not counted, after draining the GPU.
    """
    on_gpu = torch.cuda.is_available()
    names = list(contenders)
    samples = {name: [] for name in names}
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            call, state = contenders[name]
            timed = _timed_call_ms(call, on_gpu)
            with state():
                if on_gpu:
                    torch.cuda.synchronize()
                results = [timed() for _ in range(block)][1:]
                if on_gpu:
                    torch.cuda.synchronize()
            samples[name].append(
                [s.elapsed_time(e) for s, e in results] if on_gpu else list(results)
            )
    return samples


def _rounds(contenders: dict, rep_ms: float, block: int, quick: bool) -> int:
    """Rounds for about ``rep_ms`` per contender (8 to 200), from one untimed block each."""
    if quick:
        return 2
    estimate = 0.0
    for call, state in contenders.values():
        with state():
            call()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(3):
                call()
            torch.cuda.synchronize()
        estimate += (time.perf_counter() - start) * 1e3 / 3
    per_round = block * max(estimate, 1e-3)
    return int(min(200, max(8, rep_ms / per_round * len(contenders))))


def time_op(inputs, params, fn, families, rep_ms: float, quick: bool) -> dict:
    """{impl: {key: per-round ms lists}} of ``fn`` under PyTorch's kernels and the override of
    ``families``: eager calls and, on the GPU, CUDA-graph replays, forward and forward+backward."""
    on_gpu = torch.cuda.is_available()
    states = {ATEN: _state(None), OVERRIDE: _state(families)}
    stream = torch.cuda.Stream() if on_gpu else None
    ctx = torch.cuda.stream(stream) if on_gpu else contextlib.nullcontext()
    times = {impl: {} for impl in states}
    paths = {}
    with ctx:
        calls = {}
        for impl, state in states.items():
            with state():  # warm-up (Triton compiles) under the contender's own kernels
                calls[impl] = timing.passes(inputs, params, fn)
        paths = _paths(calls[OVERRIDE][1], states[OVERRIDE])
        for slot, key in enumerate(("fwd", "fwd_bwd")):
            contenders = {impl: (calls[impl][slot], states[impl]) for impl in states}
            rounds = _rounds(contenders, rep_ms, 6, quick)
            for impl, samples in interleaved_state_samples(contenders, rounds).items():
                times[impl][key] = samples
        if on_gpu:
            for slot, key in enumerate(("graph_fwd", "graph_fwd_bwd")):
                replays = {}
                for impl, state in states.items():
                    with state():
                        replays[impl] = timing.captured(calls[impl][slot], stream)
                for impl, samples in timing.interleaved_samples(replays, rep_ms).items():
                    times[impl][key] = samples
                del replays
    if on_gpu:
        torch.cuda.current_stream().wait_stream(stream)
    return times, paths


def spot_check(name: str, inputs, fn, families) -> None:
    """The override's output equals PyTorch's within the dtype's rounding (the test suite does
    the real checking)."""
    with torch.no_grad():
        ref = fn(*inputs).float()
        with use_aten_overrides(ops=families):
            got = fn(*inputs).float()
    err = ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    if not err < 2e-2:
        raise AssertionError(
            f"{name}: the override differs from PyTorch (relative error {err:.3g})"
        )


def _row(case, shape, impl, samples: dict) -> dict:
    row = {"case": case, "shape": list(shape), "impl": impl}
    for key in TIMED_KEYS:
        if key in samples:
            row[key + "_ms"] = timing.pooled_median(samples[key])
            row[key + "_rounds_ms"] = [round(statistics.median(r), 6) for r in samples[key]]
    return row


def run_ops(cases, shapes, rep_ms, quick, device, save) -> list:
    results = []
    for case in cases:
        families = OP_CASES[case]
        for shape in shapes:
            inputs, params, fn = op_case(case, *shape, device)
            spot_check(f"{case} {shape}", inputs, fn, families)
            timed, paths = time_op(inputs, params, fn, families, rep_ms, quick)
            for impl, samples in timed.items():
                row = _row(case, shape, impl, samples)
                if impl == OVERRIDE:
                    row["paths"] = paths
                results.append(row)
                print(
                    f"{case:9s} {str(shape):14s} {impl:9s} "
                    + "  ".join(
                        f"{k} {row[k + '_ms'] * 1e3:9.1f} us"
                        for k in TIMED_KEYS
                        if k + "_ms" in row
                    ),
                    flush=True,
                )
            save(results)
            del inputs, params, fn
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return results


# ---- the Llama block ------------------------------------------------------------------------


def block_calls(block: LlamaBlock, x: torch.Tensor) -> tuple:
    """(training step, inference) closures on ``block``: the step is forward, a loss, and
    ``torch.autograd.grad`` for the input and every parameter (nothing accumulates)."""
    params = list(block.parameters())
    x = x.detach().requires_grad_()

    def train():
        loss = block(x).float().square().mean()
        torch.autograd.grad(loss, [x, *params])

    def infer():
        with torch.inference_mode():
            block(x)

    return train, infer


def run_block(config, shapes, rep_ms, quick, device, save, results) -> list:
    block = build_block(config, device)
    contenders = {ATEN: _state(None)}
    contenders.update({name: _state(fams) for name, fams in BLOCK_OVERRIDES.items()})
    for batch, seq in shapes:
        x = torch.randn(batch, seq, config["hidden"], device=device, dtype=DTYPE)
        train, infer = block_calls(block, x)
        with torch.no_grad():
            ref = block(x).float()
            for name, state in contenders.items():
                with state():
                    got = block(x).float()
                err = ((got - ref).norm() / ref.norm()).item()
                if not err < 2e-2:
                    raise AssertionError(f"Llama block {name}: differs from PyTorch ({err:.3g})")
        for state in contenders.values():
            with state():  # warm-up under each contender's kernels (Triton compiles)
                for _ in range(2):
                    train()
                    infer()
        for case, call in (("LlamaBlock-train", train), ("LlamaBlock-inference", infer)):
            timed = {name: (call, state) for name, state in contenders.items()}
            rounds = _rounds(timed, rep_ms, 3, quick)
            samples = interleaved_state_samples(timed, rounds, block=3)
            for name, state in contenders.items():
                row = {
                    "case": case,
                    "shape": [batch, seq],
                    "impl": name,
                    "ms": timing.pooled_median(samples[name]),
                    "rounds_ms": [round(statistics.median(r), 6) for r in samples[name]],
                }
                if name != ATEN:
                    row["paths"] = _paths(call, state)
                results.append(row)
                print(f"{case:20s} {batch}x{seq:<6d} {name:24s} {row['ms']:9.3f} ms", flush=True)
            save(results)
        del x, train, infer
    return results


# ---- report ---------------------------------------------------------------------------------


def _speed(aten: dict, over: dict, key: str) -> str:
    """PyTorch's ms / the override's (> 1: the override is faster), with the quartiles of the
    per-round ratio."""
    cell = f"{aten[key + '_ms'] / over[key + '_ms']:.2f}x"
    rounds = key + "_rounds_ms"
    if len(aten.get(rounds, [])) == len(over.get(rounds, [])) >= 2:
        q1, _, q3 = timing.ratio_quartiles([[t] for t in aten[rounds]], [[t] for t in over[rounds]])
        cell += f" ({q1:.2f}-{q3:.2f})"
    return cell


def _paths_cell(row: dict) -> str:
    if "paths" not in row:
        return "-"
    return "; ".join(f"{k} {v}" for k, v in row["paths"].items()) or "none reached an override"


def op_tables(results: list) -> list:
    lines = []
    op_rows = [r for r in results if r["case"] in OP_CASES]
    for case in dict.fromkeys(r["case"] for r in op_rows):
        rows = [r for r in op_rows if r["case"] == case]
        keys = [k for k in TIMED_KEYS if any(k + "_ms" in r for r in rows)]
        titles = {"fwd": "fwd, eager", "fwd_bwd": "fwd+bwd, eager", "graph_fwd": "fwd, CUDA graph",
                  "graph_fwd_bwd": "fwd+bwd, CUDA graph"}  # fmt: skip
        lines += [
            f"## {case}: {', '.join(OP_CASES[case])} (us: PyTorch / override, speed)",
            "",
            "| shape | " + " | ".join(titles[k] for k in keys) + " | override's calls |",
            "|---|" + "---|" * (len(keys) + 1),
        ]
        for shape in dict.fromkeys(tuple(r["shape"]) for r in rows):
            by = {r["impl"]: r for r in rows if tuple(r["shape"]) == shape}
            aten, over = by[ATEN], by[OVERRIDE]
            cells = [f"{shape[0]}x{shape[1]}"]
            for k in keys:
                cells.append(
                    f"{aten[k + '_ms'] * 1e3:.1f} / {over[k + '_ms'] * 1e3:.1f}: "
                    + _speed(aten, over, k)
                )
            cells.append(_paths_cell(over))
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def decision_table(results: list) -> list:
    """Per case, the override's speed over PyTorch (lowest-highest over the shapes): what an
    ``OverrideSpec``'s ``faster_than_aten`` should follow."""
    op_rows = [r for r in results if r["case"] in OP_CASES]
    if not op_rows:
        return []
    lines = [
        "## Decision: override / PyTorch, speed over the shapes (lowest-highest)",
        "",
        "| case | families | fwd, eager | fwd+bwd, eager | fwd, CUDA graph | fwd+bwd, CUDA graph |",
        "|---|---|---|---|---|---|",
    ]
    for case in dict.fromkeys(r["case"] for r in op_rows):
        cells = [case, ", ".join(OP_CASES[case])]
        for key in TIMED_KEYS:
            speeds = []
            for shape in dict.fromkeys(tuple(r["shape"]) for r in op_rows if r["case"] == case):
                by = {
                    r["impl"]: r
                    for r in op_rows
                    if r["case"] == case and tuple(r["shape"]) == shape
                }
                if key + "_ms" in by[ATEN] and key + "_ms" in by[OVERRIDE]:
                    speeds.append(by[ATEN][key + "_ms"] / by[OVERRIDE][key + "_ms"])
            cells.append(f"{min(speeds):.2f}-{max(speeds):.2f}x" if speeds else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def block_table(results: list) -> list:
    rows = [r for r in results if r["case"].startswith("LlamaBlock")]
    if not rows:
        return []
    lines = [
        "## Untagged Llama block (ms; speed over PyTorch's kernels)",
        "",
        "| case | shape (b x s) | contender | ms | speed | override's calls |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        aten = next(
            a
            for a in rows
            if a["case"] == r["case"] and a["shape"] == r["shape"] and a["impl"] == ATEN
        )
        speed = _speed({"t_ms": aten["ms"], "t_rounds_ms": aten["rounds_ms"]},
                       {"t_ms": r["ms"], "t_rounds_ms": r["rounds_ms"]}, "t")  # fmt: skip
        lines.append(
            f"| {r['case']} | {r['shape'][0]}x{r['shape'][1]} | {r['impl']} | {r['ms']:.3f} | "
            f"{speed} | {_paths_cell(r)} |"
        )
    return [*lines, ""]


def write_markdown(meta: dict, results: list, path: str) -> None:
    lines = [
        "# aten override benchmarks",
        "",
        f"- device: {meta['device']}",
        f"- date: {meta['date']}",
        f"- torch {meta['torch']}, triton {meta['triton']}; dtype {meta['dtype']}",
        f"- timing: {meta['timing']}",
        "- speed: PyTorch's time / the override's (> 1: the override is faster); in brackets "
        "the quartiles of that ratio over the rounds (each round's medians paired). "
        "\"override's calls\": which path the override's calls took in one forward+backward "
        "(ours, or PyTorch's kernel and why).",
        "",
        *decision_table(results),
        *op_tables(results),
        *block_table(results),
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def _meta(quick: bool) -> dict:
    import triton

    on_gpu = torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name() if on_gpu else "cpu (Triton interpreter)",
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "dtype": "bfloat16",
        "quick": quick,
        "block_config": QUICK_BLOCK_CONFIG if quick else BLOCK_CONFIG,
        "timing": (
            "median of CUDA-event timings, L2 cleared before each call (timing.clear_l2); eager "
            "calls in rounds that run each contender in rotating order for a block of calls "
            "(the first not counted), the override switched on or off outside the timed calls; "
            "CUDA graphs captured under each contender and replayed in the same kind of rounds"
            if on_gpu
            else "wall clock of interpreted kernels on the CPU (--quick): proves the benchmark "
            "runs, says nothing of speed"
        ),
    }


def run(out: str, cases, quick: bool, rep_ms: float, block: bool = True) -> tuple:
    """Run the benchmark into ``out`` (results.json and results.md after every case)."""
    os.makedirs(out, exist_ok=True)
    on_gpu = torch.cuda.is_available()
    if not on_gpu and os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit(
            "python -m benchmarks.overrides needs a CUDA GPU, or --quick under TRITON_INTERPRET=1 "
            "on the CPU"
        )
    device = "cuda" if on_gpu else "cpu"
    meta = _meta(quick)

    def save(results):
        save_results(out, meta, results, write_markdown)

    shapes = QUICK_SHAPES if quick else NORM_SHAPES
    results = run_ops(cases, shapes, rep_ms, quick, device, save)
    if block:
        config = QUICK_BLOCK_CONFIG if quick else BLOCK_CONFIG
        block_shapes = QUICK_BLOCK_SHAPES if quick else BLOCK_SHAPES
        results = run_block(config, block_shapes, rep_ms, quick, device, save, results)
    save(results)
    return meta, results


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        help="folder for results.md and results.json "
        "(default benchmarks/results/<device>/overrides; required without a GPU)",
    )
    parser.add_argument(
        "--cases",
        default=",".join(OP_CASES),
        help=f"comma-separated subset of {','.join(OP_CASES)}",
    )
    parser.add_argument("--no-block", action="store_true", help="skip the Llama block")
    parser.add_argument("--quick", action="store_true", help="small shapes (CPU interpreter check)")
    parser.add_argument("--rep-ms", type=float, default=100.0, help="time each timing may take")
    args = parser.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(cases) - set(OP_CASES))
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {', '.join(OP_CASES)}")
    if math.isnan(args.rep_ms) or args.rep_ms <= 0:
        parser.error("--rep-ms must be positive")
    if args.out is None:
        if not torch.cuda.is_available():
            parser.error("--out is required without a CUDA GPU")
        args.out = str(default_out("overrides"))
    run(args.out, cases, args.quick, args.rep_ms, block=not args.no_block)
    with open(os.path.join(args.out, "results.md")) as f:
        print(f.read())


if __name__ == "__main__":
    main()
