"""Where a step's time goes: a `torch.profiler` run read as device time per kernel family.

`benchmarks.e2e --profile` profiles each contender's training step and prefill with these
functions, so that two configurations whose wall times differ by a few per cent can be told
apart by what their GPUs ran (matmuls, attention, inductor's fused kernels, ours) and by how
long the device sat idle waiting for the host.
"""

from __future__ import annotations

import re

#: The driver calls that launch a kernel, as the profiler names them.
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")

#: Kernel families, the first whose pattern matches a kernel's name (lower case) wins. Inductor
#: names its Triton kernels ``triton_<kind>_fused_<the ops fused>``, which may name attention;
#: SDPA's memory-efficient kernels are CUTLASS ones, hence attention before gemm. Our library's
#: kernels are Triton functions whose names start with an underscore.
FAMILIES = (
    ("inductor", re.compile(r"^triton_")),
    ("attention", re.compile(r"flash|fmha|cudnn|attention|sdpa")),
    ("gemm", re.compile(r"gemm|nvjet|cutlass|xmma|cublas")),
    ("ours", re.compile(r"^_")),
    ("copy / fill", re.compile(r"copy|fill|memset|memcpy|cat(?:array)?batched")),
    ("elementwise (aten)", re.compile(r"elementwise|vectorized|reduce_kernel|unrolled")),
)


def kernel_family(name: str) -> str:
    """The family (``FAMILIES``) of a kernel's profiler name, or ``"other"``."""
    lowered = name.lower()
    for family, pattern in FAMILIES:
        if pattern.search(lowered):
            return family
    return "other"


def summarize_profile(prof, steps: int, wall_ms_per_step: float | None = None) -> dict:
    """Per step: device time of all kernels and per family, kernel launches, the CPU time of
    the profiled ops (the host's work, with the profiler's own cost), the 15 kernels with most
    device time, the device's largest idle stretches (`device_gaps`) and, given the step's wall
    time, the device's idle share of it."""
    from torch.autograd import DeviceType

    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    device_ms = sum(e.self_device_time_total for e in kernels) / steps / 1e3
    families: dict[str, float] = {}
    for e in kernels:
        family = kernel_family(e.key)
        families[family] = families.get(family, 0.0) + e.self_device_time_total / steps / 1e3
    top = sorted(kernels, key=lambda e: e.self_device_time_total, reverse=True)[:15]
    summary = {
        "device_ms_per_step": device_ms,
        "families_ms_per_step": dict(sorted(families.items(), key=lambda kv: -kv[1])),
        "profiled_cpu_ms_per_step": sum(e.self_cpu_time_total for e in events) / steps / 1e3,
        "launches_per_step": sum(e.count for e in events if e.key in LAUNCHES) / steps,
        "top_kernels": [
            {
                "name": e.key,
                "family": kernel_family(e.key),
                "ms_per_step": e.self_device_time_total / steps / 1e3,
                "calls_per_step": e.count / steps,
            }
            for e in top
        ],
        "largest_gaps": device_gaps(kernels_in_order(prof)),
    }
    if wall_ms_per_step is not None:
        summary["wall_ms_per_step"] = wall_ms_per_step
        summary["device_idle_share"] = max(0.0, 1.0 - device_ms / wall_ms_per_step)
    return summary


def kernels_in_order(prof) -> list[tuple[float, float, str]]:
    """(start, end, name) of every kernel the profile recorded, µs, by start."""
    from torch.autograd import DeviceType

    spans = [
        (e.time_range.start, e.time_range.end, e.name)
        for e in prof.events()
        if e.device_type == DeviceType.CUDA
    ]
    return sorted(spans)


def device_gaps(spans: list[tuple[float, float, str]], largest: int = 8) -> list[dict]:
    """The ``largest`` stretches in which the device ran no kernel between two of ``spans``
    (the device waiting for the host: a synchronisation, a slow stretch of Python), each with
    the kernels before and after it, largest first."""
    gaps = []
    busy_until = None
    previous = ""
    for start, end, name in spans:
        if busy_until is not None and start > busy_until:
            gaps.append({"us": start - busy_until, "after": previous, "before": name})
        if busy_until is None or end > busy_until:
            busy_until, previous = end, name
    return sorted(gaps, key=lambda g: -g["us"])[:largest]


def family_table(summaries: dict[str, dict]) -> list[str]:
    """A markdown table: one row per contender, its wall, host (to issue the step, where
    recorded) and device ms per step, launches, and device ms per kernel family."""
    families = sorted(
        {f for s in summaries.values() for f in s["families_ms_per_step"]},
        key=lambda f: -max(s["families_ms_per_step"].get(f, 0.0) for s in summaries.values()),
    )
    head = ["contender", "wall ms", "host ms", "device ms", "idle", "launches", *families]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in summaries.items():
        wall, host = s.get("wall_ms_per_step"), s.get("host_ms_per_step")
        idle = s.get("device_idle_share")
        cells = [
            name,
            f"{wall:.2f}" if wall is not None else "",
            f"{host:.2f}" if host is not None else "",
            f"{s['device_ms_per_step']:.2f}",
            f"{idle:.0%}" if idle is not None else "",
            f"{s['launches_per_step']:.0f}",
            *(f"{s['families_ms_per_step'].get(f, 0.0):.2f}" for f in families),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines
