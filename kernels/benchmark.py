"""`Benchmark`: benchmark scripts shipped with a kernel repository, and the runner behind
``kernels benchmark``.

A kernel repository may carry ``benchmarks/benchmark*.py`` scripts. Each defines subclasses of
`Benchmark` whose ``benchmark_<workload>`` methods call the kernel; an optional
``verify_<workload>`` returns what the workload should have produced. The runner loads the
kernel, runs every workload of every script, checks it against its reference, times both,
and reports a table (and JSON).

Example (``activation/benchmarks/benchmark_silu.py``):
    ```python
    import torch
    from kernels.benchmark import Benchmark

    class SiluWorkloads(Benchmark):
        seed = 0

        def setup(self):
            self.x = torch.randn(4096, 2048, device=self.device)

        def benchmark_large(self):
            self.out = self.kernel.silu(self.x)

        def verify_large(self):
            return torch.nn.functional.silu(self.x)
    ```
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import math
import platform
import random
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

BENCHMARK_PREFIX = "benchmark_"
#: Tolerances of the check of a workload's output against its reference (``torch.allclose``).
ATOL = RTOL = 1e-2


class Benchmark:
    """Base class of a kernel repository's benchmarks.

    For each ``benchmark_<workload>`` method the runner makes a new instance, sets
    ``kernel`` (the imported kernel package) and ``device`` (``"cuda"`` when a GPU is
    visible, else ``"cpu"``), seeds torch and ``random`` with ``seed`` when it is set, and
    calls ``setup_<workload>()`` if the class defines it, else ``setup()``. The workload
    method is what is timed; it stores its result in ``self.out``. ``verify_<workload>()``,
    when defined, is the reference: it returns the tensor ``self.out`` should match
    (``torch.allclose`` with ``atol = rtol = 1e-2``) or a bool, and is timed like the
    workload, for the speedup column.

    Example:
        ```python
        import torch
        from kernels.benchmark import Benchmark

        class RMSNormWorkloads(Benchmark):
            seed = 0

            def setup(self):
                self.x = torch.randn(8192, 4096, device=self.device)
                self.w = torch.ones(4096, device=self.device)

            def benchmark_rms_norm(self):
                self.out = self.kernel.rms_norm(self.x, self.w, 1e-6)

            def verify_rms_norm(self):
                return self.w * self.x * torch.rsqrt(self.x.pow(2).mean(-1, keepdim=True) + 1e-6)
        ```
    """

    #: Seed for torch and ``random`` before each workload's setup; None leaves them alone.
    seed: int | None = None
    #: The device type to put tensors on; set by the runner.
    device: str = "cpu"

    def __init__(self) -> None:
        self.kernel: Any = None
        self.out: Any = None

    def setup(self) -> None:
        """Create the workload's inputs as attributes (the default does nothing)."""


@dataclass(frozen=True)
class Timing:
    """Wall time of one callable over `iterations` calls, each followed by a device sync."""

    iterations: int
    mean_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    q1_ms: float
    q3_ms: float
    #: Calls outside [q1 - 1.5 IQR, q3 + 1.5 IQR].
    outliers: int

    @property
    def iqr_ms(self) -> float:
        return self.q3_ms - self.q1_ms


@dataclass(frozen=True)
class WorkloadResult:
    """One workload: its timing, its reference's, and whether its output matched."""

    benchmark: str  # the Benchmark subclass
    workload: str  # the part after ``benchmark_``
    script: str
    timing: Timing
    reference: Timing | None = None
    #: None without a ``verify_<workload>``; False when the output differs (or it raised).
    verified: bool | None = None
    error: str | None = None

    @property
    def speedup(self) -> float | None:
        if self.reference is None or self.timing.mean_ms <= 0:
            return None
        return self.reference.mean_ms / self.timing.mean_ms


