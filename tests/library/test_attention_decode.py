"""The decode path of library/attention: ``flash_attn_with_kvcache`` over a contiguous and a paged
KV cache (new keys written in place first, per-sequence filled lengths, left padding), split
into several chunks of keys (split-KV, flash-decoding) or not, and paged
``flash_attn_varlen_func``, against the float64 reference; the split-count rule; the one-launch
split path's counters (back at zero after every call) and its agreement with the two-launch
path it replaced."""

import zlib
from importlib import import_module

import pytest
import torch

from tests.support.attention_reference import attention as reference
from tests.support.library import DEVICE, ON_GPU, assert_close, load, randn


@pytest.fixture(scope="module")
def attn():
    return load("attention")


@pytest.fixture(scope="module")
def ops(attn):
    return import_module(attn.__name__ + "._ops")


@pytest.fixture(autouse=True)
def seed(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def _expected(q, k_cache, v_cache, used, **options):
    """Per sequence: the reference ``(out, lse)`` over the first ``used[b]`` cache rows."""
    outs, lses = [], []
    for b, n in enumerate(used):
        out, lse = reference(q[b : b + 1].cpu(), k_cache[b : b + 1, :n].cpu(),
                             v_cache[b : b + 1, :n].cpu(), **options)  # fmt: skip
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def _paged(k_cache, page_size, generator):
    """``(pages, block_table)``: ``k_cache`` ``(batch, capacity, ...)`` cut into pages of
    ``page_size`` rows, stored shuffled among spare pages."""
    batch, capacity = k_cache.shape[:2]
    per_seq = capacity // page_size
    n_pages = batch * per_seq + 3
    order = torch.randperm(n_pages, generator=generator)[: batch * per_seq]
    pages = randn(n_pages, page_size, *k_cache.shape[2:], dtype=k_cache.dtype)
    pages[order.to(DEVICE)] = k_cache.reshape(batch * per_seq, page_size, *k_cache.shape[2:])
    return pages, order.view(batch, per_seq).to(torch.int32).to(DEVICE)


# (seqlen_q, seqlen_new, cache_seqlens, heads, kv_heads, dim, causal, window, softcap, sink, dtype)
CASES = [
    pytest.param(1, 1, [5, 16, 0], 4, 2, 64, True, (-1, -1), 0.0, False, torch.float16, id="decode"),
    # 3 queries x 8 heads of one kv head: 24 rows, two tiles of the interpreter's 16.
    pytest.param(3, 3, [9, 20, 1], 8, 1, 128, True, (-1, -1), 0.0, True, torch.bfloat16, id="spec-sinks"),
    pytest.param(2, 0, [17, 30, 2], 2, 2, 80, True, (4, -1), 10.0, False, torch.float32, id="window-cap"),
    pytest.param(1, 1, [31, 7, 12], 8, 2, 256, False, (-1, -1), 0.0, False, torch.bfloat16, id="d256"),
]  # fmt: skip


# Split-KV: the interpreter's blocks are 16 keys, so 3 chunks of up to 33 keys are a block each
# (some empty for the shorter sequences), 2 chunks two blocks each, 7 chunks more than there are
# blocks (the last four always empty); 1 chunk is the program that writes the output itself.
@pytest.mark.parametrize(
    "paged,num_splits",
    [(False, 3), (True, 2), (False, 1), (True, 7)],
    ids=["contiguous", "paged", "contiguous-unsplit", "paged-7-splits"],
)
@pytest.mark.parametrize(
    "seqlen_q,seqlen_new,cache_seqlens,heads,kv_heads,dim,causal,window,softcap,sink,dtype", CASES
)
def test_flash_attn_with_kvcache(attn, ops, paged, num_splits, seqlen_q, seqlen_new,
                                 cache_seqlens, heads, kv_heads, dim, causal, window, softcap,
                                 sink, dtype):  # fmt: skip
    assert ops._DECODE_FUSED  # the one-launch path is the one these cases check
    generator = torch.Generator().manual_seed(0)
    batch, capacity, page_size = len(cache_seqlens), 32, 8
    q = randn(batch, seqlen_q, heads, dim, dtype=dtype)
    k_cache = randn(batch, capacity, kv_heads, dim, dtype=dtype)
    v_cache = randn(batch, capacity, kv_heads, dim, dtype=dtype)
    k_new = randn(batch, seqlen_new, kv_heads, dim, dtype=dtype) if seqlen_new else None
    v_new = randn(batch, seqlen_new, kv_heads, dim, dtype=dtype) if seqlen_new else None
    s_aux = randn(heads) if sink else None
    used = torch.tensor(cache_seqlens, dtype=torch.int32, device=DEVICE)
    # What the cache holds after the call: the new rows written at each sequence's end.
    want_k, want_v = k_cache.clone(), v_cache.clone()
    for b, n in enumerate(cache_seqlens):
        if seqlen_new:
            want_k[b, n : n + seqlen_new] = k_new[b]
            want_v[b, n : n + seqlen_new] = v_new[b]
    total = [n + seqlen_new for n in cache_seqlens]
    options = {"causal": causal, "window_size": window, "softcap": softcap, "s_aux": s_aux,
               "num_splits": num_splits}  # fmt: skip
    if paged:
        k_pages, table = _paged(k_cache, page_size, generator)
        v_pages, _ = _paged(v_cache, page_size, torch.Generator().manual_seed(0))
        out, lse = attn.flash_attn_with_kvcache(
            q, k_pages, v_pages, k_new, v_new, cache_seqlens=used, block_table=table,
            return_softmax_lse=True, **options,
        )  # fmt: skip
        k_after = k_pages[table.long()].reshape(batch, capacity, kv_heads, dim)
        v_after = v_pages[table.long()].reshape(batch, capacity, kv_heads, dim)
    else:
        out, lse = attn.flash_attn_with_kvcache(
            q, k_cache, v_cache, k_new, v_new, cache_seqlens=used, return_softmax_lse=True,
            **options,
        )  # fmt: skip
        k_after, v_after = k_cache, v_cache
    assert torch.equal(k_after, want_k) and torch.equal(v_after, want_v)
    assert lse.shape == (batch, heads, seqlen_q)
    expected, expected_lse = _expected(q, want_k, want_v, total, causal=causal, window=window,
                                       softcap=softcap, sink=s_aux.cpu() if sink else None)  # fmt: skip
    assert_close(out, expected, dtype, "out")
    finite = torch.isfinite(expected_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), finite), "rows that see no key: lse +inf"
    assert_close(lse.cpu()[finite], expected_lse[finite], torch.float32, "lse", floor=1.0)
    if num_splits > 1:
        # The last program of each row tile put its counter back: the next call starts at zero.
        counters = ops._current_decode_counters(out.device)
        assert counters is not None and counters.numel() >= len(cache_seqlens) * kv_heads
        assert not counters.any(), "a decode counter was left non-zero"


