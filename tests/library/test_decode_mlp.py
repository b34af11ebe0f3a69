"""The decode-size gated MLP (library/activation ``gated_mlp_decode``): its two kernels against a
float64 reference with a bound of one rounding per stored value, split-K and not, strided
inputs, the op and compile fallbacks, its configuration rule, and when ``SwiGLUMLP`` /
``GeGLUMLP`` take it."""

import copy
import importlib
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.support.library import DEVICE, alternating, assert_close, randn
from tests.support.models import llama_config

H, I, OUT = 67, 131, 45  # odd sizes: every block is ragged
# One rounding moves a value by less than an ulp, at most 2^-7 (bf16) or 2^-10 (fp16) of it:
# the bound whichever way it rounds (the GPU rounds to nearest, within half of that; Triton's
# interpreter, 3.9, truncates fp32 to bf16).
ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}
ACTS = {"silu": F.silu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}


@pytest.fixture(scope="module")
def decode(activation):
    return sys.modules[f"{activation.__name__}.decode_mlp"]


def _weights(dtype, bias: bool, out: int = OUT, seed: int = 0):
    """(gate_w, gate_b, up_w, up_b, down_w, down_b), scaled so that gate and up are O(1)."""
    torch.manual_seed(seed)
    gate_w, up_w = randn(I, H, dtype=dtype, scale=H**-0.5), randn(I, H, dtype=dtype, scale=H**-0.5)
    down_w = randn(out, I, dtype=dtype, scale=I**-0.5)
    biases = [randn(n, dtype=dtype) if bias else None for n in (I, I, out)]
    return gate_w, biases[0], up_w, biases[1], down_w, biases[2]


def _f64(t):
    return None if t is None else t.double()


def _reference(x, weights, act: str):
    """(h, out) in float64 from the same (rounded) inputs: h = act(gate) * up, out = down(h)."""
    gate_w, gate_b, up_w, up_b, down_w, down_b = map(_f64, weights)
    x = x.double()
    h = ACTS[act](F.linear(x, gate_w, gate_b)) * F.linear(x, up_w, up_b)
    return h, F.linear(h, down_w, down_b)


def _assert_one_rounding(got, want, dtype, slack, what):
    """|got - want| <= u |want| + u * slack + fp32's share: one rounding of each stored value
    (``u`` = ``ULP``) plus, through ``slack``, the roundings of the values it was made from; the
    fp32 sums' own errors are far below."""
    u = ULP[dtype]
    err = (got.double() - want).abs()
    bound = u * (want.abs() + slack) + 1e-5 * (want.abs().max() + 1)
    worst = (err - bound).max().item()
    assert worst <= 0, f"{what}: error {err.max().item():.3g} past one rounding (by {worst:.3g})"


def _check(out, h_used, x, weights, act, dtype, what):
    """``out`` against float64: with ``h_used`` (the kernel's h, already checked to one rounding)
    each output's bound adds u * sum_j |h_j| |W_nj| for h's roundings."""
    h64, out64 = _reference(x, weights, act)
    down_w = weights[4].double()
    slack = h64.abs() @ down_w.abs().t()
    _assert_one_rounding(out, out64, dtype, slack, what)
    assert_close(out, out64, dtype, what)
    if h_used is not None:
        _assert_one_rounding(h_used, h64, dtype, 0.0, what + " (h)")


CONFIG_CASES = ["rule", "split", "fma-split", "dot"]


def _config(decode, case):
    """An explicit configuration, or None for the rule's. Blocks of K of 32 with H = 67 make
    three tiles, so split_k 2 and 3 both leave ragged splits."""
    return {
        "rule": None,
        "split": decode.GemvConfig(16, 32, 3, 4, 2, True),
        "fma-split": decode.GemvConfig(16, 32, 2, 4, 1, False),
        "dot": decode.GemvConfig(32, 64, 1, 4, 3, True),
    }[case]


