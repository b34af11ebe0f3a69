"""Cold start: from a fresh process to the end of the first training step and to the first
generated tokens, and how much of that is Triton compiling.

    python -m benchmarks.cold_start     # writes benchmarks/results/<device>/cold_start

Each case runs in a fresh Python process (``python -m benchmarks.cold_start --child CASE``), on
the 1.1B Llama-style model of `benchmarks.llama` (random weights, bf16):

- ``train``: import, build, kernelize (TRAINING, our fused loss), then one training step
  (forward and backward of the loss at 8x512), synchronised;
- ``generate``: import, build, then ``fast_generate(..., kernels=True)``: a first call of one
  new token (prefill: the time to the first token) and a first call of 128 (decode graphs
  captured, the fused loop compiled);
- ``eager-train`` and ``eager-generate``: the same without our kernels (plain transformers
  training step, ``model.generate``): what a cold start costs with no Triton at all.

With ``--binaries``, each of ours first runs on an empty cache that the packages seed from the
Triton binaries they ship (``binaries``; cold and warm runs turn seeding off with
``KERNELS_TRITON_BINARIES=0``). ``--keep-cache DIR`` keeps each case's cold cache as
``DIR/<case>``, for ``library/binaries.py capture DIR/*``; with ``--compile-for a100`` (or
``b200``) the cases of ours run once, compiling for that GPU on this one and launching nothing
(`pretend_gpu`): the capture of another GPU's binaries. Each of ours runs twice, in order: ``cold``, with an empty Triton cache (``TRITON_CACHE_DIR`` a
new folder), and ``warm``, a new process on the cache the cold run filled: the cold run's
extra time is what compiling costs, and the warm run is what shipped binaries could at best
give. Inside each process the time spent in Triton's compiler (``triton.compiler.compile``)
and in building C modules (``triton.runtime.build``: the launcher and driver utilities) is
summed by wrapping those functions, and the kernels compiled are counted.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.results_io import default_out, save_results

CASES = ("train", "generate", "eager-train", "eager-generate")
TRAIN_SHAPE = (8, 512)
PROMPT = 128
NEW_TOKENS = 128
#: Where a child prints its result, one JSON line after this marker.
MARKER = "COLD_START_RESULT "
#: GPUs whose binaries ``--compile-for`` captures on another one: (major, minor, SMs). The SM
#: count matters as much as the architecture: our launch tables read it (split-K, grid sizes),
#: and with them the kernels' constexprs and Triton's cache keys.
OTHER_GPUS = {"a100": (8, 0, 108), "b200": (10, 0, 148)}


# ---- inside one fresh process ------------------------------------------------------------------


class TritonClock:
    """Sums the time spent in Triton's compiler and in its C builds, by wrapping them.

    Wraps ``triton.compiler.compile`` (which ``JITFunction`` looks up when it first binds a
    kernel, so wrapping it before any launch catches every compile) and every module-level
    builder in ``triton.runtime.build`` (the launcher's and driver utilities' C sources)."""

    def __init__(self):
        self.compile_s = 0.0
        self.compiles: list[tuple[str, float]] = []
        self.c_build_s = 0.0
        self.c_builds = 0
        self.wrapped: list[str] = []

    def install(self) -> None:
        import triton.compiler
        import triton.compiler.compiler
        import triton.runtime.build as build

        compile_fn = triton.compiler.compile

        def timed_compile(src, *args, **kwargs):
            start = time.perf_counter()
            try:
                return compile_fn(src, *args, **kwargs)
            finally:
                seconds = time.perf_counter() - start
                self.compile_s += seconds
                name = getattr(getattr(src, "fn", None), "__name__", None) or str(src)[:60]
                self.compiles.append((name, seconds))

        triton.compiler.compile = timed_compile
        triton.compiler.compiler.compile = timed_compile
        self.wrapped.append("triton.compiler.compile")
        # The outermost builder is enough: compile_module_from_src/file call _build inside.
        builder = next(
            (
                n
                for n in ("compile_module_from_src", "compile_module_from_file", "_build")
                if hasattr(build, n)
            ),
            None,
        )
        if builder is not None:
            self._wrap_build(build, builder)
            self.wrapped.append(f"triton.runtime.build.{builder}")
            # Drivers import the builder by name; point those names at the wrapper too.
            for module in list(sys.modules.values()):
                if getattr(module, "__name__", "").startswith("triton.backends.") and hasattr(
                    module, builder
                ):
                    setattr(module, builder, getattr(build, builder))

    def _wrap_build(self, module, name: str) -> None:
        original = getattr(module, name)

        def timed_build(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.c_build_s += time.perf_counter() - start
                self.c_builds += 1

        setattr(module, name, timed_build)

    def summary(self) -> dict:
        slowest = sorted(self.compiles, key=lambda item: -item[1])[:8]
        return {
            "triton_compile_s": round(self.compile_s, 3),
            "kernels_compiled": len(self.compiles),
            "slowest_compiles": [[name, round(s, 3)] for name, s in slowest],
            "c_build_s": round(self.c_build_s, 3),
            "c_builds": self.c_builds,
            "wrapped": self.wrapped,
        }


class Phases:
    """Wall-clock seconds of each phase, and the time since the process started."""

    def __init__(self, started: float):
        self.started = started
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str):
        start = time.time()
        yield
        torch = sys.modules.get("torch")  # the import phase is timed before torch is imported
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        self.seconds[name] = round(time.time() - start, 3)
        self.seconds[f"{name} (since start)"] = round(time.time() - self.started, 3)


def pretend_gpu(major: int, minor: int, sms: int) -> None:
    """Make this process compile for another GPU: Triton's target, and the capability and SM
    count that torch reports (which our launch tables read), are that GPU's. With
    ``KERNELS_TRITON_COMPILE_ONLY=1`` our launches then compile without running: the results
    are garbage, the Triton cache is that GPU's."""
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    real_properties = torch.cuda.get_device_properties

    class Properties:
        """The real device's properties but for the architecture and SM count."""

        def __init__(self, real):
            self._real = real
            self.major, self.minor, self.multi_processor_count = major, minor, sms

        def __getattr__(self, name):
            return getattr(self._real, name)

    torch.cuda.get_device_properties = lambda device=None: Properties(real_properties(device))
    torch.cuda.get_device_capability = lambda device=None: (major, minor)
    target = GPUTarget("cuda", major * 10 + minor, 32)
    driver.active.get_current_target = lambda: target