def _decode_inputs(dtype=torch.float32):
    # 3 queries x 4 heads of each of 2 kv heads (12 rows: one tile), ragged lengths of up to 3
    # key blocks (one empty sequence), a sink, a left window and a soft cap: every branch of
    # the combine (a split with no key, a row with only the sink).
    batch, capacity = 3, 40
    q = randn(batch, 3, 8, 64, dtype=dtype)
    k_cache, v_cache = (randn(batch, capacity, 2, 64, dtype=dtype) for _ in range(2))
    used = torch.tensor([37, 0, 18], dtype=torch.int32, device=DEVICE)
    options = {"causal": True, "window_size": (20, -1), "softcap": 8.0, "s_aux": randn(8)}
    return q, k_cache, v_cache, used, options


@pytest.mark.parametrize("num_splits", [1, 3, 7])
def test_one_launch_decode_equals_two_launches_and_repeats(attn, ops, monkeypatch, num_splits):
    # The fused path's last program combines exactly as the reduce kernel did: same code, same
    # split order, on the same fp32 partials read back (or, with one split, on the values the
    # partial would have held), so the outputs are equal bit for bit, not merely close. A second
    # call on the same inputs must repeat the first exactly: a counter left non-zero would make
    # no program (or the wrong one) combine, leaving the output unwritten.
    q, k_cache, v_cache, used, options = _decode_inputs()

    def call():
        return attn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=used,
                                            num_splits=num_splits, return_softmax_lse=True,
                                            **options)  # fmt: skip

    out, lse = call()
    again, lse_again = call()
    assert torch.equal(again, out) and torch.equal(lse_again, lse)
    counters = ops._current_decode_counters(out.device)
    if num_splits > 1:
        assert counters is not None and not counters.any()
    monkeypatch.setattr(ops, "_DECODE_FUSED", False)
    two_out, two_lse = call()
    assert torch.equal(two_out, out) and torch.equal(two_lse, lse)
    want, want_lse = _expected(q, k_cache, v_cache, used.tolist(), causal=True, window=(20, -1),
                               softcap=8.0, sink=options["s_aux"].cpu())  # fmt: skip
    assert_close(out, want, torch.float32, "out")
    # The empty sequence's rows see only the sink: finite log-sum-exps everywhere.
    assert_close(lse, want_lse, torch.float32, "lse", floor=1.0)


