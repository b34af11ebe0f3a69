"""Decode speed: milliseconds per new token of transformers' generate(), and host time per call.

    python -m benchmarks.decode     # writes benchmarks/results/<device>/decode

Part 1 (``decode``): the 1.1B Llama-style model of `benchmarks.llama` (its ``build``), bf16,
greedy, prompt 128, 128 new tokens, at batch 1 and 8, for

- ``eager``: transformers' generate() with its dynamic cache;
- ``ours kernelized``: the same, the model kernelized with our kernels (Mode.INFERENCE);
- ``static + compile``: transformers' own static-cache path (``cache_implementation="static"``,
  which torch.compiles the decode step on CUDA);
- ``ours kernelized + static + compile``: the same, kernelized with Mode.INFERENCE |
  TORCH_COMPILE first;
- ``ours CUDA graphs`` and ``ours kernelized + CUDA graphs``: `kernels.generation`'s
  `CudaGraphGenerator` decoding step by step through generate() (``fused_steps=0``: the decode
  step captured in a CUDA graph per batch size), without and with our kernels;
- ``ours CUDA graphs + fused greedy loop`` and ``ours kernelized + CUDA graphs + fused greedy
  loop``: the same generator with its fused greedy loop (the default: after generate()'s
  prefill, `DEFAULT_FUSED_STEPS` decode steps per graph replay, no generate() Python between
  steps).
- ``ours kernelized + fused loop, layers unfolded``: the kernelized fused loop with
  ``fold_layers=False`` (each decoder layer module by module, its norms and residual adds
  kernels of their own): the A/B of `kernels.generation.folded_layers`;
- ``ours kernelized + fused loop, our attention``: the same with our library's attention
  (`kernels.library.attention`) in place of PyTorch's SDPA.

Reported per contender and batch: decode ms per new token ((time of 128 new tokens - time of
1, the prefill) / 127, median over interleaved rounds), the whole call per token, and, for the
first call at that batch size on the freshly built model, the time to the first token and to
the first token of a decode step (the second; that is where compiling or capturing happens)
and of the whole call. The fused loop takes no streamer (a streamer sends a call through
generate()'s own loop), so its first-token times are not taken (—), only its first call's.
Whether each contender's tokens match eager's is checked (bf16: a different cache layout or
kernel may round a near-tie differently; the count of equal leading tokens is given).

Part 2 (``host``): host microseconds per call of our RMSNorm, LayerNorm, SiluAndMul and rotary
at 4096x4096 (bf16; forward, and forward+backward) beside the aten op (``F.rms_norm``,
``F.layer_norm``, ``F.silu(a) * b``, transformers' eager rotary): the time to issue a block of
back-to-back calls while the GPU is kept busy (so the launch queue never pushes back), the wall
time per call of back-to-back calls, and the device time per call (the same calls captured back
to back in a CUDA graph, ``timing.back_to_back_graph``).

Contenders are built as ``e2e.py`` builds them, each from the modelling-module state its set-up
left (``llama.ModuleState``: our tagging patches transformers' Llama module), the eager-mode ones
first and the compiled ones after (``--group`` runs one of them). Writes ``results.json`` and
``results.md`` into ``--out`` (default ``benchmarks/results/<device>/decode``), one entry per
transformers line: a run of every part replaces its line's entry, a partial one (``--only``,
``--group``, ``--contenders``, ``--batches``) is merged into it.
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

from benchmarks import llama
from benchmarks.results_io import (
    default_out,
    entry_for,
    read_entries,
    replace_entry,
    transformers_line,
    write_entries,
)

PROMPT = 128
NEW_TOKENS = 128
BATCHES = (1, 8)
EAGER = "eager"
#: generate() settings each contender runs with, by name: plain greedy; sampling as chat models
#: are served (temperature 0.7, top-p 0.9); greedy with min_new_tokens and a repetition penalty
#: (an end token is set for min_new_tokens to ban, for every new token, so that every call
#: still makes all its tokens).
SETTINGS = {
    "greedy": dict(do_sample=False),
    "sampling": dict(do_sample=True, temperature=0.7, top_p=0.9, top_k=0),
    # min_new_tokens is each call's own new tokens: Contender.generate sets it.
    "penalties": dict(do_sample=False, repetition_penalty=1.1),
}
#: The end token of the "penalties" setting (min_new_tokens needs one to ban).
PENALTIES_EOS = 2
#: contender -> (kernelize mode or None, how it generates: "dynamic", "static", "graphs" (step
#: by step through generate()) or "fused" (the fused loop), its setting of `SETTINGS`)
CONTENDERS = {
    EAGER: (None, "dynamic", "greedy"),
    "ours kernelized": ("INFERENCE", "dynamic", "greedy"),
    "ours CUDA graphs": (None, "graphs", "greedy"),
    "ours kernelized + CUDA graphs": ("INFERENCE", "graphs", "greedy"),
    "ours CUDA graphs + fused greedy loop": (None, "fused", "greedy"),
    "ours kernelized + CUDA graphs + fused greedy loop": ("INFERENCE", "fused", "greedy"),
    "ours kernelized + fused loop, layers unfolded": ("INFERENCE", "fused", "greedy"),
    "ours kernelized + fused loop, our attention": ("INFERENCE", "fused", "greedy"),
    "ours kernelized + CUDA graphs, sampling": ("INFERENCE", "graphs", "sampling"),
    "ours kernelized + fused loop, sampling": ("INFERENCE", "fused", "sampling"),
    "ours kernelized + CUDA graphs, penalties": ("INFERENCE", "graphs", "penalties"),
    "ours kernelized + fused loop, penalties": ("INFERENCE", "fused", "penalties"),
    "static + compile": (None, "static", "greedy"),
    "static + compile, sampling": (None, "static", "sampling"),
    "static + compile, penalties": (None, "static", "penalties"),
    "ours kernelized + static + compile": ("INFERENCE|TORCH_COMPILE", "static", "greedy"),
}
GROUPS = {
    "eager": [name for name, (_, how, _) in CONTENDERS.items() if how != "static"],
    "compiled": [name for name, (_, how, _) in CONTENDERS.items() if how == "static"],
}
HOST_OPS = ("RMSNorm", "LayerNorm", "SiluAndMul", "rotary")


# ---- part 1: decode -------------------------------------------------------------------------


class Contender:
    """A model and how it generates: ``generate(ids, mask, new_tokens, streamer)``."""

    def __init__(self, model, how: str, setting: str = "greedy", generator=None):
        self.model, self.how, self.generator = model, how, generator
        self.setting = setting

    @property
    def streams(self) -> bool:
        """Whether its first call's token times are taken: the fused loop gives a streamer a
        block's tokens at once, after the block."""
        return self.how != "fused"

    def generate(self, ids, mask, new_tokens, streamer=None):
        options = dict(attention_mask=mask, max_new_tokens=new_tokens, **SETTINGS[self.setting])
        if self.setting == "penalties":
            options.update(eos_token_id=PENALTIES_EOS, min_new_tokens=new_tokens)
        if self.streams:
            options["streamer"] = streamer
        if self.how in ("graphs", "fused"):
            return self.generator.generate(ids, **options)
        if self.how == "static":
            options["cache_implementation"] = "static"
        return self.model.generate(ids, **options)


