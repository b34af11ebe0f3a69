"""The SwiGLUMLP kernel layer (library/activation) bound to transformers' gated MLP modules, and
``kernels.library.tag_gated_mlps``, which tags those modules so that ``kernelize`` reaches them."""

import copy
import importlib
import logging
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kernels import Mode, kernelize, library_mapping, use_kernel_mapping
from kernels.layer.swap import kernel_layer_of
from kernels.layer.tagging import TAG_ATTRIBUTE, replace_kernel_forward_from_hub
from kernels.library import tag_gated_mlps
from tests.support.library import (
    COMPILE_BACKEND,
    DEVICE,
    DTYPES,
    assert_close,
    grads,
    library_ops,
    randn,
)
from tests.support.models import llama_config

# family -> (modelling module, config class, MLP class, extra config)
FAMILIES = {
    "llama": ("llama", "LlamaConfig", "LlamaMLP", {"mlp_bias": True}),
    "mistral": ("mistral", "MistralConfig", "MistralMLP", {}),
    "qwen2": ("qwen2", "Qwen2Config", "Qwen2MLP", {}),
    "qwen3": ("qwen3", "Qwen3Config", "Qwen3MLP", {}),
}

HIDDEN, INTERMEDIATE = 24, 37


def _mlp(family: str, dtype=torch.float32, **config):
    name, config_name, class_name, extra = FAMILIES[family]
    modeling = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    config_class = getattr(importlib.import_module("transformers"), config_name)
    torch.manual_seed(0)
    mlp = getattr(modeling, class_name)(
        config_class(
            hidden_size=HIDDEN,
            intermediate_size=INTERMEDIATE,
            # transformers 5.x validates the attention shape even for an MLP-only test.
            num_attention_heads=4,
            num_key_value_heads=2,
            **{**extra, **config},
        )
    )
    with torch.no_grad():
        for p in mlp.parameters():
            p.mul_(4.0)  # default init is small; make the activation's nonlinearity matter
    return mlp.to(DEVICE, dtype)


def _bind(mlp, activation):
    fast = copy.deepcopy(mlp)
    fast.forward = types.MethodType(activation.layers.SwiGLUMLP.forward, fast)
    return fast


