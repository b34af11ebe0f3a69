"""The rewrite pass: find each registered pattern in a graph and, where the entry's policy and
guards allow, put one call of its kernel in place of the matched ops.

For each entry, in `KernelRegistry.entries` order, every node of the graph is asked whether
the pattern's computation ends there. A match is replaced when

1. the pattern raised no problem with it (`Match.problem`: a form no kernel of the pattern
   takes, intermediate values used elsewhere, an in-place op whose memory is read later),
2. the entry's policy applies under the downstream compiler (`Policy.applies`),
3. its inputs are on a device and of dtypes the kernel takes (`guards.input_problem`), and
4. the kernel's fake result has the shape and dtype of the matched output
   (`guards.result_problem`);

otherwise its ops stay, and the report says which of these failed. A replacement is one
``call_function`` node, inserted just before the match's output (every argument of the
match is computed before that point), that takes over the output's uses; the matched nodes
nothing else reads are then erased. Nodes outside a match are never touched.
"""

from __future__ import annotations

import logging

from torch import fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from . import fx_nodes as fxn
from .entry import KernelEntry
from .guards import input_problem, resolve, result_problem
from .patterns import AttrRef, Match
from .report import MatchRecord, RewriteReport

logger = logging.getLogger(__name__)


def ensure_values(gm: fx.GraphModule, example_inputs: list) -> None:
    """Give every node a traced value when the graph lacks them (a ``symbolic_trace`` graph,
    handed to the backend directly), by running it on fake copies of ``example_inputs``.

    Dynamo's graphs carry them already (``example_value``), and are left as they are.
    """
    if fxn.has_values(gm.graph):
        return
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = detect_fake_mode(example_inputs) or FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(gm, mode).propagate(*example_inputs)


def rewrite(
    gm: fx.GraphModule,
    entries: list[KernelEntry],
    *,
    downstream: str,
    downstream_fuses: bool,
    graph_index: int = 0,
) -> RewriteReport:
    """Replace the matches of ``entries`` in ``gm`` (in place) and report what was done."""
    graph = gm.graph
    report = RewriteReport(graph_index, downstream, nodes_before=len(graph.nodes))
    erased: set[fx.Node] = set()
    for entry in entries:
        for node in list(graph.nodes):
            if node in erased:
                continue
            match = entry.pattern.match(node, gm)
            if match is None or any(n in erased for n in match.nodes):
                continue
            reason = _why_kept(entry, match, gm, downstream, downstream_fuses)
            record = MatchRecord(
                pattern=match.pattern,
                form=match.form,
                kernel=entry.label,
                nodes=tuple(n.name for n in match.nodes),
                where=fxn.module_path(match.output),
                reason=reason,
            )
            if reason is not None:
                report.kept.append(record)
                continue
            erased |= _replace(gm, match, entry.call_for(downstream))
            report.replaced.append(record)
    if report.replaced:
        graph.lint()
        gm.recompile()
    report.nodes_after = len(graph.nodes)
    for record in report.replaced:
        logger.debug("replaced %s (%s) with %s: %s", record.pattern, record.form, record.kernel,
                     ", ".join(record.nodes))  # fmt: skip
    return report


def _why_kept(
    entry: KernelEntry, match: Match, gm: fx.GraphModule, downstream: str, fuses: bool
) -> str | None:
    if match.problem is not None:
        return match.problem
    if not entry.policy.applies(fuses):
        return entry.policy.reason_not_applied(downstream)
    values = tuple(resolve(a, gm) for a in match.args)
    problem = input_problem(entry, match, values)
    if problem is not None:
        return problem
    return result_problem(entry, match, values, entry.graph_call)


def _replace(gm: fx.GraphModule, match: Match, call) -> set[fx.Node]:
    """Put ``call(*match.args)`` in place of the match; return the nodes erased."""
    graph = gm.graph
    output = match.output
    with graph.inserting_before(output):
        args = tuple(_as_graph_arg(graph, a) for a in match.args)
        new = graph.call_function(call, args)
    # The kernel's value stands where the output's stood: same shape and dtype (checked), so
    # the traced value and the source location carry over for later passes and error messages.
    for key in ("val", "example_value", "stack_trace", "nn_module_stack", "source_fn_stack"):
        if key in output.meta:
            new.meta[key] = output.meta[key]
    output.replace_all_uses_with(new)
    if match.inplace_input is not None:
        _read_result_after(graph, output, match.inplace_input, new)
    erased = set()
    for node in reversed(match.nodes):
        if node not in match.keep and not node.users:
            graph.erase_node(node)
            erased.add(node)
    return erased


def _read_result_after(graph: fx.Graph, op: fx.Node, written: fx.Node, result: fx.Node) -> None:
    """After an in-place op becomes a kernel call, the reads of the tensor it wrote into that
    come after it read the kernel's result (they saw the written values before)."""
    order = fxn.graph_order(graph)
    for user in list(written.users):
        if user is not op and user is not result and order[user] > order[op]:
            user.replace_input_with(written, result)


def _as_graph_arg(graph: fx.Graph, arg):
    """A match argument as a node argument: an `AttrRef` becomes a ``get_attr`` node."""
    if isinstance(arg, AttrRef):
        return graph.get_attr(arg.path)
    if isinstance(arg, list):
        return [_as_graph_arg(graph, a) for a in arg]
    return arg