def test_decode_counters_grow_and_stay_zero(attn, ops):
    # A call that needs more counters than the buffer holds gets a larger one (the old one kept:
    # a captured graph may still use it); calls of either size leave all of them at zero.
    q, k_cache, v_cache, used, options = _decode_inputs()
    device = q.device
    # Start from no buffer (an earlier test's, retired, may be larger than this test needs).
    earlier = ops._decode_counter_buffers.pop(ops._counters_key(device), None)
    if earlier is not None:
        ops._retired_counter_buffers.append(earlier)
    attn.flash_attn_with_kvcache(q[:1], k_cache[:1], v_cache[:1], cache_seqlens=used[:1],
                                 num_splits=2, **options)  # fmt: skip
    small = ops._current_decode_counters(device)
    assert small is not None and small.numel() == 2 and not small.any()  # 1 row tile x 2 kv heads
    wide = torch.cat([q] * 4)
    k_wide, v_wide = torch.cat([k_cache] * 4), torch.cat([v_cache] * 4)
    attn.flash_attn_with_kvcache(wide, k_wide, v_wide, cache_seqlens=torch.cat([used] * 4),
                                 num_splits=2, **options)  # fmt: skip
    grown = ops._current_decode_counters(device)
    assert grown is not small and grown.numel() >= 12 * 2 and not grown.any()
    assert any(t is small for t in ops._retired_counter_buffers)


def test_kvcache_int_seqlens_and_whole_cache(attn):
    q = randn(2, 1, 2, 64, dtype=torch.float16)
    k_cache, v_cache = (randn(2, 17, 2, 64, dtype=torch.float16) for _ in range(2))
    whole = attn.flash_attn_with_kvcache(q, k_cache, v_cache)
    assert_close(whole, _expected(q, k_cache, v_cache, [17, 17])[0], torch.float16, "whole")
    part = attn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=9, causal=True)
    assert_close(part, _expected(q, k_cache, v_cache, [9, 9])[0], torch.float16, "int seqlens")


def test_decode_split_rule(attn):
    from importlib import import_module

    splits = import_module(attn.__name__ + "._tuning").decode_splits
    # An H100 (132 SMs, one program each), 8 kv heads, a 4k cache: batch 1 gets 16 chunks of
    # 256 keys, batch 8 2 chunks (128 programs); batch 32 fills the GPU unsplit.
    assert splits(1 * 8, 4096, 132) == 16
    assert splits(8 * 8, 4096, 132) == 2
    assert splits(32 * 8, 4096, 132) == 1
    # No chunk under 256 keys, and no more than 64 chunks.
    assert splits(8, 300, 132) == 2
    assert splits(1, 1 << 20, 132) == 64
    # The wide tile's chunks are at least 4 of its 128-key blocks: batch 1 gets 8.
    assert splits(1 * 8, 4096, 132, 128) == 8


def test_decode_tile_rule(attn):
    from importlib import import_module

    tuning = import_module(attn.__name__ + "._tuning")
    table = tuning.DECODE[128]
    # Few programs (batch 1, 8 kv heads) at head dim 128 in 16 bits: the wide tile, measured
    # faster there; a batch of 8, float32, another head dim or the CPU keep the table's.
    assert tuning.decode_config(128, 8, False, False) == tuning.DECODE_WIDE != table
    assert tuning.decode_config(128, 64, False, False) == table
    assert tuning.decode_config(128, 8, False, True) == tuning.config(
        tuning.DECODE, 128, False, True
    )
    assert tuning.decode_config(64, 8, False, False) == tuning.DECODE[64]
    assert tuning.decode_config(128, 8, True, False) == tuning.CPU
    # The plan pairs each tile with its split count (an H100's 132 SMs, a 4k cache).
    assert tuning.decode_plan(128, 8, 4096, 132, False, False) == (tuning.DECODE_WIDE, 8)
    assert tuning.decode_plan(128, 64, 4096, 132, False, False) == (table, 2)