@pytest.fixture
def fused_calls(activation, monkeypatch):
    """The fused functions the layer called: ``("silu_mul", shape)`` for the fused activation
    between module calls, ``("swiglu_mlp", shape)`` for the whole MLP as one function."""
    calls = []
    for name in ("silu_mul", "swiglu_mlp", "gelu_tanh_mul"):
        fused = getattr(activation.layers, name)

        def counting(first, *rest, name=name, fused=fused):
            calls.append((name, first.shape))
            return fused(first, *rest)

        monkeypatch.setattr(activation.layers, name, counting)
    return calls


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", [None, "transpose"])
def test_swiglu_mlp_matches_the_module(activation, fused_calls, family, dtype, layout):
    mlp = _mlp(family, dtype)
    fast = _bind(mlp, activation)
    reference = copy.deepcopy(mlp).double()  # the module's own forward, in float64
    if layout == "transpose":
        x = randn(5, 2, HIDDEN, dtype=dtype).transpose(0, 1).requires_grad_()
    else:
        x = randn(2, 5, HIDDEN, dtype=dtype).requires_grad_()
    y = fast(x)
    assert [c[0] for c in fused_calls] == ["swiglu_mlp"], "training did not take the fused MLP"
    assert y.dtype == dtype and y.shape == x.shape
    x64 = x.detach().double().requires_grad_()
    y64 = reference(x64)
    assert_close(y, y64, dtype, f"{family} forward")
    dy = randn(*y.shape, dtype=dtype)
    names = [n for n, _ in fast.named_parameters()]
    got = grads(y, (x, *fast.parameters()), dy)
    want = grads(y64, (x64, *reference.parameters()), dy.double())
    for name, g, w in zip(["x", *names], got, want, strict=True):
        assert_close(g, w, dtype, f"{family} grad {name}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16], ids=str)
def test_swiglu_mlp_model_sized(activation, fused_calls, dtype):
    from transformers.models.llama.modeling_llama import LlamaMLP

    torch.manual_seed(0)
    mlp = LlamaMLP(llama_config(hidden_size=4096, intermediate_size=14336)).to(DEVICE, dtype)
    fast = _bind(mlp, activation)
    x = randn(2, 2048, 4096, dtype=dtype).requires_grad_()
    y = fast(x)
    assert len(fused_calls) == 1
    with torch.no_grad():
        gate, up = mlp.gate_proj(x), mlp.up_proj(x)
        ref = mlp.down_proj((F.silu(gate.float()) * up.float()).to(dtype))
    assert_close(y, ref.double(), dtype, "model-sized forward")
    (dx,) = grads(y, (x,), torch.randn_like(y))
    assert torch.isfinite(dx).all()


@pytest.mark.parametrize("layer", ["SwiGLUMLP", "GeGLUMLP"])
@pytest.mark.parametrize("hidden_act", ["gelu_pytorch_tanh", "gelu_python_tanh"])
def test_tanh_gelu_is_fused(activation, fused_calls, layer, hidden_act):
    """Gemma's activation: ``act(gate) * up`` runs as ``gelu_tanh_mul``, forward and backward."""
    mlp = _mlp("llama", hidden_act=hidden_act)
    fast = copy.deepcopy(mlp)
    fast.forward = types.MethodType(getattr(activation.layers, layer).forward, fast)
    x = randn(2, 5, HIDDEN).requires_grad_()
    y = fast(x)
    assert [c[0] for c in fused_calls] == ["gelu_tanh_mul"]
    reference = copy.deepcopy(mlp).double()
    x64 = x.detach().double().requires_grad_()
    y64 = reference(x64)
    assert_close(y, y64, torch.float32, f"{layer} {hidden_act} forward")
    dy = randn(*y.shape)
    got = grads(y, (x, *fast.parameters()), dy)
    want = grads(y64, (x64, *reference.parameters()), dy.double())
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, torch.float32, f"{layer} {hidden_act} grad")


@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_new", "relu"])
def test_other_activations_run_the_modules_own_formula(activation, fused_calls, hidden_act):
    mlp = _mlp("llama", hidden_act=hidden_act)
    fast = _bind(mlp, activation)
    x = randn(3, HIDDEN).requires_grad_()
    y, y_ref = fast(x), mlp(x)
    assert not fused_calls
    assert torch.equal(y, y_ref)
    dy = randn(*y.shape)
    got = grads(y, (x, *fast.parameters()), dy)
    want = grads(y_ref, (x, *mlp.parameters()), dy)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_torch_silu_module_is_fused(activation, fused_calls):
    mlp = _mlp("llama", hidden_act="swish")  # transformers' ACT2FN["swish"] is torch.nn.SiLU
    assert type(mlp.act_fn) is nn.SiLU
    x = randn(4, HIDDEN)
    assert_close(_bind(mlp, activation)(x), mlp.double()(x.double()), torch.float32, "swish")
    assert len(fused_calls) == 1


def test_kernelized_silu_act_fn_is_still_fused(activation, fused_calls):
    # With library_mapping(), kernelize gives act_fn our "SiLU" kernel as well as the MLP its own.
    mlp = _mlp("qwen3")
    fast = _bind(mlp, activation)
    fast.act_fn.forward = types.MethodType(activation.layers.SiLU.forward, fast.act_fn)
    x = randn(4, HIDDEN)
    assert_close(fast(x), mlp.double()(x.double()), torch.float32, "kernelized act_fn")
    assert len(fused_calls) == 1


