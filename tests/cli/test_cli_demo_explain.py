"""`kernels demo` and `kernels explain`, run in-process through `kernels.cli.main`.

explain builds its models on the meta device, so it runs no kernel and costs little beyond
importing transformers. The demo on the CPU is its tiny model through the Triton
interpreter: a few seconds.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from kernels.cli import COMMANDS, main
from tests.support.children import run_python
from tests.support.models import llama_config
from tests.support.paths import subprocess_env

transformers = pytest.importorskip("transformers")

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"


def run(*argv: str) -> int:
    return main(list(argv))


def test_help_lists_demo_and_explain_first(capsys):
    assert COMMANDS[:2] == ("demo", "explain")
    assert run("--help") == 0
    out = capsys.readouterr().out
    assert "demo " in out and "explain " in out


def test_demo_help_wires_the_demo_arguments(capsys):
    assert run("demo", "--help") == 0
    out = capsys.readouterr().out
    assert "usage: kernels demo" in out
    for option in ("--device", "--seed", "--no-timing"):
        assert option in out
    assert "Llama-style" in out  # the description comes from kernels.demo's docstring


def test_python_dash_m_kernels_demo_still_works():
    env = subprocess_env()
    result = run_python("-m", "kernels.demo", "--help", env=env)
    assert result.returncode == 0, result.stderr
    assert "usage: kernels demo" in result.stdout


@pytest.mark.skipif(HAS_CUDA, reason="checks the error on a machine without a GPU")
def test_demo_on_cuda_without_a_gpu_is_an_error(capsys):
    assert run("demo", "--device", "cuda") == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("error: --device cuda, but torch sees no CUDA GPU")


@pytest.mark.slow
def test_demo_runs_and_its_checks_pass(capsys):
    # On the CPU: the tiny model through the Triton interpreter (tests/conftest.py sets it),
    # about 5 s. On a GPU: the bf16 model, correctness only.
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_info()
    try:
        assert run("demo", "--device", DEVICE, "--no-timing") == 0
        # The demo quiets transformers while it runs and gives the caller its level back.
        assert transformers_logging.get_verbosity() == transformers_logging.INFO
    finally:
        transformers_logging.set_verbosity_warning()
    out = capsys.readouterr().out
    assert "kernels for mode TRAINING" in out
    assert "correctness" in out and "FAILED" not in out


def test_explain_model_type_inference(capsys):
    assert run("explain", "llama", "--device", "cpu", "--mode", "inference") == 0
    out = capsys.readouterr().out
    assert "LlamaForCausalLM" in out
    assert "kernelize plan for mode INFERENCE on cpu" in out
    assert "- RMSNorm (LlamaRMSNorm) at model.layers.0.input_layernorm" in out
    assert "- SiLU (SiLUActivation) at model.layers.0.mlp.act_fn" in out
    assert "uses kernel layer RMSNorm from local repository" in out
    assert "uses kernel layer SiLU from local repository" in out
    assert "- SwiGLUMLP (LlamaMLP) at model.layers.0.mlp" in out
    # The tags explain made for it are gone again.
    from transformers.models.llama import modeling_llama

    assert "kernel_layer_name" not in vars(modeling_llama.LlamaMLP)


def test_explain_capability_chooses_our_cuda_kernels_without_a_gpu(capsys):
    assert run("explain", "llama", "--device", "cuda", "--capability", "9.0") == 0
    out = capsys.readouterr().out
    assert "on cuda, capability 90" in out
    assert "uses kernel layer RMSNorm from local repository" in out
    assert "registered for device cuda (capability 80..max)" in out


def test_explain_training_compile(capsys):
    assert run("explain", "qwen3", "--device", "cpu", "--mode", "Training+Compile") == 0
    out = capsys.readouterr().out
    assert "mode TRAINING | TORCH_COMPILE on cpu" in out
    assert "- RMSNorm (Qwen3RMSNorm)" in out
    assert "uses kernel layer RMSNorm" in out and "uses kernel layer SiLU" in out


def test_explain_saved_folder_reads_it_and_changes_nothing(tmp_path, capsys):
    from transformers import LlamaForCausalLM

    config = llama_config(num_attention_heads=2, num_key_value_heads=1)
    folder = tmp_path / "tiny-llama"
    LlamaForCausalLM(config).save_pretrained(folder)
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}

    assert run("explain", str(folder), "--device", "cpu", "--mode", "training") == 0
    out = capsys.readouterr().out
    assert f"LlamaForCausalLM from {folder}" in out
    assert "mode TRAINING on cpu" in out
    assert "uses kernel layer RMSNorm" in out and "uses kernel layer SiLU" in out
    after = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}
    assert after == before


def test_explain_demo_model_as_json(capsys):
    assert run("explain", "demo", "--device", "cpu", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["device_type"] == "cpu" and data["mode"] == "INFERENCE"
    layers = {layer["layer_name"]: layer for layer in data["layers"]}
    # With our kernels, explain tags what `kernels demo` tags: the loss stays untagged.
    assert set(layers) == {"RMSNorm", "SiLU", "SwiGLUMLP", "rotary_pos_emb"}
    assert all(layer["outcome"] == "kernel" for layer in layers.values())
    assert layers["RMSNorm"]["candidates"][0]["why"] == "chosen"
    assert "model.norm" in layers["RMSNorm"]["paths"]


def test_explain_without_kernels_lists_the_tagged_layers(capsys):
    assert run("explain", "mistral", "--device", "cpu", "--mapping", "none") == 0
    out = capsys.readouterr().out
    assert "keeps its own forward: no kernel is registered for layer name 'RMSNorm'" in out


def test_explain_unknown_model_type_is_an_error(capsys):
    assert run("explain", "notamodel", "--device", "cpu") == 1
    err = capsys.readouterr().err
    assert err.startswith("error: 'notamodel' is neither a folder nor a transformers model type")


def test_explain_missing_folder_is_an_error(tmp_path, capsys):
    missing = tmp_path / "no-such-model"
    assert run("explain", str(missing), "--device", "cpu") == 1
    assert capsys.readouterr().err.startswith(f"error: {missing}: no such folder")


def test_explain_folder_without_config_is_an_error(tmp_path, capsys):
    assert run("explain", str(tmp_path), "--device", "cpu") == 1
    assert "has no config.json" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--mode", "fast"], "invalid mode 'fast'; choose from inference, training,"),
        (["--mapping", "library,hub"], "invalid mapping 'library,hub'"),
        (["--mapping", "none,library"], "--mapping none cannot be combined"),
        (["--capability", "sm90"], "invalid capability 'sm90'"),
    ],
)
def test_explain_bad_options_are_usage_errors(argv, message, capsys):
    assert run("explain", "llama", *argv) == 2
    err = capsys.readouterr().err
    assert "usage: kernels explain" in err and message in err
