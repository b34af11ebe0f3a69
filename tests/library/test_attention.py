"""Flash attention (library/attention) against a float64 reference: forward, log-sum-exp and the
gradients of q, k, v and the sinks, for dense and packed (varlen) batches, every option, odd
shapes and strided inputs; the deterministic backward; errors; transformers' signature checks;
and the op under torch.compile(fullgraph=True).

On the CPU the kernels run in Triton's interpreter (16x16 blocks there, so lengths of 17 and 33
cross block boundaries); shapes stay tiny."""

import inspect
import zlib

import pytest
import torch

from tests.support.attention_reference import attention as reference
from tests.support.attention_reference import varlen_attention as varlen_reference
from tests.support.library import DEVICE, ON_GPU, assert_close, grads, load, randn


@pytest.fixture(scope="module")
def attn():
    return load("attention")


@pytest.fixture(autouse=True)
def seed(request):
    # Each test draws the same inputs on every run (and on every machine's CPU generator).
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def _inputs(batch, seqlen_q, seqlen_k, heads, kv_heads, dim, dim_v, dtype, layout):
    """q, k, v (leaf tensors with gradients) laid out as a model would pass them."""
    if layout == "transposed":
        # (batch, heads, seqlen, dim) transposed, as transformers' attention modules pass them.
        q = randn(batch, heads, seqlen_q, dim, dtype=dtype).transpose(1, 2)
        k = randn(batch, kv_heads, seqlen_k, dim, dtype=dtype).transpose(1, 2)
        v = randn(batch, kv_heads, seqlen_k, dim_v, dtype=dtype).transpose(1, 2)
    elif layout == "fused":
        # Views of one fused projection (seqlen_q == seqlen_k): heads strided within a row.
        qkv = randn(batch, seqlen_q, heads + 2 * kv_heads, dim, dtype=dtype)
        q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=2)
    elif layout == "dim-strided":
        # Every other element of the head dimension: no unit stride, copied by the launcher.
        q = randn(batch, seqlen_q, heads, 2 * dim, dtype=dtype)[..., ::2]
        k = randn(batch, seqlen_k, kv_heads, 2 * dim, dtype=dtype)[..., ::2]
        v = randn(batch, seqlen_k, kv_heads, 2 * dim_v, dtype=dtype)[..., ::2]
    else:
        q = randn(batch, seqlen_q, heads, dim, dtype=dtype)
        k = randn(batch, seqlen_k, kv_heads, dim, dtype=dtype)
        v = randn(batch, seqlen_k, kv_heads, dim_v, dtype=dtype)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    if layout in ("transposed", "fused", "dim-strided"):
        # Keep the strided layout (detach keeps it) and check it is what the kernel gets.
        assert not leaves[0].is_contiguous()
    return leaves


def _check_against_reference(out, lse, inputs, ref_out, ref_lse, ref_inputs, dtype, sink=None):
    assert out.dtype == dtype
    assert_close(out, ref_out, dtype, "out")
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), finite), "rows that see no key: lse +inf"
    assert_close(lse.cpu()[finite], ref_lse[finite], torch.float32, "lse", floor=1.0)
    dout = randn(*out.shape, dtype=dtype)
    got = grads(out, inputs, dout)
    want = grads(ref_out, ref_inputs, dout.double().cpu())
    for g, w, name in zip(got, want, ("dq", "dk", "dv"), strict=False):
        assert g.dtype == dtype
        assert_close(g, w, dtype, name)
    if sink is not None:
        # d s_aux sums -p_sink * (dout . out) over a head's rows, terms of either sign that can
        # cancel: its error is judged against the sum of their magnitudes (a rounding of out to
        # bf16 moves each term), not against the sum itself.
        p_sink = torch.exp(
            ref_inputs[3].detach()[None, :, None] - ref_lse.reshape(-1, *ref_lse.shape[-2:])
        )
        delta = (
            (dout.double().cpu() * ref_out.detach())
            .sum(-1)
            .reshape(p_sink.shape[0], -1, p_sink.shape[1])
        )
        terms = (p_sink.transpose(1, 2) * delta).abs()
        assert got[3].dtype == sink.dtype
        assert_close(got[3], want[3], dtype, "ds_aux", floor=terms.sum(dim=(0, 1)).max().item())


