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
import gc
import importlib.util
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.paired import compare
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

#: Where the models are built: a CUDA GPU when timing (the tests build on the CPU).
DEVICE = "cuda"

#: The shapes (batch x sequence) a run times by default: many short sequences, a few long ones,
#: one sequence of the model's whole context.
SHAPES = ("8x512", "4x2048", "1x4096")


@dataclass(frozen=True)
class Contender:
    """One configuration the benchmark times."""

    key: str  # its name on the command line (--contenders)
    name: str  # its name in results.json and the tables
    ours: bool  # one of our configurations (else a peer: what a user has without us)
    compiled: bool  # torch.compile'd: built and timed after every eager-mode contender
    liger: bool  # needs Liger-Kernel


CONTENDERS = (
    Contender("eager", "eager", ours=False, compiled=False, liger=False),
    Contender("compile", "torch.compile", ours=False, compiled=True, liger=False),
    Contender("ours", "ours (kernelized)", ours=True, compiled=False, liger=False),
    Contender("ours-fce", "ours (kernelized, fused CE)", ours=True, compiled=False, liger=False),
    Contender(
        "ours-compile",
        "ours (kernelized + compile, fused CE)",
        ours=True,
        compiled=True,
        liger=False,
    ),
    Contender(
        "ours-attn",
        "ours (kernelized, fused CE, our attention)",
        ours=True,
        compiled=False,
        liger=False,
    ),
    Contender(
        "ours-attn-compile",
        "ours (kernelized + compile, fused CE, our attention)",
        ours=True,
        compiled=True,
        liger=False,
    ),
    Contender("liger", "liger (no fused CE)", ours=False, compiled=False, liger=True),
    Contender(
        "liger-compile",
        "liger (no fused CE) + compile",
        ours=False,
        compiled=True,
        liger=True,
    ),
    Contender("liger-flce", "liger (fused linear CE)", ours=False, compiled=False, liger=True),
    Contender(
        "liger-flce-compile",
        "liger (fused linear CE) + compile",
        ours=False,
        compiled=True,
        liger=True,
    ),
)
BY_KEY = {c.key: c for c in CONTENDERS}
BY_NAME = {c.name: c for c in CONTENDERS}
COMPILED = tuple(c.name for c in CONTENDERS if c.compiled)
#: Ours + compile (with the fused loss) and compile alone: what issue 38's first target compares.
OURS_COMPILED, COMPILE_ALONE = BY_KEY["ours-compile"].name, BY_KEY["compile"].name


def select_contenders(keys: str | None = None, skip=()) -> list[Contender]:
    """The contenders ``keys`` names (comma-separated keys; all of them when None) but those in
    ``skip`` (keys or names), in ``CONTENDERS``'s order. Raises ValueError naming the valid
    keys when one is not."""
    chosen = list(CONTENDERS) if keys is None else []
    for key in [] if keys is None else [k.strip() for k in keys.split(",") if k.strip()]:
        if key not in BY_KEY:
            raise ValueError(f"unknown contender {key!r}: choose from {', '.join(BY_KEY)}")
        chosen.append(BY_KEY[key])
    for item in skip:
        if item not in BY_KEY and item not in BY_NAME:
            raise ValueError(
                f"cannot skip {item!r}: not a contender; its keys are {', '.join(BY_KEY)}"
            )
    skipped = {BY_KEY[s].name if s in BY_KEY else s for s in skip}
    return [c for c in CONTENDERS if c in chosen and c.name not in skipped]


def runnable(
    contenders: list[Contender], liger_installed: bool
) -> tuple[list[Contender], list[str]]:
    """(the contenders this process can run, a note for each one it cannot)."""
    if liger_installed:
        return list(contenders), []
    notes = [
        f"{c.name}: skipped, Liger-Kernel is not installed (pip install liger-kernel: 0.8.5 on "
        "transformers 5, 0.7.0 on 4.57; benchmarks/README.md)"
        for c in contenders
        if c.liger
    ]
    return [c for c in contenders if not c.liger], notes


