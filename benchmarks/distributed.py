"""A training step of the 1.1B Llama-style model of benchmarks/llama.py on N GPUs, under FSDP2 and
under tensor parallelism: eager transformers against ours kernelized, Liger-Kernel and
torch.compile, with the scaling efficiency from 1 to N GPUs.

    torchrun --nproc-per-node 1 -m benchmarks.distributed --engine fsdp2,tp --shape 8x512
    torchrun --nproc-per-node 2 -m benchmarks.distributed --engine fsdp2,tp --shape 8x512
    torchrun --nproc-per-node 4 -m benchmarks.distributed --engine fsdp2,tp --shape 8x512
    python -m benchmarks.distributed --report

Results go to ``--out`` (default benchmarks/results/<device>/distributed): results.json keeps one
entry per setting (transformers line, engine, shape, ranks, resharding; a run replaces its own
settings' entries), results.md and distributed.png are written from all of them.

Engines (``--engine``):

``fsdp2``
    data parallel: ``--shape`` is each rank's batch x sequence, N ranks train on N times its
    tokens. ``fully_shard`` on every decoder layer and on the root (``--no-reshard``: the gathered
    weights stay from forward to backward).
``tp``
    tensor parallel: the ranks share one batch of ``--shape``. Megatron-style, with sequence
    parallel norms (`tensor_parallel_plan`: q, k, v, gate, up column-wise, o, down row-wise,
    lm_head column-wise; the residual stream sharded along the sequence), so our norm kernels get
    sequence-sharded DTensors and run on their local shards (docs/distributed.md). The fused
    losses (ours and Liger's) need a plain lm_head, which this one is not: ours falls back to the
    model's own loss (the "fused CE" contender then times as "ours"). Liger-Kernel's contenders
    are recorded as skipped under tp: its kernels take the weights as plain tensors, and on the
    GPU its failed first step left an illegal memory access that ended the whole run.

Contenders (benchmarks/llama.py's set-ups, on the same weights on every rank, bf16 weights and
SDPA attention): ``eager``, ``ours (kernelized)`` and ``ours (kernelized, fused CE)`` (tagged and
kernelized for training before sharding), ``liger (no fused CE)`` and ``liger (fused linear
CE)`` (``apply_liger_kernel_to_llama``), and ``torch.compile``: the eager model sharded, then
``torch.compile``'d; ``ours (kernelized + compile, fused CE)``: kernelized for ``TRAINING |
TORCH_COMPILE`` with the fused loss, sharded, then ``torch.compile``'d; under FSDP2 both of these
also with each decoder layer compiled (``fullgraph=True``) before sharding instead
(``torch.compile (each decoder layer)``, ``ours (kernelized + compile of each decoder layer,
fused CE)``), FSDP2's own compile recipe (torchtitan's): a whole-model compile breaks its graph
at every FSDP2 hook. A contender whose set-up or first step raises (compiling a sharded model,
Liger on DTensors) is recorded with its error and left out of the timing, on every rank.

Measured, in interleaved rounds as in e2e.py (each round runs every contender once, in rotating
order, the same on every rank): the wall time of a training step (forward and backward of the
causal-LM loss with the engine's collectives; no optimizer) between CUDA events, the slowest
rank's in each round, its median after warm-up; tokens per second (over all ranks' distinct
tokens: N times the shape for fsdp2, the shape for tp); the peak memory of a step on the rank that
needed most (its shard of the weights and gradients, plus what the step allocated); the loss of
the first step, so that the contenders are seen to train the same model; the first step's wall
time (compilation included). Scaling efficiency at N = tokens/s at N / (N x tokens/s at 1), the
same engine, shape and contender at 1 rank (``--nproc-per-node 1``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

from benchmarks import llama  # the model, its contenders and the module-state bookkeeping
from benchmarks.paired import compare
from benchmarks.results_io import (
    RESULTS,
    device_folder,
    entry_for,
    read_entries,
    replace_entry,
    transformers_line,
    write_entries,
)

COMPILED = "torch.compile"
OURS_COMPILED = llama.OURS_COMPILED
COMPILED_LAYERS = "torch.compile (each decoder layer)"
OURS_COMPILED_LAYERS = "ours (kernelized + compile of each decoder layer, fused CE)"
#: The contenders timed by default (`benchmarks.llama`'s names, and two of FSDP2's own compile
#: recipe). The compiled ones are built, then compiled in one of two ways: sharded, then
#: torch.compile'd whole (`COMPILED_AFTER_SHARDING`: COMPILED the eager model, OURS_COMPILED
#: ours kernelized for TRAINING | TORCH_COMPILE with the fused loss), or each decoder layer
#: compiled with ``fullgraph=True`` before sharding (`COMPILED_PER_LAYER`, FSDP2 only), as
#: torchtitan compiles a model it shards: FSDP2's hooks stay outside the compiled layers, where
#: a whole-model compile breaks its graph at each of them and runs parts of the model eagerly.
CONTENDERS = (
    "eager",
    "ours (kernelized)",
    "ours (kernelized, fused CE)",
    OURS_COMPILED,
    OURS_COMPILED_LAYERS,
    "liger (no fused CE)",
    "liger (fused linear CE)",
    COMPILED,
    COMPILED_LAYERS,
)
OURS = ("ours (kernelized)", "ours (kernelized, fused CE)", OURS_COMPILED, OURS_COMPILED_LAYERS)
COMPILED_AFTER_SHARDING = (COMPILED, OURS_COMPILED)
COMPILED_PER_LAYER = (COMPILED_LAYERS, OURS_COMPILED_LAYERS)
ENGINES = ("fsdp2", "tp")
#: torch.compile's backend for the compiled contenders (tests on the CPU take "aot_eager").
COMPILE_BACKEND = "inductor"


def shard(model, mesh, reshard_after_forward: bool = True):
    """FSDP2 as its documentation applies it to a transformer: every decoder layer, then the root."""
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model


def tensor_parallel_plan(model) -> dict:
    """Megatron-style tensor parallelism with sequence parallel norms for a Llama-style
    ``*ForCausalLM``: q, k, v, gate and up column-wise, o and down row-wise, lm_head column-wise
    gathering its output; the residual stream between them sharded along the sequence
    (``SequenceParallel`` norms), gathered before attention and the MLP. The embedding's and the
    row-wise outputs stay DTensors (``use_local_output=False``), so that transformers sees the
    whole sequence length when it makes positions and masks."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    plan = {
        "model.embed_tokens": RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False
        ),
        "model.norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    for index in range(len(model.model.layers)):
        layer = f"model.layers.{index}"
        plan |= {
            f"{layer}.input_layernorm": SequenceParallel(),
            f"{layer}.self_attn": PrepareModuleInput(
                input_kwarg_layouts={"hidden_states": Shard(1)},
                desired_input_kwarg_layouts={"hidden_states": Replicate()},
            ),
            **{f"{layer}.self_attn.{p}_proj": ColwiseParallel() for p in "qkv"},
            f"{layer}.self_attn.o_proj": RowwiseParallel(
                output_layouts=Shard(1), use_local_output=False
            ),
            f"{layer}.post_attention_layernorm": SequenceParallel(),
            f"{layer}.mlp": PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
            ),
            f"{layer}.mlp.gate_proj": ColwiseParallel(),
            f"{layer}.mlp.up_proj": ColwiseParallel(),
            f"{layer}.mlp.down_proj": RowwiseParallel(
                output_layouts=Shard(1), use_local_output=False
            ),
        }
    return plan


