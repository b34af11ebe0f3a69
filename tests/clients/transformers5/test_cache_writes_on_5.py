"""The cache-write checks of tests/generation/test_cache_writes.py on transformers 5.x, whose
static layers keep their position in a device counter that the kernel advances."""

from tests.generation.test_cache_writes import (  # noqa: F401  (collected here as well)
    model,
    test_a_decode_write_goes_through_the_kernel_and_equals_transformers,
    test_other_calls_are_transformers_update,
)
