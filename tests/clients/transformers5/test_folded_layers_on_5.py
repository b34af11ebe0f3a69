"""The folded decoder layers of tests/generation/test_folded_layers.py on transformers 5.x, whose
decoder layers pass the cache as ``cache=`` and whose attention updates it with ``kwargs=``."""

from tests.generation.test_folded_layers import (  # noqa: F401  (collected here as well)
    kernelized,
    test_a_folded_step_is_the_kernelized_layer_within_its_roundings,
    test_a_hook_on_a_folded_module_keeps_its_layer_unfolded,
    test_gemma_layers_pass_the_code_check_but_do_not_fold,
    test_generation_folds_every_layer_and_leaves_nothing_behind,
    test_llama_layers_and_attention_fold_statement_for_statement,
    test_qwen2_with_biases_folds,
    test_the_prefill_more_rows_and_float32_are_the_layers_own,
)
