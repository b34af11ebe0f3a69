"""Whether one contender is slower than another, from the rounds of one interleaved run.

Medians of separate runs differ by several percent on the same code (the e2e runs of one day
put the same contender 7% apart), so a target "A no slower than B" cannot be read off two
medians that differ by 1%. Interleaved rounds pair the two: round r of A and round r of B ran
back to back, under the same clocks and the same neighbours. `compare` takes the per-round
ratios A/B and a sign test over them:

- PASS: the median ratio is at most 1 (A no slower);
- FAIL: A was slower in so many rounds that a coin (A and B the same speed, each round as
  likely either way) would give as many in fewer than 5% of runs;
- TIE: A's median is above B's, but not in enough rounds to tell it from a coin. The run
  cannot tell A from B; it does not show A slower.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

#: The sign test's level: FAIL when a coin gives as many slower rounds less often than this.
LEVEL = 0.05


@dataclass(frozen=True)
class Paired:
    """A against B over paired rounds."""

    ratio: float  # median of A's time over B's, round by round
    slower: int  # rounds in which A took longer than B
    rounds: int
    status: str  # PASS, TIE or FAIL (module docstring)

    def describe(self) -> str:
        return (
            f"paired ratio {self.ratio:.3f}, slower in {self.slower} of {self.rounds} rounds: "
            f"{self.status}"
        )


def chance_of_at_least(slower: int, rounds: int) -> float:
    """The probability that a fair coin lands "slower" in at least `slower` of `rounds`."""
    return sum(math.comb(rounds, k) for k in range(slower, rounds + 1)) / 2**rounds


def compare(a: Sequence[float], b: Sequence[float]) -> Paired:
    """A's rounds against B's, round by round (the same number of rounds, all positive)."""
    if len(a) != len(b) or not a:
        raise ValueError(
            f"paired rounds must be as many on both sides and some: {len(a)}, {len(b)}"
        )
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    ratio = statistics.median(ratios)
    slower = sum(r > 1 for r in ratios)
    if ratio <= 1:
        status = "PASS"
    elif chance_of_at_least(slower, len(ratios)) < LEVEL:
        status = "FAIL"
    else:
        status = "TIE"
    return Paired(ratio, slower, len(ratios), status)
