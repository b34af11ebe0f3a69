"""Our attention against another version of itself, and the backward's tiles, in one process.

    python -m benchmarks.diagnose.attention_versions [--baseline DIR] [--dkdv TILES] [--dq TILES]
        [--switch NAME=VALUE ...] [--shapes 4x4096] [--dims 64,128] [--causal both|yes|no]

The contenders, timed in interleaved rounds as ``benchmarks.attention`` times its dense section
(L2 cleared before each call, forward and forward+backward):

- ``ours``: this checkout's ``library/attention`` with its launch tables;
- ``baseline``, with ``--baseline DIR``: a copy of ``library/attention`` from another commit
  (``git archive <commit> library/attention | tar -x -C DIR``, then ``DIR/library/attention``);
  both load into the process side by side, each with its own ops;
- ``dkdv=BMxBNxWxS`` and ``dq=BMxBNxWxS`` for each tile of ``--dkdv`` / ``--dq`` (comma
  lists): ours with that one backward kernel's table entry replaced while it runs, the sweep a
  change to ``_tuning.BACKWARD_DKDV`` / ``BACKWARD_DQ`` rests on;
- ``NAME=VALUE`` for each ``--switch NAME=VALUE``: ours with its private ``_ops.NAME`` (such as
  ``_BACKWARD_TMA``) set to the value, forward and backward.

Prints ms, TFLOP/s and each contender's speed against ``ours`` per shape, and how far each
contender's output and gradients are from ours' (a wrong variant shows there, not as a
speed-up). Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Callable
from importlib import import_module

import torch

from benchmarks import attention as bench

OURS, BASELINE = "ours", "baseline"


def parse_switch(text: str) -> tuple[str, object]:
    """``"_BACKWARD_TMA=False"`` as ("_BACKWARD_TMA", False)."""
    name, sep, value = text.partition("=")
    try:
        return name.strip(), ast.literal_eval(value.strip()) if sep else None
    except (ValueError, SyntaxError) as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: a switch is NAME=<Python literal>") from exc


def parse_tiles(text: str) -> list[tuple[int, ...]]:
    """``"64x128x4x2,32x64x4x3"`` as [(block_m, block_n, num_warps, num_stages), ...]."""
    tiles = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        fields = item.split("x")
        if len(fields) != 4 or not all(f.isdigit() for f in fields):
            raise argparse.ArgumentTypeError(f"{item!r}: a tile is BMxBNxWARPSxSTAGES")
        tiles.append(tuple(int(f) for f in fields))
    return tiles


class _OnBackward(torch.autograd.Function):
    """The identity on a tensor, whose backward first calls ``action``."""

    @staticmethod
    def forward(ctx, tensor, action):
        ctx.action = action
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        ctx.action()
        return grad, None


def during(call, enter: Callable, leave: Callable):
    """``call`` with ``enter()`` in effect while its forward runs and while its backward runs:
    the output's backward calls ``enter``, the inputs' backward, which runs after the
    attention's, calls ``leave``."""

    def run(q, k, v):
        enter()
        try:
            q, k, v = (_OnBackward.apply(t, leave) for t in (q, k, v))
            out = call(q, k, v)
        finally:
            leave()
        return _OnBackward.apply(out, enter)

    return run


def with_tile(attn, table: str, block_d: int, tile: tuple, call):
    """``call`` with entry ``block_d`` of ``attn``'s ``_tuning.<table>`` set to ``tile`` (the
    launchers read their table at each call, and hold the table object itself, so the entry
    changes in place)."""
    tuning = import_module(attn.__name__ + "._tuning")
    entries = getattr(tuning, table)
    kept = entries[block_d]

    def enter():
        entries[block_d] = tuning.Config(*tile)

    def leave():
        entries[block_d] = kept

    return during(call, enter, leave)


def with_switch(attn, name: str, value, call):
    """``call`` with ``attn``'s private ``_ops.<name>`` set to ``value``."""
    ops = import_module(attn.__name__ + "._ops")
    kept = getattr(ops, name)
    return during(call, lambda: setattr(ops, name, value), lambda: setattr(ops, name, kept))


def contenders_at(
    versions: dict, block_d: int, dkdv: list, dq: list, switches: list
) -> dict[str, Callable]:
    """{name: make(causal) -> call(q, k, v)}: each version's ``flash_attn_func``, then ours with
    each backward tile of ``dkdv`` and ``dq`` at head dims padded to ``block_d``, and with each
    ``(name, value)`` of ``switches``."""

    def plain(attn) -> Callable:
        def make(causal: bool) -> Callable:
            return lambda q, k, v: attn.flash_attn_func(q, k, v, causal=causal)

        return make

    def tiled(table: str, tile: tuple) -> Callable:
        def make(causal: bool) -> Callable:
            return with_tile(versions[OURS], table, block_d, tile, plain(versions[OURS])(causal))

        return make

    def switched(name: str, value) -> Callable:
        def make(causal: bool) -> Callable:
            return with_switch(versions[OURS], name, value, plain(versions[OURS])(causal))

        return make

    contenders = {name: plain(attn) for name, attn in versions.items()}
    for name, value in switches:
        contenders[f"{name}={value}"] = switched(name, value)
    for label, table, tiles in (("dkdv", "BACKWARD_DKDV", dkdv), ("dq", "BACKWARD_DQ", dq)):
        for tile in tiles:
            contenders[f"{label}={'x'.join(map(str, tile))}"] = tiled(table, tile)
    return contenders


