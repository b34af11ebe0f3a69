"""The torch.compile backend (`kernels.compile`) on models nobody tagged: eager PyTorch,
torch.compile (inductor), and ours (our kernels put into the graph, then inductor).

    python -m benchmarks.compile_backend                        # on a CUDA GPU: every model
    python -m benchmarks.compile_backend --models llama         # one model (merged into --out)
    TRITON_INTERPRET=1 python -m benchmarks.compile_backend --quick --out /tmp/cb   # CPU check

Models, each built once and copied for every contender (the same weights):

- ``llama`` (rows named ``llama BxS``, batch x sequence): a hand-written Llama-style stack with no kernel tags: ``nn.RMSNorm`` (or, with
  ``--norm formula``, transformers' LlamaRMSNorm formula written out), attention with rotary
  embeddings and ``F.scaled_dot_product_attention``, and the gated MLP ``F.silu(gate) * up``;
- ``resnet18``: torchvision's ResNet-18 (when torchvision is importable), whose only pattern
  is the ReLU, which the library has no kernel for: OpenDeepKernel's example registers a
  Triton ReLU of its own (``triton_relu`` below) and compiles with it.

Contenders: ``eager``; ``compile`` (``torch.compile``, inductor) and ``compile,
reduce-overhead`` (inductor replaying CUDA graphs); ``ours`` (the backend with the library's
kernels and default policies, inductor downstream: ``eager_only`` entries, so the same program
as ``compile``, with a report of what it left) and ``ours, CUDA graphs`` (``cuda_graphs=True``);
``ours, eager downstream`` (our kernels, no compiler) and ``ours, eager downstream, CUDA
graphs`` (our kernels replayed from CUDA graphs by Dynamo's cudagraphs backend). For ``llama`` also the library's entries forced into inductor's
graph (``ours, all 'always'``, ``ours, rms_norm 'always'``, ``ours, silu_mul 'always'``: what
the default policy is decided on); for ``resnet18`` ``ours + triton relu`` (inductor; a
registered kernel applies everywhere by default) and ``ours + triton relu, eager
downstream``.

Measured: a training step (forward, a loss, backward; no optimizer) and inference (forward
under ``torch.no_grad()``); milliseconds per call, timed in interleaved rounds with L2 cleared
before each call (`timing.interleaved_samples`: every contender in every round, so that the
machine's phases fall on all alike), median over the rounds' calls, and the ratio's quartiles
over rounds; the peak memory of a training step; the first call's time (compilation); what the
backend replaced; the largest difference of each contender's inference output from eager's.

``--quick``: tiny shapes, float32, a few calls, no inductor contenders unless on a GPU: proves
the whole path runs (on the CPU under ``TRITON_INTERPRET=1``: our kernels through Triton's
interpreter, eager downstream). Writes ``results.md`` and ``results.json`` into ``--out``
(default ``benchmarks/results/<device>/compile_backend``); a run replaces the rows of the
models it ran and keeps the others.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import nn

from benchmarks import timing
from benchmarks.cases import LlamaRMSNorm
from benchmarks.results_io import RESULTS, device_folder, save_results

MODELS = ("llama", "resnet18")

LLAMA = dict(hidden=2048, heads=16, intermediate=5632, layers=4, batch=8, seq=2048)
LLAMA_QUICK = dict(hidden=64, heads=4, intermediate=128, layers=2, batch=2, seq=8)
RESNET = dict(batch=64, image=224, classes=1000)
RESNET_QUICK = dict(batch=2, image=32, classes=10)


# ---- the hand-written Llama (no kernel tags anywhere) ----------------------------------------


def _norm(kind: str, hidden: int) -> nn.Module:
    # "formula": transformers' LlamaRMSNorm as written there (benchmarks.cases' copy of it).
    return nn.RMSNorm(hidden, eps=1e-6) if kind == "module" else LlamaRMSNorm(hidden)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q, k, v = (
            p(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, intermediate: int, norm: str):
        super().__init__()
        self.input_norm = _norm(norm, hidden)
        self.attn = Attention(hidden, heads)
        self.post_norm = _norm(norm, hidden)
        self.mlp = MLP(hidden, intermediate)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.input_norm(x), cos, sin)
        return x + self.mlp(self.post_norm(x))


class LlamaStack(nn.Module):
    """Decoder blocks over hidden states (no embedding or head: the blocks are what the
    backend rewrites), with a final norm."""

    def __init__(self, hidden, heads, intermediate, layers, seq, norm="module", **_):
        super().__init__()
        self.blocks = nn.ModuleList(
            LlamaBlock(hidden, heads, intermediate, norm) for _ in range(layers)
        )
        self.norm = _norm(norm, hidden)
        head_dim = hidden // heads
        inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(seq).float(), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x):
        cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.norm(x)


# ---- OpenDeepKernel's Triton ReLU (the seed's example), for ResNet-18 ------------------------


@triton.jit
def relu_kernel(x_ptr, y_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(y_ptr + offsets, tl.maximum(x, 0.0), mask=mask)


def triton_relu(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    n = x.numel()
    relu_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK_SIZE=1024)
    return y


# ---- models and contenders -------------------------------------------------------------------


@dataclass
class Case:
    """A model on the device with its inputs and loss: what every contender runs."""

    name: str
    model: nn.Module
    inputs: tuple
    loss: Callable
    config: dict


def llama_case(device: str, dtype: torch.dtype, quick: bool, norm: str, **sizes) -> Case:
    config = dict(LLAMA_QUICK if quick else LLAMA)
    config.update({k: v for k, v in sizes.items() if v is not None})
    config.update(norm=norm, dtype=str(dtype))
    torch.manual_seed(0)
    model = LlamaStack(**config).to(device=device, dtype=dtype)
    x = torch.randn(config["batch"], config["seq"], config["hidden"], device=device, dtype=dtype)
    name = f"llama {config['batch']}x{config['seq']}"  # runs of other sizes keep their rows
    return Case(name, model, (x,), lambda out: out.float().pow(2).mean(), config)


def resnet_case(device: str, dtype: torch.dtype, quick: bool) -> Case | None:
    try:
        import torchvision
    except Exception as exc:  # noqa: BLE001  (not installed, or built for another torch)
        print(f"resnet18 skipped: torchvision unavailable ({type(exc).__name__}: {exc})"[:200])
        return None
    config = dict(RESNET_QUICK if quick else RESNET, dtype=str(dtype))
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=config["classes"]).to(
        device=device, dtype=dtype
    )
    shape = (config["batch"], 3, config["image"], config["image"])
    images = torch.randn(shape, device=device, dtype=dtype)
    labels = torch.randint(config["classes"], (config["batch"],), device=device)
    return Case(
        "resnet18", model, (images,), lambda out: F.cross_entropy(out.float(), labels), config
    )


def contenders(case: Case, with_inductor: bool) -> dict:
    """{name: (registry, downstream, options)}: ``(None, None, {})`` is eager PyTorch,
    ``("compile", None, options)`` torch.compile with ``options`` (``mode``); the others are the
    backend with a registry, a downstream and `KernelsBackend` keyword arguments."""
    from kernels.compile import KernelRegistry

    graphs = {"cuda_graphs": True}
    found: dict = {"eager": (None, None, {})}
    if with_inductor:
        found["compile"] = ("compile", None, {})
        found["compile, reduce-overhead"] = ("compile", None, {"mode": "reduce-overhead"})
        found["ours"] = (KernelRegistry.library(), "inductor", {})
        found["ours, CUDA graphs"] = (KernelRegistry.library(), "inductor", graphs)
    found["ours, eager downstream"] = (KernelRegistry.library(), "eager", {})
    if with_inductor:  # the CUDA-graph contenders need a GPU (on the CPU they run as above)
        found["ours, eager downstream, CUDA graphs"] = (KernelRegistry.library(), "eager", graphs)
    if case.name.startswith("llama") and with_inductor:
        # The library's entries are eager_only: these put them into inductor's graph, to
        # measure what that policy decides (docs/compile-backend.md, Policy).
        always = KernelRegistry.library(policy="always")
        found["ours, all 'always'"] = (always, "inductor", {})
        rms_norm = KernelRegistry.library(["rms_norm"], policy="always")
        found["ours, rms_norm 'always'"] = (rms_norm, "inductor", {})
        silu_mul = KernelRegistry.library(["silu_mul"], policy="always")
        found["ours, silu_mul 'always'"] = (silu_mul, "inductor", {})
    if case.name == "resnet18":
        with_relu = KernelRegistry.library()
        with_relu.register("relu", triton_relu)
        if with_inductor:
            found["ours + triton relu"] = (with_relu, "inductor", {})
        found["ours + triton relu, eager downstream"] = (with_relu, "eager", {})
    return found


def build(case: Case, registry, downstream, options: dict):
    """(callable model, backend or None) of one contender, on a copy of the case's model."""
    from kernels.compile import kernels_backend

    model = copy.deepcopy(case.model)
    if registry is None:
        return model, model, None
    if registry == "compile":
        return model, torch.compile(model, **options), None
    backend = kernels_backend(registry, downstream=downstream, **options)
    return model, torch.compile(model, backend=backend), backend


