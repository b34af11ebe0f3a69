"""benchmarks/e2e_verdict.py: the best of ours against the best peer and issue 38's PASS, TIE,
FAIL and N/A lines, on made-up numbers."""

import pytest

from benchmarks import e2e_verdict


def _timed(contender, train, prefill, train_peak, prefill_peak=None, shape="8x512"):
    row = {"shape": shape, "contender": contender, "train_ms": train, "prefill_ms": prefill}
    row["train_peak_gib"] = train_peak
    if prefill_peak is not None:
        row["prefill_peak_gib"] = prefill_peak
    return row


EAGER = "eager"
COMPILE = "torch.compile"
OURS = "ours (kernelized)"
OURS_FCE = "ours (kernelized, fused CE)"
OURS_COMPILE = "ours (kernelized + compile, fused CE)"
LIGER = "liger (no fused CE)"
LIGER_FLCE = "liger (fused linear CE)"
LIGER_COMPILE = "liger (fused linear CE) + compile"


def test_fastest_breaks_ties_by_peak_then_order():
    a, b = _timed(OURS, 50.0, 10.0, 7.0), _timed(OURS_FCE, 50.0, 10.0, 6.0)
    c = _timed(OURS_COMPILE, 50.0, 10.0, 6.0)
    assert e2e_verdict.fastest([a, b, c], "train") is b  # equal times: the lower peak
    assert e2e_verdict.fastest([c, b], "train") is c  # equal times and peaks: the first
    assert e2e_verdict.fastest([a, _timed(EAGER, 49.9, 30.0, 9.0)], "train")["contender"] == EAGER
    assert e2e_verdict.fastest([], "prefill") is None
    # Prefill peaks not recorded (runs before they were): the order decides.
    assert e2e_verdict.fastest([a, b], "prefill") is a
    assert e2e_verdict.lowest_peak([a, b], "prefill") is None


def test_best_of_ours_against_the_best_peer():
    rows = [
        _timed(EAGER, 86.6, 23.1, 16.4, 4.0),
        _timed(COMPILE, 61.7, 16.8, 11.6, 3.0),
        _timed(OURS, 69.8, 18.7, 7.2, 2.5),
        _timed(OURS_COMPILE, 63.9, 16.7, 8.8, 2.6),
        _timed(LIGER_FLCE, 91.2, 16.2, 8.1, 2.4),
    ]
    # Training: ours eager is the one of ours within Liger's 8.1 GiB, so it is the best of
    # ours (slower than compile alone); prefill: none of ours within 2.4 GiB, the fastest.
    train = e2e_verdict.best_against_peers(rows, "train")
    assert (train.ours["contender"], train.peer["contender"]) == (OURS, COMPILE)
    assert train.ratio == pytest.approx(61.7 / 69.8)
    assert train.lowest_peer["contender"] == LIGER_FLCE
    prefill = e2e_verdict.best_against_peers(rows, "prefill")
    assert (prefill.ours["contender"], prefill.peer["contender"]) == (OURS_COMPILE, LIGER_FLCE)
    assert prefill.ratio == pytest.approx(16.2 / 16.7)
    assert prefill.lowest_peer["contender"] == LIGER_FLCE
    # A shape where no peer ran (e.g. --contenders ours,ours-fce): nothing to compare.
    alone = e2e_verdict.best_against_peers(
        [r for r in rows if r["contender"].startswith("ours")], "train"
    )
    assert alone.peer is None and alone.ratio is None and alone.ours["contender"] == OURS_COMPILE
    # The 4.57 4x2048 row: the fastest of ours is above the lowest peer's peak, the fused-CE
    # configuration (a little slower, still ahead of every peer) is within it: it is the best.
    rows = [
        _timed(OURS, 104.5, 32.2, 12.3, 3.0),
        _timed(OURS_FCE, 105.2, 32.4, 10.0, 3.0),
        _timed(LIGER, 107.5, 33.4, 14.3, 3.0),
        _timed(LIGER_FLCE, 113.7, 33.1, 11.9, 3.0),
    ]
    train = e2e_verdict.best_against_peers(rows, "train")
    assert (train.ours["contender"], train.peer["contender"]) == (OURS_FCE, LIGER)
    assert train.lowest_peer["contender"] == LIGER_FLCE
    # None of ours within it: the fastest of ours, whose peak then fails the target.
    rows[1] = _timed(OURS_FCE, 105.2, 32.4, 12.0, 3.0)
    assert e2e_verdict.best_against_peers(rows, "train").ours["contender"] == OURS


def _checks(rows):
    return {(c.shape, c.target): c for c in e2e_verdict.target_checks(rows)}


