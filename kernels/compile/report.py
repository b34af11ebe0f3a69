"""What the backend did to each graph: the matches it replaced and the ones it left, with why.

Example of `RewriteReport.format`::

    graph 0 (downstream inductor): 41 nodes before, 29 after
      replaced 3 matches:
        rms_norm with library norm.rms_norm: 2
          transformers formula at input_norm: hidden_states, pow_1, variance, add, ...
          torch.rms_norm at post_norm: rms_norm
        silu_mul with library activation.silu_mul: 1
          F.silu(gate) * up at mlp: silu, mul_3
      left 1 match as it was:
        relu: 1, dtype float64 is not one the kernel takes (float32, float16, bfloat16)
          F.relu at head: relu
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class MatchRecord:
    """One match, replaced or left alone.

    Attributes:
        pattern: the pattern's name.
        form: how the computation was written (``"torch.rms_norm"``, ``"F.relu (in place)"``).
        kernel: the entry's kernel label.
        nodes: the names of the nodes the match covered, in graph order.
        where: the module the match's output came from (``layers.0.mlp``), or empty.
        reason: why it was left alone; None for a replaced match.
    """

    pattern: str
    form: str
    kernel: str
    nodes: tuple[str, ...]
    where: str = ""
    reason: str | None = None


@dataclass
class RewriteReport:
    """The rewrite of one graph (Dynamo hands a backend one graph per region between graph
    breaks, and one per recompilation)."""

    graph_index: int
    downstream: str
    nodes_before: int = 0
    nodes_after: int = 0
    replaced: list[MatchRecord] = field(default_factory=list)
    kept: list[MatchRecord] = field(default_factory=list)

    def count(self, pattern: str | None = None) -> int:
        """Replaced matches (of ``pattern``, or all)."""
        return sum(1 for r in self.replaced if pattern is None or r.pattern == pattern)

    def kept_count(self, pattern: str | None = None) -> int:
        """Matches left as they were (of ``pattern``, or all)."""
        return sum(1 for r in self.kept if pattern is None or r.pattern == pattern)

    def format(self) -> str:
        lines = [
            f"graph {self.graph_index} (downstream {self.downstream}): "
            f"{self.nodes_before} nodes before, {self.nodes_after} after"
        ]
        if not self.replaced and not self.kept:
            lines.append("  no pattern found")
        if self.replaced:
            lines.append(f"  replaced {_matches(len(self.replaced))}:")
            groups = _group(self.replaced, lambda r: (r.pattern, r.kernel))
            for (pattern, kernel), records in groups:
                lines.append(f"    {pattern} with {kernel}: {len(records)}")
                lines.extend(f"      {_where(r)}" for r in records)
        if self.kept:
            lines.append(f"  left {_matches(len(self.kept), 'as it was', 'as they were')}:")
            for (pattern, reason), records in _group(self.kept, lambda r: (r.pattern, r.reason)):
                lines.append(f"    {pattern}: {len(records)}, {reason}")
                lines.extend(f"      {_where(r)}" for r in records)
        return "\n".join(lines)


def _matches(n: int, one: str = "", many: str = "") -> str:
    text = f"{n} match" if n == 1 else f"{n} matches"
    suffix = one if n == 1 else many
    return f"{text} {suffix}" if suffix else text


def _where(record: MatchRecord) -> str:
    at = f" at {record.where}" if record.where else ""
    return f"{record.form}{at}: {', '.join(record.nodes)}"


def _group(records, key):
    groups: dict = {}
    for record in records:
        groups.setdefault(key(record), []).append(record)
    return list(groups.items())


def format_reports(reports: list[RewriteReport]) -> str:
    """Every graph's report, then the totals per pattern."""
    if not reports:
        return "kernels.compile: no graph compiled yet\n"
    replaced = Counter(r.pattern for report in reports for r in report.replaced)
    kept = Counter(r.pattern for report in reports for r in report.kept)
    lines = [f"kernels.compile: {len(reports)} graph(s)", ""]
    for report in reports:
        lines += [report.format(), ""]
    lines.append("totals (replaced / left):")
    for pattern in sorted(set(replaced) | set(kept)):
        lines.append(f"  {pattern}: {replaced[pattern]} / {kept[pattern]}")
    if not replaced and not kept:
        lines.append("  no pattern found in any graph")
    return "\n".join(lines) + "\n"