def is_ours(name: str) -> bool:
    """Whether the contender of results row name ``name`` is ours (runs kept from before a
    contender was renamed are read by this prefix)."""
    return name.startswith("ours")


def is_compiled(name: str) -> bool:
    """Whether the contender named ``name`` in results ran under torch.compile."""
    return BY_NAME[name].compiled if name in BY_NAME else "compile" in name


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


def build(state_dict=None):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**CONFIG, attn_implementation="sdpa", torch_dtype=torch.bfloat16)
    torch.manual_seed(0)
    with torch.device(DEVICE):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    if state_dict is not None:
        model.load_state_dict(state_dict)
    return model


_MISSING = object()


def build_ours(
    state_dict,
    compile_mode: bool,
    fused_ce: bool = False,
    attention: bool = False,
    compile_model: bool = True,
):
    """Our kernels through ``kernelize`` (TRAINING mode, or TRAINING | TORCH_COMPILE and then
    ``torch.compile``, unless not `compile_model`: the caller compiles it, e.g. after
    sharding it); with ``fused_ce`` also our fused linear cross-entropy (library/loss); with
    ``attention`` our flash attention (library/attention) in place of SDPA, through
    transformers' attention registry as a user would set it."""
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
    with use_kernel_mapping(library_mapping(devices=[DEVICE])):
        kernelize(model, mode=mode)
    check_kernelized(model, fused_ce)
    if attention:
        from kernels.library.attention import ATTENTION_IMPLEMENTATION, register_attention

        register_attention()
        model.set_attn_implementation(ATTENTION_IMPLEMENTATION)
    return torch.compile(model) if compile_mode and compile_model else model


def check_kernelized(model, fused_ce: bool) -> None:
    """Raise unless ``kernelize`` gave ``model`` our layers (and with ``fused_ce`` our loss):
    otherwise ours would be timed as eager transformers under ours' name. transformers 5.x
    tags its layers for ``kernelize`` only when it sees this package installed (its
    ``is_kernels_available`` reads the installed metadata, not ``sys.path``)."""
    from kernels.layer.swap import kernel_layer_of

    layers = {"model.norm": model.model.norm, "model.layers.0.mlp": model.model.layers[0].mlp}
    if fused_ce:
        layers["the causal-LM loss (LlamaForCausalLM.forward)"] = model
    missing = [path for path, module in layers.items() if kernel_layer_of(module) is None]
    if missing:
        raise RuntimeError(
            f"kernelize left {', '.join(missing)} running transformers' own forward, so "
            "'ours' would be timed as eager: install this package where transformers finds it "
            "(pip install -e . here; on the GPU machine its wheel beside the others, "
            "benchmarks/README.md)"
        )


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
    """{contender name: function building it on ``state_dict``'s weights}, for every contender of
    ``CONTENDERS``."""
    import torch

    # The compiled contender of ours keeps the fused loss: without it, compile's graph holds the
    # logits (tokens x vocabulary), which issue 38 saw as ours + compile's extra memory.
    return {
        "eager": lambda: build(state_dict),
        "torch.compile": lambda: torch.compile(build(state_dict)),
        "ours (kernelized)": lambda: build_ours(state_dict, False),
        "ours (kernelized, fused CE)": lambda: build_ours(state_dict, False, fused_ce=True),
        OURS_COMPILED: lambda: build_ours(state_dict, True, fused_ce=True),
        "ours (kernelized, fused CE, our attention)": lambda: build_ours(
            state_dict, False, fused_ce=True, attention=True
        ),
        "ours (kernelized + compile, fused CE, our attention)": lambda: build_ours(
            state_dict, True, fused_ce=True, attention=True
        ),
        "liger (no fused CE)": lambda: build_liger(state_dict, False),
        "liger (no fused CE) + compile": lambda: torch.compile(build_liger(state_dict, False)),
        "liger (fused linear CE)": lambda: build_liger(state_dict, True),
        "liger (fused linear CE) + compile": lambda: torch.compile(build_liger(state_dict, True)),
    }