HALF = (torch.bfloat16, torch.float16)
BIAS = {"nobias": False, "bias": True}


# Every activation, bias and row count, each in one of the two dtypes (tests.support.library's
# alternating: each dtype meets every value; the full product on the GPU).
@pytest.mark.parametrize("dtype,act,bias,rows", alternating(HALF, sorted(ACTS), BIAS, [1, 3, 8]))
def test_gated_mlp_decode_matches_float64(activation, decode, dtype, act, bias, rows):
    weights = _weights(dtype, bias)
    x = randn(rows, H, dtype=dtype)
    with torch.no_grad():
        out = activation.gated_mlp_decode(x, *weights, act)
        h = decode.gated_gemv(x, *weights[:4], decode.ACTIVATIONS[act])
    assert out.dtype == dtype and out.shape == (rows, OUT)
    _check(out, h, x, weights, act, dtype, f"{act} rows={rows}")
    # The public function is the two kernels.
    assert torch.equal(out, decode.gemv(h, weights[4], weights[5]))


@pytest.mark.parametrize("case", CONFIG_CASES)
@pytest.mark.parametrize("rows", [1, 8])
def test_every_configuration_kind_matches_float64(decode, case, rows):
    """Split-K (the fp32 partial sums and the reduce kernel), multiply-adds and tl.dot each
    meet the same bound; a split result is the same bits run after run."""
    dtype = torch.bfloat16
    weights = _weights(dtype, bias=True)
    x = randn(rows, H, dtype=dtype)
    config = _config(decode, case)
    h = decode.gated_gemv(x, *weights[:4], decode.ACTIVATIONS["silu"], config)
    out = decode.gemv(h, weights[4], weights[5], config)
    _check(out, h, x, weights, "silu", dtype, case)
    again = decode.gemv(decode.gated_gemv(x, *weights[:4], 0, config), *weights[4:], config)
    assert torch.equal(again, out)


def test_split_and_unsplit_agree(decode):
    dtype = torch.float16
    weights = _weights(dtype, bias=True)
    x = randn(5, H, dtype=dtype)
    whole = decode.GemvConfig(16, 32, 1, 4, 2, True)
    split = whole._replace(split_k=3)
    h_whole = decode.gated_gemv(x, *weights[:4], 2, whole)
    h_split = decode.gated_gemv(x, *weights[:4], 2, split)
    # Sums in another order: within a rounding of each other.
    _assert_one_rounding(h_split, h_whole.double(), dtype, h_whole.double().abs(), "split h")
    out_whole = decode.gemv(h_whole, weights[4], weights[5], whole)
    out_split = decode.gemv(h_whole, weights[4], weights[5], split)
    _assert_one_rounding(out_split, out_whole.double(), dtype, out_whole.double().abs(), "split")


@pytest.mark.parametrize("layout", ["transpose", "row-slice", "col-stride", "batch-seq"])
def test_strided_inputs(activation, layout):
    dtype = torch.bfloat16
    weights = _weights(dtype, bias=True)
    if layout == "transpose":
        x = randn(H, 4, dtype=dtype).t()  # last dimension not contiguous: copied
    elif layout == "row-slice":
        x = randn(4, 2 * H + 3, dtype=dtype)[:, 3 : H + 3]  # rows strided, read in place
    elif layout == "col-stride":
        x = randn(4, 2 * H, dtype=dtype)[:, ::2]
    else:
        x = randn(3, 2, H, dtype=dtype).transpose(0, 1)  # [batch, seq, hidden] from [seq, ...]
    with torch.no_grad():
        out = activation.gated_mlp_decode(x, *weights, "silu")
    assert out.shape == (*x.shape[:-1], OUT)
    _check(out, None, x, weights, "silu", dtype, layout)