def _step_calls(case: Case, model: nn.Module, fn: Callable) -> tuple[Callable, Callable]:
    def train():
        model.zero_grad(set_to_none=True)
        case.loss(fn(*case.inputs)).backward()

    def infer():
        with torch.no_grad():
            fn(*case.inputs)

    return train, infer


# ---- timing ----------------------------------------------------------------------------------


def _cpu_samples(calls: dict, rounds: int, block: int) -> dict:
    """As `timing.interleaved_samples`, timed with the host's clock (no CUDA)."""
    names = list(calls)
    samples = {name: [] for name in names}
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            times = []
            for _ in range(block):
                start = time.perf_counter()
                calls[name]()
                times.append((time.perf_counter() - start) * 1e3)
            samples[name].append(times[1:])  # the block's first call is not counted
    return samples


def samples(calls: dict, on_gpu: bool, rep_ms: float, quick: bool) -> dict:
    if on_gpu:
        return timing.interleaved_samples(calls, rep_ms)
    return _cpu_samples(calls, rounds=2 if quick else 8, block=3 if quick else 6)


def _first_call_s(fn: Callable, on_gpu: bool) -> float:
    start = time.perf_counter()
    fn()
    if on_gpu:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def _peak_gib(train: Callable, on_gpu: bool) -> float | None:
    if not on_gpu:
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    train()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**30


