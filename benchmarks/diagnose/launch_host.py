"""Host time per call of the library's launchers: what Python spends before a kernel runs.

    python -m benchmarks.diagnose.launch_host                        # CPU, launches stubbed
    python -m benchmarks.diagnose.launch_host --baseline /tmp/base   # A/B against another copy
    python -m benchmarks.diagnose.launch_host --gpu                  # real launches on a GPU

Each case calls one launcher (``rms_norm_forward``, ``layer_norm_forward``, ``gated_pair_forward``,
``rotary_forward``, ...) at a small shape, ``--calls`` times in a row, and reports the median of
``--rounds`` such runs in microseconds per call. On the CPU (the default) every package's
``launch`` is replaced by a function that does nothing, so that only the launcher's own Python
runs: its checks, plan lookup, allocations and argument packing. With ``--gpu`` the kernels are
launched for real (the first call of each case compiles them, outside the timing); a
launcher's host time then includes ``_library.launch``'s key and direct launch, and the kernels
are small enough that the GPU keeps up with the host.

``--baseline DIR``: a ``library/`` folder of another commit (``git archive REV library | tar -x
-C DIR``, then ``--baseline DIR/library``), loaded beside this checkout's; the rounds interleave
the two, so that a drift of the machine's speed hits both alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

PACKAGES = ("norm", "activation", "rotary", "loss", "attention")


def _load(library: str | None) -> dict:
    """The packages of this checkout's library (None: built from its sources, as the package
    loads them), or of a ``library/`` folder of another commit whose repositories hold a
    ``build/`` (as commits before the builds left git do; else run ``make library`` there)."""
    import kernels
    from kernels.library import load_library_package

    if library is None:
        return {name: load_library_package(name) for name in PACKAGES}
    return {name: kernels.get_local_kernel(os.path.join(library, name), name) for name in PACKAGES}


def _modules(package) -> dict:
    prefix = package.__name__ + "."
    return {
        name[len(prefix) :]: m for name, m in list(sys.modules.items()) if name.startswith(prefix)
    }


def _stub_launches(package) -> None:
    """Replace ``launch`` in each of ``package``'s modules by a function that does nothing."""

    def launch(*args, **kwargs):
        return None

    for module in _modules(package).values():
        if callable(getattr(module, "launch", None)):
            module.launch = launch


def _cases(lib: dict, device: str) -> dict:
    """name -> a closure that makes one launcher call, at a small shape."""
    import torch

    norm, act, rot = _modules(lib["norm"]), _modules(lib["activation"]), _modules(lib["rotary"])
    rms, ln, gated, elementwise = (
        norm["rms_norm"],
        norm["layer_norm"],
        act["gated"],
        act["elementwise"],
    )
    rotary, kv_cache, decode = rot["rotary"], rot["kv_cache"], act["decode_mlp"]
    ops = _modules(lib["attention"])["_ops"]
    dt = torch.bfloat16
    x = torch.randn(4, 2048, device=device, dtype=dt)
    r = torch.randn_like(x)
    w = torch.randn(2048, device=device, dtype=dt)
    y, _, rstd = rms.rms_norm_forward(x, None, w, 1e-6, rms.LLAMA)
    _, mean, ln_rstd = ln.layer_norm_forward(x, [2048], w, w, 1e-5)
    gate, up = (
        torch.randn(4, 8192, device=device, dtype=dt),
        torch.randn(4, 8192, device=device, dtype=dt),
    )
    q = torch.randn(1, 32, 4, 128, device=device, dtype=dt)
    k = torch.randn(1, 8, 4, 128, device=device, dtype=dt)
    cos = torch.randn(1, 4, 128, device=device, dtype=dt)
    sin = torch.randn(1, 4, 128, device=device, dtype=dt)
    token = torch.randn(1, 1, 2048, device=device, dtype=dt)  # a decode step's hidden state
    wg, wu = (torch.randn(8192, 2048, device=device, dtype=dt) for _ in range(2))
    cache = torch.zeros(1, 8, 256, 128, device=device, dtype=dt)
    step = torch.randn(1, 8, 1, 128, device=device, dtype=dt)
    counter = torch.zeros(1, device=device, dtype=torch.int64)
    scale = 128**-0.5
    q1 = torch.randn(1, 1, 32, 128, device=device, dtype=dt)  # a decode step's query
    kv = torch.randn(1, 256, 8, 128, device=device, dtype=dt)
    qp, kp = torch.randn(1, 128, 32, 128, device=device, dtype=dt), kv[:, :128]
    outp, lsep = ops._forward_impl(qp, kp, kp, *[None] * 5, 128, 128, scale, -1, 0, 0.0)
    qkv = [torch.randn(n, 2048, device=device, dtype=dt) for n in (2048, 512, 512)]
    return {
        "rms_norm_forward": lambda: rms.rms_norm_forward(x, None, w, 1e-6, rms.LLAMA, False),
        "rms_norm_forward (add)": lambda: rms.rms_norm_forward(x, r, w, 1e-6, rms.LLAMA, False),
        "rms_norm_backward": lambda: rms.rms_norm_backward(y, None, x, w, rstd, rms.LLAMA, True),
        "layer_norm_forward": lambda: ln.layer_norm_forward(x, [2048], w, w, 1e-5, False),
        "layer_norm_backward": lambda: ln.layer_norm_backward(
            y, x, [2048], w, mean, ln_rstd, True, True, dt, True
        ),
        "activation_forward (silu)": lambda: elementwise.activation_forward(gate, 0),
        "gated_pair_forward (silu_mul)": lambda: gated.gated_pair_forward(gate, up, 0),
        "gated_forward (silu_and_mul)": lambda: gated.gated_forward(gate, 0),
        "gated_pair_backward": lambda: gated.gated_pair_backward(gate, gate, up, 0),
        "rotary_forward": lambda: rotary.rotary_forward(q, k, cos, sin, 1),
        "write_kv_cache (decode)": lambda: kv_cache.write_kv_cache(
            cache, cache, step, step, counter=counter
        ),
        "attention forward (decode step)": lambda: ops._forward_impl(
            q1, kv, kv, *[None] * 5, 1, 256, scale, -1, -1, 0.0
        ),
        "attention forward (prefill)": lambda: ops._forward_impl(
            qp, kp, kp, *[None] * 5, 128, 128, scale, -1, 0, 0.0
        ),
        "attention backward": lambda: ops._backward_impl(
            outp, qp, kp, kp, outp, lsep, None, None, 128, 128, scale, -1, 0, 0.0
        ),
        "gated_gemv (decode)": lambda: decode.gated_gemv(token, wg, None, wu, None, 0),
        "grouped_linear_decode": lambda: decode.grouped_linear_decode(token, qkv, None),
    }