def test_kvcache_errors(attn):
    q = randn(1, 1, 2, 64)
    cache = randn(1, 8, 2, 64)
    with pytest.raises(ValueError, match="rotary_cos is not supported"):
        attn.flash_attn_with_kvcache(q, cache, cache, rotary_cos=cache)
    with pytest.raises(ValueError, match="new k and v need cache_seqlens"):
        attn.flash_attn_with_kvcache(q, cache, cache, randn(1, 1, 2, 64), randn(1, 1, 2, 64))
    with pytest.raises(ValueError, match="pass both k and v"):
        attn.flash_attn_with_kvcache(q, cache, cache, randn(1, 1, 2, 64), cache_seqlens=3)
    with pytest.raises(ValueError, match=r"block_table must be a \(batch=1, max_pages\) int32"):
        attn.flash_attn_with_kvcache(q, cache, cache, block_table=torch.zeros(2, 1, device=DEVICE))


def test_paged_varlen(attn):
    # flash_attn_varlen_func with a block table: keys of sequence b are its first
    # cu_seqlens_k[b + 1] - cu_seqlens_k[b] cache rows, through its pages.
    generator = torch.Generator().manual_seed(1)
    lengths_q, lengths_k = [3, 1], [20, 9]
    k_cache, v_cache = (randn(2, 24, 2, 64, dtype=torch.float16) for _ in range(2))
    k_pages, table = _paged(k_cache, 8, generator)
    v_pages, _ = _paged(v_cache, 8, torch.Generator().manual_seed(1))
    q = randn(sum(lengths_q), 4, 64, dtype=torch.float16)
    cu_q = torch.tensor([0, 3, 4], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 20, 29], dtype=torch.int32, device=DEVICE)
    out = attn.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, 3, 20, causal=True,
                                      block_table=table)  # fmt: skip
    for b in range(2):
        rows = slice(cu_q[b].item(), cu_q[b + 1].item())
        want, _ = reference(q[None, rows].cpu(), k_cache[b : b + 1, : lengths_k[b]].cpu(),
                            v_cache[b : b + 1, : lengths_k[b]].cpu(), causal=True)  # fmt: skip
        assert_close(out[rows], want[0], torch.float16, f"sequence {b}")


def test_kvcache_under_compile(attn):
    # The decode step as a compiled graph: cache writes and the op, no graph break.
    q = randn(2, 1, 4, 64)
    k_cache, v_cache = (randn(2, 16, 2, 64) for _ in range(2))
    k_new, v_new = (randn(2, 1, 2, 64) for _ in range(2))
    used = torch.tensor([3, 9], dtype=torch.int32, device=DEVICE)

    def step(q, k_cache, v_cache, k, v, used):
        return attn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=used,
                                            causal=True)  # fmt: skip

    eager_k, eager_v = k_cache.clone(), v_cache.clone()
    want = step(q, eager_k, eager_v, k_new, v_new, used)
    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(
        q, k_cache, v_cache, k_new, v_new, used
    )
    assert torch.equal(got, want)
    assert torch.equal(k_cache, eager_k) and torch.equal(v_cache, eager_v)


def test_key_padding_mask_under_compile(attn):
    # A padded batch's decode step as transformers' generate() compiles it: the key mask made
    # in the graph from an integer mask. The traced graph hands the op the bool mask: the
    # op reads its bytes itself, since torch 2.11's inductor could not lower a bool tensor's
    # view as uint8 (an H100 run of test_generate_with_a_static_cache, 2026-11-27).
    q = randn(2, 1, 4, 64)
    k_cache, v_cache = (randn(2, 16, 2, 64) for _ in range(2))
    mask = torch.tensor([[0] * 5 + [1] * 11, [1] * 16], device=DEVICE)
    used = torch.tensor([16, 16], dtype=torch.int32, device=DEVICE)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def step(q, k_cache, v_cache, mask, used):
        return attn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=used,
                                            key_padding_mask=mask != 0, causal=True)  # fmt: skip

    want = step(q, k_cache, v_cache, mask, used)
    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True, backend=backend)(q, k_cache, v_cache, mask, used)
    assert torch.equal(got, want)
    (graph,) = graphs
    views = [n for n in graph.graph.nodes if n.target in ("view", torch.Tensor.view)]
    assert not [n for n in views if any(isinstance(a, torch.dtype) for a in n.args)], graph.code
    # The rows left out do count: the same step with every key kept differs.
    assert not torch.allclose(got, step(q, k_cache, v_cache, torch.ones_like(mask), used))