def compile_decoder_layers(model) -> None:
    """Each decoder layer of ``model`` replaced by itself ``torch.compile``'d with
    ``fullgraph=True`` (a layer that cannot be traced whole raises at its first call instead of
    running partly eagerly), in place, before sharding."""
    import torch

    layers = model.model.layers
    for index, layer in enumerate(layers):
        layers[index] = torch.compile(layer, backend=COMPILE_BACKEND, fullgraph=True)


def parallelize(model, engine: str, mesh, reshard_after_forward: bool = True):
    """`model` under `engine` ("fsdp2" or "tp") on the 1-D `mesh`."""
    if engine == "fsdp2":
        return shard(model, mesh, reshard_after_forward)
    if engine == "tp":
        from torch.distributed.tensor.parallel import parallelize_module

        return parallelize_module(model, mesh, tensor_parallel_plan(model))
    raise ValueError(f"unknown engine {engine!r}: one of {', '.join(ENGINES)}")


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


def _error(exc: BaseException) -> str:
    """An error for the results: its type, message and where it was raised (one line)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    message = " ".join(str(exc).split())[:300]
    return f"{type(exc).__name__}: {message}{where}"


def _agree_on_failures(errors: dict[str, str], names: list[str], device) -> dict[str, str]:
    """The contenders that failed on any rank, with the first failing rank's error, the same on
    every rank (a contender some ranks kept would leave the others waiting in its collectives)."""
    import torch.distributed as dist

    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, errors)
    agreed: dict[str, str] = {}
    for rank, rank_errors in enumerate(gathered):
        for name in names:
            if name in rank_errors and name not in agreed:
                agreed[name] = f"rank {rank}: {rank_errors[name]}"
    return agreed


def _step(model, tokens):
    loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    return loss


def time_interleaved(
    contenders: dict, module_state, tokens, rounds: int, warmup: int, tokens_per_step: int
) -> list:
    """Time every contender's training step in rounds that run each once in rotating order;
    [{contender, step_ms, step_ms_rounds, step_ms_rank_spread, tokens_per_s, peak_gib,
    first_loss, first_step_s}] or, for a contender whose first step raised, [{contender,
    error}]; the same on every rank. ``step_ms_rounds`` keeps each counted round's slowest-rank
    time, in round order, so that two contenders compare round by round (`benchmarks.paired`)."""
    import torch
    import torch.distributed as dist

    device = tokens.device
    on_gpu = device.type == "cuda"
    world = dist.get_world_size()
    names = list(contenders)
    losses: dict[str, float] = {}
    first_s: dict[str, float] = {}
    # The first step of each, on its own: compilation, autotuning, NCCL communicators, and
    # the errors of a contender that does not run sharded.
    errors: dict[str, str] = {}
    for name in names:
        model, own_state = contenders[name]
        module_state.restore(own_state)
        dist.barrier()
        began = time.perf_counter()
        try:
            loss = _step(model, tokens)
            losses[name] = loss.item()
        except Exception as exc:  # recorded in the results instead of ending the run
            errors[name] = _error(exc)
            print(f"  {name}: first step failed on rank {dist.get_rank()}: {errors[name]}")
        if on_gpu:
            torch.cuda.synchronize()
        first_s[name] = time.perf_counter() - began
        model.zero_grad(set_to_none=True)
    errors = _agree_on_failures(errors, names, device)
    names = [name for name in names if name not in errors]
    for name in names:
        losses[name] = _reduce(losses[name], dist.ReduceOp.SUM, device) / world
        first_s[name] = _reduce(first_s[name], dist.ReduceOp.MAX, device)

    times: dict[str, list[float]] = {name: [] for name in names}
    spreads: dict[str, list[float]] = {name: [] for name in names}
    peaks = dict.fromkeys(names, 0.0)
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
            _step(model, tokens)
            if on_gpu:
                end.record()
                torch.cuda.synchronize()
                ms = start.elapsed_time(end)
            else:
                ms = (time.perf_counter() - began) * 1e3
            model.zero_grad(set_to_none=True)
            slowest = _reduce(ms, dist.ReduceOp.MAX, device)
            fastest = _reduce(ms, dist.ReduceOp.MIN, device)
            if r < warmup:
                continue
            times[name].append(slowest)
            spreads[name].append(slowest - fastest)
            if on_gpu:
                peak = torch.cuda.max_memory_allocated() - resident + local_bytes(model)
                peak = _reduce(peak / 2**30, dist.ReduceOp.MAX, device)
                peaks[name] = max(peaks[name], peak)
    module_state.restore()
    results = []
    for name in contenders:
        if name in errors:
            results.append({"contender": name, "error": errors[name]})
            if dist.get_rank() == 0:
                print(f"  {name:26s} failed: {errors[name]}", flush=True)
            continue
        step = statistics.median(times[name])
        results.append(
            {
                "contender": name,
                "step_ms": step,
                "step_ms_rounds": times[name],
                "step_ms_rank_spread": statistics.median(spreads[name]),
                "tokens_per_s": tokens_per_step / (step / 1e3),
                "peak_gib": peaks[name],
                "first_loss": losses[name],
                "first_step_s": first_s[name],
            }
        )
        if dist.get_rank() == 0:
            print(
                f"  {name:26s} step {step:8.2f} ms  {results[-1]['tokens_per_s']:10.0f} tok/s  "
                f"peak {peaks[name]:5.1f} GiB  loss {losses[name]:.4f}",
                flush=True,
            )
    return results


def default_makers() -> dict:
    """{contender name: function building it}: `benchmarks.llama`'s, on its model's weights and
    this rank's GPU, but uncompiled for the contenders `run` compiles after sharding."""
    state = {k: v.detach().clone() for k, v in llama.build().state_dict().items()}
    makers = llama.contender_makers(state)
    makers[COMPILED] = makers[COMPILED_LAYERS] = makers["eager"]
    makers[OURS_COMPILED] = makers[OURS_COMPILED_LAYERS] = lambda: llama.build_ours(
        state, True, fused_ce=True, compile_model=False
    )
    return makers


