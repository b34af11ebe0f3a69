"""The GPU probe that decides the compile rule (library/_shared/_compile_rule.py).

    python -m benchmarks.compile_rule                    # every layer, every size class (~4 min, H100)
    python -m benchmarks.compile_rule --layers rms_norm,rotary --tokens 512,4096

For each library layer and size class it compiles a small graph around the layer (the layer
and its neighbours: residual add + norm + linear, the projections around a gated activation,
the projections and layout changes around rotary, a norm before the fused loss) twice, once
with the layer forced to its custom op and once to its PyTorch formula (``_compile_rule.force``),
and times each, forward (no grad: ``infer``) and forward + backward (``train``), with
``triton.testing.do_bench``. The side that wins each (layer, pass, hidden, tokens) class is
printed as rows of ``RULE`` (``(layer, pass, min_hidden, min_tokens, side)``), ready to paste
into library/_shared/_compile_rule.py; JSON (every timing) and markdown go to
``benchmarks/results/<device>/compile_rule/``. The losses stay ops in the rule whatever wins
here (their formula holds the logits); they are timed so that the cost is known.

Each (layer, hidden, side) is compiled with ``dynamic=True``, once for all token counts (a
forward graph and a training one), as a model compiled once serves many batch shapes; that
keeps the run near 4 minutes on an H100. ``--static`` compiles each shape apart, as a first
``torch.compile(model)`` call does (longer: eight compilations a side instead of two).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path

#: The layers probed, by their name in the rule.
LAYERS = (
    "rms_norm",
    "gemma_rms_norm",
    "layer_norm",
    "fused_add_rms_norm",
    "gated_activation",
    "gated_mlp",
    "rotary",
    "fused_linear_cross_entropy",
)
#: The layers the rule keeps as ops whatever is measured (their formula holds the logits).
ALWAYS_OP = ("fused_linear_cross_entropy",)
SIDES = ("op", "formula")
PASSES = ("infer", "train")
#: The end-to-end model's sizes (benchmarks/e2e.py: 8x512, 4x2048, 1x4096 and more tokens).
TOKENS = (512, 4096, 8192, 16384)
HIDDEN = (2048, 4096)
VOCAB = (32000, 128256)
#: The longest sequence a rotary graph is given; more tokens are more sequences.
MAX_SEQ = 2048
HEAD_DIM = 64
EPS = 1e-6


class ProbeError(ValueError):
    """An argument the probe cannot use: the message names the fix."""


@dataclasses.dataclass(frozen=True)
class Case:
    """One timed class: a layer at ``hidden`` (and ``vocab``, for the loss) and ``tokens``."""

    layer: str
    hidden: int
    tokens: int
    vocab: int = 0


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ProbeError(f"--{what}: {text!r} is not a comma-separated list of integers.") from None
    if not values or any(v <= 0 for v in values):
        raise ProbeError(f"--{what}: give positive integers, such as 512,4096.")
    return tuple(sorted(set(values)))


def _layers(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in LAYERS]
    if unknown or not names:
        raise ProbeError(
            f"--layers: unknown {unknown or text!r}; the layers are {', '.join(LAYERS)}."
        )
    return tuple(n for n in LAYERS if n in names)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", default=",".join(LAYERS), help="comma-separated layers")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="token counts")
    parser.add_argument("--hidden", default=",".join(map(str, HIDDEN)), help="hidden sizes")
    parser.add_argument("--vocab", default=",".join(map(str, VOCAB)), help="loss vocabularies")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--backend", default="inductor", help="torch.compile backend")
    parser.add_argument("--static", action="store_true", help="compile each shape apart")
    parser.add_argument("--rep-ms", type=float, default=60.0, help="do_bench's rep (ms)")
    parser.add_argument("--device", default=None, help="default: cuda")
    parser.add_argument(
        "--out", default=None, help="default: benchmarks/results/<device>/compile_rule"
    )
    args = parser.parse_args(argv)
    args.layers = _layers(args.layers)
    args.tokens = _ints(args.tokens, "tokens")
    args.hidden = _ints(args.hidden, "hidden")
    args.vocab = _ints(args.vocab, "vocab")
    return args


def cases(args) -> list[Case]:
    """The classes to time, in order (one compilation serves the token counts of a layer,
    hidden size and vocabulary)."""
    out = []
    for layer in args.layers:
        for hidden in args.hidden:
            for vocab in args.vocab if layer == "fused_linear_cross_entropy" else (0,):
                out += [Case(layer, hidden, tokens, vocab) for tokens in args.tokens]
    return out


def device_slug(device) -> str:
    """The results folder of a device: ``h100``, ``h200``, ``a100``..., or ``cpu``."""
    import torch

    if device.type != "cuda":
        return device.type
    name = torch.cuda.get_device_name(device).lower()
    found = re.search(r"\b([a-z]\d{2,3})\b", name)
    return found.group(1) if found else re.sub(r"\W+", "-", name).strip("-")


# ---- the graphs around each layer --------------------------------------------------------------


def _load_packages():
    """The kernel packages of the probed layers, by repository name (the library's registry
    says which repository's kernels ask each layer)."""
    from kernels.library import load_library_package
    from kernels.library.registry import repository_of

    repos = {repository_of(layer, "compile_layers") for layer in LAYERS}
    return {name: load_library_package(name) for name in sorted(repos)}


def rule_module(package):
    return sys.modules[f"{package.__name__}._compile_rule"]


def rule_hidden(layer: str, hidden: int) -> int:
    """The size the rule keys ``layer`` on, for a model of ``hidden``: the gated activations'
    own width (the MLP's intermediate size, 4 x hidden here), else the hidden size."""
    return 4 * hidden if layer in ("gated_activation", "gated_mlp") else hidden


def build_graph(layer: str, hidden: int, vocab: int, packages, dtype, device):
    """``(graph, inputs_of)``: the graph around ``layer`` (its parameters made once, so that
    one compilation serves every token count) and ``inputs_of(tokens)``, the inputs of a call
    of ``tokens`` tokens, the token dimension first."""
    import torch
    import torch.nn.functional as F

    n, ffn = hidden, 4 * hidden

    def param(*shape, scale=0.02, shift=0.0):
        return (torch.randn(*shape, device=device) * scale + shift).to(dtype).requires_grad_()

    def act(*shape):
        return torch.randn(*shape, device=device, dtype=dtype).requires_grad_()

    def rows(t):
        return act(t, n), act(t, n)

    norm, activation = packages["norm"], packages["activation"]
    if layer in ("rms_norm", "gemma_rms_norm", "layer_norm"):
        w, b, proj = param(n, shift=1.0), param(n), param(n, n)
        fn = {
            "rms_norm": lambda h: norm.rms_norm(h, w, EPS),
            "gemma_rms_norm": lambda h: norm.gemma_rms_norm(h, w, EPS),
            "layer_norm": lambda h: norm.layer_norm(h, [n], w, b, EPS),
        }[layer]

        def graph(x, r):
            return F.linear(fn(x + r), proj)

        return graph, rows
    if layer == "fused_add_rms_norm":
        w, proj = param(n, shift=1.0), param(n, n)

        def graph(x, r):
            y, s = norm.fused_add_rms_norm(x, r, w, EPS)
            return F.linear(y, proj) + s

        return graph, rows
    if layer == "gated_activation":
        gate_up, down = param(2 * ffn, n), param(n, ffn)

        def graph(x):
            return F.linear(activation.silu_and_mul(F.linear(x, gate_up)), down)

        return graph, lambda t: (act(t, n),)
    if layer == "gated_mlp":
        gate, up, down = param(ffn, n), param(ffn, n), param(n, ffn)

        def graph(x):
            return F.linear(activation.silu_mul(F.linear(x, gate), F.linear(x, up)), down)

        return graph, lambda t: (act(t, n),)
    if layer == "rotary":
        heads = max(1, n // HEAD_DIM)
        kv = max(1, heads // 4)
        wq, wk = param(heads * HEAD_DIM, n), param(kv * HEAD_DIM, n)
        rotary = packages["rotary"]

        def graph(x, cos, sin):
            batch, seq = x.shape[0], x.shape[1]
            q = F.linear(x, wq).view(batch, seq, heads, HEAD_DIM).transpose(1, 2)
            k = F.linear(x, wk).view(batch, seq, kv, HEAD_DIM).transpose(1, 2)
            q, k = rotary.apply_rotary_pos_emb(q, k, cos, sin)
            return q.transpose(1, 2).reshape(batch, seq, -1), k.transpose(1, 2).reshape(
                batch, seq, -1
            )

        def inputs_of(t):
            seq = min(t, MAX_SEQ)
            angles = torch.arange(seq, device=device)[:, None] * torch.rand(
                HEAD_DIM // 2, device=device
            )
            emb = torch.cat((angles, angles), -1)[None]
            return act(max(1, t // seq), seq, n), emb.cos().to(dtype), emb.sin().to(dtype)

        return graph, inputs_of
    assert layer == "fused_linear_cross_entropy", layer
    w, head = param(n, shift=1.0), param(vocab, n)
    loss = packages["loss"]

    def graph(x, labels):
        h = x.float()
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * w
        return loss.fused_linear_cross_entropy(h, head, labels)

    return graph, lambda t: (act(t, n), torch.randint(0, vocab, (t,), device=device))


# ---- timing ------------------------------------------------------------------------------------


def time_ms(fn, rep_ms: float, device) -> float:
    """Median milliseconds of ``fn``: ``triton.testing.do_bench`` on a GPU; wall time of a few
    calls elsewhere (the CPU run only checks the probe's own logic)."""
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=max(5, rep_ms / 4), rep=rep_ms))
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def _outputs(out):
    return out if isinstance(out, tuple) else (out,)


def measure(args, packages, device, log=print) -> list[dict]:
    """Every class's timings: one dict a (case, side, pass) with ``ms``."""
    import torch

    dtype = getattr(torch, args.dtype)
    results = []
    groups = {}
    for case in cases(args):
        groups.setdefault((case.layer, case.hidden, case.vocab), []).append(case)
    for (layer, hidden, vocab), group in groups.items():
        graph, inputs_of = build_graph(layer, hidden, vocab, packages, dtype, device)
        for side in SIDES:
            for package in packages.values():
                rule_module(package).force(side, [layer])
            torch._dynamo.reset()
            # Symbolic sizes from the first call, so that one compilation (a forward graph and a
            # training one) serves every token count: two compilations a side, not eight.
            compiled = torch.compile(graph, backend=args.backend, dynamic=not args.static)
            started = time.perf_counter()
            for case in group:
                inputs = inputs_of(case.tokens)

                def infer(compiled=compiled, inputs=inputs):
                    with torch.no_grad():
                        return compiled(*inputs)

                def train(compiled=compiled, inputs=inputs):
                    outs = [o for o in _outputs(compiled(*inputs)) if o.requires_grad]
                    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])

                for pass_, fn in (("infer", infer), ("train", train)):
                    ms = time_ms(fn, args.rep_ms, device)
                    results.append(
                        {**dataclasses.asdict(case), "side": side, "pass": pass_, "ms": ms}
                    )
                del inputs
            log(f"{layer} hidden={hidden}{f' vocab={vocab}' if vocab else ''} {side}: "
                f"{time.perf_counter() - started:.1f} s")  # fmt: skip
        del graph, inputs_of
    for package in packages.values():
        rule_module(package).force()
    torch._dynamo.reset()
    return results


# ---- the rule ----------------------------------------------------------------------------------


def winners(results: list[dict]) -> list[dict]:
    """One entry a (layer, pass, hidden, vocab, tokens) class: both sides' ms, the winner and
    its speed-up over the other side."""
    table = {}
    for r in results:
        key = (r["layer"], r["pass"], r["hidden"], r["vocab"], r["tokens"])
        table.setdefault(key, {})[r["side"]] = r["ms"]
    out = []
    for (layer, pass_, hidden, vocab, tokens), ms in sorted(table.items()):
        if set(ms) != set(SIDES):
            continue
        side = "op" if ms["op"] <= ms["formula"] else "formula"
        other = "formula" if side == "op" else "op"
        out.append({
            "layer": layer, "pass": pass_, "hidden": hidden, "vocab": vocab, "tokens": tokens,
            "op_ms": ms["op"], "formula_ms": ms["formula"], "winner": side,
            "speedup": ms[other] / ms[side] if ms[side] else float("inf"),
        })  # fmt: skip
    return out


def rule_rows(won: list[dict]) -> list[tuple]:
    """``RULE`` rows from the winners: a row a class (the smallest hidden size and token count
    measured start at 0, so the rows cover every size), the losses always ``op``, merged where
    possible: one ``"*"`` pass where both passes agree on every class, one row where a layer
    agrees with itself everywhere. A loss measured over several vocabularies takes the side of
    the most classes (the rule does not key on the vocabulary)."""
    by_layer = {}
    for w in won:
        by_layer.setdefault(w["layer"], []).append(w)
    rows = []
    for layer in LAYERS:
        entries = by_layer.get(layer)
        if not entries:
            continue
        if layer in ALWAYS_OP:
            rows.append((layer, "*", 0, 0, "op"))
            continue
        hiddens = sorted({e["hidden"] for e in entries})
        tokens = sorted({e["tokens"] for e in entries})
        cells = {}
        for e in entries:
            cells.setdefault((e["pass"], e["hidden"], e["tokens"]), []).append(e["winner"])
        side = {k: max(set(v), key=v.count) for k, v in cells.items()}
        if len(set(side.values())) == 1:
            rows.append((layer, "*", 0, 0, next(iter(side.values()))))
            continue
        passes = sorted({p for p, _, _ in side})
        same = all(
            side.get(("infer", h, t)) == side.get(("train", h, t)) for h in hiddens for t in tokens
        )
        for pass_ in ("*",) if same else passes:
            for h in hiddens:
                for t in tokens:
                    won_side = side.get((passes[0] if pass_ == "*" else pass_, h, t))
                    if won_side is not None:
                        min_h = 0 if h == hiddens[0] else rule_hidden(layer, h)
                        min_t = 0 if t == tokens[0] else t
                        rows.append((layer, pass_, min_h, min_t, won_side))
    return rows


def _measured(w: dict) -> str:
    vocab = f" vocab {w['vocab']}" if w["vocab"] else ""
    return (
        f"{w['pass']} {w['tokens']}x{w['hidden']}{vocab}: "
        f"op {w['op_ms']:.3f} / formula {w['formula_ms']:.3f} ms"
    )


def format_rows(rows: list[tuple], won: list[dict]) -> str:
    """``rows`` as Python source for ``RULE``, each with the measured ms as a comment."""
    lines = ["RULE = ("]
    for row in rows:
        layer, pass_, min_h, min_t, side = row
        mine = [w for w in won if w["layer"] == layer]
        first_h = min((w["hidden"] for w in mine), default=0)
        first_t = min((w["tokens"] for w in mine), default=0)
        measured = [
            w for w in mine
            if (pass_ == "*" or w["pass"] == pass_)
            and (w["hidden"] == first_h if min_h == 0 else rule_hidden(layer, w["hidden"]) == min_h)
            and (w["tokens"] == first_t if min_t == 0 else w["tokens"] == min_t)
        ]  # fmt: skip
        note = ", ".join(_measured(w) for w in measured[:2])
        if layer in ALWAYS_OP:
            note = "kept an op (its formula holds the logits); " + note
        lines.append(f"    {row!r},  # {note}" if note else f"    {row!r},")
    lines.append(")")
    return "\n".join(lines)


def markdown(won: list[dict], meta: dict) -> str:
    lines = [
        f"# Compile rule probe: op vs formula under torch.compile ({meta['device']})",
        "",
        f"{meta['date']}, torch {meta['torch']}, {meta['dtype']}, backend {meta['backend']}, "
        f"{'static' if meta['static'] else 'dynamic tokens'}. Each graph is the layer and its "
        "neighbours (benchmarks/compile_rule.py); ms are do_bench medians.",
        "",
        "| layer | pass | hidden | vocab | tokens | op ms | formula ms | winner | speed-up |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for w in won:
        lines.append(
            f"| {w['layer']} | {w['pass']} | {w['hidden']} | {w['vocab'] or ''} | {w['tokens']} | "
            f"{w['op_ms']:.3f} | {w['formula_ms']:.3f} | {w['winner']} | {w['speedup']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def write_results(out: Path, results: list[dict], meta: dict) -> dict:
    """``results.json`` (every timing, the winners and the rows), ``results.md`` and
    ``rule.py`` (the rows to paste) under ``out``; returns what was written."""
    won = winners(results)
    rows = rule_rows(won)
    out.mkdir(parents=True, exist_ok=True)
    data = {"meta": meta, "timings": results, "winners": won, "rule": [list(r) for r in rows]}
    (out / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / "results.md").write_text(markdown(won, meta))
    (out / "rule.py").write_text(format_rows(rows, won) + "\n")
    return data


# ---- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except ProbeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import torch

    device = torch.device(args.device or "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA GPU; the probe times on a GPU (--device cpu only checks its logic, "
              "with TRITON_INTERPRET=1).", file=sys.stderr)  # fmt: skip
        return 2
    out = (
        Path(args.out)
        if args.out
        else Path(__file__).resolve().parent / "results" / device_slug(device) / "compile_rule"
    )
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    packages = _load_packages()
    results = measure(args, packages, device)
    meta = {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "dtype": args.dtype,
        "backend": args.backend,
        "static": args.static,
        "seconds": round(time.perf_counter() - started, 1),
        "command": " ".join(
            ["python -m benchmarks.compile_rule", *(argv if argv is not None else sys.argv[1:])]
        ),
        "environment": {
            k: v for k, v in os.environ.items() if k in ("TRITON_INTERPRET", "KERNELS_COMPILE_RULE")
        },
    }
    data = write_results(out, results, meta)
    print(markdown(data["winners"], meta))
    print(format_rows([tuple(r) for r in data["rule"]], data["winners"]))
    print(f"\nwritten to {out} in {meta['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
