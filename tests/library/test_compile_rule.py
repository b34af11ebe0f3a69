"""The compile rule (library/_shared/_compile_rule.py): under ``torch.compile`` each layer hands
the graph its custom op or its PyTorch formula, as the rule's table says, and either way the
compiled result and gradients match a float64 reference.

The graphs are read where AOTAutograd hands them on (forward and backward), with
``fullgraph=True`` and ``dynamic=True``: a layer on the op side is one opaque node in the
forward and its backward op in the backward; on the formula side no op of ours is left. On the
CPU the kernels run through Triton's interpreter (ops registered with ``custom_op`` compile
there too).
"""

import copy
import sys

import pytest
import torch
import torch.nn.functional as F

from tests.support.library import DEVICE, assert_close, library_ops, randn
from tests.support.models import llama_config

# ---- the rule as data -------------------------------------------------------------------------


def _rule(package):
    return sys.modules[f"{package.__name__}._compile_rule"]


@pytest.fixture
def packages(activation, norm, rotary, loss):
    """The four packages, with every forced side and rule change undone afterwards."""
    loaded = {"activation": activation, "norm": norm, "rotary": rotary, "loss": loss}
    yield loaded
    for package in loaded.values():
        _rule(package).force()
        _rule(package).set_rule()
    torch._dynamo.reset()


def _force(packages, side, layers=None):
    for package in packages.values():
        _rule(package).force(side, layers)
    torch._dynamo.reset()


def test_the_rule_holds_the_probes_sides(norm):
    rule = _rule(norm)
    sides = {layer: rule.compile_side(layer, 2048, 4096, True) for layer in rule.LAYERS}
    assert sides == {
        "rms_norm": "formula",
        "gemma_rms_norm": "formula",
        "fused_add_rms_norm": "op",
        "layer_norm": "formula",
        "activation": "formula",
        "gated_activation": "op",
        "gated_mlp": "formula",
        "gated_mlp_decode": "op",
        "rotary": "formula",
        "fused_linear_cross_entropy": "op",
        "cross_entropy": "op",
    }
    assert rule.forced() == {}


def test_the_losses_stay_ops_whatever_a_table_says(norm):
    rule = _rule(norm)
    for layer in rule.ALWAYS_OP:
        with pytest.raises(rule.CompileRuleError, match="puts the logits in memory"):
            rule.check_rule(((layer, "*", 0, 0, "formula"),))


def test_the_most_specific_row_wins_and_agreeing_rows_compare_no_size(packages):
    rule = _rule(packages["norm"])
    rule.set_rule(
        (
            ("rms_norm", "*", 0, 0, "formula"),
            ("rms_norm", "*", 4096, 0, "op"),
            ("rms_norm", "train", 4096, 8192, "formula"),
            ("rms_norm", "*", 4096, 8192, "op"),
            ("rotary", "*", 0, 0, "op"),
            ("rotary", "train", 1024, 512, "op"),
        )
    )
    assert rule.compile_side("rms_norm", 2048, 16384, True) == "formula"
    assert rule.compile_side("rms_norm", 4096, 512, True) == "op"
    assert rule.compile_side("rms_norm", 4096, 8192, True) == "formula"  # exact pass over "*"
    assert rule.compile_side("rms_norm", 4096, 8192, False) == "op"
    assert rule.compile_side("layer_norm", 64, 8, False) == "op"  # no row: the op

    class Unreadable:
        """A size that must not be compared (it would be a guard on the shape)."""

        def __ge__(self, other):
            raise AssertionError("a size was compared")

    assert rule.compile_side("rotary", Unreadable(), Unreadable(), True) == "op"


def test_forcing_a_side(packages):
    rule = _rule(packages["norm"])
    rule.force("op", ["rms_norm"])
    assert rule.compile_side("rms_norm", 8, 8, True) == "op"
    rule.force("formula")
    assert rule.compile_side("rms_norm", 8, 8, True) == "op"  # a layer's own entry first
    assert rule.compile_side("layer_norm", 8, 8, True) == "formula"
    rule.force(None, ["rms_norm"])
    assert rule.forced() == {"*": "formula"}
    rule.force()
    assert rule.forced() == {}
    with pytest.raises(rule.CompileRuleError, match="unknown layer 'rmsnorm'"):
        rule.force("op", ["rmsnorm"])
    with pytest.raises(rule.CompileRuleError, match="write op or formula"):
        rule.force("kernel")