def difference(a: tuple, b: tuple) -> float:
    """The largest relative L2 difference between matching tensors of ``a`` and ``b``."""
    return max(bench.relative_error(x, y) for x, y in zip(a, b, strict=True))


def outputs_and_grads(fn, q, k, v, seed: torch.Tensor) -> tuple:
    """``fn``'s output and the gradients of q, k and v for the output gradient ``seed``."""
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v)
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), seed))


def run_shape(contenders: dict, batch, seqlen, dim, causal, rep_ms, block) -> None:
    q, k, v = bench.attention_inputs(batch, seqlen, seqlen, dim)
    calls = {
        name: (lambda q, k, v, make=make: make(causal)(q, k, v), [t.clone() for t in (q, k, v)])
        for name, make in contenders.items()
    }
    fwd, fwd_bwd, failed = bench._prepare(calls)
    seed = torch.randn_like(q)
    reference = outputs_and_grads(contenders[OURS](causal), q, k, v, seed)
    errors = {
        name: difference(outputs_and_grads(contenders[name](causal), q, k, v, seed), reference)
        for name in fwd
        if name != OURS
    }
    del reference
    times = bench._timed_rows(fwd, rep_ms, block, "fwd")
    for name, row in bench._timed_rows(fwd_bwd, rep_ms, block, "fwd_bwd").items():
        times[name].update(row)
    flops = bench.attention_flops(batch, seqlen, seqlen, dim, causal)
    print(f"--- {batch}x{seqlen} d{dim} {'causal' if causal else 'full'}", flush=True)
    print(f"    {'contender':<22} {'fwd ms':>8} {'TFLOP/s':>8} {'fwd+bwd ms':>11} {'TFLOP/s':>8}"
          f" {'vs ours':>8} {'max rel diff':>13}")  # fmt: skip
    base = times.get(OURS, {}).get("fwd_bwd_ms")
    for name in contenders:
        if name in failed:
            print(f"    {name:<22} {failed[name]}")
            continue
        row = times[name]
        f_ms, fb_ms = row["fwd_ms"], row["fwd_bwd_ms"]
        speed = f"{base / fb_ms:8.3f}" if base else f"{'':8}"
        err = f"{errors[name]:13.2e}" if name in errors else f"{'':13}"
        print(f"    {name:<22} {f_ms:8.3f} {flops / f_ms / 1e9:8.1f} {fb_ms:11.3f} "
              f"{bench.FWD_BWD_FACTOR * flops / fb_ms / 1e9:8.1f} {speed} {err}")  # fmt: skip
    del calls, fwd, fwd_bwd
    torch.cuda.empty_cache()


def register_use(attn) -> None:
    """Print each compiled variant of ``attn``'s forward and backward kernels: its tile, warps,
    stages, shared memory, registers a thread and spilled registers (a spilling tile is slow
    whatever its shape promises). Reads Triton's own kernel cache (Triton 3.4 to 3.6 layout);
    prints nothing where that layout differs."""
    kernels_module = import_module(attn.__name__ + "._kernels")
    shown = ("BLOCK_M", "BLOCK_N", "BLOCK_DQK", "WINDOW_RIGHT")
    for name in ("_fwd_kernel", "_bwd_dkdv_kernel", "_bwd_dq_kernel"):
        fn = getattr(kernels_module, name)
        try:
            variants = [c for caches in fn.device_caches.values() for c in caches[0].values()]
        except (AttributeError, IndexError, TypeError):
            return
        for compiled in variants:
            try:  # constexprs keyed by (parameter index,)
                constants = compiled.src.constants.items()
                named = {fn.arg_names[key[0]]: value for key, value in constants}
            except (AttributeError, IndexError, KeyError, TypeError):
                named = {}
            tile = " ".join(f"{k}={named[k]}" for k in shown if k in named)
            meta = compiled.metadata
            print(f"    {name} {tile} warps={meta.num_warps} stages={meta.num_stages} "
                  f"shared={meta.shared} regs={getattr(compiled, 'n_regs', '?')} "
                  f"spills={getattr(compiled, 'n_spills', '?')}")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", help="a library/attention folder of another commit")
    parser.add_argument("--dkdv", type=parse_tiles, default=[], help="dk/dv kernel tiles")
    parser.add_argument("--dq", type=parse_tiles, default=[], help="dq kernel tiles")
    parser.add_argument(
        "--switch",
        type=parse_switch,
        action="append",
        default=[],
        help="NAME=VALUE: ours with its private _ops.NAME set to VALUE (a Python literal)",
    )
    parser.add_argument("--shapes", type=bench.parse_shapes, default=[(4, 4096)])
    parser.add_argument("--dims", default="64,128")
    parser.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    parser.add_argument("--rep-ms", type=float, default=150.0)
    parser.add_argument("--block", type=int, default=4)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("benchmarks.diagnose.attention_versions needs a CUDA GPU")
    import kernels

    ours = bench.load_ours()
    versions = {OURS: ours}
    if args.baseline:
        # A copy from another commit, in a folder of its own: not the library's package, so not
        # kernels.library.load_library_package.
        versions[BASELINE] = kernels.get_local_kernel(args.baseline, "attention")
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    for batch, seqlen in args.shapes:
        for dim in map(int, args.dims.split(",")):
            block_d = max(16, 1 << (dim - 1).bit_length())
            contenders = contenders_at(versions, block_d, args.dkdv, args.dq, args.switch)
            for causal in causals:
                run_shape(contenders, batch, seqlen, dim, causal, args.rep_ms, args.block)
    for name, attn in versions.items():
        print(f"--- compiled kernels of {name}")
        register_use(attn)


if __name__ == "__main__":
    main()