def test_targets_fail_where_issue_38_saw_them_fail():
    """The issue's 4x2048 row: ours + compile slower and larger than ours eager."""
    shape = "4x2048"
    rows = [
        _timed(EAGER, 173.0, 46.0, 29.9, 9.0, shape),
        _timed(COMPILE, 140.2, 40.6, 19.8, 8.0, shape),
        _timed(OURS_FCE, 133.8, 33.3, 11.1, 6.0, shape),
        _timed(OURS_COMPILE, 147.6, 41.1, 14.2, 7.0, shape),
        _timed(LIGER_FLCE, 134.8, 33.4, 12.8, 6.5, shape),
        _timed(LIGER_COMPILE, 130.0, 35.0, 12.0, 6.2, shape),
    ]
    checks = _checks(rows)
    compile_check = checks[(shape, e2e_verdict.TARGET_COMPILE)]
    assert compile_check.status == "FAIL"
    assert compile_check.line() == (
        "4x2048: ours + compile <= min(ours eager, compile alone) in time and <= ours eager in "
        "peak: FAIL (train 147.6 ms (ours-compile) vs 133.8 ms (ours-fce): FAIL; train peak "
        "14.2 GiB (ours-compile) vs 11.1 GiB (ours-fce): FAIL; prefill 41.1 ms (ours-compile) "
        "vs 33.3 ms (ours-fce): FAIL; prefill peak 7.0 GiB (ours-compile) vs 6.0 GiB "
        "(ours-fce): FAIL)"
    )
    # Liger + compile is the best peer in training: ours (133.8) loses to it (130.0).
    peers_check = checks[(shape, e2e_verdict.TARGET_PEERS)]
    assert peers_check.status == "FAIL"
    assert [status for status, _ in peers_check.parts] == ["FAIL", "PASS", "PASS", "PASS"]
    assert peers_check.parts[0][1] == (
        "train 133.8 ms (ours-fce) vs 130.0 ms (liger-flce-compile): FAIL, 0.97x"
    )


def test_targets_pass_when_met_and_ties_pass():
    rows = [
        _timed(EAGER, 86.6, 23.1, 16.4, 4.0),
        _timed(COMPILE, 61.7, 16.8, 11.6, 3.0),
        _timed(OURS, 69.8, 18.7, 7.2, 2.5),
        _timed(OURS_FCE, 70.0, 18.0, 6.1, 2.5),
        _timed(OURS_COMPILE, 61.7, 16.0, 6.1, 2.4),  # a tie with compile alone, in time and peak
        _timed(LIGER_FLCE, 91.2, 16.2, 8.1, 2.4),
    ]
    checks = _checks(rows)
    assert checks[("8x512", e2e_verdict.TARGET_COMPILE)].status == "PASS"
    peers = checks[("8x512", e2e_verdict.TARGET_PEERS)]
    assert peers.status == "PASS"
    assert peers.parts[0][1] == "train 61.7 ms (ours-compile) vs 61.7 ms (compile): PASS, 1.00x"
    assert peers.parts[3][1] == (
        "prefill peak 2.4 GiB (ours-compile) vs 2.4 GiB (liger-flce): PASS"
    )


def test_targets_without_a_contender_or_a_peak_are_not_passed():
    rows = [_timed(EAGER, 86.6, 23.1, 16.4), _timed(OURS_FCE, 70.0, 18.0, 6.1)]
    checks = _checks(rows)
    compile_check = checks[("8x512", e2e_verdict.TARGET_COMPILE)]
    assert compile_check.status == "N/A"
    assert compile_check.parts[0] == (
        "N/A",
        "train: ours (kernelized + compile, fused CE), torch.compile not measured",
    )
    # Both ran, but no prefill peak was recorded: the prefill peak part cannot pass.
    peers = checks[("8x512", e2e_verdict.TARGET_PEERS)]
    assert [status for status, _ in peers.parts] == ["PASS", "PASS", "PASS", "N/A"]
    assert peers.status == "N/A" and "prefill peak: not recorded" in peers.line()
    # A failing part outweighs a missing one.
    slow = [_timed(EAGER, 60.0, 23.1, 16.4), _timed(OURS_FCE, 70.0, 18.0, 6.1)]
    assert _checks(slow)[("8x512", e2e_verdict.TARGET_PEERS)].status == "FAIL"


def _rounds(row, group, train_rounds):
    """`row` as timed in rounds of `group` (its prefill rounds all at its prefill time)."""
    prefill = [row["prefill_ms"]] * len(train_rounds)
    return {**row, "group": group, "train_rounds_ms": train_rounds, "prefill_rounds_ms": prefill}


def test_times_of_one_group_compare_round_by_round():
    """ours + compile against compile alone, timed in the same rounds: a median 1% slower in 6
    of 10 rounds is a TIE, not a FAIL; the same medians from different groups compare as
    values (FAIL); 9 slower rounds of 10 FAIL."""
    group = "run-1 8x512 compiled"
    alone = _rounds(_timed(COMPILE, 50.0, 15.0, 6.0, 2.4), group, [50.0] * 10)
    tie = _rounds(_timed(OURS_COMPILE, 50.5, 15.0, 6.0, 2.4), group, [50.5] * 6 + [49.8] * 4)
    eager = _rounds(_timed(OURS_FCE, 60.0, 18.0, 6.0, 2.4), "run-1 8x512 eager-mode", [60.0] * 10)
    check = _checks([alone, tie, eager])[("8x512", e2e_verdict.TARGET_COMPILE)]
    assert check.parts[0] == (
        "TIE",
        "train 50.5 ms (ours-compile) vs 50.0 ms (compile): paired ratio 1.010, slower in 6 of "
        "10 rounds: TIE",
    )
    assert check.parts[2][0] == "PASS"  # prefill: the same time in every round
    assert check.status == "TIE"
    apart = {**tie, "group": "run-2 8x512 compiled"}
    assert (
        _checks([alone, apart, eager])[("8x512", e2e_verdict.TARGET_COMPILE)].parts[0][0] == "FAIL"
    )
    slower = _rounds(tie, group, [50.5] * 9 + [49.8])
    assert _checks([alone, slower, eager])[("8x512", e2e_verdict.TARGET_COMPILE)].status == "FAIL"