def make_contender(name: str, state_dict) -> Contender:
    """Build contender ``name`` on ``state_dict``'s weights, as e2e.py builds its models
    (`benchmarks.llama`)."""
    from kernels import Mode, kernelize, library_mapping, use_kernel_mapping
    from kernels.generation import CudaGraphGenerator
    from kernels.library import tag_gated_mlps, tag_rotary_embeddings

    mode_names, how, setting = CONTENDERS[name]
    model = llama.build(state_dict).eval()
    # Every call generates all its tokens (random weights may emit the end token early).
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    if how in ("graphs", "fused"):
        options = {} if how == "fused" else {"fused_steps": 0}
        if name.endswith("layers unfolded"):  # the folded decoder layers' A/B
            options["fold_layers"] = False
        if name.endswith("our attention"):  # our decode attention in place of SDPA's
            from kernels.library.attention import ATTENTION_IMPLEMENTATION, register_attention

            register_attention()
            model.set_attn_implementation(ATTENTION_IMPLEMENTATION)
        generator = CudaGraphGenerator(model, kernels=mode_names is not None, **options)
        return Contender(model, how, setting, generator)
    if mode_names is not None:
        mode = Mode[mode_names.split("|")[0]]
        for extra in mode_names.split("|")[1:]:
            mode = mode | Mode[extra]
        tag_gated_mlps(model)
        tag_rotary_embeddings(model)
        with use_kernel_mapping(library_mapping(devices=["cuda"])):
            kernelize(model, mode=mode)
    return Contender(model, how, setting)