def _check_dense(out, lse, q, k, v, s_aux, dtype, **options):
    """A dense call's ``out`` and ``lse``, and their gradients, against the float64 reference
    with the same mask ``options`` (causal, window, softcap) and sink."""
    inputs = [q, k, v] + ([s_aux] if s_aux is not None else [])
    ref_inputs = [t.detach().double().cpu().requires_grad_() for t in inputs]
    sink = ref_inputs[3] if s_aux is not None else None
    ref_out, ref_lse = reference(*ref_inputs[:3], sink=sink, **options)
    _check_against_reference(out, lse, inputs, ref_out, ref_lse, ref_inputs, dtype, s_aux)


# (batch, seqlen_q, seqlen_k, heads, kv_heads, dim, dim_v, causal, window, softcap, sink, dtype,
#  layout)
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
CASES = [
    pytest.param(2, 17, 17, 4, 4, 64, 64, False, (-1, -1), 0.0, False, F32, None, id="plain"),
    pytest.param(1, 33, 33, 4, 2, 64, 64, True, (-1, -1), 0.0, False, BF16, None, id="causal-gqa2"),
    pytest.param(1, 17, 33, 4, 1, 80, 80, True, (-1, -1), 0.0, False, F16, None, id="causal-sq<sk-mqa"),
    pytest.param(1, 33, 17, 4, 1, 96, 96, True, (-1, -1), 0.0, False, F32, None, id="causal-sq>sk"),
    pytest.param(2, 1, 33, 4, 4, 128, 128, True, (-1, -1), 0.0, False, BF16, None, id="one-query"),
    pytest.param(1, 3, 3, 8, 2, 256, 256, True, (-1, -1), 0.0, False, F16, None, id="d256-gqa4"),
    pytest.param(1, 33, 33, 2, 1, 64, 64, True, (4, -1), 0.0, False, F32, None, id="causal-window"),
    pytest.param(1, 17, 33, 2, 2, 64, 64, False, (3, 5), 0.0, False, BF16, None, id="window-2-sided"),
    pytest.param(1, 17, 17, 2, 2, 64, 64, True, (-1, -1), 5.0, False, F32, None, id="softcap"),
    pytest.param(2, 17, 17, 4, 2, 64, 64, True, (7, -1), 0.0, True, F32, None, id="sinks-window"),
    pytest.param(1, 17, 17, 2, 1, 64, 64, False, (-1, -1), 0.0, True, BF16, None, id="sinks-bf16"),
    pytest.param(1, 17, 9, 2, 2, 64, 64, True, (-1, -1), 0.0, True, F32, None, id="sinks-empty-rows"),
    pytest.param(1, 17, 17, 4, 2, 64, 32, True, (-1, -1), 0.0, False, F32, None, id="dim-v-32"),
    pytest.param(2, 17, 17, 4, 2, 64, 64, True, (-1, -1), 0.0, False, F16, "transposed", id="transposed"),
    pytest.param(1, 17, 17, 4, 2, 80, 80, False, (-1, -1), 0.0, False, BF16, "fused", id="fused-qkv"),
    pytest.param(1, 3, 17, 2, 1, 64, 64, True, (-1, -1), 0.0, False, F32, "dim-strided", id="dim-strided"),
    pytest.param(1, 33, 33, 4, 2, 128, 128, True, (8, -1), 30.0, True, BF16, None, id="all-options",
                 marks=pytest.mark.slow),  # fmt: skip
    pytest.param(2, 1000, 1000, 8, 2, 128, 128, True, (-1, -1), 0.0, False, BF16, None, id="gpu-1k",
                 marks=pytest.mark.gpu),  # fmt: skip
    pytest.param(1, 777, 1537, 4, 4, 80, 80, True, (255, -1), 50.0, True, F16, None, id="gpu-odd",
                 marks=pytest.mark.gpu),  # fmt: skip
    pytest.param(1, 515, 515, 4, 1, 256, 256, False, (-1, -1), 0.0, False, BF16, None, id="gpu-d256",
                 marks=pytest.mark.gpu),  # fmt: skip
]  # fmt: skip