def test_act_fn_with_a_hook_or_its_own_forward_is_called(activation, fused_calls):
    mlp = _mlp("llama")
    seen = []
    hooked = _bind(mlp, activation)
    hooked.act_fn.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    x = randn(4, HIDDEN)
    assert torch.equal(hooked(x), mlp(x))
    assert seen == [(4, INTERMEDIATE)] and not fused_calls

    replaced = _bind(mlp, activation)
    replaced.act_fn.forward = lambda t: torch.relu(t)  # someone else's forward on the instance
    assert torch.equal(replaced(x), mlp.down_proj(torch.relu(mlp.gate_proj(x)) * mlp.up_proj(x)))
    assert not fused_calls


# ---- the whole MLP as one function (training) ----------------------------------------------


def test_backward_kernel_recomputes_the_forward_output_exactly(activation):
    """swiglu_mlp's backward takes silu(gate) * up from the backward kernel: it must be the very
    bits the forward kernel wrote, or down_proj's weight gradient would drift from eager."""
    gated = importlib.import_module(f"{activation.__name__}.gated")
    for dtype in DTYPES:
        gate = randn(37, 6, dtype=dtype, scale=3.0).t()  # strided, as a view can come
        up, dy = randn(6, 37, dtype=dtype, scale=3.0), randn(6, 37, dtype=dtype)
        y = gated.gated_pair_forward(gate, up, 0)
        d_gate, d_up, y_again = gated.gated_pair_backward(dy, gate, up, 0, recompute_output=True)
        assert torch.equal(y_again, y), dtype
        assert all(torch.equal(a, b) for a, b in zip(
            (d_gate, d_up), gated.gated_pair_backward(dy, gate, up, 0), strict=True))  # fmt: skip


def _saved_products(run, params, rows):
    """How many [rows, INTERMEDIATE] tensors (storages) autograd keeps for backward while
    ``run()`` records its graph; parameters (and views of them) are not counted."""
    param_storages = {p.untyped_storage().data_ptr() for p in params}
    storages = set()

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if t.numel() == rows * INTERMEDIATE and ptr not in param_storages:
            storages.add(ptr)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    return len(storages), out


def test_training_keeps_gate_and_up_but_not_their_product(activation, fused_calls):
    mlp = _mlp("llama")
    fast = _bind(mlp, activation)
    x = randn(7, HIDDEN).requires_grad_()
    fused, y = _saved_products(lambda: fast(x), list(fast.parameters()), 7)
    assert [c[0] for c in fused_calls] == ["swiglu_mlp"]
    # The module calls with the fused activation keep gate, up and the product (down_proj's input).
    unfused, y_ref = _saved_products(
        lambda: mlp.down_proj(activation.silu_mul(mlp.gate_proj(x), mlp.up_proj(x))),
        list(mlp.parameters()),
        7,
    )
    assert (fused, unfused) == (2, 3)
    assert_close(y, y_ref.double(), torch.float32, "fused MLP forward")


def test_fused_mlp_with_frozen_weights_and_no_input_grad(activation, fused_calls):
    """Only the gradients asked for are computed (a frozen down_proj, an input that needs none),
    and they match float64; zero tokens give an empty output and zero weight gradients."""
    mlp = _mlp("llama")  # with biases
    fast = _bind(mlp, activation)
    fast.down_proj.weight.requires_grad_(False)
    fast.gate_proj.bias.requires_grad_(False)
    reference = copy.deepcopy(mlp).double()
    x = randn(2, 3, HIDDEN)
    y = fast(x)
    assert [c[0] for c in fused_calls] == ["swiglu_mlp"]
    y64 = reference(x.double())
    assert_close(y, y64, torch.float32, "forward")
    trained = [(n, p) for n, p in fast.named_parameters() if p.requires_grad]
    assert [n for n, _ in trained] == ["gate_proj.weight", "up_proj.weight", "up_proj.bias",
                                       "down_proj.bias"]  # fmt: skip
    dy = randn(*y.shape)
    got = grads(y, [p for _, p in trained], dy)
    ref_params = dict(reference.named_parameters())
    want = grads(y64, [ref_params[n] for n, _ in trained], dy.double())
    for (name, _), g, w in zip(trained, got, want, strict=True):
        assert_close(g, w, torch.float32, f"grad {name}")

    empty = fast(randn(0, HIDDEN).requires_grad_())
    assert empty.shape == (0, HIDDEN)
    (dw,) = grads(empty, (fast.up_proj.weight,), randn(0, HIDDEN))
    assert torch.equal(dw, torch.zeros_like(dw))