class TokenTimes:
    """A generate() streamer that notes when each new token reaches the host."""

    def __init__(self, batch: int):
        self.batch = batch
        self.times: list[float] = []

    def put(self, value) -> None:
        if value.numel() == self.batch:  # new tokens (the prompt comes first, in one piece)
            self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def timed(fn):
    """(result, wall seconds) of ``fn()`` with the GPU drained before and after."""
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return result, time.perf_counter() - start


def same_leading_tokens(got, expected) -> int:
    """How many new tokens every sequence of ``got`` shares with ``expected`` from the start."""
    new_got, new_expected = got[:, PROMPT:], expected[:, PROMPT:]
    if new_got.shape == new_expected.shape and bool((new_got == new_expected).all()):
        return new_got.shape[1]
    differs = (new_got != new_expected).any(dim=0).nonzero()
    return int(differs[0]) if len(differs) else new_got.shape[1]


def prompt_ids(batch: int):
    """The prompts of ``batch`` (the same for every contender) and their attention mask."""
    import torch

    generator = torch.Generator().manual_seed(batch)
    ids = torch.randint(1, llama.CONFIG["vocab_size"], (batch, PROMPT), generator=generator)
    ids = ids.to("cuda")
    return ids, torch.ones_like(ids)


def time_decode(contenders: dict, module_state, batch: int, rounds: int, references) -> list:
    """Rows of part 1 for ``batch``: each contender's first call, then ``rounds`` interleaved
    rounds of a call with all new tokens and one with a single token (the prefill). The first
    call's tokens are compared with ``references[setting, batch]`` (eager, the same seed)."""
    import torch

    ids, mask = prompt_ids(batch)
    rows = {}
    for name, (contender, state) in contenders.items():
        module_state.restore(state)
        streamer = TokenTimes(batch)
        torch.manual_seed(SEED)
        start = time.perf_counter()
        out, call_s = timed(lambda c=contender, s=streamer: c.generate(ids, mask, NEW_TOKENS, s))
        first, decode = [t - start for t in streamer.times[:2]] if contender.streams else [None] * 2
        contender.generate(ids, mask, NEW_TOKENS)  # a second warm-up call
        rows[name] = {
            "contender": name,
            "batch": batch,
            "cold_first_token_s": first,
            "cold_first_decode_token_s": decode,
            "cold_call_s": call_s,
            "setting": contender.setting,
            "same_tokens_as_eager": same_leading_tokens(out, references[contender.setting, batch]),
        }
        print(f"  batch {batch} {name:50s} first call {call_s:7.2f} s", flush=True)
    samples = {name: {"full": [], "prefill": []} for name in contenders}
    names = list(contenders)
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            contender, state = contenders[name]
            module_state.restore(state)
            full = timed(lambda c=contender: c.generate(ids, mask, NEW_TOKENS))[1]
            prefill = timed(lambda c=contender: c.generate(ids, mask, 1))[1]
            samples[name]["full"].append(full)
            samples[name]["prefill"].append(prefill)
    module_state.restore()
    for name, row in rows.items():
        full = statistics.median(samples[name]["full"])
        prefill = statistics.median(samples[name]["prefill"])
        row.update(
            decode_ms_per_token=(full - prefill) / (NEW_TOKENS - 1) * 1e3,
            call_ms_per_token=full / NEW_TOKENS * 1e3,
            prefill_ms=prefill * 1e3,
        )
        print(
            f"  batch {batch} {name:50s} {row['decode_ms_per_token']:7.2f} ms/token "
            f"(call {row['call_ms_per_token']:.2f}), first decode token "
            f"{seconds(row['cold_first_decode_token_s'], 2)}, same tokens "
            f"{row['same_tokens_as_eager']}/{NEW_TOKENS}",
            flush=True,
        )
    return list(rows.values())