def test_empty_and_wrong_shapes(activation):
    weights = _weights(torch.bfloat16, bias=True)
    with torch.no_grad():
        empty = activation.gated_mlp_decode(randn(0, H, dtype=torch.bfloat16), *weights)
        assert empty.shape == (0, OUT)
        with pytest.raises(ValueError, match="down_weight"):
            bad = (*weights[:4], weights[4][:, :-1], weights[5])
            activation.gated_mlp_decode(randn(2, H, dtype=torch.bfloat16), *bad)
        with pytest.raises(ValueError, match="activation"):
            activation.gated_mlp_decode(randn(2, H, dtype=torch.bfloat16), *weights, "relu")


def _formula(x, weights, act):
    """The PyTorch formula the function falls back to (projections rounded, product once)."""
    gate_w, gate_b, up_w, up_b, down_w, down_b = weights
    gate, up = F.linear(x, gate_w, gate_b), F.linear(x, up_w, up_b)
    product = (ACTS[act](gate.float()) * up.float()).to(x.dtype)
    return F.linear(product, down_w, down_b)


@pytest.mark.parametrize("case", ["fp32", "rows=9", "grad"])
def test_other_inputs_take_the_formula(activation, decode, monkeypatch, case):
    calls = []
    monkeypatch.setattr(decode, "_decode_mlp", lambda *a: calls.append(1))
    dtype = torch.float32 if case == "fp32" else torch.bfloat16
    weights = _weights(dtype, bias=True)
    x = randn(9 if case == "rows=9" else 2, H, dtype=dtype)
    if case == "grad":
        x.requires_grad_()
    out = activation.gated_mlp_decode(x, *weights, "gelu_tanh")
    assert not calls
    assert torch.equal(out, _formula(x, weights, "gelu_tanh"))
    if case == "grad":
        (dx,) = torch.autograd.grad(out.sum(), x)
        assert dx.shape == x.shape


def _compiled_graph_code(fn, *args):
    """(output, code of the graphs dynamo made) of ``torch.compile(fn, fullgraph=True)(*args)``
    under no_grad, with an eager backend (the op runs its kernels through the interpreter)."""
    from torch._dynamo.testing import EagerAndRecordGraphs

    torch._dynamo.reset()
    backend = EagerAndRecordGraphs()
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    with torch.no_grad():
        out = compiled(*args)
    return out, "\n".join(g.code for g in backend.graphs)


def test_under_compile_a_static_decode_call_is_the_op(activation):
    """Under torch.compile (transformers' compiled static-cache decode) a decode-size call of
    static shape stays the op, for inductor to leave to the kernels: the same result as the
    eager call."""
    weights = _weights(torch.bfloat16, bias=False)
    x = randn(2, H, dtype=torch.bfloat16)
    out, code = _compiled_graph_code(activation.gated_mlp_decode, x, *weights, "silu")
    assert "kernels_lib_" in code and "gated_mlp_decode" in code, code
    with torch.no_grad():
        assert torch.equal(out, activation.gated_mlp_decode(x, *weights, "silu"))


@pytest.mark.parametrize("case", ["rows=9", "fp32", "grad"])
def test_under_compile_other_calls_are_the_formula(activation, case):
    dtype = torch.float32 if case == "fp32" else torch.bfloat16
    weights = _weights(dtype, bias=False)
    x = randn(9 if case == "rows=9" else 2, H, dtype=dtype)
    fn = activation.gated_mlp_decode
    if case == "grad":  # a call that needs a backward
        x.requires_grad_()
        torch._dynamo.reset()
        backend = torch._dynamo.testing.EagerAndRecordGraphs()
        out = torch.compile(fn, backend=backend, fullgraph=True)(x, *weights, "silu")
        code = "\n".join(g.code for g in backend.graphs)
    else:
        out, code = _compiled_graph_code(fn, x, *weights, "silu")
    assert "kernels_lib_" not in code and "linear" in code, code
    assert torch.equal(out, _formula(x, weights, "silu"))