def child(case: str, started: float) -> dict:
    """Run ``case`` in this (fresh) process; its phases and Triton's share."""
    other = os.environ.get("COLD_START_COMPILE_FOR")
    if other:
        pretend_gpu(*OTHER_GPUS[other])
    phases = Phases(started)
    clock = TritonClock()
    with phases.phase("import"):
        import torch  # noqa: F401
        import transformers  # noqa: F401

        import kernels  # noqa: F401

        clock.install()
        if os.environ.get("KERNELS_RECORD_LAUNCHES") == "1":
            # A capture: each launch that compiles, for library/binaries.py (build, verify).
            from kernels.library.triton_launches import recording

            recording(os.environ["TRITON_CACHE_DIR"]).__enter__()  # until the process ends
        from benchmarks import llama
    if case in ("train", "eager-train"):
        tokens = llama.tokens_for("x".join(str(v) for v in TRAIN_SHAPE))
        if case == "train":
            with phases.phase("build and kernelize"):
                model = llama.build_ours(None, compile_mode=False, fused_ce=True)
        else:
            with phases.phase("build"):
                model = llama.build()
        with phases.phase("first training step"):
            llama.training_step(model, tokens)
        with phases.phase("second training step"):
            llama.training_step(model, tokens)
    else:
        with phases.phase("build"):
            model = llama.build().eval()
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        ids = llama.tokens_for(f"1x{PROMPT}")
        mask = torch.ones_like(ids)
        if case == "generate":
            from kernels.generation import fast_generate

            def generate(n):
                return fast_generate(
                    model, ids, attention_mask=mask, max_new_tokens=n, do_sample=False, kernels=True
                )
        else:

            def generate(n):
                return model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False)

        with phases.phase("first token"):
            generate(1)
        with phases.phase(f"first call of {NEW_TOKENS} tokens"):
            generate(NEW_TOKENS)
        with phases.phase(f"second call of {NEW_TOKENS} tokens"):
            generate(NEW_TOKENS)
    return {"case": case, "phases": phases.seconds, **clock.summary()}