class _LoRALinear(nn.Linear):
    """A stand-in for a LoRA or quantized wrapper: a Linear subclass with its own forward."""

    def forward(self, x):
        return super().forward(x) * 2.0


@pytest.mark.parametrize(
    "case", ["no_grad", "hook_on_up_proj", "subclassed_down_proj", "global_hook", "autocast"]
)
def test_fused_mlp_only_where_it_computes_what_the_modules_would(
    activation, fused_calls, case, request
):
    mlp = _mlp("llama")
    fast = _bind(mlp, activation)
    x = randn(3, HIDDEN, scale=0.5)
    seen = []
    if case == "hook_on_up_proj":
        for m in (mlp, fast):
            m.up_proj.register_forward_hook(lambda mod, args, out: seen.append(1))
    elif case == "subclassed_down_proj":
        for m in (mlp, fast):
            lora = _LoRALinear(INTERMEDIATE, HIDDEN).to(DEVICE)
            lora.load_state_dict(m.down_proj.state_dict())
            m.down_proj = lora
    elif case == "global_hook":
        handle = nn.modules.module.register_module_forward_hook(lambda *a: seen.append(1))
        request.addfinalizer(handle.remove)  # a global hook must not outlive the test
    if case == "no_grad":
        with torch.no_grad():
            y, y_ref = fast(x), mlp(x)
    elif case == "autocast":
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            y, y_ref = fast(x), mlp(x)
        assert y.dtype == torch.bfloat16
    else:
        y, y_ref = fast(x), mlp(x)
    assert [c[0] for c in fused_calls] == ["silu_mul"], case
    if case in ("hook_on_up_proj", "global_hook"):
        assert seen, "the hook did not run"
    dtype = torch.bfloat16 if case == "autocast" else torch.float32
    assert_close(y, y_ref.double(), dtype, case)


def test_swiglu_mlp_under_compile_matches_the_reference(activation):
    mlp = _mlp("qwen3")
    x = randn(2, 3, HIDDEN).requires_grad_()
    weights = (mlp.gate_proj.weight, None, mlp.up_proj.weight, None, mlp.down_proj.weight, None)
    torch._dynamo.reset()
    compiled = torch.compile(activation.swiglu_mlp, backend=COMPILE_BACKEND, fullgraph=True)
    y = compiled(x, *weights)
    reference = copy.deepcopy(mlp).double()
    x64 = x.detach().double().requires_grad_()
    y64 = reference(x64)
    assert_close(y, y64, torch.float32, "compiled swiglu_mlp")
    dy = randn(*y.shape)
    got = grads(y, (x, *mlp.parameters()), dy)
    want = grads(y64, (x64, *reference.parameters()), dy.double())
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_close(g, w, torch.float32, f"compiled grad {i}")


# ---- the whole MLP under torch.compile (training) ------------------------------------------


@pytest.fixture
def compile_rule(activation):
    """The activation package's compile rule; the sides a test forces are undone afterwards."""
    rule = importlib.import_module(f"{activation.__name__}._compile_rule")
    yield rule
    rule.force()
    torch._dynamo.reset()