def test_under_compile_with_dynamic_shapes_the_size_is_a_guard(activation):
    """With dynamic shapes the decode-size test becomes a guard: the graph for 2 rows has the op,
    a call of 9 rows another graph, with the formula."""
    from torch._dynamo.testing import EagerAndRecordGraphs

    weights = _weights(torch.bfloat16, bias=False)
    torch._dynamo.reset()
    backend = EagerAndRecordGraphs()
    compiled = torch.compile(activation.gated_mlp_decode, backend=backend, dynamic=True)
    with torch.no_grad():
        for rows in (2, 9):
            x = randn(rows, H, dtype=torch.bfloat16)
            want = activation.gated_mlp_decode(x, *weights, "silu")
            assert torch.equal(compiled(x, *weights, "silu"), want)
    codes = [g.code for g in backend.graphs]
    assert len(codes) == 2
    assert "gated_mlp_decode" in codes[0] and "gated_mlp_decode" not in codes[1]


# ---- q, k and v in one launch -----------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype,bias,rows,dot",
    alternating(HALF, BIAS, [1, 3, 8], {"rule": None, "fma": False, "dot": True}),
)
def test_grouped_linear_matches_float64(decode, dtype, bias, rows, dot):
    """Three projections of one input (ragged: 45, 13 and 7 features over blocks of 16), each
    output within one rounding of the float64 product."""
    torch.manual_seed(0)
    weights = [randn(n, H, dtype=dtype, scale=H**-0.5) for n in (45, 13, 7)]
    biases = [randn(n, dtype=dtype) for n in (45, 13, 7)] if bias else None
    x = randn(rows, H, dtype=dtype)
    config = None if dot is None else decode.GemvConfig(16, 32, 1, 4, 2, dot)
    outs = decode.grouped_linear_decode(x, weights, biases, config)
    for i, (out, w) in enumerate(zip(outs, weights, strict=True)):
        want = F.linear(x.double(), w.double(), None if biases is None else biases[i].double())
        assert out.shape == (rows, w.shape[0]) and out.dtype == dtype and out.is_contiguous()
        _assert_one_rounding(out, want, dtype, 0.0, f"projection {i}")


def test_grouped_linear_takes_any_leading_shape_and_strided_rows(decode):
    weights = [randn(n, H, dtype=torch.bfloat16, scale=H**-0.5) for n in (32, 16, 16)]
    x = randn(2, 1, H + 5, dtype=torch.bfloat16)[..., 3 : 3 + H]  # rows 72 apart
    outs = decode.grouped_linear_decode(x, weights, None)
    for out, w in zip(outs, weights, strict=True):
        assert out.shape == (2, 1, w.shape[0])
        _assert_one_rounding(out, F.linear(x.double(), w.double()), torch.bfloat16, 0.0, "q/k/v")


def test_grouped_linear_errors(decode):
    x = randn(2, H, dtype=torch.bfloat16)
    w = randn(8, H, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="three weights"):
        decode.grouped_linear_decode(x, (w, w), None)
    with pytest.raises(ValueError, match="does not take x"):
        decode.grouped_linear_decode(x, (w, w, w.float()), None)


def _op_cases(decode):
    """{case: (op, args)} for torch.library.opcheck (tests/library/test_registry.py checks that
    every op of the package has one)."""
    weights = _weights(torch.bfloat16, bias=True)
    x = randn(3, H, dtype=torch.bfloat16)
    no_bias = _weights(torch.float16, bias=False)
    return {
        "bias_bf16": (decode.decode_mlp_op, (x, *weights, 0)),
        "no_bias_fp16": (decode.decode_mlp_op, (randn(1, 2, H, dtype=torch.float16), *no_bias, 2)),
    }


@pytest.mark.parametrize("case", ["bias_bf16", "no_bias_fp16"])
def test_opcheck(decode, case):
    op, args = _op_cases(decode)[case]
    torch.library.opcheck(op, args)


