"""End to end: a hand-written Llama block that nobody tagged (``nn.RMSNorm`` or transformers'
RMSNorm formula, causal ``F.scaled_dot_product_attention``, ``F.silu(gate) * up``), and a
transformers Llama decoder layer, compiled with the library's kernels: every norm and the
gated MLP replaced, output and gradients against float64."""

import pytest
import torch

from kernels.compile import KernelRegistry, kernels_backend
from tests.support.compile import ON_GPU, LlamaBlock, check_against_float64, randn
from tests.support.models import llama_config


@pytest.mark.parametrize("norm", ["module", "formula"])
@pytest.mark.parametrize("downstream", ["eager", "aot_eager"])
def test_untagged_llama_block(norm, downstream):
    block = LlamaBlock(norm=norm)
    backend = kernels_backend(KernelRegistry.library(), downstream=downstream)
    compiled = torch.compile(block, backend=backend, fullgraph=True)
    check_against_float64(block, compiled, randn(2, 5, 32), what=f"{norm}/{downstream}")
    (report,) = backend.reports
    assert (report.count("rms_norm"), report.count("silu_mul")) == (2, 1), report.format()
    assert report.kept == []
    form = "torch.rms_norm" if norm == "module" else "transformers formula"
    assert {r.form for r in report.replaced if r.pattern == "rms_norm"} == {form}
    assert {r.where for r in report.replaced} == {"input_norm", "post_norm", "mlp"}


def test_transformers_llama_decoder_layer():
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    config = llama_config(attn_implementation="sdpa")
    torch.manual_seed(0)
    layer = LlamaDecoderLayer(config, layer_idx=0).to(ON_GPU and "cuda" or "cpu")
    rotary = LlamaRotaryEmbedding(config).to(ON_GPU and "cuda" or "cpu")
    for norm in (layer.input_layernorm, layer.post_attention_layernorm):
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def forward(self, x):
            positions = torch.arange(x.shape[1], device=x.device)[None]
            out = self.layer(x, position_embeddings=rotary(x, positions))
            return out[0] if isinstance(out, tuple) else out

    model = Layer()
    backend = kernels_backend(downstream="aot_eager")
    check_against_float64(model, torch.compile(model, backend=backend), randn(2, 6, 32))
    assert (backend.count("rms_norm"), backend.count("silu_mul")) == (2, 1), backend.report()