@pytest.mark.parametrize(
    "text,expected",
    [
        ("", {}),
        ("op", {"*": "op"}),
        (" rms_norm=op , rotary=formula ", {"rms_norm": "op", "rotary": "formula"}),
    ],
)
def test_the_environment_variable(norm, text, expected):
    assert _rule(norm).parse_forced(text) == expected


def test_the_environment_variable_is_read_when_the_package_is_imported(norm, monkeypatch):
    # The module reads the variable once, at its top level, and imports nothing of the package
    # (only os): executing its file afresh under the variable is what importing the package
    # does, without a second Python process (which costs seconds of imports).
    import importlib.util

    monkeypatch.setenv("KERNELS_COMPILE_RULE", "formula,rms_norm=op")
    spec = importlib.util.spec_from_file_location("fresh_compile_rule", _rule(norm).__file__)
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    assert sorted(fresh.forced().items()) == [("*", "formula"), ("rms_norm", "op")]
    assert _rule(norm).forced() == {}  # the package's own module is untouched


@pytest.mark.parametrize(
    "text,message",
    [("rms=op", "unknown layer 'rms'"), ("rms_norm=fast", "unknown side 'fast'")],
)
def test_a_bad_environment_variable_names_the_fix(norm, text, message):
    rule = _rule(norm)
    with pytest.raises(rule.CompileRuleError, match=message):
        rule.parse_forced(text)


@pytest.mark.parametrize(
    "row,message",
    [
        (("rms_norm", "*", 0, 0), "expected"),
        (("rmsnorm", "*", 0, 0, "op"), "layer must be one of"),
        (("rms_norm", "both", 0, 0, "op"), "pass must be one of"),
        (("rms_norm", "*", -1, 0, "op"), "integers >= 0"),
        (("rms_norm", "*", 0, 0, "kernel"), "side must be one of"),
    ],
)
def test_a_bad_row_is_refused(norm, row, message):
    rule = _rule(norm)
    with pytest.raises(rule.CompileRuleError, match=message):
        rule.set_rule((row,))


# ---- each layer in a compiled graph -----------------------------------------------------------

EPS = 1e-6


def _rms(x, eps=EPS):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _rotate_half(x):
    d = x.shape[-1] // 2
    return torch.cat((-x[..., d:], x[..., :d]), -1)


