"""`kernels explain demo` lists what `kernels demo` kernelizes, and nothing it never runs."""

from __future__ import annotations

import json

import pytest

from kernels.cli import main

pytest.importorskip("transformers")


def explained_layers(capsys, model: str) -> set[str]:
    assert main(["explain", model, "--device", "cpu", "--json"]) == 0
    return {layer["layer_name"] for layer in json.loads(capsys.readouterr().out)["layers"]}


def test_explain_demo_leaves_out_the_loss_kernel_the_demo_never_uses(capsys):
    # kernels demo tags the gated MLPs and rotary, and checks logits: it never tags the loss.
    layers = explained_layers(capsys, "demo")
    assert "CausalLMFusedLoss" not in layers
    assert {"RMSNorm", "SiLU", "SwiGLUMLP", "rotary_pos_emb"} <= layers


def test_explain_of_a_model_type_still_lists_the_loss_register_library_kernels_tags(capsys):
    assert "CausalLMFusedLoss" in explained_layers(capsys, "llama")