# ---- the parent: fresh processes, cold and warm caches --------------------------------------


def run_case(
    case: str,
    cache_dir: str,
    temperature: str,
    compile_for: str | None = None,
    record: bool = False,
) -> dict:
    env = dict(os.environ, TRITON_CACHE_DIR=cache_dir, PYTHONUNBUFFERED="1")
    if compile_for is not None:  # a capture for another GPU: compile, never launch
        env.update(COLD_START_COMPILE_FOR=compile_for, KERNELS_TRITON_COMPILE_ONLY="1")
    if record:  # a cache kept for a capture: record each launch that compiles beside it
        env["KERNELS_RECORD_LAUNCHES"] = "1"
    # Only the `binaries` runs seed the cache from the Triton binaries the packages ship
    # (docs/writing-kernels.md, Shipped Triton binaries); cold and warm runs compile as if
    # there were none.
    env["KERNELS_TRITON_BINARIES"] = "1" if temperature == "binaries" else "0"
    # Nothing here uses Inductor; a fresh folder keeps a stray cache from hiding a compile.
    env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_dir, "inductor")
    spawned = time.time()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.cold_start",
            "--child",
            case,
            "--started",
            repr(spawned),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.time() - spawned
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARKER)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(
            f"{case} ({temperature}) failed (exit {done.returncode}):\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    result = json.loads(lines[-1][len(MARKER) :])
    result.update(
        cache=temperature,
        process_wall_s=round(wall, 3),
        cache_files=sum(len(files) for _, _, files in os.walk(cache_dir)),
    )
    print(
        f"{case:15} {temperature:5} {wall:7.2f} s  triton compile {result['triton_compile_s']:6.2f} s"
        f" ({result['kernels_compiled']} kernels), C builds {result['c_build_s']:5.2f} s "
        f"({result['c_builds']})  {result['phases']}",
        flush=True,
    )
    return result


def measure(
    cases, *, binaries: bool = False, keep_cache: Path | None = None, compile_for: str | None = None
) -> list[dict]:
    """Each case cold then warm on one new cache; with ``binaries``, first on an empty cache
    that the packages' shipped binaries seed. ``keep_cache``: each case's cold run's cache is
    ``keep_cache/<case>`` (new or empty), kept for ``library/binaries.py capture``.
    ``compile_for`` (one of `OTHER_GPUS`, with ``keep_cache``): one cold run per case of ours
    that compiles for that GPU and launches nothing."""
    if compile_for is not None:
        assert keep_cache is not None
        ours = [case for case in cases if not case.startswith("eager")]
        for case in ours:
            (keep_cache / case).mkdir(parents=True, exist_ok=True)
        return [
            run_case(case, str(keep_cache / case), "cold", compile_for, record=True)
            for case in ours
        ]
    results = []
    for case in cases:
        if binaries and not case.startswith("eager"):
            with tempfile.TemporaryDirectory(prefix="triton-binaries-") as cache_dir:
                results.append(run_case(case, cache_dir, "binaries"))
        with contextlib.ExitStack() as stack:
            if keep_cache is not None:
                (keep_cache / case).mkdir(parents=True, exist_ok=True)
                cache_dir = str(keep_cache / case)
            else:
                cache_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="triton-cold-"))
            temperatures = ("cold",) if case.startswith("eager") else ("cold", "warm")
            for temperature in temperatures:
                kept = keep_cache is not None and temperature == "cold"
                results.append(run_case(case, cache_dir, temperature, record=kept))
    return results


