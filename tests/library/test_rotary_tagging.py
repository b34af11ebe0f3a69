"""``kernels.library.tag_rotary_embeddings``: transformers 4.57's attention layers call the module
global ``apply_rotary_pos_emb``; after tagging, ``kernelize`` swaps it for our rotary kernel."""

import importlib
import inspect
import logging
import sys
import textwrap

import pytest
import torch
from torch import nn

from kernels import Mode, explain, kernelize, library_mapping, use_kernel_mapping
from kernels.layer.func import ATTACHED_ATTRIBUTE
from kernels.layer.swap import kernel_layer_of
from kernels.layer.tagging import TAG_ATTRIBUTE
from kernels.library import tag_gated_mlps, tag_rotary_embeddings, untag
from tests.support.library import DEVICE

FAMILIES = ["llama", "mistral", "qwen2", "qwen3"]


def _modeling(family):
    return importlib.import_module(f"transformers.models.{family}.modeling_{family}")


@pytest.fixture
def restore_rotary():
    """Tagging replaces module globals and attaches to classes, process-wide: undo it."""
    yield
    untag()


def _tiny(family, layers=2):
    import transformers

    config_class = getattr(transformers, f"{family.capitalize()}Config")
    model_class = getattr(transformers, f"{family.capitalize()}ForCausalLM")
    torch.manual_seed(0)
    config = config_class(
        hidden_size=48,
        intermediate_size=45,
        num_hidden_layers=layers,
        num_attention_heads=6,  # head_dim 8
        num_key_value_heads=3,
        vocab_size=64,
        attn_implementation="sdpa",
    )
    return model_class(config).to(DEVICE)


def _loss_and_grads(model, tokens):
    model.zero_grad()
    out = model(tokens, labels=tokens)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("family", FAMILIES)
def test_tag_then_kernelize_matches_the_original(restore_rotary, family, monkeypatch):
    model = _tiny(family).train()
    tokens = torch.randint(0, 64, (2, 7), device=DEVICE)
    expected_logits, expected_grads = _loss_and_grads(model, tokens)

    attention = type(model.model.layers[0].self_attn).__name__
    assert tag_rotary_embeddings(model) == [attention]
    assert tag_rotary_embeddings(model) == []  # already tagged
    global_fn = _modeling(family).apply_rotary_pos_emb
    assert isinstance(global_fn, nn.Module) and global_fn.kernel_layer_name == "rotary_pos_emb"
    # Before kernelize the model computes what it did, bit for bit.
    logits, _ = _loss_and_grads(model, tokens)
    assert torch.equal(logits, expected_logits)

    with use_kernel_mapping(library_mapping(devices=[DEVICE], layers=["rotary_pos_emb"])):
        kernelize(model, mode=Mode.TRAINING, device=DEVICE)
    # kernels 0.19: each attention layer's private copy is kernelized, not the global.
    assert kernel_layer_of(global_fn) is None
    kernel = kernel_layer_of(model.model.layers[0].self_attn._kernel_funcs["rotary_pos_emb"])
    assert kernel is not None and kernel.__name__ == "apply_rotary_pos_emb"
    launches = []
    module = importlib.import_module(kernel.forward.__wrapped__.__module__)
    launch = module._launch
    monkeypatch.setattr(module, "_launch", lambda *a: launches.append(a[-1]) or launch(*a))
    logits, got_grads = _loss_and_grads(model, tokens)
    assert launches == [False, False, True, True]  # two layers, forward then backward
    torch.testing.assert_close(logits, expected_logits, rtol=1e-4, atol=1e-4)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)


def test_explain_lists_the_rotary_function(restore_rotary):
    model = _tiny("llama")
    tag_rotary_embeddings(model)
    with use_kernel_mapping(library_mapping(devices=[DEVICE])):
        plan = str(explain(model, mode=Mode.INFERENCE, device=DEVICE))
    assert (
        "rotary_pos_emb (apply_rotary_pos_emb) at model.layers.0.self_attn:apply_rotary_pos_emb"
        in plan
    )
    assert "keeps its own forward" not in plan.split("rotary_pos_emb", 1)[1].split("\n- ", 1)[0]


def test_compile_fullgraph_through_the_tagged_global(restore_rotary):
    model = _tiny("qwen3", layers=1).eval()  # each decoder layer lengthens the trace
    tokens = torch.randint(0, 64, (1, 5), device=DEVICE)
    with torch.no_grad():
        expected = model(tokens).logits
    tag_rotary_embeddings(model)
    with use_kernel_mapping(library_mapping(devices=[DEVICE], layers=["rotary_pos_emb"])):
        kernelize(model, mode=Mode.INFERENCE | Mode.TORCH_COMPILE, device=DEVICE)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        got = compiled(tokens).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


# ---- which functions are tagged -----------------------------------------------------------

