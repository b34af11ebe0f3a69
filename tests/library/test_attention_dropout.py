"""Attention dropout of library/attention: the output and gradients against the float64 reference
applying the kernel's own keep-mask (``_ops.dropout_keep_mask``, the same random-number code),
dense and packed; the same seed giving the same result; dropout 0 costing nothing; and the
mask's statistics.

The seed is drawn from torch's generator (``_ops.draw_dropout_seed``) on each call, so reseeding
torch before a call and before drawing gives the test the seed the call used."""

import zlib
from importlib import import_module

import pytest
import torch

from tests.support.attention_reference import attention as reference
from tests.support.attention_reference import varlen_attention as varlen_reference
from tests.support.library import DEVICE, assert_close, grads, load, randn


@pytest.fixture(scope="module")
def attn():
    return load("attention")


@pytest.fixture(scope="module")
def ops(attn):
    return import_module(attn.__name__ + "._ops")


@pytest.fixture(autouse=True)
def seed(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def _seed_of_next_call(ops, seed: int) -> torch.Tensor:
    """The dropout seed that a call made right after ``torch.manual_seed(seed)`` draws; leaves
    torch seeded so."""
    torch.manual_seed(seed)
    drawn = ops.draw_dropout_seed(torch.device(DEVICE))
    torch.manual_seed(seed)
    return drawn


def _check(out, ref_out, inputs, ref_inputs, dtype):
    assert_close(out, ref_out, dtype, "out")
    dout = randn(*out.shape, dtype=dtype)
    got = grads(out, inputs, dout)
    want = grads(ref_out, ref_inputs, dout.double().cpu())
    for g, w, name in zip(got, want, ("dq", "dk", "dv", "ds_aux"), strict=False):
        assert_close(g, w, dtype, name)


# (batch, seqlen_q, seqlen_k, heads, kv_heads, dim, causal, window, softcap, sink, p, dtype)
DENSE = [
    pytest.param(1, 17, 33, 2, 1, 32, True, (-1, -1), 0.0, False, 0.3, torch.float32, id="causal-gqa"),
    pytest.param(1, 33, 17, 2, 1, 64, False, (5, 3), 8.0, True, 0.5, torch.float32, id="window-cap-sink"),
    pytest.param(1, 17, 17, 2, 2, 128, True, (-1, -1), 0.0, False, 0.1, torch.bfloat16, id="bf16"),
]  # fmt: skip


# The dk/dv kernel's two tile layouts (_ops._DKDV_KEYS_DOWN), each with the dropout mask laid
# its way.
@pytest.mark.parametrize("keys_down", [False, True], ids=["queries-down", "keys-down"])
@pytest.mark.parametrize(
    "batch,seqlen_q,seqlen_k,heads,kv_heads,dim,causal,window,softcap,sink,p,dtype", DENSE
)
def test_dropout_matches_reference_with_the_kernels_mask(attn, ops, monkeypatch, keys_down, batch,
                                                          seqlen_q, seqlen_k, heads, kv_heads,
                                                          dim, causal, window, softcap, sink, p,
                                                          dtype):  # fmt: skip
    monkeypatch.setattr(ops, "_DKDV_KEYS_DOWN", keys_down)
    q = randn(batch, seqlen_q, heads, dim, dtype=dtype).requires_grad_()
    k = randn(batch, seqlen_k, kv_heads, dim, dtype=dtype).requires_grad_()
    v = randn(batch, seqlen_k, kv_heads, dim, dtype=dtype).requires_grad_()
    s_aux = randn(heads).requires_grad_() if sink else None
    drawn = _seed_of_next_call(ops, 7)
    options = {"causal": causal, "window_size": window, "softcap": softcap}
    out = attn.flash_attn_func(q, k, v, dropout_p=p, s_aux=s_aux, **options)
    keep = ops.dropout_keep_mask(drawn, batch * seqlen_q, heads, seqlen_k, p).cpu()
    keep = keep.view(batch, seqlen_q, heads, seqlen_k)
    # Something is dropped and something kept, or the comparison proves nothing.
    assert 0 < keep.float().mean() < 1
    inputs = [q, k, v] + ([s_aux] if sink else [])
    ref_inputs = [t.detach().double().cpu().requires_grad_() for t in inputs]
    ref_out, _ = reference(*ref_inputs[:3], causal=causal, window=window, softcap=softcap,
                           sink=ref_inputs[3] if sink else None, keep=keep, dropout_p=p)  # fmt: skip
    _check(out, ref_out, inputs, ref_inputs, dtype)


@pytest.mark.parametrize("keys_down", [False, True], ids=["queries-down", "keys-down"])
def test_varlen_dropout_matches_reference(attn, ops, monkeypatch, keys_down):
    monkeypatch.setattr(ops, "_DKDV_KEYS_DOWN", keys_down)
    lengths_q, lengths_k, heads, kv_heads, p = [17, 0, 5, 20], [17, 3, 9, 20], 2, 1, 0.25
    cu_q = torch.tensor([0, *lengths_q], device=DEVICE).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0, *lengths_k], device=DEVICE).cumsum(0).to(torch.int32)
    q = randn(sum(lengths_q), heads, 64, dtype=torch.float16).requires_grad_()
    k = randn(sum(lengths_k), kv_heads, 64, dtype=torch.float16).requires_grad_()
    v = randn(sum(lengths_k), kv_heads, 64, dtype=torch.float16).requires_grad_()
    drawn = _seed_of_next_call(ops, 3)
    out = attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                      dropout_p=p, causal=True)  # fmt: skip
    keep = ops.dropout_keep_mask(drawn, q.shape[0], heads, max(lengths_k), p).cpu()
    ref_inputs = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    ref_out, _ = varlen_reference(*ref_inputs, cu_q.cpu(), cu_k.cpu(), keep=keep, causal=True,
                                  dropout_p=p)  # fmt: skip
    _check(out, ref_out, [q, k, v], ref_inputs, torch.float16)