class _AOTRecorder:
    """An AOTAutograd backend whose graphs run as traced (no code generation) and which keeps,
    for each run of the forward graph, the shapes of its outputs: the module's output, then
    what the backward reads (saved tensors and weights). ``partition``: ``"default"`` (what
    ``aot_eager`` does) or ``"inductor"`` (inductor's decompositions, joint-graph passes and
    min-cut partitioner: what decides the tensors a compiled training step keeps)."""

    def __init__(self, partition: str):
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        self.outputs: list[list[tuple[int, ...]]] = []
        self.ops: dict[str, set[str]] = {}
        self.frames = 0

        def forward(gm, example_inputs):
            self.ops["forward"] = library_ops(gm)

            def run(*args):
                out = gm(*args)
                self.outputs.append([tuple(t.shape) for t in out if isinstance(t, torch.Tensor)])
                return out

            return make_boxed_func(run)

        def backward(gm, example_inputs):
            self.ops["backward"] = library_ops(gm)
            return make_boxed_func(gm.forward)

        options = {}
        if partition == "inductor":
            from torch._inductor.compile_fx import partition_fn
            from torch._inductor.decomposition import select_decomp_table

            options = {"partition_fn": partition_fn, "decompositions": select_decomp_table()}
        self._aot = aot_autograd(fw_compiler=forward, bw_compiler=backward, **options)

    def __call__(self, gm, example_inputs):
        self.frames += 1
        return self._aot(gm, example_inputs)


@pytest.mark.parametrize(
    "partition,dtype", [("default", torch.float32), ("inductor", torch.bfloat16)], ids=str
)
@pytest.mark.parametrize("side", ["op", "formula"])
def test_compiled_training_keeps_gate_and_up_but_not_their_product(
    activation, compile_rule, side, partition, dtype
):
    """Compiled for training (fullgraph, dynamic shapes), SwiGLUMLP runs ``swiglu_mlp``, whose
    forward graph hands the backward two [tokens, intermediate] tensors (gate and up) on either
    side of the rule; the module calls would hand it three (and the formula's fp32 copies).
    Output and every gradient match float64."""
    compile_rule.force(side, ["gated_mlp"])
    torch._dynamo.reset()
    mlp = _mlp("llama", dtype)  # with biases
    reference = copy.deepcopy(mlp).double()
    recorder = _AOTRecorder(partition)
    compiled = torch.compile(_bind(mlp, activation), backend=recorder, fullgraph=True, dynamic=True)
    for rows in (5, 7):  # a second size reuses the graph
        x = randn(rows, HIDDEN, dtype=dtype).requires_grad_()
        y = compiled(x)
        saved = recorder.outputs[-1][1:]
        assert saved.count((rows, INTERMEDIATE)) == 2, saved
        x64 = x.detach().double().requires_grad_()
        y64 = reference(x64)
        assert_close(y, y64, dtype, f"{side} forward")
        dy = randn(*y.shape, dtype=dtype)
        params = dict(compiled.named_parameters())
        got = grads(y, (x, *params.values()), dy)
        want = grads(y64, (x64, *reference.parameters()), dy.double())
        for name, g, w in zip(["x", *params], got, want, strict=True):
            assert_close(g, w, dtype, f"{side} grad {name}")
    assert recorder.frames == 1
    if side == "op":
        assert recorder.ops == {
            "forward": {"gated_pair_activation"},
            "backward": {"gated_pair_activation_backward_output"},
        }
    else:
        assert recorder.ops == {"forward": set(), "backward": set()}


@pytest.mark.parametrize("side", ["op", "formula"])
def test_compiled_training_with_frozen_down_proj_and_no_input_grad(activation, compile_rule, side):
    """Compiled, only the gradients asked for are computed: with down_proj frozen the backward
    needs no silu(gate) * up (the plain backward op, or none of the formula's product)."""
    compile_rule.force(side, ["gated_mlp"])
    torch._dynamo.reset()
    mlp = _mlp("llama")
    fast = _bind(mlp, activation)
    fast.down_proj.weight.requires_grad_(False)
    reference = copy.deepcopy(mlp).double()
    recorder = _AOTRecorder("default")
    x = randn(2, 3, HIDDEN)
    y = torch.compile(fast, backend=recorder, fullgraph=True)(x)
    y64 = reference(x.double())
    assert_close(y, y64, torch.float32, f"{side} forward")
    trained = [(n, p) for n, p in fast.named_parameters() if p.requires_grad]
    dy = randn(*y.shape)
    got = grads(y, [p for _, p in trained], dy)
    ref_params = dict(reference.named_parameters())
    want = grads(y64, [ref_params[n] for n, _ in trained], dy.double())
    for (name, _), g, w in zip(trained, got, want, strict=True):
        assert_close(g, w, torch.float32, f"{side} grad {name}")
    expected = {"gated_pair_activation_backward"} if side == "op" else set()
    assert recorder.ops["backward"] == expected


