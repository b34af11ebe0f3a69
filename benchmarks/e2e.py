"""End-to-end: a ~1.1B Llama-style transformers model, ours against eager, torch.compile and Liger.

    python -m benchmarks.e2e                                # every contender, 8x512, 4x2048, 1x4096
    python -m benchmarks.e2e --vocab 128256                 # a Llama-3-sized vocabulary
    python -m benchmarks.e2e --shape 8x512 --contenders eager,ours-fce,liger-flce
    python -m benchmarks.e2e --time-limit 540               # stop, and say how to go on, before 9 min
    python -m benchmarks.e2e --report                       # results.md and plots again
    python -m benchmarks.e2e --profile --shape 8x512 --contenders compile,ours-compile

Runs on transformers 4.57 with Liger-Kernel 0.7.0, and on transformers 5.24 with Liger-Kernel
0.8.5 (0.8 needs transformers 5; benchmarks/README.md). Without Liger-Kernel its contenders are
skipped, with a note.

The model and its contenders are `benchmarks.llama`'s (the set-up `benchmarks.decode`,
`benchmarks.distributed` and `benchmarks.cold_start` build too); the verdict is
`benchmarks.e2e_verdict`'s, the results files and their rendering `benchmarks.e2e_report`'s.

The contenders (``CONTENDERS``; ``--contenders`` takes their keys): eager transformers
(``eager``), ``torch.compile(model)`` (``compile``), ours kernelized (``ours``: our Triton kernels
through ``kernelize``), ours with our fused linear cross-entropy as well (``ours-fce``,
``tag_causal_lm_losses``), ours kernelized with Mode.TORCH_COMPILE, fused loss included, then
compiled (``ours-compile``), both of these with our flash attention (library/attention) in place
of SDPA (``ours-attn``, ``ours-attn-compile``: issue 39), and Liger-Kernel's own transformers
patching (rope, rms_norm, swiglu) without (``liger``) and with its fused linear cross-entropy
(``liger-flce``), each compiled too (``liger-compile``, ``liger-flce-compile``: on Liger-Kernel
0.8.5 the latter dies with an illegal memory access on its first call, so Liger + compile is
measured as ``liger-compile``). Every contender runs on the same weights and inputs.

They are timed in interleaved rounds, the eager-mode ones at every shape before anything is
compiled (see `run`); ours and Liger patch transformers' modelling module for the whole process,
so each contender's module state is put back before its steps (`ModuleState`). Each group is
freed (``free``) before the next is built.

Measured: a training step (forward + backward of the causal-LM loss, no optimizer) and
prefill (forward without grad, logits of the last position only); median of CUDA-event
timings after warm-up; peak memory of each; the host time to issue a training step (its
forward and backward calls), which says whether the step was bound by the host; the first
call's wall time (compilation, for the compiled contenders).

The report (printed, and in results.md) gives, per shape, training step and prefill, the best
configuration of ours against the best peer configuration (``best_against_peers``) and a line
per target of issue 38 (``target_checks``): ours + compile no slower than ours eager and compile
alone, and no larger than ours eager; the best of ours at least as fast as the best peer, with
no more memory than the lowest peer. Two contenders timed in the same rounds compare round by
round (`benchmarks.paired`): a median ratio above 1 that a sign test cannot tell from chance is
a TIE, not a FAIL.

Results go to <out>/results.json (default benchmarks/results/<device>/e2e), one entry per
setting (the transformers line and the vocabulary, ``setting_of``), and <out>/results.md; a run
replaces the rows of the contenders and shapes it measured (``replace_rows``). ``--max-batch
512,2048,4096`` searches, instead of timing, the largest batch a training step fits for eager,
ours with the fused loss and Liger with its fused loss, one contender on the GPU at a time.
`--report` writes results.md and one plot per setting (``e2e-<setting>.png``) again.
``--profile`` (one shape) profiles each chosen contender's training step and prefill instead
(`profile`): wall and device time per step, the device's idle share, launches, and device time
per kernel family (`benchmarks.profiling`), into <out>/profile_v<vocab>_<shape>.json.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

# CONFIG and DEVICE are read through the module, at call time: --vocab sets the vocabulary, and
# the tests put the model on the CPU at a tiny size.
from benchmarks import llama
from benchmarks.e2e_report import replace_rows, report, setting_of, store
from benchmarks.e2e_verdict import verdict_lines
from benchmarks.llama import (
    BY_KEY,
    SHAPES,
    Contender,
    ModuleState,
    build,
    build_contenders,
    contender_makers,
    free,
    no_silent_fallback,
    package_version,
    prefill_step,
    runnable,
    select_contenders,
    tokens_for,
    training_step,
)
from benchmarks.results_io import default_out, entry_for, read_entries


def parse_shapes(text: str) -> list[str]:
    """``"8x512,4x2048"`` -> ``["8x512", "4x2048"]``; ValueError saying the form otherwise."""
    shapes = [s.strip() for s in text.split(",") if s.strip()]
    for shape in shapes:
        parts = shape.split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(
                f"shape {shape!r} is not batch x sequence in positive integers, e.g. 8x512"
            )
    if not shapes:
        raise ValueError("no shape given: pass e.g. --shape 8x512,4x2048")
    return list(dict.fromkeys(shapes))


def own_bytes(model) -> int:
    """Bytes of the model's parameters and buffers (what it holds between steps)."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def skip_causal_masks_as_torch_2_13() -> bool:
    """Give every compiled contender transformers' causal-mask skip, as torch >= 2.13 does
    (`kernels.compile.causal_mask`): on torch 2.11 only ``kernelize(Mode.TORCH_COMPILE)`` would
    restore it, so compile alone and Liger + compile would get it or not by whether ours + compile
    was built in the same process (Liger + compile without it, at vocab 32000 on an H100: 130 ms
    at 4x2048). Returns whether transformers' mask code now skips it."""
    import importlib

    from kernels.compile.causal_mask import restore_causal_mask_skip

    try:
        importlib.import_module("transformers.masking_utils")
    except ImportError:  # transformers without masking_utils builds its masks itself
        return False
    return restore_causal_mask_skip()


