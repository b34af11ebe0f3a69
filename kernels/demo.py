"""`kernels demo`: kernelize a Llama-style transformers model with our kernels, check it, time it.

On a CUDA GPU it builds a bf16 model of a few hundred million parameters and times prefill and
a training step, eager vs kernelized vs torch.compile. Without a GPU it builds a tiny model
and runs our Triton kernels through Triton's interpreter, which checks correctness only.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class DemoShape:
    """Model and input sizes for one kind of machine."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    batch: int
    seq: int


# Tiny on the CPU: the Triton interpreter runs every kernel program in Python.
CPU_SHAPE = DemoShape(
    hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=256, batch=2, seq=16
)
GPU_SHAPE = DemoShape(
    hidden=2048, intermediate=8192, layers=4, heads=32, kv_heads=8, vocab=32000, batch=4, seq=2048
)


def shape_for(device: str) -> DemoShape:
    """The demo's sizes on a device of type `device` ("cpu" or a GPU type)."""
    return CPU_SHAPE if device.split(":")[0] == "cpu" else GPU_SHAPE


def demo_config(shape: DemoShape):
    """The transformers ``LlamaConfig`` of the demo's model at `shape`."""
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        vocab_size=shape.vocab,
        max_position_embeddings=max(shape.seq, 128),
        attn_implementation="sdpa",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where to run (default: cuda when a GPU is visible, else cpu through the Triton interpreter)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed for weights and inputs (default 0)"
    )
    parser.add_argument(
        "--no-timing", action="store_true", help="skip the GPU timings (correctness only)"
    )


def run(args: argparse.Namespace) -> int:
    """Run the demo; returns the process exit status (1 when a check fails)."""
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        # Must be set before triton is imported (our kernel packages import it when loaded).
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda, but torch sees no CUDA GPU", file=sys.stderr)
        return 1
    try:
        from transformers.utils import logging as transformers_logging
    except ImportError:
        print("error: the demo needs transformers: pip install 'kernels[demo]'", file=sys.stderr)
        return 1
    # transformers' load-time notices would drown the demo's table; the caller's level is
    # restored afterwards (the demo also runs inside other programs, such as tests).
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        return _run(args, device, torch)
    finally:
        transformers_logging.set_verbosity(verbosity)


def _run(args: argparse.Namespace, device: str, torch) -> int:
    import transformers
    from transformers import LlamaForCausalLM

    from . import Mode, explain, kernelize, library_mapping, use_kernel_mapping
    from .library import tag_gated_mlps, tag_rotary_embeddings, untag

    shape = shape_for(device)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(args.seed)
    config = demo_config(shape)
    # transformers declares `to` through functools.wraps(nn.Module.to), which the type
    # checker reads as the unbound function: it asks for `self`.
    original = LlamaForCausalLM(config).to(device=device, dtype=dtype)  # type: ignore[call-arg]
    model = LlamaForCausalLM(config).to(device=device, dtype=dtype)  # type: ignore[call-arg]
    model.load_state_dict(original.state_dict())
    params = sum(p.numel() for p in model.parameters())
    print(
        f"Llama-style model: {params / 1e6:.1f}M parameters, {shape.layers} layers, hidden "
        f"{shape.hidden}, {dtype} on {device}; input {shape.batch}x{shape.seq} tokens"
    )
    if device == "cpu":
        print("No GPU: our Triton kernels run through Triton's interpreter (correct, not fast).")
    tokens = torch.randint(0, shape.vocab, (shape.batch, shape.seq), device=device)
    timing = device == "cuda" and not args.no_timing

    # The original's results and times come first: tagging the rotary embedding replaces a
    # function of transformers' modelling module, which the original calls too.
    expected = reference_results(original, tokens)
    times = time_original(original, tokens) if timing else {}
    del original

    try:
        tagged = tag_gated_mlps(model) + tag_rotary_embeddings(model)
        print(
            f"\ntagged what transformers {transformers.__version__} leaves untagged: {', '.join(tagged)} "
            "(kernels.library.tag_gated_mlps, tag_rotary_embeddings)"
        )
        with use_kernel_mapping(library_mapping(devices=[device])):
            print_plan(explain(model, mode=Mode.TRAINING))
            started = time.perf_counter()
            kernelize(model, mode=Mode.TRAINING, verify=(tokens,))
            print(
                f"\nkernelized and verified every kernel on the model's real inputs in {time.perf_counter() - started:.1f} s"
            )
        failures = check(expected, model, tokens, dtype)
        if timing:
            time_kernelized(model, tokens, times)
    finally:
        untag()  # the demo also runs inside other programs, such as tests
    if device == "cpu":
        print(
            "\nTimings need a CUDA GPU (run `kernels demo` there); on the CPU the interpreter is slow by design."
        )
    return 1 if failures else 0


