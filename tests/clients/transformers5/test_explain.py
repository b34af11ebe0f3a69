"""`kernels explain` for transformers 5.24 models: its tags, its lazily built default mapping."""

import json

from kernels.cli import main


def test_explain_a_5x_model_on_cuda_shows_our_kernels_winning(capsys):
    assert main(["explain", "qwen3", "--device", "cuda", "--capability", "90", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mapping"].startswith("transformers' default Hub mapping, then our Triton kernels")
    layers = {layer["layer_name"]: layer for layer in data["layers"]}
    # 5.24 tags the norms, the activation and apply_rotary_pos_emb; explain tags the MLP and the
    # causal-LM forward (the fused loss) as register_library_kernels() has kernelize do.
    assert set(layers) == {"RMSNorm", "SiLU", "SwiGLUMLP", "rotary_pos_emb", "CausalLMFusedLoss"}
    for name, layer in layers.items():
        assert layer["outcome"] == "kernel", layer
        if name != "CausalLMFusedLoss":  # our own name: transformers maps no Hub kernel to it
            assert "kernels-community/" in json.dumps(layer["candidates"])  # passed over
    assert "model.layers.0.self_attn:apply_rotary_pos_emb" in layers["rotary_pos_emb"]["paths"]


def test_explain_transformers_defaults_alone(capsys):
    assert main(["explain", "llama", "--device", "cpu", "--mapping", "transformers"]) == 0
    out = capsys.readouterr().out
    # transformers 5.24 builds its mapping lazily; it has RMSNorm kernels, none for the cpu.
    assert (
        "layer 'RMSNorm' has kernels for device types cuda, rocm, xpu, mps, npu, not for cpu" in out
    )