def run_case(case: Case, on_gpu: bool, quick: bool, rep_ms: float) -> list[dict]:
    """Every contender's rows (one per mode) for ``case``."""
    with torch.no_grad():
        reference = case.model(*case.inputs).float()
    built = {}
    for name, (registry, downstream, options) in contenders(case, with_inductor=on_gpu).items():
        torch._dynamo.reset()
        model, fn, backend = build(case, registry, downstream, options)
        train, infer = _step_calls(case, model, fn)
        first_train = _first_call_s(train, on_gpu)
        train_graphs = len(backend.reports) if backend is not None else 0
        first_infer = _first_call_s(infer, on_gpu)
        with torch.no_grad():
            diff = (fn(*case.inputs).float() - reference).abs().max().item()
        built[name] = dict(
            train=train,
            infer=infer,
            reports=dict(
                train=backend.reports[:train_graphs] if backend is not None else [],
                infer=backend.reports[train_graphs:] if backend is not None else [],
            ),
            first_train_s=first_train,
            first_infer_s=first_infer,
            max_abs_diff=diff,
            peak_gib=_peak_gib(train, on_gpu),
        )
        print(f"  {case.name} / {name}: compiled in {first_train + first_infer:.1f} s, "
              f"max |out - eager| {diff:.3g}")  # fmt: skip
    rows = []
    for mode in ("train", "infer"):
        rounds = samples({n: b[mode] for n, b in built.items()}, on_gpu, rep_ms, quick)
        for name, b in built.items():
            row = dict(
                model=case.name,
                mode=mode,
                contender=name,
                ms=timing.pooled_median(rounds[name]),
                rounds_ms=[statistics.median(r) for r in rounds[name]],
                vs_eager=ratio(rounds["eager"], rounds[name]),
                vs_compile=ratio(rounds["compile"], rounds[name]) if "compile" in rounds else None,
                first_call_s=b[f"first_{mode}_s"],
                max_abs_diff=b["max_abs_diff"],
                peak_gib=b["peak_gib"] if mode == "train" else None,
                replaced=_counts(b["reports"][mode], kept=False),
                kept=_counts(b["reports"][mode], kept=True),
            )
            rows.append(row)
            print(f"  {case.name} {mode} {name}: {row['ms']:.3f} ms")
    return rows