@dataclass(frozen=True)
class BenchmarkReport:
    """What ``kernels benchmark`` ran: where the kernel came from, on what, and the results."""

    kernel: str
    machine: dict[str, str]
    scripts_sha256: str
    results: tuple[WorkloadResult, ...]

    @property
    def ok(self) -> bool:
        return all(r.verified is not False and r.error is None for r in self.results)

    def to_dict(self) -> dict:
        results = []
        for r in self.results:
            entry = asdict(r)
            entry["speedup"] = r.speedup
            results.append(entry)
        return {
            "kernel": self.kernel,
            "machine": self.machine,
            "scripts_sha256": self.scripts_sha256,
            "results": results,
        }


def find_scripts(repo_dir: Path) -> list[Path]:
    """The ``benchmarks/benchmark*.py`` scripts of a kernel repository folder, sorted.

    Raises:
        FileNotFoundError: the folder has no such script; the message says where it looked.
    """
    scripts = sorted((repo_dir / "benchmarks").glob("benchmark*.py"))
    if not scripts:
        raise FileNotFoundError(
            f"{repo_dir} has no benchmark scripts: kernels benchmark runs "
            f"{repo_dir / 'benchmarks'}/benchmark*.py, each defining kernels.benchmark.Benchmark "
            "subclasses with benchmark_<workload> methods (docs/writing-kernels.md)."
        )
    return scripts


def benchmark_classes(script: Path) -> list[type[Benchmark]]:
    """Import `script` (under a name of its own) and return the `Benchmark` subclasses it defines."""
    digest = hashlib.sha256(str(script.resolve()).encode()).hexdigest()[:12]
    name = f"_kernels_benchmark_{script.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, script)
    if spec is None or spec.loader is None:
        raise ImportError(f"Cannot import benchmark script {script}.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return [
        value
        for value in vars(module).values()
        if inspect.isclass(value)
        and issubclass(value, Benchmark)
        and value is not Benchmark
        and value.__module__ == name
    ]


def run_benchmarks(
    kernel: ModuleType,
    scripts: Iterable[Path],
    *,
    iterations: int = 100,
    warmup: int = 10,
    kernel_description: str = "",
    progress: Callable[[str], None] = lambda line: None,
) -> BenchmarkReport:
    """Run every workload of every script against `kernel`.

    A workload whose setup, run or reference raises is reported with its error and not
    timed; the others still run.
    """
    device = _device()
    scripts = list(scripts)
    results: list[WorkloadResult] = []
    for script in scripts:
        classes = benchmark_classes(script)
        if not classes:
            raise ValueError(f"{script} defines no kernels.benchmark.Benchmark subclass.")
        for cls in classes:
            workloads = sorted(n for n in dir(cls) if n.startswith(BENCHMARK_PREFIX))
            if not workloads:
                raise ValueError(f"{cls.__name__} in {script} has no benchmark_<workload> method.")
            for method in workloads:
                workload = method[len(BENCHMARK_PREFIX) :]
                progress(f"{script.name}: {cls.__name__}.{workload} on {device}")
                results.append(
                    _run_workload(cls, workload, kernel, device, script, iterations, warmup)
                )
    return BenchmarkReport(
        kernel=kernel_description or getattr(kernel, "__name__", str(kernel)),
        machine=machine_info(),
        scripts_sha256=_sha256(scripts),
        results=tuple(results),
    )


def _run_workload(cls, workload, kernel, device, script, iterations, warmup) -> WorkloadResult:
    instance = cls()
    instance.kernel = kernel
    instance.device = device
    base = dict(benchmark=cls.__name__, workload=workload, script=script.name)
    try:
        _seed(instance.seed)
        getattr(instance, f"setup_{workload}", instance.setup)()
        run = getattr(instance, BENCHMARK_PREFIX + workload)
        verify = getattr(instance, f"verify_{workload}", None)
        verified = reference = None
        if verify is not None:
            run()
            _synchronize()
            verified = _matches(instance.out, verify())
            reference = time_calls(verify, iterations=iterations, warmup=warmup)
        timing = time_calls(run, iterations=iterations, warmup=warmup)
    except Exception as exc:  # reported in its row, the other workloads still run
        empty = Timing(0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan, 0)
        return WorkloadResult(**base, timing=empty, error=f"{type(exc).__name__}: {exc}")
    return WorkloadResult(**base, timing=timing, reference=reference, verified=verified)


