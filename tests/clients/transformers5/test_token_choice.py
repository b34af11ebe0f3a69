"""Token choice on the device, with transformers 5.x's processors as the reference: the checks
of tests/generation/test_token_choice.py (transformers 4.57), collected here as well."""

from tests.generation.test_token_choice import (  # noqa: F401  (collected here as well)
    test_appends_past_the_end_change_nothing,
    test_bad_word_prefixes_are_banned,
    test_bias_sums_round_as_transformers,
    test_choice_keys,
    test_device_version_matches_transformers,
    test_eta_runs_as_transformers_with_no_host_read,
    test_loads_refill_what_a_step_reads,
    test_sampling_is_multinomials,
    test_stop_strings_match_transformers,
    test_unknown_processors_are_refused,
)