def _time_us(fn, calls: int, sync) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    sync()
    return elapsed / calls * 1e6


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--library", help="the library/ timed (default: this checkout's, built from its sources)"
    )
    parser.add_argument("--baseline", help="a library/ folder of another commit, timed alongside")
    parser.add_argument("--gpu", action="store_true", help="real launches on a CUDA GPU")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--cases", nargs="*", help="names (or parts of names) of cases to time")
    args = parser.parse_args(argv)
    if not args.gpu:
        # The CPU runs the rotary launcher only where the interpreter is on (else it takes
        # PyTorch's formula); with launches stubbed, nothing is interpreted.
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    if args.gpu and not torch.cuda.is_available():
        sys.exit("--gpu needs a CUDA GPU")
    device = "cuda" if args.gpu else "cpu"
    sync = torch.cuda.synchronize if args.gpu else (lambda: None)
    versions = {"this": _load(args.library and os.path.abspath(args.library))}
    if args.baseline:
        versions["baseline"] = _load(os.path.abspath(args.baseline))
    cases = {}
    for label, lib in versions.items():
        if not args.gpu:
            for package in lib.values():
                _stub_launches(package)
        cases[label] = _cases(lib, device)
    names = [n for n in cases["this"] if not args.cases or any(c in n for c in args.cases)]
    with torch.inference_mode(False), torch.no_grad():
        for fns in cases.values():
            for name in names:
                fns[name]()  # compile, plan
        sync()
        times = {(label, name): [] for label in cases for name in names}
        order = list(cases)
        for _ in range(args.rounds):
            order.reverse()  # each version goes first in every other round
            for name in names:
                for label in order:
                    times[label, name].append(_time_us(cases[label][name], args.calls, sync))
    where = torch.cuda.get_device_name() if args.gpu else "CPU, launches stubbed"
    print(
        f"host time per call, us: median (least) of {args.rounds} rounds of {args.calls}; {where}"
    )
    header = f"{'launcher':32s}" + "".join(f"{label:>16s}" for label in cases)
    print(header + ("  ratio (median of rounds)" if args.baseline else ""))
    for name in names:
        row = f"{name:32s}"
        for label in cases:
            t = times[label, name]
            row += f"{statistics.median(t):8.2f} ({min(t):5.2f})"
        if args.baseline:
            # Each round times both back to back: the ratio within a round cancels the drift of
            # a shared machine's load, which moves both alike.
            ratios = [
                a / b for a, b in zip(times["this", name], times["baseline", name], strict=True)
            ]
            row += f"{statistics.median(ratios):10.3f}"
        print(row)


if __name__ == "__main__":
    main()