def seconds(value: float | None, digits: int = 1) -> str:
    """``value`` seconds as text, "—" where it was not measured."""
    return "—" if value is None else f"{value:.{digits}f} s"


#: The seed of each checked call: sampled contenders draw from the same generator state.
SEED = 0


def eager_tokens(state_dict, batches) -> dict:
    """{(setting, batch): eager tokens}, from a model of its own (so that a run of the compiled
    group alone checks tokens too, and no eager model sits beside compiled ones); sampled ones
    drawn from `SEED`."""
    import torch

    contender = make_contender(EAGER, state_dict)
    tokens = {}
    for setting in SETTINGS:
        contender.setting = setting
        for b in batches:
            torch.manual_seed(SEED)
            tokens[setting, b] = contender.generate(*prompt_ids(b), NEW_TOKENS)
    del contender
    torch.cuda.empty_cache()
    return tokens


def read_limit(model) -> dict:
    """The copy-bandwidth limit of a decode step: the bytes it must read (every parameter but
    the input embedding's table, of which a step reads a row per sequence; the KV cache is left
    out: at this context it is under 2% of them) at the device-to-device copy's rate."""
    from benchmarks import timing

    embedding = model.get_input_embeddings().weight
    tied = embedding is model.get_output_embeddings().weight
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    read = params - (0 if tied else embedding.numel() * embedding.element_size())
    copy_gbps = timing.copy_bandwidth()
    return {
        "decode_read_bytes": read,
        "copy_gbps": copy_gbps,
        "limit_ms_per_token": read / (copy_gbps * 1e9) * 1e3,
    }


def run_decode(groups: list[str], batches, rounds: int, only=None) -> tuple[list, dict]:
    """Part 1's rows, and the copy-bandwidth limit they are measured against (`read_limit`)."""
    import torch

    from kernels.library import untag

    reference_model = llama.build()
    limit = read_limit(reference_model)
    state = {k: v.detach().clone() for k, v in reference_model.state_dict().items()}
    del reference_model
    module_state = llama.ModuleState()
    reference = eager_tokens(state, batches)
    makers = {name: (lambda n=name: make_contender(n, state)) for name in CONTENDERS}
    rows = []
    for group in groups:
        names = [name for name in GROUPS[group] if not only or name in only]
        if not names:
            continue
        contenders = llama.build_contenders(makers, names, module_state)
        for batch in batches:
            rows += time_decode(contenders, module_state, batch, rounds, reference)
        del contenders
        torch.cuda.empty_cache()
    untag()
    return rows, limit


# ---- part 2: host time per call ---------------------------------------------------------------