@pytest.mark.gpu
@pytest.mark.parametrize("batch,used", [(1, [4001]), (8, [4096, 1, 3000, 17, 2048, 4095, 0, 999])])
def test_split_decode_at_size(attn, batch, used):
    # The decode shapes (32 q / 8 kv heads, a 4k cache, bf16) with the split count the
    # rule picks on this GPU, against the float64 reference.
    q = randn(batch, 1, 32, 128, dtype=torch.bfloat16)
    k_cache, v_cache = (randn(batch, 4096, 8, 128, dtype=torch.bfloat16) for _ in range(2))
    lengths = torch.tensor(used, dtype=torch.int32, device=DEVICE)
    out = attn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, causal=True)
    want, _ = _expected(q, k_cache, v_cache, used, causal=True)
    assert_close(out, want, torch.bfloat16, "out")


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
@pytest.mark.gpu
def test_kvcache_cuda_graph(attn):
    q = randn(4, 1, 32, 128, dtype=torch.bfloat16)
    k_cache, v_cache = (randn(4, 4096, 8, 128, dtype=torch.bfloat16) for _ in range(2))
    k_new, v_new = (randn(4, 1, 8, 128, dtype=torch.bfloat16) for _ in range(2))
    used = torch.tensor([100, 4000, 7, 2048], dtype=torch.int32, device=DEVICE)
    want = attn.flash_attn_with_kvcache(q, k_cache.clone(), v_cache.clone(), k_new, v_new,
                                        cache_seqlens=used, causal=True)  # fmt: skip
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = attn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=used,
                                           causal=True)  # fmt: skip
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(got, want)


def _pool_of(address: int):
    # The memory pool id of the caching allocator's segment holding address ((0, 0): the
    # ordinary pool; a CUDA graph's private pool otherwise).
    for segment in torch.cuda.memory_snapshot():
        if segment["address"] <= address < segment["address"] + segment["total_size"]:
            return tuple(segment.get("segment_pool_id", (0, 0)))
    return None


@pytest.mark.skipif(not ON_GPU, reason="the GPU runs the split programs at once")
@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [0, 16, 64])
def test_one_launch_decode_at_size_is_repeatable(attn, ops, monkeypatch, num_splits):
    # The decode shapes, ragged, programs of every split running at once (in no fixed
    # order) and the last of each row tile combining: every call equals the two-launch path's
    # output bit for bit (a partial read before it was written, or read stale, would not), and
    # the counters are all back at zero after each.
    used = [4096, 1, 3000, 17, 2048, 4095, 0, 999]
    q = randn(8, 1, 32, 128, dtype=torch.bfloat16)
    k_cache, v_cache = (randn(8, 4096, 8, 128, dtype=torch.bfloat16) for _ in range(2))
    lengths = torch.tensor(used, dtype=torch.int32, device=DEVICE)

    def call():
        return attn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                            causal=True, num_splits=num_splits,
                                            return_softmax_lse=True)  # fmt: skip

    with monkeypatch.context() as patch:
        patch.setattr(ops, "_DECODE_FUSED", False)
        want, want_lse = call()
    for _ in range(20):
        out, lse = call()
        assert torch.equal(out, want) and torch.equal(lse, want_lse)
    torch.cuda.synchronize()
    counters = ops._current_decode_counters(q.device)
    assert counters is not None and not counters.any()
    assert _pool_of(counters.data_ptr()) == (0, 0)
    # Another stream counts in counters of its own.
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out, _ = call()
        mine = ops._current_decode_counters(q.device)
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(out, want)
    assert mine is not None and mine.data_ptr() != counters.data_ptr()


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
@pytest.mark.gpu
def test_decode_counters_made_during_capture(attn, ops):
    # The first call on a stream is a graph capture's: its counters are made then, their zeros
    # a memset of the graph; a call on that stream before the first replay must zero them
    # itself, and the replays leave them at zero.
    q = randn(2, 1, 32, 128, dtype=torch.bfloat16)
    k_cache, v_cache = (randn(2, 2048, 8, 128, dtype=torch.bfloat16) for _ in range(2))
    used = torch.tensor([2000, 333], dtype=torch.int32, device=DEVICE)

    def call():
        return attn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=used,
                                            causal=True, num_splits=8)  # fmt: skip

    want = call()  # compiles the kernels on the current stream, outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        # Streams come from a pool: forget any counters this one had (a graph of an earlier
        # test may still hold them, so they stay alive among the retired).
        earlier = ops._decode_counter_buffers.pop(ops._counters_key(q.device), None)
    if earlier is not None:
        ops._retired_counter_buffers.append(earlier)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        got = call()
    with torch.cuda.stream(stream):
        counters = ops._current_decode_counters(q.device)
        assert counters is not None
        counters.fill_(5)  # what the memory may hold before the graph's memset has run
        assert torch.equal(call(), want)
        for _ in range(3):
            graph.replay()
            assert torch.equal(got, want)
    torch.cuda.synchronize()
    assert not counters.any()