@pytest.mark.parametrize("case", ["no_grad", "nothing_requires_grad"])
def test_compiled_inference_calls_the_modules(activation, fused_calls, case):
    """With no backward to record, compiled SwiGLUMLP keeps the module calls and ``silu_mul``."""
    mlp = _mlp("llama")
    fast = _bind(mlp, activation)
    x = randn(3, HIDDEN)
    torch._dynamo.reset()
    compiled = torch.compile(fast, backend="eager", fullgraph=True)
    if case == "no_grad":
        with torch.no_grad():
            y = compiled(x)
    else:
        fast.requires_grad_(False)
        y = compiled(x)
    assert [c[0] for c in fused_calls] == ["silu_mul"]
    assert_close(y, mlp.double()(x.double()), torch.float32, case)


# ---- tag_gated_mlps ------------------------------------------------------------------------


def _module_classes():
    todo, seen = [nn.Module], set()
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
    return seen


@pytest.fixture
def restore_tags():
    """Tags are set on classes, for the whole process: remove those a test added."""
    before = {cls for cls in _module_classes() if TAG_ATTRIBUTE in vars(cls)}
    yield
    for cls in _module_classes():
        if TAG_ATTRIBUTE in vars(cls) and cls not in before:
            delattr(cls, TAG_ATTRIBUTE)


def _tiny_llama():
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    config = llama_config(intermediate_size=45, num_hidden_layers=2, attn_implementation="sdpa")
    return LlamaForCausalLM(config).to(DEVICE)


