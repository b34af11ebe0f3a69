"""`kernels explain` for transformers 5.x models: its tags, its lazily built default mapping."""

import json

from transformers.integrations.hub_kernels import get_kernel_mapping_transformers

from kernels.cli import main


def test_explain_a_5x_model_on_cuda_shows_our_kernels_winning(capsys):
    assert main(["explain", "qwen3", "--device", "cuda", "--capability", "90", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mapping"].startswith("transformers' default Hub mapping, then our Triton kernels")
    layers = {layer["layer_name"]: layer for layer in data["layers"]}
    # 5.x tags the norms, the activation and apply_rotary_pos_emb; explain tags the MLP and the
    # causal-LM forward (the fused loss) as register_library_kernels() has kernelize do.
    assert set(layers) == {"RMSNorm", "SiLU", "SwiGLUMLP", "rotary_pos_emb", "CausalLMFusedLoss"}
    # transformers' own Hub kernels for cuda (5.25 dropped SwiGLUMLP's): passed over for ours.
    hub_mapped = {
        name for name, devices in get_kernel_mapping_transformers().items() if "cuda" in devices
    }
    assert {"RMSNorm", "SiLU", "rotary_pos_emb"} <= hub_mapped
    for name, layer in layers.items():
        assert layer["outcome"] == "kernel", layer
        candidates = json.dumps(layer["candidates"])
        assert "library/" in candidates
        assert ("kernels-community/" in candidates) == (name in hub_mapped), layer
    assert "model.layers.0.self_attn:apply_rotary_pos_emb" in layers["rotary_pos_emb"]["paths"]


def test_explain_transformers_defaults_alone(capsys):
    assert main(["explain", "llama", "--device", "cpu", "--mapping", "transformers"]) == 0
    out = capsys.readouterr().out
    # transformers 5.x builds its mapping lazily; it has RMSNorm kernels, none for the cpu.
    devices = ", ".join(get_kernel_mapping_transformers()["RMSNorm"])
    assert "cpu" not in devices
    assert f"layer 'RMSNorm' has kernels for device types {devices}, not for cpu" in out