@pytest.mark.parametrize(
    "batch,seqlen_q,seqlen_k,heads,kv_heads,dim,dim_v,causal,window,softcap,sink,dtype,layout",
    CASES,
)
def test_flash_attn_func(attn, batch, seqlen_q, seqlen_k, heads, kv_heads, dim, dim_v, causal,
                         window, softcap, sink, dtype, layout):  # fmt: skip
    q, k, v = _inputs(batch, seqlen_q, seqlen_k, heads, kv_heads, dim, dim_v, dtype, layout)
    s_aux = randn(heads, scale=2.0).requires_grad_() if sink else None
    out, lse, mask = attn.flash_attn_func(
        q, k, v, causal=causal, window_size=window, softcap=softcap, s_aux=s_aux,
        return_attn_probs=True,
    )  # fmt: skip
    assert mask is None and lse.shape == (batch, heads, seqlen_q) and lse.dtype == torch.float32
    _check_dense(out, lse, q, k, v, s_aux, dtype, causal=causal, window=window, softcap=softcap)
    # Without return_attn_probs: the output alone, the same values.
    again = attn.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap,
                                 s_aux=s_aux)  # fmt: skip
    assert torch.equal(again, out)


def test_softmax_scale(attn):
    q, k, v = _inputs(1, 17, 17, 2, 2, 64, 64, torch.float32, None)
    out = attn.flash_attn_func(q, k, v, softmax_scale=0.3, causal=True)
    ref, _ = reference(*(t.detach().double().cpu() for t in (q, k, v)), causal=True, scale=0.3)
    assert_close(out, ref, torch.float32, "out")


# Packed sequences: (lengths_q, lengths_k, heads, kv_heads, dim, causal, window, sink, dtype);
# an empty sequence, a one-token one, odd lengths, unequal q and k lengths.
VARLEN = [
    pytest.param([17, 0, 1, 33, 3], None, 4, 2, 64, True, (-1, -1), False, torch.float32, id="causal"),
    pytest.param([5, 17, 2], [9, 17, 20], 2, 1, 96, True, (-1, -1), True, torch.bfloat16, id="sq<sk-sinks"),
    pytest.param([3, 0, 19], [3, 4, 19], 4, 4, 64, False, (2, 2), False, torch.float16, id="window"),
    pytest.param([7, 2], [0, 2], 2, 2, 64, False, (-1, -1), True, torch.float32, id="no-keys-sink"),
]  # fmt: skip


@pytest.mark.parametrize("lengths_q,lengths_k,heads,kv_heads,dim,causal,window,sink,dtype", VARLEN)
def test_flash_attn_varlen_func(attn, lengths_q, lengths_k, heads, kv_heads, dim, causal, window,
                                sink, dtype):  # fmt: skip
    lengths_k = lengths_q if lengths_k is None else lengths_k
    cu_q = torch.tensor([0, *lengths_q], device=DEVICE).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0, *lengths_k], device=DEVICE).cumsum(0).to(torch.int32)
    # Two rows past the last sequence in q: no sequence's, output and gradient 0 there.
    total_q, total_k = sum(lengths_q) + 2, sum(lengths_k)
    q = randn(total_q, heads, dim, dtype=dtype).requires_grad_()
    k = randn(total_k, kv_heads, dim, dtype=dtype).requires_grad_()
    v = randn(total_k, kv_heads, dim, dtype=dtype).requires_grad_()
    s_aux = randn(heads).requires_grad_() if sink else None
    out, lse, _ = attn.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal, window_size=window,
        s_aux=s_aux, return_attn_probs=True,
    )  # fmt: skip
    assert lse.shape == (heads, total_q)
    inputs = [q, k, v] + ([s_aux] if sink else [])
    ref_inputs = [t.detach().double().cpu().requires_grad_() for t in inputs]
    ref_out, ref_lse = varlen_reference(
        *ref_inputs[:3], cu_q.cpu(), cu_k.cpu(), causal=causal, window=window,
        sink=ref_inputs[3] if sink else None,
    )  # fmt: skip
    _check_against_reference(out, lse, inputs, ref_out, ref_lse, ref_inputs, dtype, s_aux)


def test_varlen_equals_dense_per_sequence(attn):
    # Packing changes nothing: each sequence's rows equal flash_attn_func on it alone.
    lengths = [17, 5, 33]
    cu = torch.tensor([0, *lengths], device=DEVICE).cumsum(0).to(torch.int32)
    q, k, v = (randn(sum(lengths), 2, 64, dtype=torch.float16) for _ in range(3))
    packed = attn.flash_attn_varlen_func(q, k, v, cu, cu, 33, 33, causal=True)
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        alone = attn.flash_attn_func(q[None, start:end], k[None, start:end], v[None, start:end],
                                     causal=True)  # fmt: skip
        assert torch.equal(packed[start:end], alone[0])