def aten_function(op: str, params):
    """The aten op (or eager PyTorch) that our kernel for ``op`` replaces, on benchmarks.cases' inputs."""
    import torch.nn.functional as F

    from benchmarks import cases

    if op == "RMSNorm":
        return lambda x: F.rms_norm(x, (x.shape[-1],), params[0], 1e-6)
    if op == "LayerNorm":
        return lambda x: F.layer_norm(x, (x.shape[-1],), params[0], params[1], 1e-5)
    if op == "SiluAndMul":
        return lambda x: F.silu(x[..., : x.shape[-1] // 2]) * x[..., x.shape[-1] // 2 :]
    cos, sin = cases.rotary_tables(1, 4096)
    return lambda q, k: cases.apply_rotary_pos_emb(q, k, cos, sin)


def host_case(op: str, lib):
    """(inputs, params, {"aten": fn, "ours": fn}) of ``op`` at 4096x4096, from benchmarks.cases."""
    from benchmarks import cases

    shape = (1, 4096) if op == "rotary" else (4096, 4096)  # rotary: 4096 tokens, 32 heads of 128
    inputs, params, fns, _, _ = cases.make_case(op, lib, None, shape)
    return inputs, params, {"aten": aten_function(op, params), "ours": fns["ours"]}


def issue_block_us(call, calls: int = 50) -> float:
    """Host microseconds to issue one of ``calls`` back-to-back calls, with the GPU kept busy by
    a sleep kernel first so that the launch queue never makes the host wait.

    Where the GPU finishes sleeping before the host is done, either the sleep was too short or
    the calls filled the launch queue (a call of many small kernels, as eager rotary is: the
    host then waits for the queue, which drains only once the sleep ends): the block is
    retried with a longer sleep and half the calls.
    """
    import torch

    cycles = 100_000_000  # about 50-70 ms at an H100's or H200's clock
    while cycles < 10**10:
        torch.cuda.synchronize()
        torch.cuda._sleep(cycles)
        busy = torch.cuda.Event()
        busy.record()
        start = time.perf_counter()
        for _ in range(calls):
            call()
        elapsed = time.perf_counter() - start
        finished_early = busy.query()  # the GPU finished sleeping before the host was done
        torch.cuda.synchronize()
        if not finished_early:
            return elapsed / calls * 1e6
        cycles *= 2
        calls = max(4, calls // 2)
    raise RuntimeError("the GPU could not be kept busy for the issue of one block of calls")


def interleaved_issue_us(calls: dict, rounds: int = 9) -> dict:
    """{name: median host microseconds a call}: blocks of each call issued in turn, the order
    rotating each round, so that a phase of the host (another tenant, a clock change) weighs on
    every contender alike rather than on whichever ran then."""
    names = list(calls)
    samples: dict = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            samples[name].append(issue_block_us(calls[name]))
    return {name: statistics.median(values) for name, values in samples.items()}


def wall_us(call, calls: int = 50, blocks: int = 7) -> float:
    """Median wall microseconds per call of back-to-back calls, the GPU drained at both ends."""
    return statistics.median(
        timed(lambda: [call() for _ in range(calls)])[1] / calls * 1e6 for _ in range(blocks)
    )


def device_us(call) -> float:
    """Device microseconds per call of ``call`` captured back to back in one CUDA graph."""
    import torch

    from benchmarks import timing

    # CUDA graphs are captured on a side stream (capture on the default stream is refused).
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph = timing.back_to_back_graph([call], rep_ms=40.0)
    torch.cuda.current_stream().wait_stream(stream)
    return timing.interleaved_graphs_ms({"call": graph}, rounds=7)["call"] * 1e3


def run_host() -> list:
    from benchmarks import cases, timing

    lib = cases.load_library()
    rows = []
    for op in HOST_OPS:
        inputs, params, fns = host_case(op, lib)
        passes = {impl: timing.passes(inputs, params, fn) for impl, fn in fns.items()}
        for index, pass_name in enumerate(("forward", "forward+backward")):
            calls = {impl: both[index] for impl, both in passes.items()}
            host = interleaved_issue_us(calls)
            for impl, call in calls.items():
                row = {
                    "op": op,
                    "pass": pass_name,
                    "impl": impl,
                    "host_us": host[impl],
                    "wall_us": wall_us(call),
                    "device_us": device_us(call),
                }
                print(
                    f"  {op:10s} {pass_name:16s} {impl:5s} host {row['host_us']:7.1f} us  "
                    f"wall {row['wall_us']:7.1f} us  device {row['device_us']:7.1f} us",
                    flush=True,
                )
                rows.append(row)
    return rows


# ---- results ---------------------------------------------------------------------------------


def metadata(args) -> dict:
    from importlib.metadata import version

    import torch
    import transformers

    return {
        "device": torch.cuda.get_device_name(),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "triton": version("triton"),
        "python": platform.python_version(),
        "config": llama.CONFIG,
        "prompt": PROMPT,
        "new_tokens": NEW_TOKENS,
        "rounds": args.rounds,
        "argv": sys.argv[1:],
    }


def merge(previous: dict, meta: dict, decode: list, host: list) -> dict:
    """``previous`` results with this run's rows replacing those of the same contender and
    batch (decode) or op, pass and implementation (host)."""
    keys = {"decode": ("contender", "batch"), "host": ("op", "pass", "impl")}
    merged = {"runs": [*previous.get("runs", []), meta]}
    for section, new in (("decode", decode), ("host", host)):
        fresh = {tuple(r[k] for k in keys[section]) for r in new}
        old = [
            r for r in previous.get(section, []) if tuple(r[k] for k in keys[section]) not in fresh
        ]
        merged[section] = old + new
    return merged


def markdown(entries: list[dict]) -> str:
    """results.md: for each transformers line, its decode table (speedups over eager and over
    transformers' static-cache compiled path) and its host-time table (ours over aten)."""
    lines = [
        "# Decode speed and host time per call",
        "",
        "The latest run on each transformers line; earlier runs are in git history.",
    ]
    for entry in entries:
        lines += ["", f"## transformers {entry['setting']['transformers']}", ""]
        lines += _entry_lines(entry)
    return "\n".join(lines) + "\n"


def _entry_lines(results: dict) -> list[str]:
    """One transformers line's tables (``merge``'s dict)."""
    meta = results["runs"][-1]
    lines = [
        f"{meta['device']}, {meta['date']}; torch {meta['torch']}, transformers "
        f"{meta['transformers']}, triton {meta['triton']}.",
    ]
    decode = results.get("decode", [])
    if decode:
        by = {(r["contender"], r["batch"]): r for r in decode}
        batches = sorted({r["batch"] for r in decode})
        lines += [
            "",
            f"### Decode: ms per new token (prompt {meta['prompt']}, {meta['new_tokens']} new "
            "tokens, bf16)",
            "",
            "Settings: greedy; sampling (temperature 0.7, top-p 0.9); penalties (greedy, "
            "min_new_tokens and repetition penalty 1.1). "
            "Decode ms per token: (call with all new tokens - call with one) / (new tokens - 1), "
            "median over interleaved rounds; in brackets, over transformers' static-cache compiled "
            "decode of the same setting. First call: the first generate() at that batch size on the fresh model, until "
            "its first token of a decode step (compiling or capturing included) / whole call. "
            "Same tokens: leading new tokens equal to eager's of the same setting (sampled ones "
            "from the same seed) in every sequence.",
            "",
            "| contender | "
            + " | ".join(
                f"batch {b}: ms/token | first decode token / call | same tokens" for b in batches
            )
            + " |",
            "|---|" + "---|---|---|" * len(batches),
        ]
        for name in dict.fromkeys(r["contender"] for r in decode):
            cells = []
            for b in batches:
                r = by.get((name, b))
                setting = (r or {}).get("setting", "greedy")
                static_name = "static + compile" + ("" if setting == "greedy" else f", {setting}")
                static = by.get((static_name, b))
                if r is None:
                    cells += ["—", "—", "—"]
                    continue
                ratio = (
                    f" ({r['decode_ms_per_token'] / static['decode_ms_per_token']:.2f}x)"
                    if static
                    else ""
                )
                same = r["same_tokens_as_eager"]
                cells += [
                    f"{r['decode_ms_per_token']:.2f}{ratio}",
                    f"{seconds(r['cold_first_decode_token_s'])} / {seconds(r['cold_call_s'])}",
                    "—" if same is None else f"{same}/{meta['new_tokens']}",
                ]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        limit = next(
            (run for run in reversed(results["runs"]) if "limit_ms_per_token" in run), None
        )
        if limit:
            lines += [
                "",
                f"Copy-bandwidth limit: {limit['limit_ms_per_token']:.2f} ms per token "
                f"({limit['decode_read_bytes'] / 1e9:.2f} GB of weights a step reads, at the "
                f"{limit['copy_gbps'] / 1e3:.2f} TB/s a device-to-device copy moved); a contender's "
                "share of it is limit / its ms per token.",
            ]
    host = results.get("host", [])
    if host:
        by = {(r["op"], r["pass"], r["impl"]): r for r in host}
        lines += [
            "",
            "### Host time per call, 4096x4096 bf16 (rotary: 4096 tokens, 32 q and 8 kv heads of 128)",
            "",
            "Host: microseconds to issue a call, back to back with the GPU kept busy (median of "
            "blocks of aten's and ours issued in turn). Wall: per "
            "call of back-to-back calls. Device: per call, the calls captured back to back in a "
            "CUDA graph. aten: F.rms_norm, F.layer_norm, F.silu(a) * b, transformers' eager "
            "rotary (PyTorch ops). Target: ours host <= 1.5x aten's.",
            "",
            "| op | pass | aten host / wall / device us | ours host / wall / device us | ours / aten host |",
            "|---|---|---|---|---|",
        ]
        for op, pass_name in dict.fromkeys((r["op"], r["pass"]) for r in host):
            aten, ours = by.get((op, pass_name, "aten")), by.get((op, pass_name, "ours"))
            cells = [
                "—"
                if r is None
                else f"{r['host_us']:.1f} / {r['wall_us']:.1f} / {r['device_us']:.1f}"
                for r in (aten, ours)
            ]
            ratio = f"{ours['host_us'] / aten['host_us']:.2f}x" if aten and ours else "—"
            lines.append(f"| {op} | {pass_name} | {cells[0]} | {cells[1]} | {ratio} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, help="results folder (default benchmarks/results/<device>/decode)"
    )
    parser.add_argument("--only", choices=("decode", "host"), help="run one part (default: both)")
    parser.add_argument(
        "--group",
        choices=(*GROUPS, "all"),
        default="all",
        help="decode contenders to run: eager (no torch.compile), compiled, or all",
    )
    parser.add_argument(
        "--contenders",
        nargs="+",
        choices=CONTENDERS,
        metavar="NAME",
        help="decode contenders to run, by name (default: every one of --group's)",
    )
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    decode, host, limit = [], [], {}
    if args.only in (None, "host"):
        print("host time per call:", flush=True)
        host = run_host()
    if args.only in (None, "decode"):
        groups = list(GROUPS) if args.group == "all" else [args.group]
        print(f"decode, groups {groups}:", flush=True)
        decode, limit = run_decode(groups, args.batches, args.rounds, args.contenders)

    args.out = args.out or default_out("decode")
    path = args.out / "results.json"
    meta = {**metadata(args), **limit}
    entries = read_entries(path)
    setting = {"transformers": transformers_line(meta["transformers"])}
    whole = args.only is None and args.group == "all" and not args.contenders
    whole = whole and list(args.batches) == list(BATCHES)
    previous = {} if whole else entry_for(entries, setting)
    entry = {"setting": setting, **merge(previous, meta, decode, host)}
    entries = replace_entry(entries, entry)
    write_entries(path, entries)
    (args.out / "results.md").write_text(markdown(entries))
    print(f"wrote {path} and results.md", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