def ratio(peer_rounds: list, ours_rounds: list) -> list[float]:
    """[q1, median, q3] of peer ms / contender ms over rounds (> 1: the contender is faster)."""
    return list(timing.ratio_quartiles(peer_rounds, ours_rounds))


def _counts(reports: list, kept: bool) -> dict:
    """{pattern: matches} replaced (or left, with ``kept``) in the graphs of one mode."""
    counts: dict = {}
    for report in reports:
        for record in report.kept if kept else report.replaced:
            counts[record.pattern] = counts.get(record.pattern, 0) + 1
    return counts


# ---- results ---------------------------------------------------------------------------------


def metadata(args) -> dict:
    on_gpu = torch.cuda.is_available()
    return dict(
        device=torch.cuda.get_device_name() if on_gpu else "cpu (Triton interpreter)",
        date=datetime.date.today().isoformat(),
        torch=torch.__version__,
        triton=triton.__version__,
        quick=args.quick,
        norm=args.norm,
        timing=(
            "interleaved rounds, CUDA events, L2 cleared before each call (timing.interleaved_samples)"
            if on_gpu
            else "interleaved rounds, host clock"
        ),
    )


def _ratio_cell(q: list | None) -> str:
    if not q:
        return ""
    return f"{q[1]:.2f}x ({q[0]:.2f}-{q[2]:.2f})"