class ModuleState:
    """The attributes of transformers' Llama modelling module and of its classes, so that each
    contender runs with the module state its set-up left.

    Both ours (``tag_rotary_embeddings``) and Liger (``apply_liger_kernel_to_llama``) patch
    that module for the whole process: its ``apply_rotary_pos_emb`` global, and for Liger's
    fused cross-entropy ``LlamaForCausalLM.forward``. On transformers 5.x that global is a
    function module; since kernels 0.19 ``kernelize`` gives each attention layer a copy of its
    own and leaves the global be, but a forward set on the global by hand would still be shared
    by every model of the process, so such module instances stay owners. Contenders run in interleaved rounds, so each one's
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
        self._module = torch.nn.Module
        self.baseline = self._attributes()
        # (owner index, name) of every attribute some set-up changed: only these are put back,
        # so that what transformers or dynamo set at run time is left alone.
        self.patched: set[tuple[int, str]] = set()

    def _attributes(self) -> list[dict]:
        # A module instance's class too: kernelize binds most kernels by giving the instance a
        # class of its own (kernels.layer.swap).
        return [
            {**vars(owner), "__class__": type(owner)}
            if isinstance(owner, self._module)
            else dict(vars(owner))
            for owner in self.owners
        ]

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
            current = type(owner) if name == "__class__" else vars(owner).get(name, _MISSING)
            if current is value:
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


def free(contenders: dict) -> None:
    """Drop the models of ``contenders`` (the dict is emptied) and what else holds their memory:
    reference cycles, dynamo's compiled code and guards, the allocator's cached blocks; prints
    what stays resident (the benchmark's own copy of the weights, 2.2 GB)."""
    import torch

    contenders.clear()
    gc.collect()
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    print(f"  freed; resident now {torch.cuda.memory_allocated() / 2**30:.1f} GiB", flush=True)


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


def no_silent_fallback() -> None:
    """Make dynamo raise instead of running a frame eagerly when it hits its recompile limit: a
    compiled contender that fell back would be timed as an eager one under its compiled name.
    The limit is raised for the contenders sharing a frame (``nn.Module.__call__``), each with
    a training and an inference graph per shape, and for Liger's graph breaks (its SwiGLU calls
    an ``lru_cache``'d helper, which splits every decoder layer's frame): at 16, Liger + compile
    hit the limit at its first shape (H100, transformers 5.24, Liger-Kernel 0.8.5)."""
    import torch._dynamo.config as config

    if hasattr(config, "recompile_limit"):  # cache_size_limit before torch 2.6
        config.recompile_limit = max(config.recompile_limit, 64)
    if hasattr(config, "fail_on_recompile_limit_hit"):  # torch >= 2.6
        config.fail_on_recompile_limit_hit = True


def tokens_for(shape: str):
    """The input ids of ``shape`` (batch x sequence), the same in every run."""
    import torch

    batch, seq = (int(v) for v in shape.split("x"))
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    return torch.randint(0, CONFIG["vocab_size"], (batch, seq), device=DEVICE, generator=generator)


def training_step(model, tokens) -> None:
    """Forward and backward of the causal-LM loss (no optimizer): what the benchmark trains."""
    model(input_ids=tokens, labels=tokens).loss.backward()


def prefill_step(model, tokens) -> None:
    """Forward without grad, logits of the last position only."""
    import torch

    with torch.no_grad():
        model(input_ids=tokens, logits_to_keep=1)


#: The step keys time_interleaved times, and the peak memory key of each.
STEPS = {"train": ("train_ms", "train_peak_gib"), "prefill": ("prefill_ms", "prefill_peak_gib")}


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


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


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
        "triton": _version("triton"),
        "liger_kernel": _version("liger-kernel"),
        "python": platform.python_version(),
        "config": dict(CONFIG),
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
    commands = [resume_command(CONFIG["vocab_size"], s, g) for g, s in left]
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
    on_gpu = torch.device(DEVICE).type == "cuda"
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
    path = out / f"profile_v{CONFIG['vocab_size']}_{shape}.json"
    meta = {
        "shape": shape,
        "device": torch.cuda.get_device_name() if on_gpu else "cpu",
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "config": dict(CONFIG),
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

    tokens = torch.randint(0, CONFIG["vocab_size"], (batch, seq), device=DEVICE)
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


def replace_rows(entry: dict, rows: list[dict]) -> dict:
    """``entry`` with ``rows`` in place of its rows of the same shape and contender, so that a
    run of a few contenders or shapes keeps the others'. Rows of a contender no longer built
    (renamed or retired from ``CONTENDERS``) are dropped: no table shows a configuration the
    benchmark no longer measures beside the ones it does. Rows are ordered by shape (``SHAPES``
    first) and contender (``CONTENDERS``' order)."""
    ran = {(r["shape"], r["contender"]) for r in rows}
    kept = [
        r
        for r in entry.get("rows", [])
        if (r["shape"], r["contender"]) not in ran and r["contender"] in BY_NAME
    ]
    merged = kept + list(rows)
    shapes = list(dict.fromkeys([*SHAPES, *(r["shape"] for r in merged)]))
    names = list(dict.fromkeys([*BY_NAME, *(r["contender"] for r in merged)]))
    merged.sort(key=lambda r: (shapes.index(r["shape"]), names.index(r["contender"])))
    return {**entry, "rows": merged}


def store(out: Path, meta: dict, update) -> dict:
    """Put ``update(entry)`` in place of the entry of ``meta``'s setting in <out>/results.json,
    and write results.md; returns the new entry."""
    path = out / "results.json"
    entries = read_entries(path)
    entry = update(entry_for(entries, setting_of(meta)))
    entries = replace_entry(entries, entry)
    write_entries(path, entries)
    (out / "results.md").write_text(report_text(entries))
    return entry


def fastest(rows: list[dict], step: str) -> dict | None:
    """The row of ``rows`` fastest at ``step`` (``train`` or ``prefill``); of equal times the
    one of lower peak memory, then the first. None when ``rows`` is empty."""
    ms, peak = STEPS[step]
    ranked = sorted(enumerate(rows), key=lambda ir: (ir[1][ms], ir[1].get(peak, math.inf), ir[0]))
    return ranked[0][1] if ranked else None


def lowest_peak(rows: list[dict], step: str) -> dict | None:
    """The row of ``rows`` of the lowest peak memory at ``step`` (of equal peaks the faster,
    then the first); None when no row recorded one (runs before prefill peaks were kept)."""
    ms, peak = STEPS[step]
    recorded = [(i, r) for i, r in enumerate(rows) if r.get(peak) is not None]
    ranked = sorted(recorded, key=lambda ir: (ir[1][peak], ir[1][ms], ir[0]))
    return ranked[0][1] if ranked else None


@dataclass(frozen=True)
class Match:
    """At one shape and step: the best configuration of ours (`best_against_peers`) and the
    best peer configuration (eager, torch.compile, Liger, Liger + compile: the fastest), and the
    peer of the lowest peak memory."""

    shape: str
    step: str
    ours: dict | None
    peer: dict | None
    lowest_peer: dict | None

    @property
    def ratio(self) -> float | None:
        """The best peer's time over the best of ours' (> 1: ours is faster)."""
        if self.ours is None or self.peer is None:
            return None
        ms = STEPS[self.step][0]
        return self.peer[ms] / self.ours[ms]


def best_against_peers(rows: list[dict], step: str) -> Match:
    """``rows`` of one shape: the best of ours against the best peer at ``step``. The best of
    ours is the fastest of ours whose peak is at most the lowest peer's, where one is (the
    configuration a user who wants both would pick), else the fastest of ours."""
    ours = [r for r in rows if is_ours(r["contender"])]
    peers = [r for r in rows if not is_ours(r["contender"])]
    shape = rows[0]["shape"] if rows else ""
    lowest = lowest_peak(peers, step)
    peak = STEPS[step][1]
    within = [
        r
        for r in ours
        if lowest is not None and r.get(peak) is not None and r[peak] <= lowest[peak]
    ]
    return Match(shape, step, fastest(within or ours, step), fastest(peers, step), lowest)


TARGET_COMPILE = (
    "ours + compile <= min(ours eager, compile alone) in time and <= ours eager in peak"
)
TARGET_PEERS = "best ours >= 1.0x best peer, peak <= lowest peer's"


@dataclass(frozen=True)
class Check:
    """One of issue 38's targets at one shape: (status, what was compared) for each part (a
    step's time, a step's peak), PASS only when every part passed."""

    shape: str
    target: str
    parts: tuple[tuple[str, str], ...]

    @property
    def status(self) -> str:
        """FAIL if a part failed; else N/A if a part lacked a measurement; else TIE if a time
        could not be told from its bound's (`benchmarks.paired`); else PASS."""
        statuses = {status for status, _ in self.parts}
        for status in ("FAIL", "N/A", "TIE"):
            if status in statuses:
                return status
        return "PASS"

    def line(self) -> str:
        return f"{self.shape}: {self.target}: {self.status} ({'; '.join(t for _, t in self.parts)})"


def _label(row: dict) -> str:
    """A contender in a check line: its key (short), or its name for rows of retired names."""
    name = row["contender"]
    return BY_NAME[name].key if name in BY_NAME else name


def _rounds_key(key: str) -> str:
    return key.replace("_ms", "_rounds_ms")


def _at_most(what: str, row: dict, bound: dict | None, key: str, unit: str) -> tuple[str, str]:
    """Whether ``row[key] <= bound[key]``, as (status, the comparison in words). Times of two
    rows timed in the same rounds (one group of one run) compare round by round
    (`benchmarks.paired`: PASS, TIE or FAIL); others, and peaks, by their values."""
    value = row.get(key)
    if value is None or bound is None or bound.get(key) is None:
        return "N/A", f"{what}: not recorded"
    limit = bound[key]
    text = f"{what} {value:.1f} {unit} ({_label(row)}) vs {limit:.1f} {unit} ({_label(bound)})"
    mine, theirs = row.get(_rounds_key(key)), bound.get(_rounds_key(key))
    same_rounds = row.get("group") is not None and row.get("group") == bound.get("group")
    if unit == "ms" and same_rounds and mine and theirs:
        paired = compare(mine, theirs)
        return paired.status, f"{text}: {paired.describe()}"
    status = "PASS" if value <= limit else "FAIL"
    return status, f"{text}: {status}"


def _compile_parts(rows: list[dict], step: str) -> list[tuple[str, str]]:
    """Issue 38's first target at one shape and step: ours + compile (with the fused loss)
    against the fastest of ours' eager-mode configurations and compile alone in time, and
    against the lowest peak of ours' eager-mode configurations."""
    ms, peak = STEPS[step]
    by = {r["contender"]: r for r in rows}
    ours_compiled, alone = by.get(OURS_COMPILED), by.get(COMPILE_ALONE)
    eager_ours = [r for r in rows if is_ours(r["contender"]) and not is_compiled(r["contender"])]
    missing = [
        name
        for name, present in (
            (OURS_COMPILED, ours_compiled),
            (COMPILE_ALONE, alone),
            ("ours eager", eager_ours),
        )
        if not present
    ]
    if missing or ours_compiled is None or alone is None:
        return [("N/A", f"{step}: {', '.join(missing)} not measured")]
    bound = fastest([r for r in (fastest(eager_ours, step), alone) if r is not None], step)
    return [
        _at_most(step, ours_compiled, bound, ms, "ms"),
        _at_most(f"{step} peak", ours_compiled, lowest_peak(eager_ours, step), peak, "GiB"),
    ]


def _peer_parts(rows: list[dict], step: str) -> list[tuple[str, str]]:
    """Issue 38's second target at one shape and step: the best of ours at least as fast as the
    best peer, its peak at most the lowest peer's."""
    ms, peak = STEPS[step]
    match = best_against_peers(rows, step)
    if match.ours is None or match.peer is None:
        side = "no configuration of ours" if match.ours is None else "no peer"
        return [("N/A", f"{step}: {side} measured")]
    status, text = _at_most(step, match.ours, match.peer, ms, "ms")
    return [
        (status, f"{text}, {match.ratio:.2f}x"),
        _at_most(f"{step} peak", match.ours, match.lowest_peer, peak, "GiB"),
    ]


def target_checks(rows: list[dict]) -> list[Check]:
    """Issue 38's two targets at each shape of one setting's ``rows``, training step and prefill
    together."""
    shapes, _, _ = _index(rows)
    checks = []
    for shape in shapes:
        at = [r for r in rows if r["shape"] == shape]
        for target, parts in ((TARGET_COMPILE, _compile_parts), (TARGET_PEERS, _peer_parts)):
            found = tuple(p for step in STEPS for p in parts(at, step))
            checks.append(Check(shape, target, found))
    return checks


def _cell(row: dict | None, key: str, spec: str = ".1f") -> str:
    value = None if row is None else row.get(key)
    return "—" if value is None else format(value, spec)


def verdict_lines(rows: list[dict]) -> list[str]:
    """Lines of the report: per shape and step, the best of ours against the best peer, then
    a line per target of issue 38 and shape."""
    if not rows:
        return []
    shapes, _, _ = _index(rows)
    lines = [
        "Best of ours against the best peer (eager, torch.compile, Liger, Liger + compile): the",
        "fastest peer; the fastest of ours within the lowest peer's peak (else the fastest of",
        "ours); ratio: the peer's time over ours' (> 1: ours faster).",
        "",
        "| shape | step | best of ours | ms | peak GiB | best peer | ms | peak GiB | ratio "
        "| lowest peer peak GiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for shape in shapes:
        at = [r for r in rows if r["shape"] == shape]
        for step, (ms, peak) in STEPS.items():
            m = best_against_peers(at, step)
            low = m.lowest_peer
            low_name = "" if low is None else f" ({low['contender']})"
            lines.append(
                f"| {shape} | {step} | {m.ours['contender'] if m.ours else '—'} | "
                f"{_cell(m.ours, ms)} | {_cell(m.ours, peak)} | "
                f"{m.peer['contender'] if m.peer else '—'} | {_cell(m.peer, ms)} | "
                f"{_cell(m.peer, peak)} | {'—' if m.ratio is None else f'{m.ratio:.2f}x'} | "
                f"{_cell(low, peak)}{low_name} |"
            )
    lines += [
        "",
        "Issue 38's targets per shape (PASS when met at the training step and prefill; N/A when a",
        "contender or measurement it needs is missing; TIE when a time of two contenders timed in",
        "the same rounds is above its bound by a median that a sign test over the rounds cannot",
        "tell from chance, benchmarks/paired.py). Ours eager: the fastest of ours without compile",
        "for time, the lowest of their peaks for memory; ours + compile keeps the fused loss.",
        "",
    ]
    lines += [f"- {check.line()}" for check in target_checks(rows)]
    return lines


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
    """results.md: for each setting, its timing table (``markdown``), the best of ours against
    the best peer with issue 38's targets (``verdict_lines``) and its largest batches."""
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
            lines += ["", *verdict_lines(entry["rows"])]
        lines += _max_batch_table(entry.get("max_batch", []))
    return "\n".join(lines) + "\n"


def markdown(rows: list[dict]) -> str:
    """One setting's tables in results.md: speedups over eager and peak memory per shape, and
    the host time of the training steps."""
    shapes, contenders, by = _index(rows)
    meta = rows[0]
    liger = meta.get("liger_kernel") or "not installed"
    runs = list(dict.fromkeys(r.get("run", r["date"]) for r in rows))
    lines = [
        f"{meta['device']}, {meta['date']}; torch {meta['torch']}, transformers {meta['transformers']}, "
        f"triton {meta['triton']}, liger-kernel {liger}. Config: {meta['config']}, SDPA attention.",
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
    if len(runs) > 1:  # a run of a few contenders or shapes keeps the others' rows
        lines[4:4] = [
            f"Rows from {len(runs)} runs ({', '.join(runs)}); the line above names the first. "
            "Contenders of different runs were timed on different machines or at different times.",
            "",
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
        default=CONFIG["vocab_size"],
        help=f"vocabulary size (default {CONFIG['vocab_size']}; Llama 3's is 128256)",
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
    CONFIG["vocab_size"] = args.vocab  # recorded with every result (meta["config"])
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
