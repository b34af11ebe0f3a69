"""Fixtures of the benchmarks' tests that build `benchmarks.llama`'s model."""

import pytest


@pytest.fixture
def module_state():
    """A `benchmarks.llama.ModuleState`, put back to its baseline after the test."""
    pytest.importorskip("transformers.models.llama.modeling_llama")
    from benchmarks import llama

    state = llama.ModuleState()
    yield state
    state.restore()


@pytest.fixture
def tiny(monkeypatch):
    """`benchmarks.llama`'s model on the CPU at the tests' tiny Llama size (our kernels through
    Triton's interpreter)."""
    pytest.importorskip("transformers.models.llama.modeling_llama")
    from benchmarks import llama
    from tests.support.models import TINY_LLAMA

    monkeypatch.setattr(llama, "DEVICE", "cpu")
    monkeypatch.setattr(
        llama, "CONFIG", {**llama.CONFIG, **TINY_LLAMA, "max_position_embeddings": 64}
    )