def test_tag_gated_mlps_then_kernelize(restore_tags, monkeypatch):
    from transformers.models.llama.modeling_llama import LlamaMLP

    model = _tiny_llama()
    reference = copy.deepcopy(model)
    assert TAG_ATTRIBUTE not in vars(LlamaMLP)
    assert tag_gated_mlps(model) == ["LlamaMLP"]
    assert LlamaMLP.kernel_layer_name == "SwiGLUMLP"
    assert tag_gated_mlps(model) == []  # already tagged
    mlps = [m for m in model.modules() if isinstance(m, LlamaMLP)]
    assert len(mlps) == 2 and all(
        kernel_layer_of(m) is None for m in mlps
    )  # nothing until kernelize

    with use_kernel_mapping(library_mapping(devices=[DEVICE])):
        kernelize(model, mode=Mode.TRAINING, device=DEVICE)
    assert all(kernel_layer_of(m).__name__ == "SwiGLUMLP" for m in mlps)
    # Count the fused calls in the repository copy kernelize loaded.
    layers = importlib.import_module(kernel_layer_of(mlps[0]).__module__)
    calls = []
    fused = layers.swiglu_mlp  # training: the whole MLP as one function
    monkeypatch.setattr(layers, "swiglu_mlp", lambda *a: calls.append(1) or fused(*a))

    tokens = torch.randint(0, 64, (2, 7), device=DEVICE)
    out, expected = model(tokens, labels=tokens), reference(tokens, labels=tokens)
    assert len(calls) == 2
    torch.testing.assert_close(out.logits, expected.logits, rtol=1e-4, atol=1e-4)
    out.loss.backward()
    expected.loss.backward()
    for (name, p), q in zip(reference.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_tag_gated_mlps_then_kernelize_with_verify(restore_tags):
    model = _tiny_llama()
    tag_gated_mlps(model)
    tokens = torch.randint(0, 64, (1, 5), device=DEVICE)
    with use_kernel_mapping(library_mapping(devices=[DEVICE], layers=["SwiGLUMLP"])):
        kernelize(model, mode=Mode.INFERENCE, device=DEVICE, verify=tokens)
    # A kernel that failed verification would have been left out.
    assert all(
        kernel_layer_of(m).__name__ == "SwiGLUMLP"
        for m in model.modules()
        if type(m).__name__ == "LlamaMLP"
    )


def _gated_mlp_class(forward):
    """A module class with a Llama MLP's attributes and the given forward."""

    def __init__(self):
        nn.Module.__init__(self)
        self.gate_proj, self.up_proj = nn.Linear(8, 12), nn.Linear(8, 12)
        self.down_proj, self.act_fn = nn.Linear(12, 8), nn.SiLU()

    return type("CustomMLP", (nn.Module,), {"__init__": __init__, "forward": forward})


def _plain(self, x):
    """A docstring does not matter."""
    # nor do comments, spacing or the local variable's name
    out = self.down_proj(self.act_fn(self.gate_proj(x))  *  self.up_proj(x))  # fmt: skip
    return out


def _direct(self, x):
    return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def _with_dropout(self, x):
    return self.down_proj(F.dropout(self.act_fn(self.gate_proj(x)) * self.up_proj(x), 0.1))


def _swapped(self, x):
    return self.down_proj(self.act_fn(self.up_proj(x)) * self.gate_proj(x))


def _other_name(self, hidden_states):
    return self.down_proj(self.act_fn(self.gate_proj(hidden_states)) * self.up_proj(hidden_states))


def _two_steps(self, x):
    h = self.act_fn(self.gate_proj(x)) * self.up_proj(x)
    return self.down_proj(h)


@pytest.mark.parametrize(
    "forward,tagged",
    [
        (_plain, True),
        (_direct, True),
        (_with_dropout, False),
        (_swapped, False),
        (_other_name, False),
        (_two_steps, False),  # computes the same, but only the two known forms are recognised
    ],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_tag_gated_mlps_reads_the_forward(restore_tags, caplog, forward, tagged):
    cls = _gated_mlp_class(forward)
    model = nn.Sequential(cls(), cls())
    with caplog.at_level(logging.INFO, logger="kernels.library"):
        names = tag_gated_mlps(model)
    assert names == (["CustomMLP"] if tagged else [])
    assert getattr(cls, TAG_ATTRIBUTE, None) == ("SwiGLUMLP" if tagged else None)
    if not tagged:
        assert "its forward is not down_proj(act_fn(gate_proj(x)) * up_proj(x))" in caplog.text


def test_tag_gated_mlps_leaves_tagged_classes_alone(restore_tags):
    cls = _gated_mlp_class(_direct)
    replace_kernel_forward_from_hub(cls, "MyMLP")
    assert tag_gated_mlps(nn.Sequential(cls())) == []
    assert cls.kernel_layer_name == "MyMLP"


@pytest.mark.parametrize(
    "model_type,class_name,recognised",
    [
        ("llama", "LlamaMLP", True),
        ("mistral", "MistralMLP", True),
        ("qwen2", "Qwen2MLP", True),
        ("qwen3", "Qwen3MLP", True),
        ("bitnet", "BitNetMLP", False),  # a norm before down_proj
        ("falcon_h1", "FalconH1MLP", False),  # multipliers
        ("t5gemma", "T5GemmaMLP", False),  # dropout
        ("seed_oss", "SeedOssMLP", False),  # dropout after down_proj
    ],
)
def test_transformers_mlps_recognised(model_type, class_name, recognised):
    from kernels.library.transformers_tags import _computes_gated_mlp

    try:
        modeling = importlib.import_module(
            f"transformers.models.{model_type}.modeling_{model_type}"
        )
        cls = getattr(modeling, class_name)
    except (ImportError, AttributeError):
        pytest.skip(f"this transformers has no {class_name}")
    assert _computes_gated_mlp(cls) is recognised