def test_deterministic_backward_is_bitwise_repeatable(attn):
    # The interpreter runs programs one after another, so on the CPU this checks only that the
    # options reach the backward (two 16-row blocks); on a GPU, where programs race, a size at
    # which they would.
    batch, seqlen, heads = (2, 1000, 8) if ON_GPU else (1, 17, 2)
    q, k, v = _inputs(batch, seqlen, seqlen, heads, 1, 64, 64, torch.bfloat16, None)
    s_aux = randn(heads).requires_grad_()
    dout = randn(batch, seqlen, heads, 64, dtype=torch.bfloat16)
    runs = []
    for _ in range(2):
        out = attn.flash_attn_func(q, k, v, causal=True, s_aux=s_aux, deterministic=True)
        runs.append(grads(out, (q, k, v, s_aux), dout))
    for first, second, name in zip(*runs, ("dq", "dk", "dv", "ds_aux"), strict=True):
        assert torch.equal(first, second), name


def test_no_grad_and_empty_inputs(attn):
    q, k, v = _inputs(1, 17, 17, 2, 2, 64, 64, torch.float16, None)
    with torch.no_grad():
        out = attn.flash_attn_func(q, k, v, causal=True)
    assert not out.requires_grad
    empty = randn(0, 17, 2, 64, dtype=torch.float16)
    assert attn.flash_attn_func(empty, empty, empty).shape == (0, 17, 2, 64)
    no_keys = randn(1, 0, 2, 64, dtype=torch.float16)
    out, lse, _ = attn.flash_attn_func(q, no_keys, no_keys, return_attn_probs=True)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isinf(lse).all()


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"dropout_p": 1.0}, r"dropout_p must be a probability in \[0, 1\), got 1.0"),
        ({"alibi_slopes": torch.ones(4)}, "alibi_slopes"),
        ({"s_aux": torch.ones(3)}, r"one logit per query head, shape \(4,\)"),
        ({"window_size": 3}, "window_size must be a pair"),
        ({"softcap": -1.0}, "softcap must be 0"),
    ],
)
def test_option_errors(attn, kwargs, message):
    q, k, v = _inputs(1, 3, 3, 4, 2, 64, 64, torch.float32, None)
    kwargs = {key: t.to(DEVICE) if isinstance(t, torch.Tensor) else t for key, t in kwargs.items()}
    with pytest.raises(ValueError, match=message):
        attn.flash_attn_func(q, k, v, **kwargs)


def test_shape_and_dtype_errors(attn):
    q = randn(1, 3, 4, 64)
    with pytest.raises(
        ValueError, match="k and v need the same number of heads, which must divide"
    ):
        attn.flash_attn_func(q, randn(1, 3, 3, 64), randn(1, 3, 3, 64))
    with pytest.raises(ValueError, match=r"must be \(batch, seqlen, heads, head_dim\)"):
        attn.flash_attn_func(q[0], q[0], q[0])
    with pytest.raises(TypeError, match="share one dtype"):
        attn.flash_attn_func(q, q.half(), q)
    with pytest.raises(TypeError, match="share one dtype"):
        attn.flash_attn_func(q.double(), q.double(), q.double())
    big = randn(1, 3, 1, 320)
    with pytest.raises(ValueError, match="between 1 and 256"):
        attn.flash_attn_func(big, big, big)
    cu = torch.tensor([0, 3], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="cu_seqlens_k must be a 1-D int32 tensor"):
        attn.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu.float(), 3, 3)


def test_transformers_sees_every_option(attn):
    # transformers 5.x passes an option only where the function's signature names it
    # (modeling_flash_attention_utils._lazy_define_process_function).
    for function in (attn.flash_attn_func, attn.flash_attn_varlen_func):
        names = set(inspect.signature(function).parameters)
        assert {"dropout_p", "softmax_scale", "causal", "window_size", "softcap", "s_aux",
                "deterministic"} <= names  # fmt: skip
    assert "max_seqlen_q" in inspect.signature(attn.flash_attn_varlen_func).parameters
    kvcache = set(inspect.signature(attn.flash_attn_with_kvcache).parameters)
    assert {"block_table", "cache_seqlens", "s_aux", "softcap", "window_size"} <= kvcache