# ---- the configuration rule ------------------------------------------------------------------


@pytest.mark.parametrize(
    "rows,n,k,gated,want",
    [
        # (block_n, block_k, split_k, num_warps, num_stages, dot) on an H100 (132 SMs)
        (1, 5632, 2048, True, (16, 512, 1, 8, 3, False)),  # 704 weight blocks: no split
        (1, 2048, 5632, False, (16, 512, 1, 8, 3, False)),  # 128 blocks >= 66: no split
        (1, 4096, 14336, False, (16, 512, 1, 8, 3, False)),  # 256 blocks
        (8, 14336, 4096, True, (64, 128, 1, 4, 4, True)),  # 224 blocks, two weights
        (8, 2048, 5632, False, (64, 128, 4, 4, 4, True)),  # 32 blocks, split 4: 128
        (8, 3072, 8192, False, (64, 128, 2, 4, 4, True)),  # 48 blocks, split 2: 96
        (1, 64, 256, False, (16, 512, 1, 8, 3, False)),  # K of one tile: no split
    ],
)
def test_config_rule(decode, rows, n, k, gated, want):
    config = decode.gemv_config(rows, n, k, gated, 132)
    assert tuple(config) == want
    candidates = decode.candidate_configs(rows, n, k, gated, 132)
    assert config in candidates and len(set(candidates)) == len(candidates)
    for c in candidates:
        assert c.dot or rows <= 2  # multiply-adds keep a tile of products per row
        assert c.block_n >= 16 or not c.dot  # the smallest MMA


# ---- the SwiGLUMLP / GeGLUMLP layers ---------------------------------------------------------


def _llama_mlp(dtype, hidden_act="silu", bias=True):
    from transformers.models.llama.modeling_llama import LlamaMLP

    torch.manual_seed(0)
    config = llama_config(
        hidden_size=H,
        intermediate_size=I,
        hidden_act=hidden_act,
        mlp_bias=bias,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=8,  # transformers 5.x validates the rotary dimension (even) at construction
    )
    mlp = LlamaMLP(config)
    with torch.no_grad():
        for p in mlp.parameters():
            p.mul_(4.0)  # default init is small; make the activation's nonlinearity matter
    return mlp.to(DEVICE, dtype)


@pytest.fixture
def decode_calls(activation, monkeypatch):
    """The calls of ``gated_mlp_decode`` the layers made (their activation names)."""
    layers = activation.layers
    calls, decode = [], layers.gated_mlp_decode

    def counting(x, *weights_and_act):
        calls.append(weights_and_act[-1])
        return decode(x, *weights_and_act)

    monkeypatch.setattr(layers, "gated_mlp_decode", counting)
    return calls


def _bind(mlp, activation, layer="SwiGLUMLP"):
    fast = copy.deepcopy(mlp)
    fast.forward = types.MethodType(getattr(activation.layers, layer).forward, fast)
    return fast


@pytest.mark.parametrize("layer", ["SwiGLUMLP", "GeGLUMLP"])
@pytest.mark.parametrize("hidden_act", ["silu", "gelu_pytorch_tanh"])
@pytest.mark.parametrize("shape", [(1, 1), (2, 4), (8,)], ids=str)
def test_layer_takes_the_decode_path(activation, decode_calls, layer, hidden_act, shape):
    dtype = torch.bfloat16
    mlp = _llama_mlp(dtype, hidden_act)
    fast = _bind(mlp, activation, layer)
    x = randn(*shape, H, dtype=dtype)
    with torch.no_grad():
        y, y_module = fast(x), mlp(x)
    want = "silu" if hidden_act == "silu" else "gelu_tanh"
    assert decode_calls == [want]
    assert y.shape == y_module.shape and y.dtype == dtype
    reference = copy.deepcopy(mlp).double()
    with torch.no_grad():
        y64 = reference(x.double())
    assert_close(y, y64, dtype, f"{layer} decode")
    assert_close(y_module, y64, dtype, "the module itself")  # the same tolerance holds for both


