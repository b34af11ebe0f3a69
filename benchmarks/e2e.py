"""End-to-end: a ~1.1B Llama-style transformers model, eager vs torch.compile vs Liger vs ours.

    python -m benchmarks.e2e --shape 8x512                  # into benchmarks/results/<device>/e2e
    python -m benchmarks.e2e --shape 8x512 --vocab 128256   # a Llama-3-sized vocabulary
    python -m benchmarks.e2e --report                       # results.md and plots again

Runs on transformers 4.57 with Liger-Kernel 0.7.0, and on transformers 5.24 with Liger-Kernel
0.8.5 (0.8 needs transformers 5; benchmarks/README.md).

One process per shape; inside it every contender runs on the same weights and inputs:
eager transformers, torch.compile(model), ours kernelized (our Triton kernels through
`kernelize`), ours kernelized with Mode.TORCH_COMPILE and then compiled, and Liger-Kernel's
own transformers patching (rope, rms_norm, swiglu) without and with its fused linear
cross-entropy; ours also with our fused linear cross-entropy (``tag_causal_lm_losses``).
``--vocab 128256`` sets the vocabulary (default 32000); ``--max-batch 512,2048,4096`` searches,
instead of timing, the largest batch a training step fits for eager, ours with the fused loss
and Liger with its fused loss, one contender on the GPU at a time. They are timed in interleaved rounds, the eager-mode ones before anything is
compiled (see `run`); ours and Liger patch transformers' modelling module for the whole
process, so each contender's module state is put back before its steps (`ModuleState`).

Measured: a training step (forward + backward of the causal-LM loss, no optimizer) and
prefill (forward without grad, logits of the last position only); median of CUDA-event
timings after warm-up; peak memory of the training step; the host time to issue a training
step (its forward and backward calls), which says whether the step was bound by the host.
Results go to <out>/results.json (default benchmarks/results/<device>/e2e), one entry per
setting (the transformers line and the vocabulary, ``setting_of``), and <out>/results.md; a run
of one shape replaces that shape's rows in its setting's entry and leaves the rest. `--report`
writes results.md and one plot per setting (``e2e-<setting>.png``) again.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from benchmarks.results_io import (
    default_out,
    entry_for,
    read_entries,
    replace_entry,
    transformers_line,
    write_entries,
)

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


_MISSING = object()


def build_ours(state_dict, compile_mode: bool, fused_ce: bool = False):
    """Our kernels through ``kernelize`` (TRAINING mode, or TRAINING | TORCH_COMPILE and then
    ``torch.compile``); with ``fused_ce`` also our fused linear cross-entropy (library/loss)."""
    import torch

    from kernels import Mode, kernelize, library_mapping, use_kernel_mapping
    from kernels.library import tag_causal_lm_losses, tag_gated_mlps, tag_rotary_embeddings

    model = build(state_dict)
    # transformers 4.57 leaves LlamaMLP and apply_rotary_pos_emb untagged, 5.x LlamaMLP: tag
    # them, so that kernelize reaches them (SwiGLUMLP fuses SiLU and the multiply;
    # rotary_pos_emb rotates q and k in one kernel). On 5.x the rotary tag is a no-op.
    tag_gated_mlps(model)
    tag_rotary_embeddings(model)
    if fused_ce:  # LlamaForCausalLM's loss without logits in training (CausalLMFusedLoss)
        tag_causal_lm_losses(model)
    mode = Mode.TRAINING | Mode.TORCH_COMPILE if compile_mode else Mode.TRAINING
    with use_kernel_mapping(library_mapping(devices=["cuda"])):
        kernelize(model, mode=mode)
    return torch.compile(model) if compile_mode else model


def build_liger(state_dict, flce: bool):
    """Liger-Kernel's own transformers patching: rope, rms_norm, swiglu, and with ``flce`` its
    fused linear cross-entropy."""
    from liger_kernel.transformers import apply_liger_kernel_to_llama

    model = build(state_dict)
    apply_liger_kernel_to_llama(
        rope=True,
        rms_norm=True,
        swiglu=True,
        cross_entropy=False,
        fused_linear_cross_entropy=flce,
        model=model,
    )
    return model


def contender_makers(state_dict) -> dict:
    """{contender name: function building it on ``state_dict``'s weights}."""
    import torch

    return {
        "eager": lambda: build(state_dict),
        "torch.compile": lambda: torch.compile(build(state_dict)),
        "ours (kernelized)": lambda: build_ours(state_dict, False),
        "ours (kernelized, fused CE)": lambda: build_ours(state_dict, False, fused_ce=True),
        "ours (kernelized + compile)": lambda: build_ours(state_dict, True),
        "liger (no fused CE)": lambda: build_liger(state_dict, False),
        "liger (fused linear CE)": lambda: build_liger(state_dict, True),
    }


class ModuleState:
    """The attributes of transformers' Llama modelling module and of its classes, so that each
    contender runs with the module state its set-up left.

    Both ours (``tag_rotary_embeddings``) and Liger (``apply_liger_kernel_to_llama``) patch
    that module for the whole process: its ``apply_rotary_pos_emb`` global, and for Liger's
    fused cross-entropy ``LlamaForCausalLM.forward``. On transformers 5.x that global is a
    function module whose ``forward`` ``kernelize`` sets, for every model of the process, so
    such module instances are owners too. Contenders run in interleaved rounds, so each one's
    state is captured after its set-up and put back before each of its steps.
    """

    def __init__(self):
        import torch
        import transformers.models.llama.modeling_llama as modeling

        self.owners = [modeling] + [
            v
            for v in vars(modeling).values()
            if (isinstance(v, type) and v.__module__ == modeling.__name__)
            or isinstance(v, torch.nn.Module)
        ]
        self.baseline = self._attributes()
        # (owner index, name) of every attribute some set-up changed: only these are put back,
        # so that what transformers or dynamo set at run time is left alone.
        self.patched: set[tuple[int, str]] = set()

    def _attributes(self) -> list[dict]:
        return [dict(vars(owner)) for owner in self.owners]

    def capture(self) -> list[dict]:
        """The state now; remembers which attributes differ from the state at construction."""
        state = self._attributes()
        for i, (before, after) in enumerate(zip(self.baseline, state, strict=True)):
            for name in set(before) | set(after):
                if before.get(name, _MISSING) is not after.get(name, _MISSING):
                    self.patched.add((i, name))
        return state

    def restore(self, state: list[dict] | None = None) -> None:
        """Put back ``state`` (by default the state at construction) for the patched attributes."""
        state = self.baseline if state is None else state
        for i, name in self.patched:
            owner, value = self.owners[i], state[i].get(name, _MISSING)
            if vars(owner).get(name, _MISSING) is value:
                continue
            if value is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


def build_contenders(makers: dict, names, module_state: ModuleState) -> dict:
    """{name: (model, the modelling-module state its set-up left)}, each built from a clean
    module state (nothing tagged or patched), which is put back at the end."""
    from kernels.library import untag

    contenders = {}
    for name in names:
        module_state.restore()
        untag()
        contenders[name] = (makers[name](), module_state.capture())
    module_state.restore()
    return contenders


def own_bytes(model) -> int:
    """Bytes of the model's parameters and buffers (what it holds between steps)."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


COMPILED = ("torch.compile", "ours (kernelized + compile)")


def time_interleaved(contenders: dict, module_state, tokens, rounds: int, warmup: int) -> list:
    """Time every contender's training step, then its prefill, in rounds that run each of them
    once in rotating order; [{contender, train_ms, prefill_ms, train_peak_gib, train_host_ms}]."""
    import torch

    def train_step(model):
        model(input_ids=tokens, labels=tokens).loss.backward()

    def prefill(model):
        with torch.no_grad():
            model(input_ids=tokens, logits_to_keep=1)

    times = {name: {"train_ms": [], "prefill_ms": [], "train_host_ms": []} for name in contenders}
    peaks = {name: 0.0 for name in contenders}
    names = list(contenders)
    for key, step in (("train_ms", train_step), ("prefill_ms", prefill)):
        for r in range(warmup + rounds):
            for i in range(len(names)):
                name = names[(r + i) % len(names)]
                model, own_state = contenders[name]
                module_state.restore(own_state)
                model.train(key == "train_ms")
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                resident = torch.cuda.memory_allocated()
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                issued = time.perf_counter()
                start.record()
                step(model)
                issued = time.perf_counter() - issued  # host time to issue the step's work
                end.record()
                torch.cuda.synchronize()
                if key == "train_ms":
                    model.zero_grad(set_to_none=True)
                if r < warmup:  # compilation and first-call allocations
                    continue
                times[name][key].append(start.elapsed_time(end))
                if key == "train_ms":
                    times[name]["train_host_ms"].append(issued * 1e3)
                    peak = torch.cuda.max_memory_allocated() - resident + own_bytes(model)
                    peaks[name] = max(peaks[name], peak / 2**30)
    module_state.restore()

    results = []
    for name in names:
        train = statistics.median(times[name]["train_ms"])
        pre = statistics.median(times[name]["prefill_ms"])
        host = statistics.median(times[name]["train_host_ms"])
        print(
            f"  {name:34s} train {train:8.2f} ms  prefill {pre:8.2f} ms  peak {peaks[name]:5.1f} GiB",
            flush=True,
        )
        results.append(
            {
                "contender": name,
                "train_ms": train,
                "prefill_ms": pre,
                "train_peak_gib": peaks[name],
                "train_host_ms": host,
            }
        )
    return results


def run(shape: str, out: Path, skip: set[str], rounds: int = 12, warmup: int = 3) -> None:
    """Build the eager-mode contenders and time them in interleaved rounds; then the same for
    the compiled ones.

    On the VM we measure on, host-bound steps vary by up to a third from minute to minute;
    contenders timed one after another drew different phases (the same code measured 15.8 and
    21.1 ms in two calls). Each round runs every contender of a group once, in rotating order,
    so phases hit all alike; the median over the rounds after warm-up is reported. Peak memory
    of a training step is the contender's own weights plus the most the step allocated beyond
    what was resident when it started (the other contenders' weights are resident too).
    """
    import torch
    import transformers

    from kernels.library import untag

    batch, seq = (int(v) for v in shape.split("x"))
    torch.manual_seed(0)
    tokens = torch.randint(0, CONFIG["vocab_size"], (batch, seq), device="cuda")
    reference = build()
    state = {k: v.detach().clone() for k, v in reference.state_dict().items()}
    del reference
    module_state = ModuleState()

    makers = contender_makers(state)
    # Eager-mode contenders are timed before anything is compiled: with compiled models in the
    # process, host-bound steps of the others ran slower (1x4096 prefill, ours: 27.3 ms beside
    # compiled models, 18.8 ms without; run e2e-2026-11-23c-h100, benchmarks/results/h100/NOTES.md).
    groups = [
        [name for name in makers if name not in COMPILED and name not in skip],
        [name for name in makers if name in COMPILED and name not in skip],
    ]
    print(f"shape {shape}:", flush=True)
    results = []
    for group in groups:
        contenders = build_contenders(makers, group, module_state)
        results += time_interleaved(contenders, module_state, tokens, rounds, warmup)
        del contenders
        torch.cuda.empty_cache()
    untag()

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
        "timing": f"interleaved rounds: {warmup} warm-up, median of {rounds}",
    }
    rows = [{**meta, **r} for r in results]
    store(out, rows[0], lambda entry: _replace_shape(entry, shape, rows))


MAX_BATCH_CONTENDERS = ("eager", "ours (kernelized, fused CE)", "liger (fused linear CE)")


def fits(model, batch: int, seq: int) -> bool:
    """Whether a training step (forward + backward of the loss) at ``batch x seq`` fits."""
    import torch

    tokens = torch.randint(0, CONFIG["vocab_size"], (batch, seq), device="cuda")
    try:
        model(input_ids=tokens, labels=tokens).loss.backward()
        torch.cuda.synchronize()
        return True
    except torch.cuda.OutOfMemoryError:
        return False
    finally:
        model.zero_grad(set_to_none=True)
        del tokens
        torch.cuda.empty_cache()


def largest_batch(model, seq: int, limit: int = 1024) -> int:
    """The largest batch of ``seq`` tokens a training step fits (doubling, then bisecting)."""
    low, high = 0, 1
    while high <= limit and fits(model, high, seq):
        low, high = high, high * 2
    high = min(high, limit + 1)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(model, middle, seq) else (low, middle)
    return low


def max_batch(seqs: list[int], out: Path, skip: set[str]) -> None:
    """For each contender of MAX_BATCH_CONTENDERS alone on the GPU (built, searched, freed),
    the largest batch x sequence a training step fits; puts them in the setting's entry of <out>/results.json."""
    import torch
    import transformers

    from kernels.library import untag

    reference = build()
    state = {k: v.detach().cpu() for k, v in reference.state_dict().items()}
    del reference
    torch.cuda.empty_cache()
    module_state = ModuleState()
    makers = contender_makers(state)
    rows = []
    for name in MAX_BATCH_CONTENDERS:
        if name in skip:
            continue
        model, own_state = build_contenders(makers, [name], module_state)[name]
        module_state.restore(own_state)
        model.train()
        for seq in seqs:
            batch = largest_batch(model, seq)
            print(f"  {name:34s} seq {seq:6d}: batch {batch}", flush=True)
            rows.append({"contender": name, "seq": seq, "batch": batch, "tokens": batch * seq})
        module_state.restore()
        del model
        untag()
        torch.cuda.empty_cache()
    meta = {
        "device": torch.cuda.get_device_name(),
        "date": datetime.date.today().isoformat(),
        "transformers": transformers.__version__,
        "config": CONFIG,
        "gpu_gib": torch.cuda.get_device_properties(0).total_memory / 2**30,
    }
    rows = [{**meta, **r} for r in rows]
    store(out, rows[0], lambda entry: {**entry, "max_batch": rows})


def setting_of(meta: dict) -> dict:
    """What a run's results are kept under: its transformers line and vocabulary (a new run of
    the same setting replaces the old one's rows)."""
    return {
        "transformers": transformers_line(meta["transformers"]),
        "vocab": meta["config"]["vocab_size"],
    }


def _replace_shape(entry: dict, shape: str, rows: list[dict]) -> dict:
    """``entry`` with ``rows`` in place of its rows of ``shape`` (one process times one shape)."""
    kept = [r for r in entry.get("rows", []) if r["shape"] != shape]
    return {**entry, "rows": kept + rows}


def store(out: Path, meta: dict, update) -> None:
    """Put ``update(entry)`` in place of the entry of ``meta``'s setting in <out>/results.json,
    and write results.md."""
    path = out / "results.json"
    entries = read_entries(path)
    entry = update(entry_for(entries, setting_of(meta)))
    entries = replace_entry(entries, entry)
    write_entries(path, entries)
    (out / "results.md").write_text(report_text(entries))


def _max_batch_table(rows: list[dict]) -> list[str]:
    """Lines of results.md: the largest batch x sequence of a training step (``--max-batch``)."""
    if not rows:
        return []
    seqs = sorted({r["seq"] for r in rows})
    by = {(r["contender"], r["seq"]): r for r in rows}
    lines = [
        "",
        f"Largest batch of a training step that fits ({rows[0]['device']}, "
        f"{rows[0]['gpu_gib']:.0f} GiB; vocab {rows[0]['config']['vocab_size']}):",
        "",
        "| contender | " + " | ".join(f"seq {s}" for s in seqs) + " |",
        "|---|" + "---|" * len(seqs),
    ]
    for c in dict.fromkeys(r["contender"] for r in rows):
        cells = [
            "—" if (c, s) not in by else f"{by[(c, s)]['batch']} ({by[(c, s)]['tokens']} tokens)"
            for s in seqs
        ]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return lines


def _host_table(shapes, contenders, by) -> list[str]:
    """Lines of results.md: per training step, the host time to issue it beside its wall time (runs
    before that column was recorded have none)."""
    if not any("train_host_ms" in r for r in by.values()):
        return []
    lines = [
        "",
        "Host time to issue a training step (the forward and backward calls, until they return) of",
        "its wall time: a step whose host time is close to its wall time was bound by the host,",
        "which differs from one VM to the next, so its wall time compares hosts more than kernels.",
        "",
        "| contender | " + " | ".join(f"host / wall {s}" for s in shapes) + " |",
        "|---|" + "---|" * len(shapes),
    ]
    for c in contenders:
        cells = []
        for s in shapes:
            r = by.get((s, c))
            host = None if r is None else r.get("train_host_ms")
            cells.append("—" if host is None else f"{host:.1f} / {r['train_ms']:.1f} ms")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return lines


def _index(rows: list[dict]) -> tuple[list[str], list[str], dict]:
    """(shapes, contenders, {(shape, contender): row}), both lists in the order first met."""
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    contenders = list(dict.fromkeys(r["contender"] for r in rows))
    return shapes, contenders, {(r["shape"], r["contender"]): r for r in rows}


def setting_title(setting: dict) -> str:
    """``transformers 4.57, vocab 32000``: a setting's heading in results.md."""
    return f"transformers {setting['transformers']}, vocab {setting['vocab']}"


def setting_slug(setting: dict) -> str:
    """``tf4.57-v32000``: a setting in file names (its plot)."""
    return f"tf{setting['transformers']}-v{setting['vocab']}"


def report_text(entries: list[dict]) -> str:
    """results.md: for each setting, its timing table (``markdown``) and its largest batches."""
    lines = [
        "# End-to-end: Llama-style 1.1B model, bf16",
        "",
        "The latest run of each setting (transformers line, vocabulary); earlier runs are in git",
        "history.",
    ]
    for entry in entries:
        lines += ["", f"## {setting_title(entry['setting'])}", ""]
        if entry.get("rows"):
            lines.append(markdown(entry["rows"]).rstrip("\n"))
        lines += _max_batch_table(entry.get("max_batch", []))
    return "\n".join(lines) + "\n"


def markdown(rows: list[dict]) -> str:
    """One setting's tables in results.md: speedups over eager and peak memory per shape, and
    the host time of the training steps."""
    shapes, contenders, by = _index(rows)
    meta = rows[0]
    lines = [
        f"{meta['device']}, {meta['date']}; torch {meta['torch']}, transformers {meta['transformers']}, "
        f"triton {meta['triton']}, liger-kernel {meta['liger_kernel']}. Config: {meta['config']}, SDPA attention.",
        "Training step: forward + backward of the causal-LM loss, no optimizer. Prefill: forward without grad,",
        "logits of the last position only. Each contender's step between CUDA events, in rounds that run every",
        f"contender once in rotating order ({meta.get('timing', 'median of 10 after warm-up')}); speedup over eager.",
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
    lines += _host_table(shapes, contenders, by)
    return "\n".join(lines) + "\n"


def report(out: Path) -> None:
    """results.json -> results.md (``report_text``) and, per setting, e2e-<setting>.png."""
    entries = read_entries(out / "results.json")
    if not entries:
        sys.exit(f"{out / 'results.json'} holds no results: run a shape first")
    (out / "results.md").write_text(report_text(entries))
    for entry in entries:
        if entry.get("rows"):
            plot(entry["rows"], out / f"e2e-{setting_slug(entry['setting'])}.png")


def plot(rows: list[dict], path: Path) -> None:
    """Speedups over eager of one setting's rows, training step and prefill, to ``path``."""
    shapes, contenders, by = _index(rows)
    meta = rows[0]

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
        ax.set_title(
            f"{title}: speedup over eager ({meta['device']}, transformers "
            f"{meta['transformers']}, vocab {meta['config']['vocab_size']})",
            fontsize=9,
        )
        ax.set_xlabel("batch x sequence")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", help="batch x sequence, e.g. 8x512")
    parser.add_argument(
        "--out", type=Path, help="results folder (default benchmarks/results/<device>/e2e)"
    )
    parser.add_argument(
        "--skip", action="append", default=[], help="contender to skip (repeatable)"
    )
    parser.add_argument(
        "--vocab",
        type=int,
        default=CONFIG["vocab_size"],
        help=f"vocabulary size (default {CONFIG['vocab_size']}; Llama 3's is 128256)",
    )
    parser.add_argument(
        "--report", action="store_true", help="write results.md and the plots from results.json"
    )
    parser.add_argument(
        "--max-batch",
        metavar="SEQS",
        help="instead of timing: the largest batch that fits at each of these comma-separated "
        "sequence lengths, for eager, ours with the fused CE and Liger with its fused CE",
    )
    args = parser.parse_args()
    if args.out is None:
        if args.report:
            parser.error("--out is required with --report")
        args.out = default_out("e2e")
    if args.report:
        report(args.out)
        return 0
    CONFIG["vocab_size"] = args.vocab  # recorded with every result (meta["config"])
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.max_batch:
        max_batch([int(s) for s in args.max_batch.split(",")], args.out, set(args.skip))
        return 0
    if not args.shape:
        parser.error("--shape is required unless --report or --max-batch")
    run(args.shape, args.out, set(args.skip))
    return 0


if __name__ == "__main__":
    sys.exit(main())