def test_eager_calls_skip_the_op_dispatcher(attn, monkeypatch):
    # Eagerly the ops' implementations run through a plain autograd.Function (the dispatcher's
    # round trip cost more host time than the launches); the ops are for graphs.
    ops = _ops(attn)

    def refused(*args, **kwargs):
        pytest.fail("an eager call went through the op dispatcher")

    monkeypatch.setattr(ops, "forward", refused)
    monkeypatch.setattr(ops, "backward", refused)
    q, k, v = _inputs(1, 17, 17, 4, 2, 64, 64, torch.float32, None)
    s_aux = randn(4).requires_grad_()
    out, lse, _ = attn.flash_attn_func(q, k, v, causal=True, s_aux=s_aux, return_attn_probs=True)
    _check_dense(out, lse, q, k, v, s_aux, torch.float32, causal=True)
    with torch.no_grad():
        torch.testing.assert_close(attn.flash_attn_func(q, k, v, causal=True, s_aux=s_aux), out)


def test_torch_compile_fullgraph(attn):
    # The op is one opaque node of the graph (aot_eager: no inductor on the CPU), forward and
    # backward match eager; with dropout, whose seed the graph draws from torch's generator.
    q, k, v = _inputs(1, 17, 17, 4, 2, 64, 64, torch.float32, None)
    s_aux = randn(4).requires_grad_()

    def f(q, k, v, s_aux):
        return attn.flash_attn_func(q, k, v, causal=True, window_size=(5, -1), s_aux=s_aux,
                                    dropout_p=0.1)  # fmt: skip

    counts = []

    def backend(gm, example_inputs):
        counts.append(sum("flash_attn_forward" in str(n.target) for n in gm.graph.nodes))
        return torch._dynamo.backends.debugging.aot_eager(gm, example_inputs)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend=backend)
    dout = randn(1, 17, 4, 64)
    torch.manual_seed(5)
    got = compiled(q, k, v, s_aux)
    torch.manual_seed(5)
    want = f(q, k, v, s_aux)
    assert counts == [1]
    assert torch.equal(got, want)
    for g, w in zip(grads(got, (q, k, v, s_aux), dout), grads(want, (q, k, v, s_aux), dout),
                    strict=True):  # fmt: skip
        assert torch.equal(g, w)


def _op_cases(attn):
    """{case: (op, args)} for torch.library.opcheck (tests/library/test_registry.py checks that
    every op of the package has one)."""
    from importlib import import_module

    ops = import_module(attn.__name__ + "._ops")
    q, k, v = _inputs(1, 17, 17, 2, 1, 64, 64, torch.float32, None)
    s_aux = randn(2).requires_grad_()
    seed = ops.draw_dropout_seed(q.device)
    # The backward's out and lse need only be consistent: lse of the unmasked scores (so no
    # probability exceeds 1), in the kernel's (batch, heads, seqlen) layout; no dropout.
    scores = q.detach().transpose(1, 2) @ k.detach().transpose(1, 2).transpose(-1, -2) * 0.125
    lse = scores.logsumexp(-1)
    out, dout = randn(1, 17, 2, 64), randn(1, 17, 2, 64)
    qkv = (q.detach(), k.detach(), v.detach())
    return {
        "forward": (
            ops.forward,
            (q, k, v, None, None, None, None, s_aux, 17, 17, 0.125, -1, 0, 0.0, 0.1, seed),
        ),
        "backward": (
            ops.backward,
            (dout, *qkv, out, lse, None, None, 17, 17, 0.125, -1, 0, 0.0),
        ),
    }


@pytest.mark.slow
@pytest.mark.parametrize("case", ["forward", "backward"])
def test_opcheck(attn, case):
    op, args = _op_cases(attn)[case]
    torch.library.opcheck(op, args)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