def test_compiled_layer_takes_the_op(activation):
    """A tagged MLP compiled whole (fullgraph) at decode size: the layer's checks trace, the
    kernels run as the op, and the result is the eager layer's, bit for bit."""
    mlp = _llama_mlp(torch.bfloat16)
    fast = _bind(mlp, activation)
    x = randn(1, 3, H, dtype=torch.bfloat16)
    out, code = _compiled_graph_code(fast, x)
    assert "gated_mlp_decode" in code, code
    with torch.no_grad():
        assert torch.equal(out, fast(x))


def test_layer_in_inference_mode_and_frozen_weights(activation, decode_calls):
    mlp = _llama_mlp(torch.float16, bias=False)
    fast = _bind(mlp, activation)
    x = randn(3, H, dtype=torch.float16)
    with torch.inference_mode():
        fast(x)
    for p in fast.parameters():
        p.requires_grad_(False)
    fast(x)  # gradients enabled, but nothing needs one
    assert decode_calls == ["silu", "silu"]


class _LoRALinear(nn.Linear):
    """A stand-in for a LoRA or quantized wrapper: a Linear subclass with its own forward."""

    def forward(self, x):
        return super().forward(x) * 2.0


@pytest.mark.parametrize(
    "case", ["rows=9", "grad", "fp32", "hook", "subclassed", "global_hook", "autocast", "gelu"]
)
def test_layer_keeps_its_path_otherwise(activation, decode_calls, case, request):
    dtype = torch.float32 if case == "fp32" else torch.bfloat16
    mlp = _llama_mlp(dtype, hidden_act="gelu" if case == "gelu" else "silu")
    seen = []
    if case == "hook":
        mlp.up_proj.register_forward_hook(lambda mod, args, out: seen.append(1))
    elif case == "subclassed":
        lora = _LoRALinear(I, H).to(DEVICE, dtype)
        lora.load_state_dict(mlp.down_proj.state_dict())
        mlp.down_proj = lora
    elif case == "global_hook":
        handle = nn.modules.module.register_module_forward_hook(lambda *a: seen.append(1))
        request.addfinalizer(handle.remove)  # a global hook must not outlive the test
    fast = _bind(mlp, activation)
    x = randn(9 if case == "rows=9" else 2, H, dtype=dtype)
    if case == "grad":
        y, y_module = fast(x), mlp(x)
    elif case == "autocast":
        with torch.no_grad(), torch.autocast(x.device.type, dtype=torch.bfloat16):
            y, y_module = fast(x), mlp(x)
    else:
        with torch.no_grad():
            y, y_module = fast(x), mlp(x)
    assert decode_calls == [], case
    if case in ("hook", "global_hook"):
        assert seen, "the hook did not run"
    if case == "gelu":  # not fused at all: the module's own formula
        assert torch.equal(y, y_module)
    assert_close(y, y_module.double(), y.dtype, case)


def test_kernels_run_on_follows_the_interpreter_flag(decode, monkeypatch):
    monkeypatch.setattr(decode, "_CPU_RUNS_KERNELS", False)
    assert not decode.kernels_run_on(torch.device("cpu"))
    assert decode.kernels_run_on(torch.device("cuda", 0))
    x = torch.zeros(2, 8, dtype=torch.bfloat16)
    assert not decode.takes_decode_kernels(x)
    monkeypatch.setattr(decode, "_CPU_RUNS_KERNELS", True)
    assert decode.takes_decode_kernels(x)
    assert not decode.takes_decode_kernels(torch.zeros(9, 8, dtype=torch.bfloat16))
    assert not decode.takes_decode_kernels(torch.zeros(2, 8))


def test_exported(activation):
    module = importlib.import_module(activation.__name__)
    assert "gated_mlp_decode" in module.__all__