def time_calls(fn: Callable[[], object], *, iterations: int, warmup: int) -> Timing:
    """Call `fn` `warmup` times, then time `iterations` calls (each followed by a device sync)."""
    for _ in range(warmup):
        fn()
        _synchronize()
    times = []
    for _ in range(max(1, iterations)):
        start = time.perf_counter()
        fn()
        _synchronize()
        times.append((time.perf_counter() - start) * 1000)
    mean = sum(times) / len(times)
    std = math.sqrt(sum((t - mean) ** 2 for t in times) / len(times))
    ordered = sorted(times)
    q1, q3 = _percentile(ordered, 25), _percentile(ordered, 75)
    low, high = q1 - 1.5 * (q3 - q1), q3 + 1.5 * (q3 - q1)
    outliers = sum(1 for t in times if t < low or t > high)
    return Timing(len(times), mean, std, ordered[0], ordered[-1], q1, q3, outliers)


def _percentile(ordered: list[float], p: float) -> float:
    position = (len(ordered) - 1) * p / 100
    lower = int(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (position - lower)


def _matches(out: object, expected: object) -> bool:
    import torch

    if isinstance(expected, bool):
        return expected
    if not isinstance(expected, torch.Tensor) or not isinstance(out, torch.Tensor):
        raise TypeError(
            "verify_<workload> must return a bool, or a tensor to compare with self.out (which "
            f"the workload must set); got {type(expected).__name__} and self.out of type "
            f"{type(out).__name__}."
        )
    if out.shape != expected.shape:
        return False
    return bool(torch.allclose(out.float(), expected.float(), atol=ATOL, rtol=RTOL))


def _seed(seed: int | None) -> None:
    if seed is None:
        return
    import torch

    random.seed(seed)
    torch.manual_seed(seed)  # all devices


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _sha256(scripts: list[Path]) -> str:
    hasher = hashlib.sha256()
    for script in scripts:
        hasher.update(script.read_bytes())
    return hasher.hexdigest()


def machine_info() -> dict[str, str]:
    """The GPU (or none), CPU, OS and torch version the benchmarks ran on."""
    import torch

    gpu = "none"
    if torch.cuda.is_available():
        runtime = f"ROCm {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}"
        gpu = f"{torch.cuda.get_device_name(0)} ({runtime})"
    return {
        "gpu": gpu,
        "cpu": platform.processor() or platform.machine() or "unknown",
        "os": f"{platform.system()} {platform.release()}",
        "torch": torch.__version__,
    }


def format_report(report: BenchmarkReport) -> str:
    """The results as a plain-text table, with the machine and the kernel above it."""
    lines = [f"kernel  {report.kernel}"]
    lines += [f"{key:<7} {value}" for key, value in report.machine.items()]
    header: tuple[str, ...] = ("Benchmark", "Workload", "N", "Mean(ms)", "Std(ms)", "Min(ms)")
    header += ("Max(ms)", "IQR(ms)", "Outliers", "Ref(ms)", "Speedup", "Match")
    rows = [header]
    for r in report.results:
        t = r.timing
        ref = "" if r.reference is None else f"{r.reference.mean_ms:.4f}"
        speedup = "" if r.speedup is None else f"{r.speedup:.2f}x"
        match = {None: "-", True: "yes", False: "NO"}[r.verified]
        if r.error is not None:
            match = "error"
        rows.append(
            (r.benchmark, r.workload, str(t.iterations), f"{t.mean_ms:.4f}", f"{t.std_ms:.4f}")
            + (f"{t.min_ms:.4f}", f"{t.max_ms:.4f}", f"{t.iqr_ms:.4f}", str(t.outliers))
            + (ref, speedup, match)
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    table = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    table.insert(1, "  ".join("-" * w for w in widths))
    lines += ["", *table]
    for r in report.results:
        if r.error is not None:
            lines.append(f"{r.benchmark}.{r.workload}: {r.error}")
        elif r.verified is False:
            lines.append(
                f"{r.benchmark}.{r.workload}: output differs from verify_{r.workload}() "
                f"(torch.allclose, atol={ATOL}, rtol={RTOL})"
            )
    return "\n".join(lines)