def test_same_seed_same_result_and_zero_dropout_is_free(attn):
    q, k, v = (randn(1, 16, 2, 32).requires_grad_() for _ in range(3))
    dout = randn(1, 16, 2, 32)
    runs = []
    for _ in range(2):
        torch.manual_seed(11)
        out = attn.flash_attn_func(q, k, v, dropout_p=0.2, causal=True)
        runs.append((out, *grads(out, (q, k, v), dout)))
    for first, second in zip(*runs, strict=True):
        assert torch.equal(first, second)
    # The generator moved on: the next call drops other probabilities.
    assert not torch.equal(attn.flash_attn_func(q, k, v, dropout_p=0.2, causal=True), runs[0][0])
    # dropout_p=0 (evaluation) is the kernel without dropout, and draws nothing.
    state = torch.get_rng_state()
    plain = attn.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(attn.flash_attn_func(q, k, v, dropout_p=0.0, causal=True), plain)
    assert torch.equal(torch.get_rng_state(), state)


def test_keep_mask_statistics(ops):
    # 48 rows x 2 heads x 300 keys: the keep rate within 5 standard deviations of 1 - p, and
    # neither rows nor heads nor seeds repeating each other's masks.
    p, rows, heads, cols = 0.25, 48, 2, 300
    seed = ops.draw_dropout_seed(torch.device(DEVICE))
    keep = ops.dropout_keep_mask(seed, rows, heads, cols, p).cpu().float()
    sigma = (p * (1 - p) / keep.numel()) ** 0.5
    assert abs(keep.mean().item() - (1 - p)) < 5 * sigma
    assert not torch.equal(keep[0], keep[1]) and not torch.equal(keep[:, 0], keep[:, 1])
    # Rows and columns alike: no position keeps far more often than the rest.
    assert keep.mean(dim=(0, 1)).min() > 0.5 and keep.mean(dim=(1, 2)).min() > 0.5
    other = ops.dropout_keep_mask(seed + 1, rows, heads, cols, p).cpu().float()
    agreement = (keep == other).float().mean().item()
    # Independent masks agree with probability p^2 + (1-p)^2 = 0.625.
    assert abs(agreement - (p * p + (1 - p) ** 2)) < 0.03
