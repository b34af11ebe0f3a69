"""Issue 38's targets for `benchmarks.e2e`'s rows of one setting: per shape and step, the best
configuration of ours against the best peer configuration (`best_against_peers`), and a PASS,
TIE, FAIL or N/A line per target (`target_checks`): ours + compile no slower than ours eager
and compile alone, and no larger than ours eager; the best of ours at least as fast as the best
peer, with no more memory than the lowest peer. Two contenders timed in the same rounds compare
round by round (`benchmarks.paired`): a median ratio above 1 that a sign test cannot tell from
chance is a TIE, not a FAIL. `verdict_lines` puts both in the report's words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from benchmarks.llama import BY_NAME, COMPILE_ALONE, OURS_COMPILED
from benchmarks.paired import compare


def is_ours(name: str) -> bool:
    """Whether the contender of results row name ``name`` is ours (runs kept from before a
    contender was renamed are read by this prefix)."""
    return name.startswith("ours")


def is_compiled(name: str) -> bool:
    """Whether the contender named ``name`` in results ran under torch.compile."""
    return BY_NAME[name].compiled if name in BY_NAME else "compile" in name


#: The steps of a results row (`benchmarks.e2e.time_interleaved` times them): the key of each
#: one's time and of its peak memory.
STEPS = {"train": ("train_ms", "train_peak_gib"), "prefill": ("prefill_ms", "prefill_peak_gib")}


def fastest(rows: list[dict], step: str) -> dict | None:
    """The row of ``rows`` fastest at ``step`` (``train`` or ``prefill``); of equal times the
    one of lower peak memory, then the first. None when ``rows`` is empty."""
    ms, peak = STEPS[step]
    ranked = sorted(enumerate(rows), key=lambda ir: (ir[1][ms], ir[1].get(peak, math.inf), ir[0]))
    return ranked[0][1] if ranked else None


def lowest_peak(rows: list[dict], step: str) -> dict | None:
    """The row of ``rows`` of the lowest peak memory at ``step`` (of equal peaks the faster,
    then the first); None when no row recorded one (runs before prefill peaks were kept)."""
    ms, peak = STEPS[step]
    recorded = [(i, r) for i, r in enumerate(rows) if r.get(peak) is not None]
    ranked = sorted(recorded, key=lambda ir: (ir[1][peak], ir[1][ms], ir[0]))
    return ranked[0][1] if ranked else None


@dataclass(frozen=True)
class Match:
    """At one shape and step: the best configuration of ours (`best_against_peers`) and the
    best peer configuration (eager, torch.compile, Liger, Liger + compile: the fastest), and the
    peer of the lowest peak memory."""

    shape: str
    step: str
    ours: dict | None
    peer: dict | None
    lowest_peer: dict | None

    @property
    def ratio(self) -> float | None:
        """The best peer's time over the best of ours' (> 1: ours is faster)."""
        if self.ours is None or self.peer is None:
            return None
        ms = STEPS[self.step][0]
        return self.peer[ms] / self.ours[ms]


def best_against_peers(rows: list[dict], step: str) -> Match:
    """``rows`` of one shape: the best of ours against the best peer at ``step``. The best of
    ours is the fastest of ours whose peak is at most the lowest peer's, where one is (the
    configuration a user who wants both would pick), else the fastest of ours."""
    ours = [r for r in rows if is_ours(r["contender"])]
    peers = [r for r in rows if not is_ours(r["contender"])]
    shape = rows[0]["shape"] if rows else ""
    lowest = lowest_peak(peers, step)
    peak = STEPS[step][1]
    within = [
        r
        for r in ours
        if lowest is not None and r.get(peak) is not None and r[peak] <= lowest[peak]
    ]
    return Match(shape, step, fastest(within or ours, step), fastest(peers, step), lowest)


TARGET_COMPILE = (
    "ours + compile <= min(ours eager, compile alone) in time and <= ours eager in peak"
)
TARGET_PEERS = "best ours >= 1.0x best peer, peak <= lowest peer's"


@dataclass(frozen=True)
class Check:
    """One of issue 38's targets at one shape: (status, what was compared) for each part (a
    step's time, a step's peak), PASS only when every part passed."""

    shape: str
    target: str
    parts: tuple[tuple[str, str], ...]

    @property
    def status(self) -> str:
        """FAIL if a part failed; else N/A if a part lacked a measurement; else TIE if a time
        could not be told from its bound's (`benchmarks.paired`); else PASS."""
        statuses = {status for status, _ in self.parts}
        for status in ("FAIL", "N/A", "TIE"):
            if status in statuses:
                return status
        return "PASS"

    def line(self) -> str:
        return f"{self.shape}: {self.target}: {self.status} ({'; '.join(t for _, t in self.parts)})"


def _label(row: dict) -> str:
    """A contender in a check line: its key (short), or its name for rows of retired names."""
    name = row["contender"]
    return BY_NAME[name].key if name in BY_NAME else name


def _rounds_key(key: str) -> str:
    return key.replace("_ms", "_rounds_ms")