def _with_kvcache(attn, q, k_cache, v_cache, paged: bool, **options):
    """``flash_attn_with_kvcache`` over the cache as it is, or cut into shuffled pages of 8 rows."""
    if not paged:
        return attn.flash_attn_with_kvcache(q, k_cache, v_cache, **options)
    k_pages, table = _paged(k_cache, 8, torch.Generator().manual_seed(0))
    v_pages, _ = _paged(v_cache, 8, torch.Generator().manual_seed(0))
    return attn.flash_attn_with_kvcache(q, k_pages, v_pages, block_table=table, **options)


# A left-padded cache (flash-attn's cache_leftpad): (leftpad, cache_seqlens) a sequence. The
# padding rows hold NaN: read, or attended to, they would show. Sequence 2 starts past its
# filled length and so sees no key (output 0, lse +inf); sequence 0 starts inside a block.
LEFTPAD = [3, 16, 9, 0]
USED = [21, 30, 9, 14]


@pytest.mark.parametrize(
    "seqlen_q,paged,num_splits,window,tma",
    [
        (1, False, 3, (-1, -1), False),
        (1, True, 1, (-1, -1), False),
        (4, False, 2, (6, 0), False),
        (20, False, 0, (-1, -1), False),  # more than 16 queries: the forward kernel
        (20, False, 0, (10, 0), True),  # its tensor-descriptor loads
    ],
    ids=["decode-split", "decode-paged", "window", "forward", "forward-tma"],
)
def test_cache_leftpad(attn, ops, monkeypatch, seqlen_q, paged, num_splits, window, tma):
    monkeypatch.setattr(ops, "_FORWARD_TMA", tma)
    batch, capacity, heads, kv_heads, dim = len(USED), 32, 4, 2, 64
    q = randn(batch, seqlen_q, heads, dim, dtype=torch.bfloat16)
    k_cache = randn(batch, capacity, kv_heads, dim, dtype=torch.bfloat16)
    v_cache = randn(batch, capacity, kv_heads, dim, dtype=torch.bfloat16)
    for b, start in enumerate(LEFTPAD):
        k_cache[b, :start] = float("nan")
        v_cache[b, :start] = float("nan")
    leftpad = torch.tensor(LEFTPAD, dtype=torch.int32, device=DEVICE)
    used = torch.tensor(USED, dtype=torch.int32, device=DEVICE)
    options = {"causal": True, "window_size": window, "num_splits": num_splits,
               "cache_seqlens": used, "cache_leftpad": leftpad,
               "return_softmax_lse": True}  # fmt: skip
    out, lse = _with_kvcache(attn, q, k_cache, v_cache, paged, **options)
    for b, (start, end) in enumerate(zip(LEFTPAD, USED, strict=True)):
        # The queries are the newest rows, end - seqlen_q .. end - 1, of an unpadded cache.
        if start >= end:
            assert torch.equal(out[b].float().cpu(), torch.zeros(seqlen_q, heads, dim))
            assert torch.isinf(lse[b]).all() and (lse[b] > 0).all()
            continue
        want, want_lse = reference(q[b : b + 1].cpu(), k_cache[b : b + 1, start:end].cpu(),
                                   v_cache[b : b + 1, start:end].cpu(), causal=True,
                                   window=window)  # fmt: skip
        finite = torch.isfinite(want_lse[0])
        assert_close(out[b : b + 1][:, finite.any(0)], want[:, finite.any(0)], torch.bfloat16,
                     "out")  # fmt: skip
        assert torch.equal(torch.isfinite(lse[b].cpu()), finite)
        assert_close(lse[b].cpu()[finite], want_lse[0][finite], torch.float32, "lse", floor=1.0)


