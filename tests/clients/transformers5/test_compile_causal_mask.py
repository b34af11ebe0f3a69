"""kernelize(Mode.TORCH_COMPILE) and transformers 5.x's causal-mask skip under torch.compile.

Before torch 2.13, Dynamo folded ``torch.compiler.is_exporting()`` to True, so transformers'
SDPA mask code (which skips the mask only when not exporting) gave every compiled graph a
materialised mask; `kernels.compile.causal_mask` answers with torch.export's flag instead.
The installed torch (2.13) answers right by itself, so the tests pretend an older one where
they check that kernelize applies the fix, and check on this torch that the function put in
its place gives the right answer compiled, exported and eager.
"""

from __future__ import annotations

import pytest
import torch
import transformers.masking_utils as masking

from kernels import Mode, kernelize
from kernels.compile import causal_mask
from tests.support.tf5_models import make_model


@pytest.fixture
def original_mask_code(monkeypatch):
    """transformers' own ``is_torchdynamo_exporting`` in place, put back afterwards."""
    from transformers.utils import import_utils

    monkeypatch.setattr(masking, "is_torchdynamo_exporting", import_utils.is_torchdynamo_exporting)
    return import_utils.is_torchdynamo_exporting


def sdpa_calls(model, ids, **kwargs) -> list[dict]:
    """The keyword arguments of each SDPA call in the graph torch.compile captures."""
    calls = []

    def backend(gm, example_inputs):
        for node in gm.graph.nodes:
            if "scaled_dot_product_attention" in str(node.target):
                calls.append(dict(node.kwargs))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=backend, fullgraph=True)(ids, **kwargs)
    return calls


def test_kernelize_for_compile_fixes_an_affected_torch(original_mask_code, monkeypatch, caplog):
    monkeypatch.setattr(causal_mask, "torch_needs_it", lambda: True)
    model = make_model("llama")
    kernelize(model, mode=Mode.INFERENCE, device="cpu")
    assert masking.is_torchdynamo_exporting is original_mask_code  # not for eager use
    with caplog.at_level("INFO", logger="kernels.compile.causal_mask"):
        kernelize(model, mode=Mode.INFERENCE | Mode.TORCH_COMPILE, device="cpu")
        kernelize(model, mode=Mode.TRAINING | Mode.TORCH_COMPILE, device="cpu")
    assert masking.is_torchdynamo_exporting is causal_mask.is_exporting
    assert sum("skip the causal mask" in r.getMessage() for r in caplog.records) == 1


def test_a_fixed_torch_or_someone_elses_function_is_left_alone(original_mask_code, monkeypatch):
    assert not causal_mask.torch_needs_it()  # the installed torch is fixed
    assert not causal_mask.restore_causal_mask_skip()
    assert masking.is_torchdynamo_exporting is original_mask_code

    def theirs() -> bool:
        return False

    monkeypatch.setattr(causal_mask, "torch_needs_it", lambda: True)
    monkeypatch.setattr(masking, "is_torchdynamo_exporting", theirs)
    assert not causal_mask.restore_causal_mask_skip()
    assert masking.is_torchdynamo_exporting is theirs


def test_compiled_graphs_skip_the_mask_and_exported_ones_keep_it(original_mask_code, monkeypatch):
    """With the function in place: SDPA gets is_causal=True and no mask when compiled without
    padding, a mask when a padded batch is compiled; torch.export still sees 'exporting'."""
    monkeypatch.setattr(masking, "is_torchdynamo_exporting", causal_mask.is_exporting)
    model = make_model("llama").eval()
    ids = torch.randint(0, 64, (2, 7))
    (call,) = sdpa_calls(model, ids)
    assert call["attn_mask"] is None and call["is_causal"] is True
    padding = torch.ones_like(ids)
    padding[1, :3] = 0
    (call,) = sdpa_calls(model, ids, attention_mask=padding)
    assert call["attn_mask"] is not None

    class Probe(torch.nn.Module):
        def forward(self, x):
            return x + 1 if causal_mask.is_exporting() else x - 1

    exported = torch.export.export(Probe(), (torch.zeros(2),))
    assert torch.equal(exported.module()(torch.zeros(2)), torch.ones(2))
    assert torch.equal(Probe()(torch.zeros(2)), -torch.ones(2))  # eager: not exporting
    compiled = torch.compile(Probe(), backend="eager", fullgraph=True)
    assert torch.equal(compiled(torch.zeros(2)), -torch.ones(2))


def test_the_e2e_benchmark_gives_every_compiled_contender_the_skip(original_mask_code, monkeypatch):
    """Compile alone and Liger + compile get the skip in a run without ours + compile too."""
    from benchmarks import e2e

    monkeypatch.setattr(causal_mask, "torch_needs_it", lambda: True)
    assert e2e.skip_causal_masks_as_torch_2_13()
    assert masking.is_torchdynamo_exporting is causal_mask.is_exporting