def run(
    shape: str,
    out: Path,
    names,
    *,
    engine: str = "fsdp2",
    rounds: int = 10,
    warmup: int = 3,
    reshard_after_forward: bool = True,
    makers=None,
) -> list[dict]:
    """Build, parallelise under `engine` and time the contenders `names` on this rank (a
    process group is set up); rank 0 stores the results in <out>/results.json and writes
    <out>/results.md. `makers`: {name: build function} (default `default_makers`); the
    contenders of `COMPILED_AFTER_SHARDING` are compiled here, after sharding, those of
    `COMPILED_PER_LAYER` layer by layer before it."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from kernels.library import untag

    started = _now()
    batch, seq = (int(v) for v in shape.split("x"))
    if makers is None:
        makers = default_makers()
    skipped: dict[str, str] = {}
    available = []
    for name in names:
        if engine == "tp" and name in COMPILED_PER_LAYER:
            skipped[name] = (
                "skipped: compiling each decoder layer before sharding is FSDP2's recipe; under "
                "tp the sharded model is compiled whole"
            )
            continue
        if engine == "tp" and name.startswith("liger"):
            # Liger's kernels take lm_head's and the norms' weights as plain tensors; under TP
            # they are DTensors. On two H100s its first step raised (AttributeError in DTensor
            # redistribution) after launching kernels that made an illegal memory access, which
            # leaves the CUDA context unusable for every other contender (run without Liger:
            # clean). So it is recorded as not run rather than tried.
            skipped[name] = "skipped: Liger-Kernel does not take tensor-parallel DTensors"
            continue
        if name.startswith("liger"):
            try:
                import liger_kernel  # noqa: F401
            except ImportError:
                skipped[name] = "skipped: liger_kernel is not installed"
                continue
        available.append(name)
    module_state = llama.ModuleState()
    on_gpu = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    contenders: dict = {}
    errors: dict[str, str] = {}
    for name in available:
        maker = makers[name]
        try:
            module_state.restore()
            untag()
            model = maker()
            state = module_state.capture()
            if name in COMPILED_PER_LAYER:
                compile_decoder_layers(model)
            model = parallelize(model, engine, mesh, reshard_after_forward)
            if name in COMPILED_AFTER_SHARDING:  # the sharded model, compiled at its first step
                model = torch.compile(model, backend=COMPILE_BACKEND)
            contenders[name] = (model, state)
        except Exception as exc:  # recorded in the results instead of ending the run
            errors[name] = _error(exc)
    module_state.restore()
    errors = _agree_on_failures(errors, available, device)
    contenders = {name: c for name, c in contenders.items() if name not in errors}
    models = [model for model, _ in contenders.values()]
    vocab = models[0].config.vocab_size if models else llama.CONFIG["vocab_size"]
    world = dist.get_world_size()
    rank_seed = dist.get_rank() if engine == "fsdp2" else 0  # tensor parallel ranks share a batch
    generator = torch.Generator().manual_seed(rank_seed)
    tokens = torch.randint(0, vocab, (batch, seq), generator=generator).to(device)
    tokens_per_step = tokens.numel() * (world if engine == "fsdp2" else 1)
    if dist.get_rank() == 0:
        print(f"{engine}, shape {shape} on {world} ranks:", flush=True)
    timed = time_interleaved(contenders, module_state, tokens, rounds, warmup, tokens_per_step)
    untag()
    by_name = {row["contender"]: row for row in timed}
    results = []
    for name in names:
        if name in by_name:
            results.append(by_name[name])
        elif name in errors:
            results.append({"contender": name, "error": errors[name]})
        elif name in skipped:
            results.append({"contender": name, "error": skipped[name]})
    if dist.get_rank() != 0:
        return results

    meta = run_meta(device, rounds, warmup, started)
    setting = {
        "transformers": transformers_line(meta["transformers"]),
        "engine": engine,
        "shape": shape,
        "world_size": world,
        "reshard_after_forward": reshard_after_forward if engine == "fsdp2" else None,
    }
    store(out, setting, meta, results)
    return results


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def run_meta(device, rounds: int, warmup: int, started: str) -> dict:
    import torch
    import torch.distributed as dist
    import transformers

    return {
        "backend": dist.get_backend(),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else device.type,
        "date": datetime.date.today().isoformat(),
        # Each call of the benchmark may get another machine: runs are told apart by this.
        "started": started,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "triton": llama.package_version("triton"),
        "liger_kernel": llama.package_version("liger-kernel"),
        "python": platform.python_version(),
        "config": dict(llama.CONFIG),
        "dtype": "bf16 weights, gradients and reductions",
        "timing": f"interleaved rounds: {warmup} warm-up, median of {rounds}, slowest rank",
    }


def store(out: Path, setting: dict, meta: dict, results: list[dict]) -> None:
    """This setting's entry in <out>/results.json (replacing its earlier one), and results.md
    from every entry."""
    path = out / "results.json"
    entries = read_entries(path)
    entry = entry_for(entries, setting) | {"meta": meta, "results": results}
    entries = replace_entry(entries, entry)
    write_entries(path, entries)
    (out / "results.md").write_text(markdown(entries))


# ---- the report -------------------------------------------------------------------------------


def _group(entries: list[dict]) -> dict[tuple, dict[int, dict]]:
    """{(transformers line, engine, shape, reshard): {world size: entry}}."""
    groups: dict[tuple, dict[int, dict]] = {}
    for entry in entries:
        s = entry["setting"]
        key = (s["transformers"], s["engine"], s["shape"], s["reshard_after_forward"])
        groups.setdefault(key, {})[s["world_size"]] = entry
    return groups


def scaling_efficiency(by_world: dict[int, dict], contender: str, world: int) -> float | None:
    """tokens/s at `world` ranks / (`world` x tokens/s at 1 rank), or None without both."""

    def tps(n):
        rows = {r["contender"]: r for r in by_world[n]["results"]} if n in by_world else {}
        return rows.get(contender, {}).get("tokens_per_s")

    one, many = tps(1), tps(world)
    return None if one is None or many is None else many / (world * one)


def best_of_ours(ours: list[dict], lowest_peer: dict) -> dict:
    """The fastest of ``ours`` whose peak is at most ``lowest_peer``'s (the configuration a user
    who wants both would pick), else the fastest of ours: as
    `benchmarks.e2e_verdict.best_against_peers`."""
    within = [r for r in ours if r["peak_gib"] <= lowest_peer["peak_gib"]]
    return max(within or ours, key=lambda r: r["tokens_per_s"])


def speed_verdict(ours: dict, peer: dict) -> tuple[str, str]:
    """(``met``, ``TIE`` or ``NOT met``; how it was read): whether ``ours`` was at least as fast
    as ``peer``. Rows with their rounds compare round by round (`benchmarks.paired`: a median
    ratio above 1 that a sign test cannot tell from chance is a TIE); rows without (runs before
    the rounds were kept) by their medians."""
    rounds = ours.get("step_ms_rounds"), peer.get("step_ms_rounds")
    if rounds[0] and rounds[1] and len(rounds[0]) == len(rounds[1]):
        pair = compare(rounds[0], rounds[1])
        return {"PASS": "met", "TIE": "TIE", "FAIL": "NOT met"}[pair.status], pair.describe()
    return ("met" if ours["tokens_per_s"] >= peer["tokens_per_s"] else "NOT met"), "medians"


def target_lines(by_world: dict[int, dict]) -> list[str]:
    """Issue 40's targets for one engine and shape: at every world size above one, the best of
    ours (`best_of_ours`) at least as fast as every peer (`speed_verdict`) with the lowest peak
    memory; ours' scaling efficiency at least eager's."""
    lines = []
    for world, entry in sorted(by_world.items()):
        if world == 1:
            continue
        rows = [r for r in entry["results"] if "error" not in r]
        ours = [r for r in rows if r["contender"] in OURS]
        peers = [r for r in rows if r["contender"] not in OURS]
        if not ours or not peers:
            continue
        fastest_peer = max(peers, key=lambda r: r["tokens_per_s"])
        lowest_peer = min(peers, key=lambda r: r["peak_gib"])
        best = best_of_ours(ours, lowest_peer)
        speed, how = speed_verdict(best, fastest_peer)
        small = best["peak_gib"] <= lowest_peer["peak_gib"]
        verdict = "NOT met" if speed == "NOT met" or not small else speed
        lines.append(
            f"- {world} ranks: {verdict}: {best['contender']} "
            f"{best['tokens_per_s']:.0f} tok/s at {best['peak_gib']:.1f} GiB; fastest peer "
            f"{fastest_peer['contender']} {fastest_peer['tokens_per_s']:.0f} tok/s ({how}); "
            f"lowest peer peak {lowest_peer['contender']} {lowest_peer['peak_gib']:.1f} GiB"
        )
        ours_eff = [scaling_efficiency(by_world, r["contender"], world) for r in ours]
        eager_eff = scaling_efficiency(by_world, "eager", world)
        ours_eff = [e for e in ours_eff if e is not None]
        if ours_eff and eager_eff is not None:
            met = max(ours_eff) >= eager_eff
            lines.append(
                f"- scaling efficiency 1 -> {world}: {'met' if met else 'NOT met'}: ours "
                f"{max(ours_eff):.2f}, eager {eager_eff:.2f}"
            )
    return lines


def _run_dates_line(by_world: dict[int, dict]) -> list[str]:
    """A line naming each world size's run where they come from separate runs (their start, or
    their date for results kept before starts were): each call of the benchmark may get another
    machine, and a scaling efficiency across two runs compares machines too."""
    runs: dict[str, list[int]] = {}
    for world, entry in sorted(by_world.items()):
        meta = entry["meta"]
        runs.setdefault(meta.get("started") or meta["date"], []).append(world)
    if len(runs) < 2:
        return []
    named = "; ".join(
        f"{' and '.join(str(w) for w in worlds)} rank(s) {when}" for when, worlds in runs.items()
    )
    return [
        "",
        f"Separate runs: {named}. Each run may have had another machine, so a scaling "
        "efficiency between two of them compares the machines too.",
    ]


def markdown(entries: list[dict]) -> str:
    """results.md: per transformers line, engine, shape and resharding, each contender's step
    time and speedup over eager, tokens per second, scaling efficiency, peak memory and
    first-step loss at each world size, then the targets."""
    lines = [
        "# Distributed training step: Llama-style 1.1B model, bf16",
        "",
        "Forward + backward of the causal-LM loss (no optimizer); the slowest rank's step between "
        "CUDA events. fsdp2: `fully_shard` per decoder layer and root, each rank its own batch "
        "of the shape; tp: Megatron-style tensor parallelism with sequence parallel norms, the "
        "ranks sharing one batch. Scaling efficiency at N = tokens/s at N / (N x tokens/s at 1). "
        "Written by `python -m benchmarks.distributed --report`.",
    ]
    for (line, engine, shape, reshard), by_world in sorted(_group(entries).items(), key=str):
        meta = next(iter(by_world.values()))["meta"]
        title = f"{engine}, shape {shape}, transformers {line}"
        if engine == "fsdp2":
            title += ", reshard after forward" if reshard else ", no reshard"
        lines += [
            "",
            f"## {title}",
            "",
            f"{meta['device']}, {meta['date']}; torch {meta['torch']}, transformers "
            f"{meta['transformers']}, triton {meta['triton']}, liger-kernel "
            f"{meta['liger_kernel']}; {meta['timing']}.",
            *_run_dates_line(by_world),
            "",
            "| ranks | contender | step | tokens/s | scaling eff. | peak GiB | first loss | "
            "first step |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for world, entry in sorted(by_world.items()):
            rows = entry["results"]
            base = next((r for r in rows if r["contender"] == "eager" and "error" not in r), None)
            for row in rows:
                if "error" in row:
                    lines.append(f"| {world} | {row['contender']} | {row['error']} | | | | | |")
                    continue
                speedup = "" if base is None else f" ({base['step_ms'] / row['step_ms']:.2f}x)"
                eff = scaling_efficiency(by_world, row["contender"], world)
                lines.append(
                    f"| {world} | {row['contender']} | {row['step_ms']:.1f} ms{speedup} | "
                    f"{row['tokens_per_s']:.0f} | {'' if eff is None else f'{eff:.2f}'} | "
                    f"{row['peak_gib']:.1f} | {row['first_loss']:.4f} | "
                    f"{row['first_step_s']:.1f} s |"
                )
        targets = target_lines(by_world)
        if targets:
            lines += ["", "Targets (issue 40):", "", *targets]
    return "\n".join(lines) + "\n"


def report(out: Path) -> None:
    """results.md and distributed.png (speedup over eager per engine, shape and ranks) from
    <out>/results.json."""
    entries = read_entries(out / "results.json")
    if not entries:
        raise SystemExit(f"no results in {out / 'results.json'}: run the benchmark first")
    (out / "results.md").write_text(markdown(entries))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = []
    by: dict[tuple, dict] = {}
    for entry in entries:
        s = entry["setting"]
        run_key = (s["transformers"], s["engine"], s["shape"], s["world_size"])
        runs.append(run_key)
        for row in entry["results"]:
            if "error" not in row:
                by[(*run_key, row["contender"])] = row
    contenders = list(dict.fromkeys(c for *_, c in by))
    fig, ax = plt.subplots(figsize=(max(8, len(runs) * 1.2), 4.5))
    width = 0.8 / max(1, len(contenders))
    for i, name in enumerate(contenders):
        speedups = [
            by[(*run, "eager")]["step_ms"] / by[(*run, name)]["step_ms"]
            if (*run, name) in by and (*run, "eager") in by
            else 0
            for run in runs
        ]
        ax.bar([x + i * width for x in range(len(runs))], speedups, width, label=name)
    ax.set_xticks(
        [x + 0.4 - width / 2 for x in range(len(runs))],
        [f"{e} {s}\n{n} ranks, tf {t}" for t, e, s, n in runs],
        fontsize=7,
    )
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_title(f"Distributed training step: speedup over eager ({entries[0]['meta']['device']})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "distributed.png", dpi=120)


def _default_out() -> Path:
    import torch

    if torch.cuda.is_available():
        return RESULTS / device_folder(torch.cuda.get_device_name()) / "distributed"
    raise SystemExit("no CUDA GPU: pass --out")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="8x512", help="batch x sequence (fsdp2: each rank's)")
    parser.add_argument(
        "--engine", default="fsdp2,tp", help=f"comma-separated, of {', '.join(ENGINES)}"
    )
    parser.add_argument("--out", type=Path, help="default benchmarks/results/<device>/distributed")
    parser.add_argument("--skip", action="append", default=[], help="contender to skip")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--no-reshard", action="store_true", help="reshard_after_forward=False in fully_shard"
    )
    parser.add_argument(
        "--report", action="store_true", help="write results.md and the plot from results.json"
    )
    args = parser.parse_args()
    out = args.out or _default_out()
    if args.report:
        report(out)
        return 0
    engines = args.engine.split(",")
    if unknown := set(engines) - set(ENGINES):
        parser.error(f"unknown engine {sorted(unknown)}: of {', '.join(ENGINES)}")

    import torch
    import torch.distributed as dist

    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl")
    llama.no_silent_fallback()
    try:
        names = [name for name in CONTENDERS if name not in args.skip]
        for engine in engines:
            run(
                args.shape,
                out,
                names,
                engine=engine,
                rounds=args.rounds,
                warmup=args.warmup,
                reshard_after_forward=not args.no_reshard,
            )
            llama.free({})
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
