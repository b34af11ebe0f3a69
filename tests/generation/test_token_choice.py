"""Token choice on the device, with transformers 4.57's processors as the reference
(tests/clients/transformers5/test_token_choice.py: the same checks on 5.x)."""

from __future__ import annotations

import pytest

from tests.support import token_choice as checks

pytest.importorskip("transformers")


@pytest.mark.parametrize("name", checks.DEVICE_CASES)
def test_device_version_matches_transformers(name):
    checks.check_device_version_matches(name)


def test_appends_past_the_end_change_nothing():
    checks.check_appends_past_the_end_change_nothing()


def test_sampling_is_multinomials():
    checks.check_sampling_is_multinomials()


def test_unknown_processors_are_refused():
    checks.check_unknown_processors_are_refused()


def test_choice_keys():
    checks.check_choice_keys()


def test_stop_strings_match_transformers():
    checks.check_stop_strings_match_transformers()


def test_bad_word_prefixes_are_banned():
    checks.check_bad_word_prefixes_are_banned()


def test_bias_sums_round_as_transformers():
    checks.check_bias_sums_round_as_transformers()


def test_loads_refill_what_a_step_reads():
    checks.check_loads_refill_what_a_step_reads()


def test_eta_runs_as_transformers_with_no_host_read():
    checks.check_eta_runs_as_transformers_with_no_host_read()
