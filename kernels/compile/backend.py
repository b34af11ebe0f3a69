"""`KernelsBackend`: a ``torch.compile`` backend that puts a registry's kernels into each graph
Dynamo hands it, then hands the graph to a downstream compiler.

Example:
    ```python
    import torch
    from kernels.compile import KernelRegistry, KernelsBackend

    backend = KernelsBackend(KernelRegistry.library(), report="report.txt", draw="graphs/")
    model = torch.compile(model, backend=backend)
    model(x)                      # compiles: rewrites, writes report.txt and the pictures
    print(backend.report())       # what was replaced, and what was left and why
    ```
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch
from torch import fx

from .drawing import check_available, write_graph
from .entry import KernelEntry
from .errors import DownstreamError
from .policy import NON_FUSING_DOWNSTREAMS
from .report import RewriteReport, format_reports
from .rewrite import ensure_values, rewrite

logger = logging.getLogger(__name__)


class EntrySource(Protocol):
    """What a backend reads its kernels from: a `KernelRegistry` (which makes backends, with
    `KernelRegistry.backend`, so this module names it only by what it offers)."""

    def entries(self) -> list[KernelEntry]: ...


class KernelsBackend:
    """A ``torch.compile`` backend: ``torch.compile(model, backend=KernelsBackend(registry))``.

    For each graph Dynamo gives it, it replaces the registry's patterns with their kernels
    (`kernels.compile.rewrite`), records a `RewriteReport`, writes the report and the graph
    pictures if asked, and returns what the downstream compiler makes of the rewritten graph.

    Args:
        registry: the kernels to put in: a `KernelRegistry` (`kernels_backend` makes a backend
            with the library's when given none).
        downstream: what compiles the rewritten graph: ``"inductor"`` (the default; forward
            and backward through aot_autograd, so training works), ``"eager"`` (the graph runs
            as it is: no compiler, our kernels and PyTorch's ops), ``"aot_eager"`` (aot_autograd
            without inductor), any other name Dynamo knows (``torch._dynamo.list_backends()``),
            or a backend callable ``(gm, example_inputs) -> callable``. Under ``"eager"`` and
            ``"aot_eager"`` the ``eager_only`` entries apply too; every other downstream counts
            as fusing.
        report: a text file to write the report to, rewritten after each graph.
        draw: a folder to write each graph to, before and after the rewrite
            (``graph0-before.svg``, ``graph0-after.svg``, ...).
        draw_format: ``"svg"``, ``"png"`` or ``"pdf"`` (pictures: pydot and Graphviz), ``"dot"``
            (the Graphviz source: pydot), or ``"txt"`` (the graph's code: nothing to install).
        inductor_options: inductor config patches for ``downstream="inductor"``: names in
            ``torch._inductor.config`` (``{"max_autotune": True}``).
        cuda_graphs: replay each compiled graph (forward and backward) from CUDA graphs, as
            ``torch.compile(mode="reduce-overhead")`` does: PyTorch's CUDA-graph trees under
            ``"inductor"``, Dynamo's ``"cudagraphs"`` backend (aot_autograd, no compiler)
            under ``"eager"`` and ``"aot_eager"`` (both then run as ``"aot_eager"``, the name
            in the reports: the graph is traced before it is captured). It takes the host out of the step, which is
            what decides models of many small kernels (ResNet-18's training step took 13.7 ms
            compiled, of 4.8 ms of GPU work: docs/compile-backend.md). Off by default, as
            there: a replay's outputs live in memory the next replay overwrites (PyTorch
            raises if one is read after that; clone what you keep), and graphs with CPU
            tensors, dynamic shapes or mutated inputs run without graphs (logged as skips).

    Attributes:
        reports: one `RewriteReport` per graph compiled, in order.
    """

    def __init__(
        self,
        registry: EntrySource,
        *,
        downstream: str | Callable = "inductor",
        report: str | Path | None = None,
        draw: str | Path | None = None,
        draw_format: str = "svg",
        inductor_options: dict | None = None,
        cuda_graphs: bool = False,
    ) -> None:
        if not callable(getattr(registry, "entries", None)):
            raise TypeError(
                f"KernelsBackend takes a KernelRegistry; got {type(registry).__name__}. "
                "Build one with KernelRegistry.library() or KernelRegistry()."
            )
        self.registry = registry
        self.downstream_name, self._downstream = _downstream(
            downstream, inductor_options, cuda_graphs
        )
        self.cuda_graphs = cuda_graphs
        self.downstream_fuses = self.downstream_name not in NON_FUSING_DOWNSTREAMS
        if draw is not None:
            check_available(draw_format)  # before anything compiles, not in the middle
        self.report_path = None if report is None else Path(report)
        self.draw_dir = None if draw is None else Path(draw)
        self.draw_format = draw_format
        self.reports: list[RewriteReport] = []

    def __call__(self, gm: fx.GraphModule, example_inputs: list) -> Callable:
        index = len(self.reports)
        ensure_values(gm, example_inputs)
        if self.draw_dir is not None:
            self._draw(gm, index, "before")
        result = rewrite(
            gm,
            self.registry.entries(),
            downstream=self.downstream_name,
            downstream_fuses=self.downstream_fuses,
            graph_index=index,
        )
        self.reports.append(result)
        logger.info(
            "graph %d: replaced %d match(es), left %d", index, result.count(), result.kept_count()
        )
        if self.report_path is not None:
            self.report_path.parent.mkdir(parents=True, exist_ok=True)
            self.report_path.write_text(self.report())
        if self.draw_dir is not None:
            self._draw(gm, index, "after")
        return self._downstream(gm, example_inputs)

    def report(self) -> str:
        """The report of every graph compiled so far, then the totals per pattern."""
        return format_reports(self.reports)

    def count(self, pattern: str | None = None) -> int:
        """Matches replaced over all graphs (of ``pattern``, or all)."""
        return sum(r.count(pattern) for r in self.reports)

    def kept_count(self, pattern: str | None = None) -> int:
        """Matches left as they were over all graphs (of ``pattern``, or all)."""
        return sum(r.kept_count(pattern) for r in self.reports)

    def _draw(self, gm: fx.GraphModule, index: int, stage: str) -> None:
        assert self.draw_dir is not None  # drawn only when asked for a folder
        name = f"graph{index}-{stage}"
        write_graph(gm, self.draw_dir / name, name, self.draw_format)

    def __repr__(self) -> str:
        graphs = ", cuda_graphs=True" if self.cuda_graphs else ""
        return f"KernelsBackend({self.registry!r}, downstream={self.downstream_name!r}{graphs})"


# Downstreams that run the graph as it is: with cuda_graphs, Dynamo's "cudagraphs" backend
# (aot_autograd splits forward and backward, each replayed from a CUDA graph) stands in.
_UNCOMPILED = ("eager", "aot_eager")


def _downstream(
    downstream: str | Callable, inductor_options: dict | None, cuda_graphs: bool = False
) -> tuple[str, Callable]:
    """(name, compile function) of the downstream compiler."""
    if inductor_options is not None and downstream != "inductor":
        raise DownstreamError(
            f"inductor_options are for downstream='inductor'; the downstream is {downstream!r}."
        )
    if not isinstance(cuda_graphs, bool):
        raise DownstreamError(f"cuda_graphs is True or False; got {cuda_graphs!r}.")
    if cuda_graphs:
        return _with_cuda_graphs(downstream, inductor_options)
    if callable(downstream):
        name = getattr(downstream, "__name__", type(downstream).__name__)
        return name, downstream
    if downstream == "inductor":
        options = dict(inductor_options or {})
        if options:
            from torch._inductor import config

            unknown = sorted(set(options) - set(config.get_config_copy()))
            if unknown:  # here, rather than at the first call, in the middle of compiling
                raise DownstreamError(
                    f"Unknown inductor option(s) {', '.join(unknown)}: inductor_options are "
                    "names in torch._inductor.config, such as 'max_autotune' or "
                    "'triton.cudagraphs'."
                )

        def inductor(gm: fx.GraphModule, example_inputs: list) -> Callable:
            from torch._inductor.compile_fx import compile_fx

            # A callable for a graph like this one; the annotation also covers AOT exports.
            return compile_fx(gm, example_inputs, config_patches=options or None)  # type: ignore[return-value]

        return "inductor", inductor
    if downstream == "eager":

        def eager(gm: fx.GraphModule, example_inputs: list) -> Callable:
            return gm.forward

        return "eager", eager
    if isinstance(downstream, str):
        try:
            return downstream, torch._dynamo.lookup_backend(downstream)
        except Exception:  # noqa: BLE001  (Dynamo's InvalidBackend, whatever its class)
            pass
        known = sorted({"inductor", "eager", "aot_eager", *torch._dynamo.list_backends(None)})
        raise DownstreamError(
            f"Unknown downstream compiler {downstream!r}: use 'inductor', 'eager', another "
            f"backend Dynamo knows ({', '.join(known)}), or a callable (gm, example_inputs)."
        )
    raise DownstreamError(
        f"downstream must be a backend name such as 'inductor' or a callable; got "
        f"{type(downstream).__name__}."
    )


def _with_cuda_graphs(downstream, inductor_options: dict | None) -> tuple[str, Callable]:
    """(name, compile function) of ``downstream`` with its graphs replayed from CUDA graphs."""
    if downstream == "inductor":
        options = dict(inductor_options or {})
        if options.get("triton.cudagraphs", True) is not True:
            raise DownstreamError(
                "cuda_graphs=True contradicts inductor_options={'triton.cudagraphs': False}: "
                "leave one of them out."
            )
        options["triton.cudagraphs"] = True
        return _downstream("inductor", options)
    if downstream in _UNCOMPILED:
        # aot_autograd traces the graph (forward and backward) before it is captured: what
        # runs is aot_eager's program, our entries called through their ops, so the backend
        # is named so in its reports.
        return "aot_eager", torch._dynamo.lookup_backend("cudagraphs")
    name = downstream if isinstance(downstream, str) else type(downstream).__name__
    raise DownstreamError(
        f"cuda_graphs=True works with downstream 'inductor', 'eager' or 'aot_eager'; got "
        f"{name!r}. Capture graphs in that compiler itself, or pick one of these."
    )