def time_interleaved(contenders: dict, module_state, tokens, rounds: int, warmup: int) -> list:
    """Time every contender's training step, then its prefill, in rounds that run each of them
    once in rotating order; [{contender, train_ms, prefill_ms, train_peak_gib,
    prefill_peak_gib, train_host_ms, first_train_s, first_prefill_s}] (``first_*``: the wall
    time of the first call, compilation included)."""
    import torch

    def train_step(model):
        training_step(model, tokens)

    def prefill(model):
        prefill_step(model, tokens)

    times: dict[str, dict[str, list[float]]] = {
        name: {"train_ms": [], "prefill_ms": [], "train_host_ms": []} for name in contenders
    }
    peaks = {name: {"train_ms": 0.0, "prefill_ms": 0.0} for name in contenders}
    first: dict[str, dict[str, float]] = {name: {} for name in contenders}
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
                issued = wall = time.perf_counter()
                start.record()
                step(model)
                issued = time.perf_counter() - issued  # host time to issue the step's work
                end.record()
                torch.cuda.synchronize()
                first[name].setdefault(key, time.perf_counter() - wall)
                if key == "train_ms":
                    model.zero_grad(set_to_none=True)
                if r < warmup:  # compilation and first-call allocations
                    continue
                times[name][key].append(start.elapsed_time(end))
                if key == "train_ms":
                    times[name]["train_host_ms"].append(issued * 1e3)
                peak = torch.cuda.max_memory_allocated() - resident + own_bytes(model)
                peaks[name][key] = max(peaks[name][key], peak / 2**30)
    module_state.restore()

    results = []
    for name in names:
        train = statistics.median(times[name]["train_ms"])
        pre = statistics.median(times[name]["prefill_ms"])
        host = statistics.median(times[name]["train_host_ms"])
        print(
            f"  {name:38s} train {train:8.2f} ms  prefill {pre:8.2f} ms  peak "
            f"{peaks[name]['train_ms']:5.1f} / {peaks[name]['prefill_ms']:5.1f} GiB  first calls "
            f"{first[name]['train_ms']:5.1f} / {first[name]['prefill_ms']:5.1f} s",
            flush=True,
        )
        results.append(
            {
                "contender": name,
                "train_ms": train,
                "prefill_ms": pre,
                "train_peak_gib": peaks[name]["train_ms"],
                "prefill_peak_gib": peaks[name]["prefill_ms"],
                "train_host_ms": host,
                "first_train_s": first[name]["train_ms"],
                "first_prefill_s": first[name]["prefill_ms"],
                # each round's time, in round order: round r of every contender of the group ran
                # back to back, so two contenders compare round by round (benchmarks.paired)
                "train_rounds_ms": times[name]["train_ms"],
                "prefill_rounds_ms": times[name]["prefill_ms"],
            }
        )
    return results


