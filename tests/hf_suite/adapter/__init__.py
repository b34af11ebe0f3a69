"""Adapters: Hugging Face's private module names, written onto our public API.

tests/hf_suite/finder.py serves ``kernels._internals.<x>`` from ``_internals/<x>.py`` here and
``kernels._rust`` from ``_rust.py``, only in the run of their suite. Each adapter maps a name
whose tested behaviour is public (variant choice, CLI, metadata, digests, locks, layer API)
onto ours, and stays thin: logic an adapter would need belongs in the package. A name no
adapter defines is a `Gap` (tests/hf_suite/gaps.py): the tests using it fail, and are listed.
"""