_ROTATE_HALF = """
def rotate_half(x):
    \"\"\"Rotates half the hidden dims of the input.\"\"\"
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)
"""
_LLAMA_ROTARY = """
def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    \"\"\"Applies Rotary Position Embedding to the query and key tensors.\"\"\"
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed
"""
# Phi-style partial rotary: rotates only the first rotary_dim channels.
_PARTIAL_ROTARY = """
def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    rotary_dim = cos.shape[-1]
    q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
    k_rot, k_pass = k[..., :rotary_dim], k[..., rotary_dim:]
    q_embed = torch.cat([(q_rot * cos) + (rotate_half(q_rot) * sin), q_pass], dim=-1)
    k_embed = torch.cat([(k_rot * cos) + (rotate_half(k_rot) * sin), k_pass], dim=-1)
    return q_embed, k_embed
"""
# Interleaved pairs (GPT-J style) under the usual names.
_INTERLEAVED_ROTATE_HALF = """
def rotate_half(x):
    x1 = x[..., ::2]
    x2 = x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)
"""
_ATTENTION = """
class Attention(nn.Module):
    def forward(self, q, k, cos, sin):
        return apply_rotary_pos_emb(q, k, cos, sin)
"""


def _modeling_file(tmp_path, name, *parts):
    path = tmp_path / f"{name}.py"
    path.write_text(
        "import torch\nfrom torch import nn\n" + "".join(textwrap.dedent(p) for p in parts)
    )
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "parts,tagged",
    [
        ((_ROTATE_HALF, _LLAMA_ROTARY), True),
        ((_ROTATE_HALF, _PARTIAL_ROTARY), False),
        ((_INTERLEAVED_ROTATE_HALF, _LLAMA_ROTARY), False),
    ],
    ids=["llama", "partial-rotary", "interleaved"],
)
def test_only_the_rotate_half_formula_is_tagged(tmp_path, caplog, parts, tagged):
    name = f"modeling_rotary_probe_{tmp_path.name}"  # tmp_path is unique to the test
    modeling = _modeling_file(tmp_path, name, *parts, _ATTENTION)
    try:
        original = modeling.apply_rotary_pos_emb
        with caplog.at_level(logging.INFO, logger="kernels"):
            names = tag_rotary_embeddings(nn.Sequential(modeling.Attention()))
        assert names == (["Attention"] if tagged else [])
        assert (modeling.apply_rotary_pos_emb is not original) == tagged
        if tagged:
            # It calls the original through transformers 5.x's signature, our kernel's.
            assert modeling.apply_rotary_pos_emb.__wrapped__.original is original
            assert str(inspect.signature(modeling.apply_rotary_pos_emb.forward)) == (
                "(q, k, cos, sin, unsqueeze_dim=1)"
            )
        else:
            assert "not transformers' rotate-half formula" in caplog.text
    finally:
        del sys.modules[name]


@pytest.mark.parametrize(
    "call,tagged",
    [
        ("apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)", True),
        ("apply_rotary_pos_emb(q, k, cos, sin, None)", False),
        ("apply_rotary_pos_emb(q, k, cos, sin, position_ids=None)", False),
        ("apply_rotary_pos_emb(*(q, k, cos, sin))", False),
        ("(lambda f: f(q, k, cos, sin))(apply_rotary_pos_emb)", False),
    ],
    ids=["unsqueeze-keyword", "fifth-positional", "position-ids", "starred", "passed-along"],
)
def test_the_5x_signature_is_given_only_where_every_call_fits_it(tmp_path, call, tagged):
    """4.57's function has ``position_ids`` before ``unsqueeze_dim``; 5.x's (our kernel's) has
    not. A call that passes a fifth positional argument, ``position_ids``, or the function
    itself elsewhere could mean something else with 5.x's signature: nothing is tagged."""
    attention = f"""
class Attention(nn.Module):
    def forward(self, q, k, cos, sin):
        return {call}
"""
    name = f"modeling_rotary_calls_{tmp_path.name}"
    modeling = _modeling_file(tmp_path, name, _ROTATE_HALF, _LLAMA_ROTARY, attention)
    try:
        original = modeling.apply_rotary_pos_emb
        assert tag_rotary_embeddings(nn.Sequential(modeling.Attention())) == (
            ["Attention"] if tagged else []
        )
        assert (modeling.apply_rotary_pos_emb is not original) == tagged
    finally:
        untag()
        del sys.modules[name]


def test_modules_that_do_not_call_it_are_left_alone(restore_rotary):
    model = nn.Sequential(nn.Linear(4, 4), nn.SiLU())
    assert tag_rotary_embeddings(model) == []
    assert all(ATTACHED_ATTRIBUTE not in vars(type(m)) for m in model.modules())


def test_untag_puts_back_what_the_tags_changed():
    modeling = _modeling("llama")
    original = modeling.apply_rotary_pos_emb
    model = _tiny("llama")
    try:
        assert tag_rotary_embeddings(model) == ["LlamaAttention"]
        assert tag_gated_mlps(model) == ["LlamaMLP"]
        assert modeling.apply_rotary_pos_emb is not original
    finally:
        untag()
    assert modeling.apply_rotary_pos_emb is original
    assert ATTACHED_ATTRIBUTE not in vars(modeling.LlamaAttention)
    assert TAG_ATTRIBUTE not in vars(modeling.LlamaMLP)
    # Tagging again after untag starts afresh.
    try:
        assert tag_rotary_embeddings(model) == ["LlamaAttention"]
    finally:
        untag()
    assert modeling.apply_rotary_pos_emb is original