def write_markdown(meta: dict, results: list[dict], path: str) -> None:
    lines = [
        "# torch.compile backend (kernels.compile) on untagged models",
        "",
        f"- device: {meta['device']}",
        f"- date: {meta['date']}; torch {meta['torch']}, triton {meta['triton']}",
        f"- timing: {meta['timing']}; ms per call, median over rounds; ratios are the "
        "contender's speed over the peer's (> 1: the contender is faster), with the "
        "quartiles over rounds in brackets",
        "- ours: `torch.compile(model, backend=kernels_backend(...))` with "
        "`KernelRegistry.library()`'s default policies unless the name says otherwise",
    ]
    if meta.get("quick"):
        lines.append("- quick mode: tiny shapes, a proof that the path runs, not a measurement")
    for model in dict.fromkeys(r["model"] for r in results):
        config = meta.get("configs", {}).get(model)
        lines += ["", f"## {model}", ""]
        if config:
            lines += [f"config: {', '.join(f'{k}={v}' for k, v in config.items())}", ""]
        lines += [
            "| contender | mode | ms | vs eager | vs compile | first call s | peak GiB | "
            "max abs diff vs eager | replaced | left |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in (r for r in results if r["model"] == model):
            peak = f"{r['peak_gib']:.2f}" if r.get("peak_gib") is not None else ""
            replaced = ", ".join(f"{k} {v}" for k, v in r["replaced"].items())
            kept = ", ".join(f"{k} {v}" for k, v in r["kept"].items())
            lines.append(
                f"| {r['contender']} | {r['mode']} | {r['ms']:.3f} | {_ratio_cell(r['vs_eager'])} "
                f"| {_ratio_cell(r['vs_compile'])} | {r['first_call_s']:.1f} | {peak} "
                f"| {r['max_abs_diff']:.3g} | {replaced} | {kept} |"
            )
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def merge_results(path: str, meta: dict, results: list[dict]) -> tuple[dict, list[dict]]:
    """Results already in ``path`` for other models, then this run's."""
    if not os.path.exists(path):
        return meta, results
    with open(path) as f:
        old = json.load(f)
    ran = {r["model"] for r in results}
    kept = [r for r in old.get("results", []) if r["model"] not in ran]
    configs = {**old.get("meta", {}).get("configs", {}), **meta.get("configs", {})}
    return {**meta, "configs": configs}, kept + results


def _run_model(parser, model, args, device, dtype, on_gpu, configs) -> list[dict]:
    if model not in MODELS:
        parser.error(f"unknown model {model!r}; known: {', '.join(MODELS)}")
    if model == "llama":
        case = llama_case(device, dtype, args.quick, args.norm, batch=args.batch, seq=args.seq,
                          layers=args.layers)  # fmt: skip
    else:
        case = resnet_case(device, dtype, args.quick)
    if case is None:
        return []
    print(f"{model}: {case.config}")
    configs[case.name] = case.config
    try:
        return run_case(case, on_gpu, args.quick, args.rep_ms)
    finally:
        torch._dynamo.reset()


def main(argv: list[str] | None = None) -> tuple[dict, list[dict]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="folder for results.md and results.json "
                        "(default benchmarks/results/<device>/compile_backend)")  # fmt: skip
    parser.add_argument("--models", default=",".join(MODELS), help=f"subset of {MODELS}")
    parser.add_argument("--norm", choices=("module", "formula"), default="module",
                        help="the Llama's RMSNorm: nn.RMSNorm or transformers' formula")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="tiny shapes: check the path runs")
    parser.add_argument("--batch", type=int, help=f"the Llama's batch (default {LLAMA['batch']})")
    parser.add_argument("--seq", type=int, help=f"the Llama's sequence (default {LLAMA['seq']})")
    parser.add_argument(
        "--layers", type=int, help=f"the Llama's blocks (default {LLAMA['layers']})"
    )
    parser.add_argument("--rep-ms", type=float, default=2000.0, help="time each timing may take")
    args = parser.parse_args(argv)
    on_gpu = torch.cuda.is_available()
    device = "cuda" if on_gpu else "cpu"
    if not on_gpu and os.environ.get("TRITON_INTERPRET") != "1":
        parser.error(
            "without a GPU, set TRITON_INTERPRET=1 (our kernels run in Triton's interpreter)"
        )
    folder = device_folder(torch.cuda.get_device_name()) if on_gpu else "cpu"
    out = args.out or str(RESULTS / folder / "compile_backend")
    os.makedirs(out, exist_ok=True)
    dtype = torch.bfloat16 if on_gpu and not args.quick else torch.float32
    meta, results, configs = metadata(args), [], {}
    threads = torch.get_num_threads()
    if not on_gpu:
        # Tiny CPU ops gain nothing from threads, and on a busy machine their spinning costs
        # ~1000x (0.3 ms against 240 ms a forward on a 2-core VM with other jobs, 2026-11-24).
        torch.set_num_threads(1)
    # Every contender compiles the same forward code again (another backend, another module
    # instance, grad on or off): keep Dynamo from falling back to eager after 8 of them.
    limits = torch._dynamo.config.patch(cache_size_limit=64, accumulated_cache_size_limit=512)
    try:
        with limits:
            for model in args.models.split(","):
                results += _run_model(parser, model, args, device, dtype, on_gpu, configs)
    finally:
        torch.set_num_threads(threads)
    meta["configs"] = configs

    meta, results = merge_results(os.path.join(out, "results.json"), meta, results)
    save_results(out, meta, results, write_markdown)
    print(f"wrote {out}/results.md and results.json")
    return meta, results


if __name__ == "__main__":
    main()
