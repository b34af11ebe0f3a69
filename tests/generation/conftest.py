"""Fixtures of the generation tests: the tiny Llama on the CPU (GPU tests bring their own), and
the undoing of what tagging for our kernels changes process-wide."""

from __future__ import annotations

import pytest

from tests.support.generation import tiny_llama, undo_kernelize


@pytest.fixture
def model():
    pytest.importorskip("transformers")
    return tiny_llama()


@pytest.fixture
def untagged():
    """Tagging for our kernels changes transformers' classes for the process: undo it."""
    yield
    undo_kernelize()