def test_cache_leftpad_errors(attn):
    q = randn(2, 1, 4, 64)
    cache = randn(2, 16, 2, 64)
    with pytest.raises(ValueError, match=r"cache_leftpad must be a \(batch=2,\) int32 tensor"):
        attn.flash_attn_with_kvcache(
            q, cache, cache, cache_leftpad=torch.zeros(3, dtype=torch.int32)
        )
    with pytest.raises(ValueError, match="cache_leftpad must be"):
        attn.flash_attn_with_kvcache(q, cache, cache, cache_leftpad=torch.zeros(2))


def _masked_reference(q, k, v, keep, end, **options):
    """``(out, lse)`` of one sequence (batch 1) whose keys are the rows ``j < end`` with
    ``keep[j]``, query ``i`` standing at row ``end - seqlen_q + i`` (causal: it sees the kept
    rows up to its own)."""
    seqlen_q = q.shape[1]
    outs, lses = [], []
    for i in range(seqlen_q):
        rows = [j for j in range(end) if keep[j] and j <= end - seqlen_q + i]
        index = torch.tensor(rows, dtype=torch.long)
        out, lse = reference(q[:, i : i + 1], k[:, index], v[:, index], **options)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs, 1), torch.cat(lses, 2)


@pytest.mark.parametrize(
    "seqlen_q,paged,num_splits,sink,tma",
    [
        (1, False, 3, False, False),
        (1, True, 1, True, False),
        (3, False, 2, False, False),
        (20, False, 0, True, False),
        (20, False, 0, False, True),
    ],
    ids=["decode-split", "decode-paged-sinks", "three-queries", "forward-sinks", "forward-tma"],
)
def test_key_padding_mask(attn, ops, monkeypatch, seqlen_q, paged, num_splits, sink, tma):
    monkeypatch.setattr(ops, "_FORWARD_TMA", tma)
    # Left padding, holes (a right-padded prompt continued) and a sequence with no key kept
    # before its last; the rows left out hold NaN.
    batch, capacity, heads, kv_heads, dim = 4, 32, 4, 2, 64
    used = [30, 21, 32, 25]
    keep = torch.ones(batch, capacity, dtype=torch.bool)
    keep[0, :5] = False
    keep[1, 7:12] = False
    keep[2, 3:31] = False
    keep[3, ::3] = False
    q = randn(batch, seqlen_q, heads, dim, dtype=torch.bfloat16)
    k_cache = randn(batch, capacity, kv_heads, dim, dtype=torch.bfloat16)
    v_cache = randn(batch, capacity, kv_heads, dim, dtype=torch.bfloat16)
    k_cache[~keep.to(DEVICE)] = float("nan")
    v_cache[~keep.to(DEVICE)] = float("nan")
    s_aux = randn(heads) if sink else None
    options = {"causal": True, "num_splits": num_splits, "softcap": 20.0, "s_aux": s_aux,
               "cache_seqlens": torch.tensor(used, dtype=torch.int32, device=DEVICE),
               "key_padding_mask": keep.to(DEVICE).int(), "return_softmax_lse": True}  # fmt: skip
    out, lse = _with_kvcache(attn, q, k_cache, v_cache, paged, **options)
    for b, end in enumerate(used):
        want, want_lse = _masked_reference(
            q[b : b + 1].cpu(), k_cache[b : b + 1].cpu(), v_cache[b : b + 1].cpu(), keep[b], end,
            causal=False, softcap=20.0, sink=s_aux.cpu() if sink else None,
        )  # fmt: skip
        assert_close(out[b : b + 1], want, torch.bfloat16, "out")
        assert_close(lse[b].cpu(), want_lse[0], torch.float32, "lse", floor=1.0)


def test_key_padding_mask_errors(attn):
    q = randn(2, 1, 4, 64)
    cache = randn(2, 16, 2, 64)
    for bad in (torch.ones(2, 15, dtype=torch.bool), torch.ones(2, 16)):
        with pytest.raises(
            ValueError, match=r"key_padding_mask must be a \(batch=2, capacity=16\)"
        ):
            attn.flash_attn_with_kvcache(q, cache, cache, key_padding_mask=bad)