def _rotary_reference(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _case(layer, p, rows):
    """(call, float64 reference, inputs needing gradients, other inputs, the op in the forward
    graph, the op in the backward graph or None) for ``layer`` at ``rows`` tokens."""
    n, ffn, vocab = 48, 40, 37
    x = randn(rows, n)
    w = randn(n, shift=1.0, scale=0.2)
    if layer in ("rms_norm", "gemma_rms_norm"):
        fn = p["norm"].rms_norm if layer == "rms_norm" else p["norm"].gemma_rms_norm

        def ref(x, w):
            return _rms(x) * (w if layer == "rms_norm" else 1 + w)

        return (lambda x, w: fn(x, w, EPS)), ref, (x, w), (), "rms_norm", "rms_norm_backward"
    if layer == "fused_add_rms_norm":

        def call(h, r, w):
            y, s = p["norm"].fused_add_rms_norm(h, r, w, EPS)
            return y * s

        def ref(h, r, w):
            return w * _rms(h + r) * (h + r)

        return call, ref, (x, randn(rows, n), w), (), "fused_add_rms_norm", "rms_norm_backward"
    if layer == "layer_norm":
        b = randn(n, scale=0.1)

        def call(x, w, b):
            return p["norm"].layer_norm(x, [n], w, b, EPS)

        def ref(x, w, b):
            return F.layer_norm(x, [n], w, b, EPS)

        return call, ref, (x, w, b), (), "layer_norm", "layer_norm_backward"
    if layer == "activation":
        return p["activation"].silu, F.silu, (x,), (), "activation", "activation_backward"
    if layer == "gated_activation":

        def ref(x):
            return F.silu(x[..., : n // 2]) * x[..., n // 2 :]

        call = p["activation"].silu_and_mul
        return call, ref, (x,), (), "gated_activation", "gated_activation_backward"
    if layer == "gated_mlp":
        # SwiGLU as the layer computes it under compile: the projections, then silu_mul.
        gw, uw, dw = randn(ffn, n, scale=0.2), randn(ffn, n, scale=0.2), randn(n, ffn, scale=0.2)

        def call(x, gw, uw, dw):
            return p["activation"].silu_mul(x @ gw.t(), x @ uw.t()) @ dw.t()

        def ref(x, gw, uw, dw):
            return (F.silu(x @ gw.t()) * (x @ uw.t())) @ dw.t()

        ops = ("gated_pair_activation", "gated_pair_activation_backward")
        return call, ref, (x, gw, uw, dw), (), *ops
    if layer == "rotary":
        q, k = randn(2, 4, rows, 8), randn(2, 2, rows, 8)
        angles = torch.arange(rows, device=DEVICE)[:, None] * torch.rand(4, device=DEVICE)
        emb = torch.cat((angles, angles), -1)[None].expand(2, -1, -1)

        def call(q, k, cos, sin):
            qo, ko = p["rotary"].apply_rotary_pos_emb(q, k, cos, sin)
            return qo.sum(1) + ko.sum(1)

        def ref(q, k, cos, sin):
            qo, ko = _rotary_reference(q, k, cos, sin)
            return qo.sum(1) + ko.sum(1)

        return call, ref, (q, k), (emb.cos(), emb.sin()), "rotary", "rotary_backward"
    labels = torch.randint(0, vocab, (rows,), device=DEVICE)
    labels[0] = -100
    if layer == "fused_linear_cross_entropy":
        head = randn(vocab, n, scale=0.3)

        def call(x, head, labels):
            return p["loss"].fused_linear_cross_entropy(x, head, labels)

        def ref(x, head, labels):
            return F.cross_entropy(x @ head.t(), labels)

        # A mean's gradients are made in the forward; the backward only scales them.
        return call, ref, (x, head), (labels,), "fused_linear_cross_entropy", None
    assert layer == "cross_entropy"

    def call(logits, labels):
        return p["loss"].cross_entropy(logits, labels)

    def ref(logits, labels):
        return F.cross_entropy(logits, labels)

    return call, ref, (randn(rows, vocab),), (labels,), "cross_entropy", None


LAYERS = (
    "rms_norm", "gemma_rms_norm", "fused_add_rms_norm", "layer_norm", "activation",
    "gated_activation", "gated_mlp", "rotary", "fused_linear_cross_entropy", "cross_entropy",
)  # fmt: skip


class _GraphRecorder:
    """An aot_eager backend that keeps the names of our ops in the forward and backward graph
    of each compilation (a compilation Dynamo restarts keeps its last attempt's)."""

    def __init__(self):
        from torch._dynamo.backends.common import aot_autograd

        self.compilations = {}

        def keep(which):
            def compiler(gm, example_inputs):
                self.compilations.setdefault(_compile_key(), {})[which] = library_ops(gm)
                return gm.forward

            return compiler

        self._aot = aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"))

    def __call__(self, gm, example_inputs):
        self.compilations[_compile_key()] = {}
        return self._aot(gm, example_inputs)

    @property
    def frames(self) -> int:
        return len(self.compilations)

    @property
    def forward(self) -> list:
        return [c.get("forward") for c in self.compilations.values()]

    @property
    def backward(self) -> list:
        return [c["backward"] for c in self.compilations.values() if "backward" in c]


def _compile_key():
    compile_id = torch._guards.CompileContext.current_compile_id()
    return compile_id.frame_id, compile_id.frame_compile_id


@pytest.mark.parametrize("side", ["op", "formula"])
@pytest.mark.parametrize("layer", LAYERS)
def test_each_layer_takes_its_side_in_a_compiled_graph(packages, layer, side):
    torch.manual_seed(0)
    if side == "formula" and layer in _rule(packages["norm"]).ALWAYS_OP:
        _force(packages, "formula", [layer])  # measurements may force it; the table may not
    else:
        _force(packages, side, [layer])
    recorder = _GraphRecorder()
    call, ref, *_ = _case(layer, packages, 6)
    compiled = torch.compile(call, backend=recorder, fullgraph=True, dynamic=True)
    for rows in (6, 11):  # another size of the same class: no recompilation
        torch.manual_seed(rows)
        _, _, grad_inputs, others, forward_op, backward_op = _case(layer, packages, rows)
        inputs = [t.detach().requires_grad_() for t in grad_inputs]
        out = compiled(*inputs, *others)
        seed = torch.randn(out.shape, device=DEVICE)
        got = torch.autograd.grad(out, inputs, seed)
        inputs64 = [t.detach().double().requires_grad_() for t in grad_inputs]
        others64 = [t.double() if t.is_floating_point() else t for t in others]
        expected = ref(*inputs64, *others64)
        want = torch.autograd.grad(expected, inputs64, seed.double())
        assert_close(out, expected, torch.float32, f"{layer} {side} forward")
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_close(g, w, torch.float32, f"{layer} {side} gradient {i}")
    assert recorder.frames == 1, f"{layer}: recompiled for another number of tokens"
    (forward,), (backward,) = recorder.forward, recorder.backward
    if side == "op":
        expected = {backward_op} if backward_op else set()
        assert forward == {forward_op} and backward == expected, (forward, backward)
    else:
        assert forward == set() and backward == set(), (forward, backward)


def test_a_size_class_boundary_recompiles_once_per_class(packages):
    """Rows that disagree make the size class a guard: a second class compiles once more, and
    every size of a class reuses its graph."""
    rule = _rule(packages["norm"])
    rule.set_rule((("rms_norm", "*", 0, 0, "formula"), ("rms_norm", "*", 0, 8, "op")))
    torch._dynamo.reset()
    recorder = _GraphRecorder()
    w = randn(48, shift=1.0, scale=0.2)
    compiled = torch.compile(
        lambda x: packages["norm"].rms_norm(x, w, EPS), backend=recorder, dynamic=True
    )
    with torch.no_grad():
        for rows in (3, 5, 9, 12, 4, 20):
            out = compiled(randn(rows, 48))
            assert out.shape == (rows, 48)
    assert recorder.frames == 2
    assert recorder.forward == [set(), {"rms_norm"}]


def test_a_compiled_call_guards_on_its_own_layers_rule_only(packages, caplog):
    """Dynamo guards a graph on every value of the rule it reads: a call reads its own layer's
    entry, not the names of every layer's rows (each a guard evaluated at every call)."""
    import logging

    w = randn(48, shift=1.0, scale=0.2)
    torch._dynamo.reset()
    torch._logging.set_logs(guards=True)
    try:
        with caplog.at_level(logging.DEBUG, logger="torch._dynamo"), torch.no_grad():
            compiled = torch.compile(
                lambda x: packages["norm"].rms_norm(x, w, EPS), backend="eager", fullgraph=True
            )
            compiled(randn(5, 48))
    finally:
        torch._logging.set_logs()
        torch._dynamo.reset()
    rule_guards = [
        line
        for line in caplog.text.splitlines()
        if "_compile_rule']._rows[" in line and "_MATCH:" in line  # guards on its entries
    ]
    assert rule_guards, "no guard on the rule was logged"
    assert all("('rms_norm', 'infer')" in line for line in rule_guards), rule_guards


# ---- inductor, and its modes -------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode", [pytest.param("max-autotune", marks=pytest.mark.gpu), "reduce-overhead"]
)
def test_ops_survive_inductor(packages, mode):
    """A norm, a gated activation and rotary as ops in one graph, compiled by inductor (C++ on
    the CPU, Triton on a GPU) with fullgraph and dynamic shapes, forward and backward.
    ``reduce-overhead`` records CUDA graphs on a GPU; on the CPU inductor skips them, so it is
    inductor's default there. ``max-autotune`` runs on the GPU only: on the CPU this graph has
    no template to tune, and it compiled the same ops a second time, slower."""
    _force(packages, "op", ["rms_norm", "gated_activation", "rotary"])
    n = 32
    w = randn(n, shift=1.0, scale=0.2).requires_grad_()

    def block(x, cos, sin):
        h = packages["norm"].rms_norm(x, w, EPS)
        h = packages["activation"].silu_and_mul(torch.cat((h, h * 0.5), -1))
        q = h.view(2, -1, 4, 8).transpose(1, 2)
        qo, ko = packages["rotary"].apply_rotary_pos_emb(q, q[:, :2], cos, sin)
        return qo.sum(1) + ko.sum(1)

    def reference(x, w, cos, sin):
        h = _rms(x) * w
        h = F.silu(h) * (h * 0.5)
        q = h.view(2, -1, 4, 8).transpose(1, 2)
        qo, ko = _rotary_reference(q, q[:, :2], cos, sin)
        return qo.sum(1) + ko.sum(1)

    from torch._inductor.compile_fx import compile_fx

    graphs = {}  # compilation -> Dynamo's graph (a restarted one keeps its last attempt's)

    def inductor(gm, example_inputs):
        graphs[_compile_key()] = gm.code
        options = torch._inductor.list_mode_options(mode)
        return compile_fx(gm, example_inputs, config_patches=options)

    compiled = torch.compile(block, backend=inductor, fullgraph=True, dynamic=True)
    for seq in (5, 7):
        x = randn(2, seq, n).requires_grad_()
        angles = torch.arange(seq, device=DEVICE)[:, None] * torch.rand(4, device=DEVICE)
        emb = torch.cat((angles, angles), -1)[None].expand(2, -1, -1)
        out = compiled(x, emb.cos(), emb.sin())
        seed = torch.randn(out.shape, device=DEVICE)
        got = torch.autograd.grad(out, (x, w), seed)
        x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
        expected = reference(x64, w64, emb.cos().double(), emb.sin().double())
        want = torch.autograd.grad(expected, (x64, w64), seed.double())
        assert_close(out, expected, torch.float32, f"{mode} forward")
        for g, wanted in zip(got, want, strict=True):
            assert_close(g, wanted, torch.float32, f"{mode} gradient")
    (code,) = graphs.values()  # one compilation for both lengths
    assert all(f".{op}.default" in code for op in ("rms_norm", "gated_activation", "rotary"))


# ---- a transformers model, kernelized for training under compile ------------------------------


@pytest.fixture
def restore_registry():
    from kernels.library import untag
    from kernels.mapping import registry

    saved = registry._global_mapping
    yield
    untag()
    registry._global_mapping = saved


def _tiny_llama():
    import transformers

    torch.manual_seed(0)
    # One decoder layer: every layer kind the library swaps is in it, and each further layer
    # only lengthens the graph to trace.
    config = llama_config(
        intermediate_size=40, num_hidden_layers=1, vocab_size=101, attn_implementation="sdpa"
    )
    model = transformers.LlamaForCausalLM(config).to(DEVICE).train()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    return model


def _step(model, tokens):
    model.zero_grad(set_to_none=True)
    out = model(tokens, labels=tokens)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("side", ["table", "op"])
def test_a_kernelized_llama_compiles_fullgraph_and_matches(packages, restore_registry, side):
    """`register_library_kernels()` and kernelize with ``Mode.TRAINING | Mode.TORCH_COMPILE``,
    then ``torch.compile(fullgraph=True)``: the training step (loss and every gradient) matches
    the untouched model, the loss is the fused op (no logits: ``logits=None``), and the
    layers take the rule's sides (``table``: the initial rule; ``op``: every layer forced)."""
    from kernels import Mode, kernelize
    from kernels.library import register_library_kernels

    if side == "op":
        _force(packages, "op")
    model = _tiny_llama()
    reference = copy.deepcopy(model)
    tokens = torch.randint(0, 101, (2, 9), device=DEVICE)
    expected, expected_grads = _step(reference, tokens)
    register_library_kernels(devices=[DEVICE])
    kernelize(model, mode=Mode.TRAINING | Mode.TORCH_COMPILE, device=DEVICE)
    torch._dynamo.reset()
    recorder = _GraphRecorder()
    model.forward = torch.compile(model.forward, backend=recorder, fullgraph=True)
    out, got_grads = _step(model, tokens)
    assert out.logits is None
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-4, atol=1e-5)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)
    assert recorder.frames == 1
    (forward,), (backward,) = recorder.forward, recorder.backward
    if side == "table":
        assert forward == {"fused_linear_cross_entropy"}, forward
        assert backward == set(), backward
    else:
        ops = {"fused_linear_cross_entropy", "rms_norm", "gated_pair_activation", "rotary"}
        assert forward == ops, forward
        # The MLP's backward recomputes silu(gate) * up rather than saving it (mlp.py).
        ops = {"rms_norm_backward", "gated_pair_activation_backward_output", "rotary_backward"}
        assert backward == ops, backward