@pytest.mark.gpu
def test_cuda_graph_capture(attn):
    q, k, v = (randn(2, 256, 4, 128, dtype=torch.bfloat16) for _ in range(3))
    want = attn.flash_attn_func(q, k, v, causal=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = attn.flash_attn_func(q, k, v, causal=True)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(got, want)


def test_float32_inputs_take_tiles_of_half_the_rows_and_columns(attn):
    """fp32 tiles of the 16-bit tables' shape spill registers (minutes in ptxas on an H100):
    float32 inputs get half the rows and columns, at most two stages; the interpreter's
    configuration is the same for every dtype."""
    from importlib import import_module

    tuning = import_module(attn.__name__ + "._tuning")
    for table in (tuning.FORWARD, tuning.BACKWARD_DKDV, tuning.BACKWARD_DQ, tuning.DECODE):
        for block_d, cfg in table.items():
            assert tuning.config(table, block_d, on_cpu=False) == cfg
            wide = tuning.config(table, block_d, on_cpu=False, fp32=True)
            assert (wide.block_m, wide.block_n, wide.num_warps) == (
                max(16, cfg.block_m // 2), max(16, cfg.block_n // 2), cfg.num_warps,
            )  # fmt: skip
            assert wide.num_stages == min(cfg.num_stages, 2)
    assert tuning.config(tuning.BACKWARD_DQ, 128, on_cpu=True, fp32=True) == tuning.CPU


# The forward and the backward through tensor descriptors (_ops._FORWARD_TMA and
# _BACKWARD_TMA), forced on (the interpreter reads descriptors too): (batch, seqlen_q, seqlen_k,
# heads, kv_heads, dim, dim_v, causal, window,
# softcap, sink, dtype, layout). Odd lengths (blocks past each tensor's end read as zeros), a
# head dimension padded from 80, unequal q/k lengths and v dimension, every option, and the
# transposed layout transformers passes (its strides are 16-byte multiples too).
TMA_CASES = [
    pytest.param(2, 17, 17, 4, 2, 64, 64, True, (-1, -1), 0.0, False, BF16, None, id="causal-gqa"),
    pytest.param(1, 17, 33, 4, 1, 80, 80, True, (-1, -1), 0.0, False, F16, None, id="d80-sq<sk"),
    pytest.param(1, 33, 17, 4, 4, 64, 32, False, (-1, -1), 0.0, False, F32, None, id="dim-v-32"),
    pytest.param(1, 33, 33, 4, 2, 64, 64, True, (4, -1), 5.0, True, F32, None, id="options"),
    pytest.param(
        2, 17, 17, 4, 2, 64, 64, False, (-1, -1), 0.0, False, F16, "transposed", id="transposed"
    ),  # fmt: skip
]


@pytest.mark.parametrize(
    "batch,seqlen_q,seqlen_k,heads,kv_heads,dim,dim_v,causal,window,softcap,sink,dtype,layout",
    TMA_CASES,
)
def test_through_tensor_descriptors(attn, monkeypatch, batch, seqlen_q, seqlen_k, heads,
                                    kv_heads, dim, dim_v, causal, window, softcap, sink, dtype,
                                    layout):  # fmt: skip
    ops = _ops(attn)
    q, k, v = _inputs(batch, seqlen_q, seqlen_k, heads, kv_heads, dim, dim_v, dtype, layout)
    s_aux = randn(heads, scale=2.0).requires_grad_() if sink else None
    options = {"causal": causal, "window_size": window, "softcap": softcap, "s_aux": s_aux,
               "return_attn_probs": True}  # fmt: skip
    inputs = [q, k, v] + ([s_aux] if sink else [])
    monkeypatch.setattr(ops, "_BACKWARD_TMA", False)
    pointer_out, pointer_lse, _ = attn.flash_attn_func(q, k, v, **options)
    dout = randn(*pointer_out.shape, dtype=dtype)
    pointer_grads = grads(pointer_out, inputs, dout)
    monkeypatch.setattr(ops, "_FORWARD_TMA", True)
    monkeypatch.setattr(ops, "_BACKWARD_TMA", True)
    assert ops._forward_tma(q, k, v, None, q.device)
    assert ops._backward_tma(q, k, v, dout, q.device)
    out, lse, _ = attn.flash_attn_func(q, k, v, **options)
    # The same arithmetic on the same values as the pointer loads: equal up to the order the
    # interpreter's fp32 products sum in (a transposed operand), a few ulp.
    torch.testing.assert_close(out, pointer_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, pointer_lse, rtol=1e-6, atol=1e-6)
    tma_grads = torch.autograd.grad(out, inputs, dout, retain_graph=True)  # _check_dense's too
    for got, want in zip(tma_grads, pointer_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    _check_dense(out, lse, q, k, v, s_aux, dtype, causal=causal, window=window, softcap=softcap)


@pytest.mark.skipif(not ON_GPU, reason="launches run through Triton's interpreter on the CPU")
def test_repeated_launches_skip_tritons_runner(attn, monkeypatch):
    # After each kernel's first launch, the forward and backward (tensor descriptors at head
    # dim 128 on Hopper) launch through the compiled kernels' launchers directly, to the bit.
    import sys

    library = sys.modules[f"{attn.__name__}._library"]
    q, k, v = (randn(2, 77, 4, 128, dtype=BF16).requires_grad_() for _ in range(3))
    dout = randn(2, 77, 4, 128, dtype=BF16)

    def step():
        out = attn.flash_attn_func(q, k, v, causal=True)
        return (out, *grads(out, [q, k, v], dout))

    first = step()
    kernels = {compiled.name for compiled, _ in library._compiled.values()}
    assert {"_fwd_kernel", "_bwd_dkdv_kernel", "_bwd_dq_kernel"} <= kernels, kernels
    assert all(direct is not None for _, direct in library._compiled.values())
    compiled_type = type(next(iter(library._compiled.values()))[0])

    def no_runner(self, grid):
        pytest.fail("a repeated launch went through Triton's runner")

    monkeypatch.setattr(compiled_type, "__getitem__", no_runner)
    for got, want in zip(step(), first, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "descriptors"])
@pytest.mark.parametrize("keys_down", [False, True], ids=["queries-down", "keys-down"])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_dkdv_tile_layouts(attn, monkeypatch, keys_down, tma, dtype):
    # The dk/dv kernel's two layouts (_ops._DKDV_KEYS_DOWN: keys x queries or queries x keys),
    # whichever the head dimension would pick, with every mask option and a sink.
    ops = _ops(attn)
    monkeypatch.setattr(ops, "_DKDV_KEYS_DOWN", keys_down)
    monkeypatch.setattr(ops, "_BACKWARD_TMA", tma)
    q, k, v = _inputs(1, 33, 37, 4, 2, 64, 64, dtype, None)
    s_aux = randn(4, scale=2.0).requires_grad_()
    out, lse, _ = attn.flash_attn_func(q, k, v, causal=True, window_size=(9, -1), softcap=5.0,
                                       s_aux=s_aux, return_attn_probs=True)  # fmt: skip
    _check_dense(out, lse, q, k, v, s_aux, dtype, causal=True, window=(9, -1), softcap=5.0)


def test_packed_through_tensor_descriptors(attn, monkeypatch):
    # Packed sequences: a descriptor block runs on into the next sequence's rows (of q and dout
    # past a sequence's queries, of k and v past its keys), which masks must keep out; two rows
    # past the last sequence, NaN in q, k, v and dout, must reach no gradient (a probability
    # of 0 times NaN is NaN).
    monkeypatch.setattr(_ops(attn), "_FORWARD_TMA", True)
    monkeypatch.setattr(_ops(attn), "_BACKWARD_TMA", True)
    lengths = [17, 0, 5, 33]
    cu = torch.tensor([0, *lengths], device=DEVICE).cumsum(0).to(torch.int32)
    total = sum(lengths)
    q, k, v = (randn(total + 2, 2, 64) for _ in range(3))
    for t in (q, k, v):
        t[total:] = float("nan")
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse, _ = attn.flash_attn_varlen_func(q, k, v, cu, cu, 33, 33, causal=True,
                                              return_attn_probs=True)  # fmt: skip
    dout = randn(*out.shape)
    dout[total:] = float("nan")
    got = grads(out, [q, k, v], dout)
    ref_inputs = [t.detach()[:total].double().cpu().requires_grad_() for t in (q, k, v)]
    ref_out, ref_lse = varlen_reference(*ref_inputs, cu.cpu(), cu.cpu(), causal=True)
    assert_close(out[:total], ref_out, torch.float32, "out")
    want = grads(ref_out, ref_inputs, dout[:total].double().cpu())
    for g, w, name in zip(got, want, ("dq", "dk", "dv"), strict=True):
        assert_close(g[:total], w, torch.float32, name)


def test_cache_rows_past_the_filled_length_stay_out_through_tensor_descriptors(attn, monkeypatch):
    # More queries than the decode path takes, over a cache whose unfilled rows hold NaN: the
    # descriptor reads them (the pointer loads mask them), and they must not reach the output
    # (a probability of 0 times NaN is NaN).
    monkeypatch.setattr(_ops(attn), "_FORWARD_TMA", True)
    q = randn(2, 17, 4, 64)
    k_cache, v_cache = (randn(2, 48, 2, 64) for _ in range(2))
    filled = torch.tensor([20, 33], dtype=torch.int32, device=DEVICE)
    for cache in (k_cache, v_cache):
        cache[0, 20:] = float("nan")
        cache[1, 33:] = float("nan")
    out = attn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=filled, causal=True)
    assert torch.isfinite(out).all()
    for b, n in enumerate(filled.tolist()):
        ref, _ = reference(q[b : b + 1].double().cpu(), k_cache[b : b + 1, :n].double().cpu(),
                           v_cache[b : b + 1, :n].double().cpu(), causal=True)  # fmt: skip
        assert_close(out[b : b + 1], ref, torch.float32, f"sequence {b}")


def test_which_inputs_go_through_tensor_descriptors(attn, monkeypatch):
    ops = _ops(attn)
    q, k, v = (randn(1, 17, 2, 64) for _ in range(3))
    device = q.device
    # By default only where the GPU has TMA, and for head dims of 128 and more.
    assert ops._FORWARD_TMA is None and not ops._forward_tma(q, k, v, None, device)
    wide = [randn(1, 17, 2, 128) for _ in range(3)]
    has_tma = ON_GPU and torch.cuda.get_device_capability(device)[0] >= 9
    assert ops._forward_tma(*wide, None, device) == has_tma
    monkeypatch.setattr(ops, "_has_tma", lambda device: True)
    assert ops._forward_tma(*wide, None, device) and not ops._forward_tma(q, k, v, None, device)
    monkeypatch.setattr(ops, "_FORWARD_TMA", False)
    assert not ops._forward_tma(*wide, None, device)
    monkeypatch.setattr(ops, "_FORWARD_TMA", True)
    assert ops._forward_tma(q, k, v, None, device)
    # A paged cache's blocks are gathered page by page.
    assert not ops._forward_tma(q, k, v, torch.zeros(1, 2, dtype=torch.int32), device)
    # A contiguous tensor whose base is 4 bytes off 16, and strides of 3 x 4 bytes, are not
    # describable.
    shifted = randn(1 + 17 * 2 * 64)[1:].view(1, 17, 2, 64)
    assert shifted.is_contiguous() and not ops._forward_tma(shifted, k, v, None, device)
    odd = randn(1, 17, 3, 3)
    assert not ops._forward_tma(q, odd, v, None, device)


def test_which_backwards_go_through_tensor_descriptors(attn, monkeypatch):
    ops = _ops(attn)
    q, k, v, dout = (randn(1, 17, 2, 64) for _ in range(4))
    device = q.device
    # By default as the forward: where the GPU has TMA, for head dims of 128 and more.
    wide = [randn(1, 17, 2, 128) for _ in range(4)]
    has_tma = ON_GPU and torch.cuda.get_device_capability(device)[0] >= 9
    assert ops._BACKWARD_TMA is None and not ops._backward_tma(q, k, v, dout, device)
    assert ops._backward_tma(*wide, device) == has_tma
    monkeypatch.setattr(ops, "_has_tma", lambda device: True)
    assert ops._backward_tma(*wide, device) and not ops._backward_tma(q, k, v, dout, device)
    monkeypatch.setattr(ops, "_BACKWARD_TMA", False)
    assert not ops._backward_tma(*wide, device)
    monkeypatch.setattr(ops, "_BACKWARD_TMA", True)
    assert ops._backward_tma(q, k, v, dout, device)
    # An output gradient whose rows are 3 x 4 bytes apart is not describable.
    assert not ops._backward_tma(q, k, v, randn(1, 17, 3, 3)[..., :3], device)
    # One query, or one key (a length compiled as a constant, on which ptxas crashed).
    one = randn(1, 1, 2, 64)
    assert not ops._backward_tma(one, k, v, one, device)
    assert not ops._backward_tma(q, one, one, dout, device)


def _ops(attn):
    from importlib import import_module

    return import_module(attn.__name__ + "._ops")