def run_meta(run_id: str, rounds: int, warmup: int) -> dict:
    """What every row of a run records beside its numbers."""
    import torch
    import transformers

    return {
        "run": run_id,
        "device": torch.cuda.get_device_name(),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "triton": package_version("triton"),
        "liger_kernel": package_version("liger-kernel"),
        "python": platform.python_version(),
        "config": dict(llama.CONFIG),
        "timing": f"interleaved rounds: {warmup} warm-up, median of {rounds}",
    }


def resume_command(vocab: int, shapes: list[str], contenders: list[Contender]) -> str:
    """The command that times ``contenders`` at ``shapes``, what a run stopped by its time limit
    left undone."""
    return (
        f"python -m benchmarks.e2e --vocab {vocab} --shape {','.join(shapes)} "
        f"--contenders {','.join(c.key for c in contenders)}"
    )


def run(
    shapes: list[str],
    out: Path,
    contenders: list[Contender],
    rounds: int = 12,
    warmup: int = 3,
    time_limit: float | None = None,
) -> list[str]:
    """Build the eager-mode contenders and time them at every shape, in interleaved rounds;
    free them; then the same for the compiled ones, compiling afresh at each shape. Each
    shape's rows go into results.json as soon as they are timed. With ``time_limit`` (seconds)
    a group stops before a shape that the longest of its shapes so far says would end past
    it; returns the commands that would time what was left (none when all was timed).

    On the VM we measure on, host-bound steps vary by up to a third from minute to minute;
    contenders timed one after another drew different phases (the same code measured 15.8 and
    21.1 ms in two calls). Each round runs every contender of a group once, in rotating order,
    so phases hit all alike; the median over the rounds after warm-up is reported. Peak memory
    of a step is the contender's own weights plus the most the step allocated beyond what was
    resident when it started (the other contenders' weights are resident too).
    """
    import torch

    from kernels.library import untag

    started = time.monotonic()
    meta = run_meta(datetime.datetime.now().isoformat(timespec="seconds"), rounds, warmup)
    reference = build()
    state = {k: v.detach().clone() for k, v in reference.state_dict().items()}
    del reference
    module_state = ModuleState()
    makers = contender_makers(state)

    # Eager-mode contenders are timed before anything is compiled: with compiled models in the
    # process, host-bound steps of the others ran slower (1x4096 prefill, ours: 27.3 ms beside
    # compiled models, 18.8 ms without; run e2e-2026-11-23c-h100, benchmarks/results/h100/NOTES.md).
    groups = [[c for c in contenders if not c.compiled], [c for c in contenders if c.compiled]]
    left: list[tuple[list[Contender], list[str]]] = []
    for group in (g for g in groups if g):
        if left:  # stopped: the compiled group waits for the next call too
            left.append((group, list(shapes)))
            continue
        if group[0].compiled:
            no_silent_fallback()
            skip_causal_masks_as_torch_2_13()
        built = time.monotonic()
        live = build_contenders(makers, [c.name for c in group], module_state)
        print(f"built {', '.join(live)} in {time.monotonic() - built:.0f} s", flush=True)
        longest = 0.0
        for i, shape in enumerate(shapes):
            if time_limit is not None and time.monotonic() - started + longest > time_limit:
                left.append((group, list(shapes[i:])))
                break
            if group[0].compiled:
                # Each shape compiles from scratch, as in a process of its own: a second shape
                # would otherwise make dynamo compile dynamic-shape graphs, which a user who
                # compiles at one shape does not run.
                torch._dynamo.reset()
            shape_start = time.monotonic()
            kind = "compiled" if group[0].compiled else "eager-mode"
            print(f"shape {shape}, {kind} contenders:", flush=True)
            results = time_interleaved(live, module_state, tokens_for(shape), rounds, warmup)
            longest = max(longest, time.monotonic() - shape_start)
            print(f"  ({time.monotonic() - shape_start:.0f} s)", flush=True)
            group_id = f"{meta['run']} {shape} {kind}"  # the rows timed in the same rounds
            rows = [{"shape": shape, **meta, "group": group_id, **r} for r in results]
            store(out, meta, lambda entry, rows=rows: replace_rows(entry, rows))
        free(live)
    untag()

    entry = entry_for(read_entries(out / "results.json"), setting_of(meta))
    print("\n".join(["", *verdict_lines(entry.get("rows", []))]), flush=True)
    commands = [resume_command(llama.CONFIG["vocab_size"], s, g) for g, s in left]
    print(f"\ntimed in {time.monotonic() - started:.0f} s", flush=True)
    for command in commands:
        print(f"STOPPED by --time-limit {time_limit:.0f}; to time what is left: {command}")
    return commands