def print_plan(explanation) -> None:
    """One row per kind of tagged module: how many, and which kernel it gets or why none."""
    print(f"\nkernels for mode {explanation.mode} on {explanation.device_type}:")
    header = ("layer name", "module class", "count", "kernel or reason for keeping its forward")
    rows = []
    for layer in explanation.layers:
        if layer.outcome == "kernel":
            outcome = layer.kernel.replace("kernel layer ", "").split(", package")[0]
        else:
            outcome = f"own forward: {layer.reason}"
        rows.append((layer.layer_name, layer.module_class, str(len(layer.paths)), outcome))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    for row in [header, *rows]:
        print(
            "  "
            + "  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True))
            + "  "
            + row[3]
        )


# The gradients the demo compares: a few named parameters, one of each kind.
_CHECKED_GRADS = (
    "model.embed_tokens.weight",
    "model.layers.0.mlp.down_proj.weight",
    "model.norm.weight",
)


def _logits_and_grads(model, tokens):
    model.zero_grad(set_to_none=True)
    logits = model(tokens).logits
    logits.float().logsumexp(-1).mean().backward()
    params = dict(model.named_parameters())
    grads = {name: params[name].grad.detach().clone() for name in _CHECKED_GRADS}
    model.zero_grad(set_to_none=True)
    return logits.detach(), grads


def reference_results(original, tokens) -> dict:
    """The original model's logits and a few gradients, to check the kernelized one against."""
    logits, grads = _logits_and_grads(original, tokens)
    return {"logits": logits, **{f"grad {name}": g for name, g in grads.items()}}


def check(expected: dict, model, tokens, dtype) -> int:
    """Compare logits and training gradients of the kernelized model with the original's."""
    import torch

    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    failures = 0
    print("\ncorrectness (relative error, kernelized vs original):")
    logits, grads = _logits_and_grads(model, tokens)
    got = {"logits": logits, **{f"grad {name}": g for name, g in grads.items()}}
    for label, want in expected.items():
        error = (
            (got[label].double() - want.double()).norm() / want.double().norm().clamp_min(1e-30)
        ).item()
        ok = error <= tolerance
        failures += not ok
        print(f"  {label:48s} {error:.2e}  {'ok' if ok else f'FAILED (tolerance {tolerance:g})'}")
    return failures


def _prefill(model, tokens):
    import torch

    with torch.no_grad():
        return model(tokens, logits_to_keep=1).logits


def _train_step(model, tokens):
    model(tokens).logits.float().logsumexp(-1).mean().backward()


_STEPS = {"prefill": _prefill, "training step": _train_step}


def _time_steps(model, tokens) -> dict:
    return {
        label: _median_ms(functools.partial(step, model, tokens)) for label, step in _STEPS.items()
    }


def time_original(original, tokens) -> dict:
    """{contender: {step: median ms}} for eager and torch.compile of the original model."""
    import torch

    times = {"eager": _time_steps(original, tokens)}
    times["torch.compile"] = _time_steps(torch.compile(original), tokens)
    original.zero_grad(set_to_none=True)
    return times


def time_kernelized(model, tokens, times: dict) -> None:
    """Time the kernelized model, eagerly and compiled, and print all timings against eager."""
    import torch

    from . import Mode, kernelize, library_mapping, use_kernel_mapping

    times["kernelized"] = _time_steps(model, tokens)
    with use_kernel_mapping(library_mapping(devices=["cuda"])):
        kernelize(model, mode=Mode.TRAINING | Mode.TORCH_COMPILE)
    times["kernelized + compile"] = _time_steps(torch.compile(model), tokens)
    print("\ntimings (median ms, CUDA events):")
    for label in _STEPS:
        base = times["eager"][label]
        summary = ", ".join(
            f"{name} {t[label]:.1f} ms ({base / t[label]:.2f}x)" for name, t in times.items()
        )
        print(f"  {label}: {summary}")


def _median_ms(fn, warmup: int = 3, repeat: int = 10) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kernels demo", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
