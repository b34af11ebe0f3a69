"""benchmarks.paired: one contender against another over the rounds of one interleaved run."""

from __future__ import annotations

import pytest

from benchmarks.paired import LEVEL, chance_of_at_least, compare


def test_a_coins_tail():
    assert chance_of_at_least(0, 10) == 1.0
    assert chance_of_at_least(10, 10) == pytest.approx(1 / 1024)
    assert chance_of_at_least(9, 10) == pytest.approx(11 / 1024)
    assert chance_of_at_least(8, 10) == pytest.approx(56 / 1024)  # above 5%: not a FAIL


def test_no_slower_passes():
    b = [10.0, 11.0, 10.5, 10.2]
    assert compare(b, b).status == "PASS"  # equal: the median ratio is 1
    faster = compare([9.0, 10.0, 9.5, 9.1], b)
    assert faster.status == "PASS" and faster.slower == 0 and faster.ratio < 1


def test_slower_in_most_rounds_fails():
    b = [10.0] * 10
    a = [10.2] * 9 + [9.9]  # 2% slower in 9 of 10 rounds: a coin does that 1.1% of the time
    result = compare(a, b)
    assert (result.status, result.slower, result.rounds) == ("FAIL", 9, 10)
    assert result.ratio == pytest.approx(1.02)
    assert result.describe() == "paired ratio 1.020, slower in 9 of 10 rounds: FAIL"
    assert chance_of_at_least(9, 10) < LEVEL


def test_slower_median_in_too_few_rounds_is_a_tie():
    # What two medians of separate runs cannot show: round by round A is 1.5% slower in 6 of
    # 10 rounds and faster in the other 4.
    b = [10.0] * 10
    a = [10.15] * 6 + [9.9] * 4
    result = compare(a, b)
    assert (result.status, result.slower) == ("TIE", 6)
    assert result.ratio > 1


def test_rounds_must_pair():
    with pytest.raises(ValueError, match="as many on both sides"):
        compare([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="as many on both sides"):
        compare([], [])