def _at_most(what: str, row: dict, bound: dict | None, key: str, unit: str) -> tuple[str, str]:
    """Whether ``row[key] <= bound[key]``, as (status, the comparison in words). Times of two
    rows timed in the same rounds (one group of one run) compare round by round
    (`benchmarks.paired`: PASS, TIE or FAIL); others, and peaks, by their values."""
    value = row.get(key)
    if value is None or bound is None or bound.get(key) is None:
        return "N/A", f"{what}: not recorded"
    limit = bound[key]
    text = f"{what} {value:.1f} {unit} ({_label(row)}) vs {limit:.1f} {unit} ({_label(bound)})"
    mine, theirs = row.get(_rounds_key(key)), bound.get(_rounds_key(key))
    same_rounds = row.get("group") is not None and row.get("group") == bound.get("group")
    if unit == "ms" and same_rounds and mine and theirs:
        paired = compare(mine, theirs)
        return paired.status, f"{text}: {paired.describe()}"
    status = "PASS" if value <= limit else "FAIL"
    return status, f"{text}: {status}"


def _compile_parts(rows: list[dict], step: str) -> list[tuple[str, str]]:
    """Issue 38's first target at one shape and step: ours + compile (with the fused loss)
    against the fastest of ours' eager-mode configurations and compile alone in time, and
    against the lowest peak of ours' eager-mode configurations."""
    ms, peak = STEPS[step]
    by = {r["contender"]: r for r in rows}
    ours_compiled, alone = by.get(OURS_COMPILED), by.get(COMPILE_ALONE)
    eager_ours = [r for r in rows if is_ours(r["contender"]) and not is_compiled(r["contender"])]
    missing = [
        name
        for name, present in (
            (OURS_COMPILED, ours_compiled),
            (COMPILE_ALONE, alone),
            ("ours eager", eager_ours),
        )
        if not present
    ]
    if missing or ours_compiled is None or alone is None:
        return [("N/A", f"{step}: {', '.join(missing)} not measured")]
    bound = fastest([r for r in (fastest(eager_ours, step), alone) if r is not None], step)
    return [
        _at_most(step, ours_compiled, bound, ms, "ms"),
        _at_most(f"{step} peak", ours_compiled, lowest_peak(eager_ours, step), peak, "GiB"),
    ]


def _peer_parts(rows: list[dict], step: str) -> list[tuple[str, str]]:
    """Issue 38's second target at one shape and step: the best of ours at least as fast as the
    best peer, its peak at most the lowest peer's."""
    ms, peak = STEPS[step]
    match = best_against_peers(rows, step)
    if match.ours is None or match.peer is None:
        side = "no configuration of ours" if match.ours is None else "no peer"
        return [("N/A", f"{step}: {side} measured")]
    status, text = _at_most(step, match.ours, match.peer, ms, "ms")
    return [
        (status, f"{text}, {match.ratio:.2f}x"),
        _at_most(f"{step} peak", match.ours, match.lowest_peer, peak, "GiB"),
    ]


def target_checks(rows: list[dict]) -> list[Check]:
    """Issue 38's two targets at each shape of one setting's ``rows``, training step and prefill
    together."""
    shapes = _shapes(rows)
    checks = []
    for shape in shapes:
        at = [r for r in rows if r["shape"] == shape]
        for target, parts in ((TARGET_COMPILE, _compile_parts), (TARGET_PEERS, _peer_parts)):
            found = tuple(p for step in STEPS for p in parts(at, step))
            checks.append(Check(shape, target, found))
    return checks


def _cell(row: dict | None, key: str, spec: str = ".1f") -> str:
    value = None if row is None else row.get(key)
    return "—" if value is None else format(value, spec)


def verdict_lines(rows: list[dict]) -> list[str]:
    """Lines of the report: per shape and step, the best of ours against the best peer, then
    a line per target of issue 38 and shape."""
    if not rows:
        return []
    shapes = _shapes(rows)
    lines = [
        "Best of ours against the best peer (eager, torch.compile, Liger, Liger + compile): the",
        "fastest peer; the fastest of ours within the lowest peer's peak (else the fastest of",
        "ours); ratio: the peer's time over ours' (> 1: ours faster).",
        "",
        "| shape | step | best of ours | ms | peak GiB | best peer | ms | peak GiB | ratio "
        "| lowest peer peak GiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for shape in shapes:
        at = [r for r in rows if r["shape"] == shape]
        for step, (ms, peak) in STEPS.items():
            m = best_against_peers(at, step)
            low = m.lowest_peer
            low_name = "" if low is None else f" ({low['contender']})"
            lines.append(
                f"| {shape} | {step} | {m.ours['contender'] if m.ours else '—'} | "
                f"{_cell(m.ours, ms)} | {_cell(m.ours, peak)} | "
                f"{m.peer['contender'] if m.peer else '—'} | {_cell(m.peer, ms)} | "
                f"{_cell(m.peer, peak)} | {'—' if m.ratio is None else f'{m.ratio:.2f}x'} | "
                f"{_cell(low, peak)}{low_name} |"
            )
    lines += [
        "",
        "Issue 38's targets per shape (PASS when met at the training step and prefill; N/A when a",
        "contender or measurement it needs is missing; TIE when a time of two contenders timed in",
        "the same rounds is above its bound by a median that a sign test over the rounds cannot",
        "tell from chance, benchmarks/paired.py). Ours eager: the fastest of ours without compile",
        "for time, the lowest of their peaks for memory; ours + compile keeps the fused loss.",
        "",
    ]
    lines += [f"- {check.line()}" for check in target_checks(rows)]
    return lines


def _shapes(rows: list[dict]) -> list[str]:
    """The shapes of ``rows``, in the order first met."""
    return list(dict.fromkeys(r["shape"] for r in rows))