def metadata() -> dict:
    import torch
    import transformers
    import triton

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "train_shape": "x".join(map(str, TRAIN_SHAPE)),
        "prompt": PROMPT,
        "new_tokens": NEW_TOKENS,
    }


def _ends(result: dict) -> tuple[str, float]:
    phases = result["phases"]
    key = next(
        k for k in ("first training step (since start)", "first token (since start)") if k in phases
    )
    return key.replace(" (since start)", ""), phases[key]


def write_markdown(meta: dict, results: list, path) -> None:
    lines = [
        "# Cold start",
        "",
        f"{meta['device']}, torch {meta['torch']}, Triton {meta['triton']}, transformers "
        f"{meta['transformers']}, {meta['date']}. Each row a fresh process; `cold` with an empty "
        "Triton cache, `warm` a new process on the cache the cold run filled. Seconds.",
        "",
        "| case | cache | process start to end of first step / first token | first call of "
        f"{meta['new_tokens']} tokens (since start) | Triton compiling | kernels compiled | C builds "
        "| phases |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        what, at = _ends(r)
        call = r["phases"].get(f"first call of {meta['new_tokens']} tokens (since start)")
        phases = ", ".join(f"{k} {v:.2f}" for k, v in r["phases"].items() if "since" not in k)
        lines.append(
            f"| {r['case']} | {r['cache']} | {at:.2f} ({what}) | {'—' if call is None else f'{call:.2f}'} "
            f"| {r['triton_compile_s']:.2f} | {r['kernels_compiled']} | {r['c_build_s']:.2f} ({r['c_builds']}) "
            f"| {phases} |"
        )
    lines += ["", "Slowest compiles (cold runs):", ""]
    for r in results:
        if r["cache"] in ("cold", "binaries") and r["slowest_compiles"]:
            top = ", ".join(f"{name} {s:.2f}" for name, s in r["slowest_compiles"])
            lines.append(f"- {r['case']}: {top}")
    Path(path).write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {CASES}")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--binaries",
        action="store_true",
        help="also run each case on an empty cache seeded from the shipped Triton binaries",
    )
    parser.add_argument(
        "--keep-cache",
        type=Path,
        metavar="DIR",
        help="keep each case's cold Triton cache as DIR/<case> (DIR new or empty), to capture from",
    )
    parser.add_argument(
        "--compile-for",
        choices=sorted(OTHER_GPUS),
        help="with --keep-cache: compile our cases' kernels for this GPU instead of running "
        "them (a capture of its binaries on another GPU; no timings are saved)",
    )
    parser.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--started", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = child(args.child, args.started or time.time())
        print(MARKER + json.dumps(result), flush=True)
        return 0
    cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s) {unknown}: choose from {', '.join(CASES)}")
    if args.compile_for is not None and (args.keep_cache is None or args.binaries):
        parser.error("--compile-for captures: it needs --keep-cache DIR, and no --binaries")
    out = None if args.compile_for else (args.out or default_out("cold_start"))
    if args.keep_cache is not None and args.keep_cache.exists() and any(args.keep_cache.iterdir()):
        parser.error(
            f"--keep-cache {args.keep_cache} is not empty: a cold run needs an empty cache"
        )
    if args.compile_for is not None:
        measure(cases, keep_cache=args.keep_cache, compile_for=args.compile_for)
        return 0
    assert out is not None
    out.mkdir(parents=True, exist_ok=True)
    results = measure(cases, binaries=args.binaries, keep_cache=args.keep_cache)
    save_results(out, metadata(), results, write_markdown)
    print(Path(out, "results.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