#: --profile's calls of each step: compilation and first-call allocations, then profiled.
PROFILE_WARMUP, PROFILED_STEPS = 3, 3
#: --profile's rounds over a group's contenders (the fastest round of each is kept).
PROFILE_ROUNDS = 2


def profile(shape: str, out: Path, contenders: list[Contender], log=None) -> dict:
    """Profile each contender's training step and prefill at ``shape`` with `torch.profiler`,
    after three warm-up calls of each (compilation): {contender: {"train" | "prefill":
    summary}} (`benchmarks.profiling.summarize_profile`, with the steps' wall and host time),
    written to ``<out>/profile_v<vocab>_<shape>.json`` and printed as one table per step of
    device time per kernel family. Contenders are built and profiled in groups as `run` times
    them: the eager-mode ones, then the compiled ones, in rotating rounds."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from benchmarks.profiling import family_table, summarize_profile
    from kernels.library import untag

    log = log or (lambda line: print(line, flush=True))
    reference = build()
    state = {k: v.detach().clone() for k, v in reference.state_dict().items()}
    del reference
    module_state = ModuleState()
    makers = contender_makers(state)
    tokens = tokens_for(shape)
    on_gpu = torch.device(llama.DEVICE).type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])

    def sync():
        if on_gpu:
            torch.cuda.synchronize()

    def train_step(model):
        training_step(model, tokens)
        model.zero_grad(set_to_none=True)

    def prefill(model):
        prefill_step(model, tokens)

    def profiled(model, step) -> dict:
        host = []
        for _ in range(PROFILED_STEPS):  # from an idle device: the host's time to issue a step
            sync()
            started = time.perf_counter()
            step(model)
            host.append((time.perf_counter() - started) * 1e3)
        sync()
        started = time.perf_counter()
        for _ in range(PROFILED_STEPS):  # back to back, as a training loop runs them
            step(model)
        sync()
        wall_ms = (time.perf_counter() - started) * 1e3 / PROFILED_STEPS
        with torch_profile(activities=activities) as prof:
            for _ in range(PROFILED_STEPS):
                step(model)
            sync()
        summary = summarize_profile(prof, PROFILED_STEPS, wall_ms)
        summary["host_ms_per_step"] = statistics.median(host)
        return summary

    summaries: dict[str, dict] = {c.name: {} for c in contenders}
    groups = [[c for c in contenders if not c.compiled], [c for c in contenders if c.compiled]]
    for group in (g for g in groups if g):
        if group[0].compiled:
            no_silent_fallback()
        # Built together, as `run` builds a group: set-ups that patch transformers for the whole
        # process (kernelize's causal-mask fix, docs/compile.md) reach the group's peers too.
        live = build_contenders(makers, [c.name for c in group], module_state)
        names = list(live)
        for step_name, step in (("train", train_step), ("prefill", prefill)):
            for name in names:
                model, own_state = live[name]
                module_state.restore(own_state)
                model.train(step_name == "train")
                for _ in range(PROFILE_WARMUP):
                    step(model)
            # Rounds in rotating order, each contender's fastest one kept: clocks and power
            # drift over a run (benchmarks/results/h100/NOTES.md, the e2e profiles).
            for r in range(PROFILE_ROUNDS):
                for i in range(len(names)):
                    name = names[(r + i) % len(names)]
                    model, own_state = live[name]
                    module_state.restore(own_state)
                    summary = profiled(model, step)
                    kept = summaries[name].get(step_name)
                    if kept is None or summary["wall_ms_per_step"] < kept["wall_ms_per_step"]:
                        summaries[name][step_name] = summary
        module_state.restore()
        log(f"profiled {', '.join(names)}")
        free(live)
    untag()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"profile_v{llama.CONFIG['vocab_size']}_{shape}.json"
    meta = {
        "shape": shape,
        "device": torch.cuda.get_device_name() if on_gpu else "cpu",
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "transformers": package_version("transformers"),
        "config": dict(llama.CONFIG),
        "steps": f"{PROFILE_WARMUP} warm-up, fastest of {PROFILE_ROUNDS} rounds of "
        f"{PROFILED_STEPS} profiled",
    }
    path.write_text(json.dumps({**meta, "profiles": summaries}, indent=1) + "\n")
    for step_name in ("train", "prefill"):
        table = family_table({name: s[step_name] for name, s in summaries.items()})
        log("\n".join([f"\n{step_name} at {shape}, per step (ms):", *table]))
        for name, steps in summaries.items():
            gaps = "; ".join(
                f"{g['us']:.0f} us before {g['before'][:48]}"
                for g in steps[step_name]["largest_gaps"][:3]
            )
            log(f"  {name}: the device's largest idle stretches: {gaps or 'none'}")
    log(f"\nwrote {path}")
    return summaries


MAX_BATCH_CONTENDERS = ("eager", "ours (kernelized, fused CE)", "liger (fused linear CE)")


def fits(model, batch: int, seq: int) -> bool:
    """Whether a training step (forward + backward of the loss) at ``batch x seq`` fits."""
    import torch

    tokens = torch.randint(0, llama.CONFIG["vocab_size"], (batch, seq), device=llama.DEVICE)
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


def max_batch(seqs: list[int], out: Path, names) -> None:
    """For each contender of MAX_BATCH_CONTENDERS among ``names``, alone on the GPU (built,
    searched, freed), the largest batch x sequence a training step fits; puts them in the
    setting's entry of <out>/results.json."""
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
        if name not in names:
            continue
        live = build_contenders(makers, [name], module_state)
        model, own_state = live[name]
        module_state.restore(own_state)
        model.train()
        for seq in seqs:
            batch = largest_batch(model, seq)
            print(f"  {name:38s} seq {seq:6d}: batch {batch}", flush=True)
            rows.append({"contender": name, "seq": seq, "batch": batch, "tokens": batch * seq})
        module_state.restore()
        del model
        untag()
        free(live)
    meta = {
        "device": torch.cuda.get_device_name(),
        "date": datetime.date.today().isoformat(),
        "transformers": transformers.__version__,
        "config": llama.CONFIG,
        "gpu_gib": torch.cuda.get_device_properties(0).total_memory / 2**30,
    }
    rows = [{**meta, **r} for r in rows]
    store(out, rows[0], lambda entry: {**entry, "max_batch": rows})


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shape",
        default=",".join(SHAPES),
        help=f"comma-separated batch x sequence shapes (default {','.join(SHAPES)})",
    )
    parser.add_argument(
        "--contenders",
        metavar="KEYS",
        help=f"comma-separated contenders to time (default all: {','.join(BY_KEY)})",
    )
    parser.add_argument(
        "--skip", action="append", default=[], help="contender to skip, key or name (repeatable)"
    )
    parser.add_argument(
        "--out", type=Path, help="results folder (default benchmarks/results/<device>/e2e)"
    )
    parser.add_argument(
        "--vocab",
        type=int,
        default=llama.CONFIG["vocab_size"],
        help=f"vocabulary size (default {llama.CONFIG['vocab_size']}; Llama 3's is 128256)",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        metavar="SECONDS",
        help="stop before a shape that would end past this many seconds from the start (as the "
        "longest shape of its group so far says), print the command that times what is left, "
        "and exit with status 3",
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
    parser.add_argument(
        "--profile",
        action="store_true",
        help="instead of timing: profile each contender's training step and prefill at one "
        "shape (torch.profiler), device time per kernel family, into "
        "<out>/profile_v<vocab>_<shape>.json",
    )
    args = parser.parse_args()
    if args.out is None:
        if args.report:
            parser.error("--out is required with --report")
        args.out = default_out("e2e")
    if args.report:
        report(args.out)
        return 0
    try:
        shapes = parse_shapes(args.shape)
        chosen = select_contenders(args.contenders, args.skip)
    except ValueError as error:
        parser.error(str(error))
    chosen, notes = runnable(chosen, importlib.util.find_spec("liger_kernel") is not None)
    for note in notes:
        print(note, flush=True)
    if not chosen:
        parser.error("no contender left to run (see the notes above)")
    llama.CONFIG["vocab_size"] = args.vocab  # recorded with every result (meta["config"])
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.profile:
        if len(shapes) != 1:
            parser.error("--profile takes one --shape")
        profile(shapes[0], args.out, chosen)
        return 0
    if args.max_batch:
        max_batch([int(s) for s in args.max_batch.split(",")], args.out, {c.name for c in chosen})
        return 0
    left = run(shapes, args.out, chosen, time_limit=args.time_limit)
    return 3 if left else 0


if __name__ == "__main__":
    sys.exit(main())
