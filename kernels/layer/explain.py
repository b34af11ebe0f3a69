"""`explain`: what `kernelize` would do with each tagged layer, and why, without doing it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..mapping.mode import Mode
from .decisions import DeviceSpec
from .fallback import KernelizeFallback
from .graphs import graph_safety
from .kernelize import plan
from .taggers import run_taggers

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class LayerExplanation:
    """The decision for one group of modules: same class, same tag, same outcome."""

    paths: tuple[str, ...]
    module_class: str
    layer_name: str
    #: "kernel" (the module would run a kernel), "fallback" (its own forward), "skipped" (the
    #: layer's condition returned False for the instance, so it keeps its own forward), or
    #: "invalid" (the chosen kernel breaks the kernel layer rules; kernelize would raise).
    outcome: str
    #: The kernel layer and where it comes from, when one was chosen.
    kernel: str | None
    #: Why this outcome.
    reason: str
    #: Every registered candidate for the layer on this device, with why it won or lost.
    candidates: tuple[tuple[str, str], ...]
    #: Whether the forward it would run can be captured in a CUDA graph and a torch.compile
    #: graph, and why not (`kernels.layer.graphs`); None for an invalid kernel.
    graphs: str | None = None


@dataclass(frozen=True)
class Explanation:
    """What kernelize would do with a model; ``str()`` renders it as a readable report."""

    mode: Mode
    device_type: str
    capability: int | None
    layers: tuple[LayerExplanation, ...]

    def __str__(self) -> str:
        capability = "" if self.capability is None else f", capability {self.capability}"
        lines = [f"kernelize plan for mode {self.mode} on {self.device_type}{capability}:"]
        if not self.layers:
            lines.append("  no tagged layers in this model")
        for layer in self.layers:
            where = layer.paths[0] or "<model>"
            if len(layer.paths) > 1:
                where += f" and {len(layer.paths) - 1} more"
            lines.append(f"- {layer.layer_name} ({layer.module_class}) at {where}")
            if layer.outcome == "kernel":
                lines.append(f"    uses {layer.kernel}: {layer.reason}")
            elif layer.outcome == "skipped":
                lines.append(f"    kernelization skipped: {layer.reason}")
            elif layer.outcome == "invalid":
                lines.append(f"    INVALID kernel, kernelize would raise: {layer.reason}")
            else:
                lines.append(f"    keeps its own forward: {layer.reason}")
            if layer.graphs is not None:
                lines.append(f"    graphs: {layer.graphs}")
            for candidate, why in layer.candidates:
                lines.append(f"    candidate {candidate}: {why}")
        return "\n".join(lines)


def explain(model: nn.Module, *, mode: Mode, device: DeviceSpec | None = None) -> Explanation:
    """Explain what `kernelize(model, mode=mode, device=device)` would do, changing nothing.

    For each tagged layer it lists the candidates registered for the device, which one won
    (by capability range and mode) and why the others were passed over, and whether the
    winner would run or the layer would keep its own forward (kernel not loadable, lacking
    backward or torch.compile support, or breaking the kernel layer rules), or whether the
    layer's condition skips the instance. Functions attached with `use_kernelized_func`
    appear as ``"<owner path>:<name>"``. Kernels are
    loaded (and downloaded if needed) to answer that, but the model is not touched (the
    taggers added with `kernels.layer.taggers.add_tagger` run first, as in `kernelize`).

    Example:
        ```python
        from kernels import Mode, explain

        print(explain(model, mode=Mode.TRAINING | Mode.TORCH_COMPILE))
        ```
    """
    run_taggers(model)
    the_plan = plan(
        model, mode=mode, device=device, use_fallback=KernelizeFallback.ALL, raise_invalid=False
    )
    groups: dict[tuple, list] = {}
    for decision in the_plan.decisions:
        kernel: str | None
        reason: str | None
        if decision.kernel is not None:
            outcome = "kernel"
            chosen = decision.resolution.chosen
            assert chosen is not None  # a decision with a kernel loaded it from the chosen one
            kernel = f"kernel layer {decision.kernel.__name__} from {chosen.repository}"
            reason = decision.resolution.reason
        elif decision.skipped_by_condition:
            outcome, kernel, reason = "skipped", None, decision.fallback_reason
        else:
            outcome = "invalid" if decision.fallback_level >= logging.ERROR else "fallback"
            kernel, reason = None, decision.fallback_reason
        candidates = tuple(
            [(str(decision.resolution.chosen), "chosen")] if decision.resolution.chosen else []
        ) + tuple((str(c), why) for c, why in decision.resolution.passed_over)
        graphs = None
        if outcome != "invalid":
            graphs = str(graph_safety(type(decision.module), decision.kernel))
        key = (
            type(decision.module).__qualname__,
            decision.layer_name,
            outcome,
            kernel,
            reason,
            candidates,
            graphs,
        )
        groups.setdefault(key, []).append(decision.path)
    layers = tuple(
        LayerExplanation(tuple(paths), cls, name, outcome, kernel, reason, candidates, graphs)
        for (cls, name, outcome, kernel, reason, candidates, graphs), paths in groups.items()
    )
    return Explanation(
        the_plan.mode, the_plan.target.device_type, the_plan.target.capability, layers
    )
