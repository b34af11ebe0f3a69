"""The fused lm_head + cross-entropy (library/loss) against float64 references: loss and the
gradients of the hidden states, the weight and the bias; the same kernels on logits; the
transformers semantics (label shift, num_items_in_batch); the layers and
``kernels.library.tag_causal_lm_losses`` on tiny transformers models; opcheck and
torch.compile; errors."""

import copy
import logging
import sys

import pytest
import torch
import torch.nn.functional as F

from kernels import Mode, kernelize, library_mapping, use_kernel_mapping
from kernels.layer.decorators import use_kernel_func_from_hub
from kernels.layer.swap import kernel_layer_of
from kernels.library import tag_causal_lm_losses, untag
from tests.support.library import (
    COMPILE_BACKEND,
    DEVICE,
    ON_GPU,
    assert_close,
    covering,
    grads,
    randn,
)
from tests.support.models import llama_config

IGNORE = -100


def _op_module(loss):
    return sys.modules[f"{loss.__name__}.fused_linear_cross_entropy"]


def _reference(h, w, b, y, *, reduction="mean", smoothing=0.0, softcap=None, items=None):
    """The loss in float64 PyTorch: F.cross_entropy of the (soft-capped) logits."""
    logits = F.linear(h, w, b)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    flat = logits.reshape(-1, logits.shape[-1])
    if items is None and reduction == "mean":
        count = (y != IGNORE).sum()
        if count == 0:  # PyTorch gives NaN; ours gives 0 (with zero gradients)
            return flat.sum() * 0.0
    rows = F.cross_entropy(
        flat, y.reshape(-1), ignore_index=IGNORE, reduction="none", label_smoothing=smoothing
    )
    if reduction == "none":
        return rows.reshape(y.shape)
    if reduction == "sum":
        return rows.sum()
    return rows.sum() / (items if items is not None else (y != IGNORE).sum())


def _hidden(lead, hidden, layout, dtype):
    if layout == "slice":  # rows of a wider tensor: a row stride, read in place
        h = randn(*lead, hidden + 8, dtype=dtype)[..., 4 : 4 + hidden]
    elif layout == "transpose":  # no view with unit column stride: copied
        h = randn(hidden, *lead, dtype=dtype).movedim(0, -1)
    else:
        h = randn(*lead, hidden, dtype=dtype)
    return h.requires_grad_()


def _labels(lead, vocab, ignored=0.0):
    y = torch.randint(0, vocab, lead, device=DEVICE)
    if ignored:
        y[torch.rand(lead, device=DEVICE) < ignored] = IGNORE
    return y


def _params(vocab, hidden, dtype, bias):
    # Logits of a few units: softmax neither flat nor one-hot.
    w = randn(vocab, hidden, dtype=dtype, scale=2.0 / hidden**0.5).requires_grad_()
    b = randn(vocab, dtype=dtype, scale=0.5).requires_grad_() if bias else None
    return w, b


# (lead shape of the tokens, hidden, vocab, chunk_size, layout). An odd vocabulary spans several
# blocks of the row kernels (256 columns on the CPU); chunks that do not divide the tokens;
# a chunk of 1-3 rows, whose rows are split between programs; non-contiguous hidden states.
SHAPES = {
    "odd-vocab": ((2, 7), 32, 1001, None, None),
    "chunks-19-by-4": ((19,), 16, 100, 4, None),
    "split-rows": ((5,), 16, 1001, 2, None),
    "sliced": ((3, 5), 24, 257, 7, "slice"),
    "transposed": ((6,), 40, 129, None, "transpose"),
    # The resident plan: as many tokens as the hidden size fill the weight gradient's buffer
    # (every tile of it computed through the temporary); more tokens than that continue in
    # chunks that accumulate into it.
    "resident-square": ((2, 12), 24, 515, None, None),
    "resident-then-chunks": ((45,), 16, 300, None, "slice"),
}
# (name, shape, options): every option on at least one shape and dtype loop.
CASES = [
    ("mean", "odd-vocab", {"bias": True}),
    ("ignored", "chunks-19-by-4", {"ignored": 0.4}),
    ("softcap-smoothing", "split-rows", {"softcap": 3.0, "smoothing": 0.1, "bias": True}),
    ("sum", "sliced", {"reduction": "sum", "ignored": 0.3}),
    ("none", "transposed", {"reduction": "none", "ignored": 0.3, "bias": True}),
    ("num-items", "chunks-19-by-4", {"items": 25, "ignored": 0.2, "softcap": 30.0}),
    ("none-softcap", "split-rows", {"reduction": "none", "softcap": 5.0, "smoothing": 0.2}),
    (
        "resident",
        "resident-square",
        {"bias": True, "softcap": 4.0, "smoothing": 0.1, "ignored": 0.3},
    ),
    ("resident-none", "resident-square", {"reduction": "none", "ignored": 0.2}),
    ("resident-then-chunks", "resident-then-chunks", {"ignored": 0.2, "items": 30, "bias": True}),
    # Two passes over tiles of the vocabulary (the last one narrower), whole chunks and not.
    ("two-pass", "odd-vocab", {"vocab_chunk": 300, "bias": True, "ignored": 0.3}),
    ("two-pass-chunks", "chunks-19-by-4", {"vocab_chunk": 32, "softcap": 4.0, "smoothing": 0.1}),
    ("two-pass-none", "sliced", {"vocab_chunk": 100, "reduction": "none", "items": None}),
]
GPU_CASES = [
    pytest.param("llama2", ((4096,), 4096, 32001, None, None), {}, marks=pytest.mark.gpu),
    pytest.param(  # the resident chunk, then one chunk of 2048 tokens over the whole vocabulary
        "llama3", ((2, 2048), 2048, 128256, None, None), {"ignored": 0.3}, marks=pytest.mark.gpu
    ),
    pytest.param(  # the resident chunk alone
        "gemma3",
        ((512,), 2048, 262144, None, "slice"),
        {"softcap": 30.0, "smoothing": 0.1},
        marks=pytest.mark.gpu,
    ),
    pytest.param(  # two passes (Liger's budget's plan): 8 chunks of 512 tokens, 23 tiles
        "gemma3-two-pass",
        ((2, 2048), 2048, 262144, 512, "slice"),
        {"softcap": 30.0, "ignored": 0.1, "vocab_chunk": 11776},
        marks=pytest.mark.gpu,
    ),
    pytest.param(
        "qwen3-none",
        ((1000,), 1024, 151936, 300, None),
        {"reduction": "none"},
        marks=pytest.mark.gpu,
    ),  # fmt: skip
]


def _check_against_reference(loss, shape, options, dtype, grad_scale=2.5):
    lead, hidden, vocab, chunk, layout = shape
    reduction = options.get("reduction", "mean")
    h = _hidden(lead, hidden, layout, dtype)
    w, b = _params(vocab, hidden, dtype, options.get("bias", False))
    y = _labels(lead, vocab, options.get("ignored", 0.0))
    kwargs = dict(
        reduction=reduction,
        label_smoothing=options.get("smoothing", 0.0),
        softcap=options.get("softcap"),
        num_items_in_batch=options.get("items"),
    )
    out = loss.fused_linear_cross_entropy(
        h, w, y, b, chunk_size=chunk, vocab_chunk=options.get("vocab_chunk"), **kwargs
    )
    assert out.dtype == torch.float32
    assert out.shape == (lead if reduction == "none" else ())
    leaves = [t for t in (h, w, b) if t is not None]
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    h64, w64, b64 = (*leaves64, None)[:3]
    ref = _reference(
        h64, w64, b64, y, reduction=reduction, smoothing=kwargs["label_smoothing"],
        softcap=kwargs["softcap"], items=kwargs["num_items_in_batch"],
    )  # fmt: skip
    assert_close(out, ref, dtype, "loss")
    seed = randn(*out.shape, scale=grad_scale) if reduction == "none" else None
    seed = torch.full((), grad_scale, device=DEVICE) if seed is None else seed
    got = grads(out, leaves, seed)
    want = grads(ref, leaves64, seed.double())
    for g, g64, what in zip(got, want, ("grad hidden", "grad weight", "grad bias"), strict=False):
        assert g.dtype == dtype, what
        assert_close(g, g64, dtype, what)


# Every case in fp32; in fp16 and bf16 too (tests.support.library.covering): hidden states read
# in place with a row stride and chunks that do not divide the tokens (sum), rows split between
# programs over an odd vocabulary with soft-capping and smoothing, the resident plan, and two
# passes over vocabulary tiles.
MATCHES = covering(
    CASES,
    every_dtype=[
        c for c in CASES if c[0] in {"sum", "softcap-smoothing", "resident", "two-pass-none"}
    ],
)


@pytest.mark.parametrize("name,shape,options,dtype", MATCHES)
def test_matches_float64_reference(loss, name, shape, options, dtype):
    torch.manual_seed(0)
    _check_against_reference(loss, SHAPES[shape], options, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16], ids=str)
@pytest.mark.parametrize("name,shape,options", GPU_CASES)
def test_model_sizes(loss, name, shape, options, dtype):
    torch.manual_seed(0)
    _check_against_reference(loss, shape, options, dtype)


def test_gradient_of_one_skips_the_scaling(loss, monkeypatch):
    """The backward's scaling kernel reads the loss's gradient on the device and leaves the
    gradients alone when it is 1; with another value it scales them (the reference test)."""
    torch.manual_seed(0)
    _check_against_reference(loss, SHAPES["odd-vocab"], {"bias": True}, torch.float32, 1.0)


@pytest.mark.parametrize("items", [None, 0], ids=["mean", "num_items=0"])
def test_every_label_ignored_gives_zero_loss_and_zero_grads(loss, items):
    h = _hidden((2, 5), 16, None, torch.float32)
    w, b = _params(101, 16, torch.float32, bias=True)
    y = torch.full((2, 5), IGNORE, device=DEVICE)
    out = loss.fused_linear_cross_entropy(h, w, y, b, num_items_in_batch=items, chunk_size=3)
    assert out.item() == 0.0
    for g in grads(out, (h, w, b), torch.ones((), device=DEVICE)):
        assert torch.count_nonzero(g) == 0
    assert loss.fused_linear_cross_entropy(h, w, y, reduction="sum").item() == 0.0


@pytest.mark.parametrize(
    "hidden,chunk_size",
    [(32, 5), (8, None)],
    ids=["chunks", "resident-then-chunks"],  # the fp32 buffer holds 16 tokens' bf16 logits
)
def test_fp32_weight_grad_accumulation(loss, hidden, chunk_size):
    torch.manual_seed(0)
    lead, vocab = (23,), 300
    h = _hidden(lead, hidden, None, torch.bfloat16)
    w, _ = _params(vocab, hidden, torch.bfloat16, bias=False)
    y = _labels(lead, vocab)
    out = loss.fused_linear_cross_entropy(h, w, y, chunk_size=chunk_size, fp32_weight_grad=True)
    gw = grads(out, w, torch.ones((), device=DEVICE))[0]
    assert gw.dtype == torch.bfloat16
    w64 = w.detach().double().requires_grad_()
    ref = _reference(h.detach().double(), w64, None, y)
    assert_close(gw, grads(ref, w64, torch.ones((), dtype=torch.float64, device=DEVICE))[0],
                 torch.bfloat16, "grad weight")  # fmt: skip


def test_no_grad_and_frozen_weight(loss):
    """Without a recorded backward the launcher alone runs; with a frozen weight only the
    hidden states' gradient is made."""
    torch.manual_seed(0)
    h = _hidden((9,), 16, None, torch.float32)
    w, _ = _params(211, 16, torch.float32, bias=False)
    w.requires_grad_(False)
    y = _labels((9,), 211, 0.2)
    with torch.no_grad():
        plain = loss.fused_linear_cross_entropy(h, w, y)
    assert plain.grad_fn is None
    out = loss.fused_linear_cross_entropy(h, w, y, chunk_size=4)
    torch.testing.assert_close(out, plain)
    (gh,) = grads(out, h, torch.ones((), device=DEVICE))
    h64 = h.detach().double().requires_grad_()
    ref = _reference(h64, w.double(), None, y)
    assert_close(gh, grads(ref, h64, torch.ones((), dtype=torch.float64, device=DEVICE))[0],
                 torch.float32, "grad hidden")  # fmt: skip


@pytest.mark.skipif(ON_GPU, reason="the CPU's autocast; CUDA autocast is the same code path")
def test_autocast_computes_in_the_autocast_dtype(loss):
    torch.manual_seed(0)
    h = _hidden((7,), 16, None, torch.float32)
    w, b = _params(150, 16, torch.float32, bias=True)
    y = _labels((7,), 150)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = loss.fused_linear_cross_entropy(h, w, y, b)
    gh, gw, gb = grads(out, (h, w, b), torch.ones((), device=DEVICE))
    assert (gh.dtype, gw.dtype, gb.dtype) == (torch.float32,) * 3
    leaves = [t.detach().to(torch.bfloat16).double().requires_grad_() for t in (h, w, b)]
    ref = _reference(*leaves, y)
    assert_close(out, ref, torch.bfloat16, "loss")
    for g, g64 in zip((gh, gw, gb), grads(ref, leaves, torch.ones((), dtype=torch.float64)),
                      strict=True):  # fmt: skip
        assert_close(g, g64, torch.bfloat16, "grad")


# benchmarks/loss.py's shapes: (hidden, vocab) for 4096 and 16384 tokens.
BENCHMARK_SHAPES = [(h, v) for h in (2048, 4096) for v in (32000, 128256, 151936, 262144)]


def _free(monkeypatch, ops, nbytes: int) -> None:
    """The plan's share of free device memory, as `_free_bytes` would measure it on a GPU."""
    monkeypatch.setattr(ops, "_free_bytes", lambda device: nbytes)


def test_chunk_rows_rule(loss, monkeypatch):
    """A one-pass chunk's logits take as many bytes as the weight's gradient: as many tokens as
    the hidden size in the weight's dtype, twice as many half-precision ones beside an fp32
    gradient buffer; never fewer than Liger's chunk; evened out."""
    ops = _op_module(loss)
    _free(monkeypatch, ops, 40 * 2**30)
    gpu = torch.device("cpu")  # the plan's arithmetic; the device only bounds free memory
    rows = loss.chunk_rows
    assert rows(4096, 4096, 128256, 2, gpu) == 4096
    assert rows(16384, 2048, 262144, 2, gpu) == 2048
    assert rows(16384, 2048, 32000, 2, gpu, weight_grad_element_size=4) == 4096
    assert rows(4096, 1024, 32000, 4, gpu) == 1024  # fp32 logits and gradient
    assert rows(100, 4096, 128256, 2, gpu) == 100  # fewer tokens than that
    assert rows(5000, 2048, 32000, 2, gpu) == 1667  # 3 chunks of 1667, not 2 of 2048 and 904
    # More tokens than vocabulary entries: Liger's chunk, next_power_of_2(ceil(tokens /
    # ceil(vocab / hidden))) = 65536 / 4 = 16384 tokens (logits the size of the hidden
    # states), is the larger.
    assert rows(65536, 2048, 8000, 2, gpu) == 16384
    # lean=True (the resident chunk's temporary) is Liger's chunk: 4096 / ceil(128256 / 4096).
    assert rows(4096, 4096, 128256, 2, gpu, lean=True) == 128
    assert rows(16384, 4096, 128256, 2, gpu, lean=True) == 512
    # Overrides, and no tokens.
    assert rows(19, 16, 100, 4, gpu, chunk_size=4) == 4
    assert rows(19, 16, 100, 4, gpu, chunk_size=100) == 19
    assert rows(0, 16, 100, 4, gpu) == 1


def test_chunk_rows_capped_by_free_memory(loss, monkeypatch):
    """Free memory caps the budget (a token's logits: 128256 x 2 bytes): between Liger's chunk
    and the weight's size the chunk shrinks with it; below Liger's chunk it is the lean plan's
    (CHUNK_WEIGHT_SHARE = 0) under the same cap, the plan before the weight's budget."""
    ops = _op_module(loss)
    gpu = torch.device("cpu")
    token = 128256 * 2
    _free(monkeypatch, ops, 1000 * token)
    assert loss.chunk_rows(4096, 4096, 128256, 2, gpu) == 820  # 5 chunks rather than 4 of 1000
    for free, want in ((100 * token, 100), (65 * token, 64), (3, 1)):  # Liger's: 128
        _free(monkeypatch, ops, free)
        got = loss.chunk_rows(4096, 4096, 128256, 2, gpu)
        monkeypatch.setattr(ops, "CHUNK_WEIGHT_SHARE", 0.0)
        assert got == loss.chunk_rows(4096, 4096, 128256, 2, gpu) == want
        monkeypatch.setattr(ops, "CHUNK_WEIGHT_SHARE", 1.0)
    # The CPU's budget (CPU_CHUNK_BYTES: 261 tokens here), for the interpreter's tiny shapes.
    assert ops.CPU_CHUNK_BYTES == 64 * 2**20
    monkeypatch.undo()
    cpu = torch.device("cpu")
    assert loss.chunk_rows(16384, 4096, 128256, 2, cpu) == 261  # 63 chunks of 261
    assert loss.chunk_rows(16, 4096, 128256, 2, cpu) == 16
    assert loss.chunk_rows(10, 8, 100, 4, cpu) == 5
    assert loss.chunk_rows(4100, 64, 1000, 4, cpu) == 456  # Liger's 512, evened (9 chunks)


def test_chunk_plan_is_one_pass_within_the_weight_budget(loss, monkeypatch):
    """With the weight's budget every shape of benchmarks/loss.py takes one pass in chunks of
    as many tokens as the hidden size: two passes would recompute a third more logits (the cost
    model: 1.15-1.17x) to save weight traffic that chunks this long no longer spend."""
    ops = _op_module(loss)
    _free(monkeypatch, ops, 40 * 2**30)
    gpu = torch.device("cpu")
    for tokens in (4096, 16384):
        for hidden, vocab in BENCHMARK_SHAPES:
            assert loss.chunk_plan(tokens, hidden, vocab, 2, gpu, fp32_rows=True) == (
                hidden,
                vocab,
            ), (tokens, hidden, vocab)
    # An fp32 gradient buffer doubles the budget.
    plan = loss.chunk_plan(16384, 2048, 128256, 2, gpu, fp32_rows=True, weight_grad_element_size=4)
    assert plan == (4096, 128256)


def test_chunk_plan_takes_two_passes_where_one_would_be_bound_by_memory(loss, monkeypatch):
    """Within Liger's budget (CHUNK_WEIGHT_SHARE = 0, or free memory that short), one pass over
    262144 columns takes 32 tokens a chunk and reads the weight 128 times; two passes take 512
    tokens over tiles of 11776 columns, within the same budget. Where one pass makes long
    chunks (16384 x 4096 -> 128256: 512 tokens) it stays."""
    ops = _op_module(loss)
    _free(monkeypatch, ops, 2**40)
    monkeypatch.setattr(ops, "CHUNK_WEIGHT_SHARE", 0.0)
    gpu = torch.device("cpu")
    plan = loss.chunk_plan
    assert plan(4096, 2048, 262144, 2, gpu, fp32_rows=True) == (512, 11776)
    assert plan(4096, 2048, 262144, 2, gpu, fp32_rows=False) == (4096, 1792)  # no accumulator
    assert plan(4096, 2048, 128256, 2, gpu, fp32_rows=True) == (1024, 11264)
    assert plan(16384, 4096, 128256, 2, gpu, fp32_rows=True) == (512, 128256)
    # Matmul work and weight traffic add up (H100, 16384 x 4096 -> 262144: one pass in chunks of
    # 256 tokens 258 ms, two passes 224 ms).
    assert plan(16384, 4096, 262144, 2, gpu, fp32_rows=True) == (2048, 23552)
    assert plan(16384, 2048, 151936, 2, gpu, fp32_rows=True) == (4096, 4864)
    assert plan(4096, 2048, 32000, 2, gpu, fp32_rows=True) == (256, 32000)
    for tokens, hidden, vocab in ((4096, 2048, 262144), (4096, 4096, 151936)):
        single = loss.chunk_rows(tokens, hidden, vocab, 2, gpu)
        rows, tile = plan(tokens, hidden, vocab, 2, gpu, fp32_rows=True)
        assert rows * (tile * 2 + hidden * 4) <= single * vocab * 2  # within Liger's budget
    assert plan(4096, 2048, 262144, 2, gpu, vocab_chunk=8192) == (1024, 8192)
    # The weight's budget, with free memory as short as Liger's budget: the same plan.
    monkeypatch.setattr(ops, "CHUNK_WEIGHT_SHARE", 1.0)
    _free(monkeypatch, ops, 32 * 262144 * 2)
    assert plan(4096, 2048, 262144, 2, gpu, fp32_rows=True) == (512, 11776)


def test_chunk_plan_overrides(loss, monkeypatch):
    """chunk_size alone is one pass; vocab_chunk alone picks the most tokens (up to 4096) whose
    tiles fit the one-pass chunk's budget; both are taken as given."""
    ops = _op_module(loss)
    _free(monkeypatch, ops, 40 * 2**30)
    gpu = torch.device("cpu")
    plan = loss.chunk_plan
    assert plan(4096, 2048, 262144, 2, gpu, chunk_size=64) == (64, 262144)
    assert plan(4096, 2048, 262144, 2, gpu, vocab_chunk=8192) == (4096, 8192)
    assert plan(40, 32, 1001, 4, gpu, chunk_size=7, vocab_chunk=300) == (7, 300)
    assert plan(40, 32, 1001, 4, gpu, vocab_chunk=5000) == (20, 1001)


@pytest.mark.parametrize(
    "share,chunks", [(1.0, [4, 3]), (0.0, [2, 2, 2, 1])], ids=["weight-budget", "lean"]
)
def test_chunks_as_planned_after_the_resident_chunk(loss, monkeypatch, share, chunks):
    """The loss runs the plan: after the resident chunk (4 tokens: the hidden size), chunks of
    the weight's budget (4 tokens), or with CHUNK_WEIGHT_SHARE = 0 Liger's (2 tokens); the
    resident chunk's temporary keeps to Liger's budget either way. Both match float64."""
    ops = _op_module(loss)
    monkeypatch.setattr(ops, "CHUNK_WEIGHT_SHARE", share)
    projected, budgets = [], []
    project, resident = ops._project, ops._resident_chunk

    def record_project(h, *args):
        projected.append(h.shape[0])
        return project(h, *args)

    def record_resident(*args):
        budgets.append(args[-1])
        return resident(*args)

    monkeypatch.setattr(ops, "_project", record_project)
    monkeypatch.setattr(ops, "_resident_chunk", record_resident)
    torch.manual_seed(0)
    _check_against_reference(loss, ((11,), 4, 40, None, None), {"bias": True}, torch.float32)
    assert projected == chunks
    assert budgets == [2 * 40 * 4]  # Liger's chunk of 11 tokens x 4 -> 40: 2 tokens


def test_resident_rows_rule(loss):
    """The weight gradient's buffer holds the logits of as many tokens as the hidden size (in
    the same dtype), twice that many in an fp32 buffer; never more tokens than there are."""
    assert loss.resident_rows(4096, 4096, 2, 2) == 4096
    assert loss.resident_rows(16384, 4096, 2, 2) == 4096
    assert loss.resident_rows(4096, 2048, 2, 4) == 4096
    assert loss.resident_rows(4096, 1024, 4, 4) == 1024
    assert loss.resident_rows(10, 4096, 2, 2) == 10


def test_resident_temporary_and_partial_sums_fit_the_budget(loss):
    """The resident chunk's temporary (its last entries' logits) and the partial sums of its
    kernels together stay within Liger's budget: a resident chunk alone peaks no higher than
    Liger's loss."""
    ops = _op_module(loss)
    cpu = torch.device("cpu")
    for n_rows, vocab, budget in ((4096, 262144, 64 * 262144 * 2), (2048, 151936, 64 * 151936 * 2),
                                  (24, 515, 2 * 515 * 4), (7, 300, 4 * 300 * 4)):  # fmt: skip
        rows = ops.resident_temp_rows(n_rows, vocab, 2, budget, cpu)
        parts = 2 * ops._col_config(n_rows, vocab, cpu)[4]
        assert rows * n_rows * 2 + (3 * parts + 1) * n_rows * 4 <= budget
        assert rows >= 1


# ---- the same kernels on logits ------------------------------------------------------------


# Every pair of dtype, reduction and row kernels (one a row, or statistics then gradient).
@pytest.mark.parametrize(
    "dtype,reduction,rows_per_sm",
    [
        pytest.param(torch.float32, "mean", 0, id="float32-mean-one-kernel"),
        pytest.param(torch.float32, "mean", 10**9, id="float32-mean-two-kernels"),
        pytest.param(torch.float32, "none", 0, id="float32-none-one-kernel"),
        pytest.param(torch.float32, "none", 10**9, id="float32-none-two-kernels"),
        pytest.param(torch.bfloat16, "mean", 0, id="bfloat16-mean-one-kernel"),
        pytest.param(torch.bfloat16, "none", 10**9, id="bfloat16-none-two-kernels"),
    ],
)
def test_cross_entropy_on_logits(loss, monkeypatch, dtype, reduction, rows_per_sm):
    monkeypatch.setattr(_op_module(loss), "FUSED_ROWS_PER_SM", rows_per_sm)
    torch.manual_seed(0)
    logits = randn(3, 4, 517, dtype=dtype, scale=3.0).requires_grad_()
    before = logits.detach().clone()
    y = _labels((3, 4), 517, 0.3)
    out = loss.cross_entropy(logits, y, reduction=reduction, label_smoothing=0.05)
    x64 = logits.detach().double().requires_grad_()
    ref = F.cross_entropy(
        x64.reshape(-1, 517), y.reshape(-1), ignore_index=IGNORE, reduction=reduction,
        label_smoothing=0.05,
    )  # fmt: skip
    ref = ref.reshape(y.shape) if reduction == "none" else ref
    assert_close(out, ref, dtype, "loss")
    seed = randn(*out.shape, scale=1.5) if out.dim() else torch.full((), 1.5, device=DEVICE)
    (g,) = grads(out, logits, seed)
    assert g.dtype == dtype
    assert_close(g, grads(ref, x64, seed.double())[0], dtype, "grad logits")
    assert torch.equal(logits.detach(), before)  # the gradient went to a tensor of its own


def test_causal_lm_loss_is_transformers_for_causal_lm_loss(loss):
    from transformers.loss.loss_utils import ForCausalLMLoss

    torch.manual_seed(0)
    h = _hidden((2, 9), 24, None, torch.float32)
    w, _ = _params(333, 24, torch.float32, bias=False)
    labels = _labels((2, 9), 333, 0.2)
    for kwargs in ({}, {"num_items_in_batch": torch.tensor(11)}, {"shift_labels": labels}):
        out = loss.causal_lm_loss(h, w, labels, chunk_size=5, **kwargs)
        h64, w64 = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
        ref = ForCausalLMLoss(F.linear(h64, w64), labels, 333, **kwargs)
        assert_close(out, ref, torch.float32, f"loss {list(kwargs)}")
        got = grads(out, (h, w), torch.ones((), device=DEVICE))
        want = grads(ref, (h64, w64), torch.ones((), dtype=torch.float64, device=DEVICE))
        for g, g64 in zip(got, want, strict=True):
            assert_close(g, g64, torch.float32, f"grad {list(kwargs)}")


def test_lm_head_and_loss_makes_logits_only_when_wanted(loss):
    torch.manual_seed(0)
    h = _hidden((2, 6), 16, None, torch.float32)
    w, b = _params(120, 16, torch.float32, bias=True)
    labels = _labels((2, 6), 120)
    expected = 4.0 * torch.tanh(F.linear(h, w, b) / 4.0)
    none, logits = loss.lm_head_and_loss(h, w, b, softcap=4.0)
    assert none is None and torch.equal(logits, expected)
    fused, none = loss.lm_head_and_loss(h, w, b, labels, softcap=4.0)
    assert none is None
    both, logits = loss.lm_head_and_loss(h, w, b, labels, softcap=4.0, return_logits=True)
    assert torch.equal(logits, expected)
    torch.testing.assert_close(fused, both)
    torch.testing.assert_close(fused, loss.causal_lm_cross_entropy(expected, labels))


# ---- the ForCausalLMLoss layer (transformers 5.x's name) -----------------------------------


def test_for_causal_lm_loss_layer(loss):
    """Bound to a function module standing for transformers' ForCausalLMLoss, as kernelize binds
    it: fused with hidden_states= and lm_head_weight= (logits None), through our kernels on
    logits otherwise; both equal transformers' function."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    torch.manual_seed(0)

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.loss_fn = use_kernel_func_from_hub("ForCausalLMLoss")(ForCausalLMLoss)

    head = Head().to(DEVICE)
    with use_kernel_mapping(library_mapping(devices=[DEVICE], layers=["ForCausalLMLoss"])):
        kernelize(head, mode=Mode.TRAINING, device=DEVICE)
    assert kernel_layer_of(head.loss_fn).__name__ == "ForCausalLMLoss"
    h = _hidden((2, 5), 16, None, torch.float32)
    w, _ = _params(99, 16, torch.float32, bias=False)
    labels = _labels((2, 5), 99, 0.2)
    items = torch.tensor(7)
    logits = F.linear(h, w)
    expected = ForCausalLMLoss(logits, labels, 99, num_items_in_batch=items)
    from_logits = head.loss_fn(logits, labels, 99, num_items_in_batch=items, output_attentions=1)
    fused = head.loss_fn(
        None, labels, 99, num_items_in_batch=items, hidden_states=h, lm_head_weight=w,
        hidden_size=16,
    )  # fmt: skip
    torch.testing.assert_close(from_logits, expected)
    torch.testing.assert_close(fused, expected)
    torch.testing.assert_close(
        grads(fused, (h, w), torch.ones((), device=DEVICE)),
        grads(expected, (h, w), torch.ones((), device=DEVICE)),
    )
    with pytest.raises(ValueError, match="no logits, and not both hidden_states"):
        head.loss_fn(None, labels, 99)


# ---- tagging transformers 4.57 models ------------------------------------------------------


@pytest.fixture
def restore_tags():
    yield
    untag()


def _tiny(family):
    import transformers

    torch.manual_seed(0)
    common = dict(
        hidden_size=32, intermediate_size=40, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=101,
    )  # fmt: skip
    if family == "gemma2":
        config = transformers.Gemma2Config(
            **common, head_dim=8, final_logit_softcapping=5.0, attn_implementation="eager"
        )
        return transformers.Gemma2ForCausalLM(config).to(DEVICE)
    if family == "mixtral":  # the router's load-balancing loss is added to the loss
        config = transformers.MixtralConfig(
            **common, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
            router_aux_loss_coef=0.5, output_router_logits=True, attn_implementation="sdpa",
        )  # fmt: skip
        return transformers.MixtralForCausalLM(config).to(DEVICE)
    config = llama_config(**common, attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(config).to(DEVICE)


def _step(model, tokens, labels, **kwargs):
    model.zero_grad(set_to_none=True)
    out = model(tokens, labels=labels, **kwargs)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("family", ["llama", "gemma2", "mixtral"])
def test_tagged_model_matches_the_untouched_one(loss, restore_tags, family):
    model = _tiny(family).train()
    reference = copy.deepcopy(model)
    tokens = torch.randint(0, 101, (2, 9), device=DEVICE)
    labels = tokens.clone()
    labels[0, :4] = IGNORE
    items = torch.tensor(13)  # gradient accumulation: the Trainer passes num_items_in_batch
    expected, expected_grads = _step(reference, tokens, labels, num_items_in_batch=items)

    layer = {
        "llama": "CausalLMFusedLoss",
        "gemma2": "GemmaCausalLMFusedLoss",
        "mixtral": "MoeCausalLMFusedLoss",
    }[family]
    assert tag_causal_lm_losses(model) == [type(model).__name__]
    assert type(model).kernel_layer_name == layer
    assert tag_causal_lm_losses(model) == []  # already tagged
    # Every kernel together in Llama; the loss layer alone in the others, whose norms' and
    # MLPs' kernels through the interpreter add time and prove nothing more about the loss.
    layers = None if family == "llama" else [layer]
    with use_kernel_mapping(library_mapping(devices=[DEVICE], layers=layers)):
        kernelize(model, mode=Mode.TRAINING, device=DEVICE)
    assert kernel_layer_of(model).__name__ == layer

    out, got_grads = _step(model, tokens, labels, num_items_in_batch=items)
    assert out.logits is None  # training with labels: no logits held, none returned
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-5, atol=1e-6)
    if family == "mixtral":
        assert expected.aux_loss is not None
        torch.testing.assert_close(out.aux_loss, expected.aux_loss)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    as_tuple = model(tokens, labels=labels, return_dict=False)
    torch.testing.assert_close(as_tuple[0], expected.loss, rtol=1e-5, atol=1e-6)

    # The logits when they are asked for: no labels, or evaluation.
    with torch.no_grad():
        plain = reference(tokens).logits
        torch.testing.assert_close(model(tokens).logits, plain)
        model.eval()
        evaluated = model(tokens, labels=labels)
        torch.testing.assert_close(evaluated.logits, reference.eval()(tokens).logits)
        torch.testing.assert_close(evaluated.loss, reference(tokens, labels=labels).loss)


def test_tagged_model_compiles_fullgraph(loss, restore_tags):
    model = _tiny("llama").train()
    reference = copy.deepcopy(model)
    tokens = torch.randint(0, 101, (1, 6), device=DEVICE)
    tag_causal_lm_losses(model)
    with use_kernel_mapping(library_mapping(devices=[DEVICE], layers=["CausalLMFusedLoss"])):
        kernelize(model, mode=Mode.TRAINING | Mode.TORCH_COMPILE, device=DEVICE)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    out, got = _step(compiled, tokens, tokens)
    expected, want = _step(reference, tokens, tokens)
    assert out.logits is None
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-5, atol=1e-6)
    for name, grad in want.items():
        torch.testing.assert_close(got[f"_orig_mod.{name}"], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_tagging_reads_the_forward(restore_tags, caplog):
    """Only forwards that are word for word transformers' are tagged; a subclass of a tagged
    class that defines its own forward keeps it (the tag's condition)."""
    from transformers import GraniteMoeConfig, GraniteMoeForCausalLM

    config = GraniteMoeConfig(
        hidden_size=16, intermediate_size=20, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=50, num_local_experts=2,
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="kernels.library"):
        # scales its logits, and adds a router loss of its own
        assert tag_causal_lm_losses(GraniteMoeForCausalLM(config)) == []
    assert "its loss is not fused" in caplog.text

    llama = _tiny("llama")

    class WithOwnForward(type(llama)):
        def forward(self, input_ids=None, labels=None, **kwargs):
            return super().forward(input_ids, labels=labels, **kwargs)

    custom = WithOwnForward(llama.config).to(DEVICE)
    assert tag_causal_lm_losses(llama) == ["LlamaForCausalLM"]
    assert tag_causal_lm_losses(custom) == []  # inherits the tag, not tagged itself
    with use_kernel_mapping(library_mapping(devices=[DEVICE])):
        kernelize(custom, mode=Mode.TRAINING, device=DEVICE)
    assert kernel_layer_of(custom) is None
    untag()
    assert "kernel_layer_name" not in vars(type(llama))


def test_fused_path_only_where_the_loss_is_transformers(loss, restore_tags):
    """A loss_function of the user's own, or an lm_head with a hook, keeps the model's own
    forward (logits returned, the user's loss used)."""
    model = _tiny("llama").train()
    tag_causal_lm_losses(model)
    with use_kernel_mapping(library_mapping(devices=[DEVICE])):
        kernelize(model, mode=Mode.TRAINING, device=DEVICE)
    tokens = torch.randint(0, 101, (1, 5), device=DEVICE)
    model.loss_function = lambda logits, labels, vocab_size, **kwargs: logits.sum() * 0
    out = model(tokens, labels=tokens)
    assert out.logits is not None and out.loss.item() == 0
    del model._loss_function
    handle = model.lm_head.register_forward_hook(lambda *args: None)
    assert model(tokens, labels=tokens).logits is not None
    handle.remove()
    assert model(tokens, labels=tokens).logits is None


@pytest.fixture
def restore_registry():
    from kernels.mapping import registry

    saved = registry._global_mapping
    yield
    untag()
    registry._global_mapping = saved


def test_register_library_kernels_fuses_the_loss_on_kernelize(loss, restore_registry):
    """transformers 4.57's ``model.use_kernels = True`` after `register_library_kernels()`:
    kernelize tags the forward for the fused loss (`tag_on_kernelize`), unless
    ``tag_on_kernelize(losses=False)`` asked to keep the logits."""
    from kernels.library import register_library_kernels, tag_on_kernelize

    model = _tiny("llama").train()
    reference = copy.deepcopy(model)
    tokens = torch.randint(0, 101, (2, 7), device=DEVICE)
    expected, expected_grads = _step(reference, tokens, tokens)
    register_library_kernels(devices=[DEVICE])
    model.use_kernels = True  # 4.57: kernelize(model, mode=TRAINING, device=model's)
    assert kernel_layer_of(model).__name__ == "CausalLMFusedLoss"
    out, got_grads = _step(model, tokens, tokens)
    assert out.logits is None
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-4, atol=1e-5)
    for name, grad in expected_grads.items():  # the norms and MLP run our kernels too
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)

    untag()
    register_library_kernels(devices=[DEVICE])
    tag_on_kernelize(losses=False)
    other = _tiny("llama").train()
    other.use_kernels = True
    assert kernel_layer_of(other) is None
    assert other(tokens, labels=tokens).logits is not None


# ---- ops and compile ------------------------------------------------------------------------


def _op_cases(loss):
    ops = _op_module(loss)
    h = randn(5, 16).requires_grad_()
    w = randn(37, 16, scale=0.3).requires_grad_()
    b = randn(37, scale=0.1).requires_grad_()
    y = torch.tensor([1, IGNORE, 36, 0, 5], device=DEVICE)
    logits = randn(5, 37, dtype=torch.bfloat16, scale=2.0).requires_grad_()
    items = torch.tensor(3.0, device=DEVICE)
    return {
        "fused_mean": (ops.fused_linear_cross_entropy_op,
                       (h, w, b, y, None, IGNORE, 0.1, 3.0, 0, 2, 0, False, True, True, True)),
        "fused_items_bf16": (
            ops.fused_linear_cross_entropy_op,
            (h.detach().bfloat16().requires_grad_(), w.detach().bfloat16().requires_grad_(),
             None, y, items, IGNORE, 0.0, 0.0, 0, 0, 0, False, True, True, False),
        ),
        "fused_none": (ops.fused_linear_cross_entropy_op,
                       (h, w, None, y, None, IGNORE, 0.0, 0.0, 2, 3, 0, False, False, False, False)),
        "fused_backward": (ops.fused_linear_cross_entropy_backward_op,
                           (randn(5), h.detach(), w.detach(), b.detach(), y, IGNORE, 0.0, 5.0,
                            2, 16, False, True, True, True)),
        # Two passes over tiles of the vocabulary, the second narrower, in one chunk of tokens
        # (fused_mean takes chunks).
        "fused_two_pass": (ops.fused_linear_cross_entropy_op,
                           (h, w, b, y, None, IGNORE, 0.0, 0.0, 0, 0, 20, False, True, True, True)),
        "cross_entropy": (ops.cross_entropy_op, (logits, y, None, IGNORE, 0.1, 0.0, 1, True)),
        "cross_entropy_backward": (ops.cross_entropy_backward_op,
                                   (randn(5), logits.detach(), y, IGNORE, 0.0, 0.0)),
    }  # fmt: skip


@pytest.mark.parametrize(
    "case",
    [
        "fused_mean",
        "fused_items_bf16",
        "fused_none",
        "fused_backward",
        "fused_two_pass",
        "cross_entropy",
        "cross_entropy_backward",
    ],
)
def test_opcheck(loss, case):
    op, args = _op_cases(loss)[case]
    torch.library.opcheck(op, args)


def test_every_op_is_checked(loss):
    checked = {op._qualname for op, _ in _op_cases(loss).values()}
    registered = {
        value._qualname
        for value in vars(_op_module(loss)).values()
        if isinstance(value, torch._library.custom_ops.CustomOpDef)
    }
    assert registered == checked, registered ^ checked


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_compile_fullgraph_matches_eager(loss, reduction):
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(24).to(DEVICE)
    w, _ = _params(301, 24, torch.float32, bias=False)

    def step(x, labels):
        if reduction == "mean":
            return loss.causal_lm_loss(norm(x), w, labels, softcap=10.0, chunk_size=4)
        return loss.fused_linear_cross_entropy(norm(x), w, labels, reduction="none").sum()

    x = randn(2, 7, 24).requires_grad_()
    labels = _labels((2, 7), 301, 0.2)
    torch._dynamo.reset()
    compiled = torch.compile(step, backend=COMPILE_BACKEND, fullgraph=True)
    out = compiled(x, labels)
    expected = step(x, labels)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    got = grads(out, (x, w, norm.weight), torch.ones((), device=DEVICE))
    want = grads(expected, (x, w, norm.weight), torch.ones((), device=DEVICE))
    for g, g_ref in zip(got, want, strict=True):
        torch.testing.assert_close(g, g_ref, rtol=1e-4, atol=1e-6)


# ---- errors -----------------------------------------------------------------------------------


def test_bad_input_gives_clear_errors(loss):
    h, w, y = randn(4, 8), randn(10, 8), torch.zeros(4, dtype=torch.long, device=DEVICE)
    fused = loss.fused_linear_cross_entropy
    with pytest.raises(ValueError, match="do not fit: the weight must be"):
        fused(h, randn(10, 9), y)
    with pytest.raises(ValueError, match="do not match hidden_states of shape"):
        fused(h, w, y[:3])
    with pytest.raises(TypeError, match="labels must be int64 or int32"):
        fused(h, w, y.float())
    with pytest.raises(TypeError, match="dtype torch.float64 is not supported"):
        fused(h.double(), w.double(), y)
    with pytest.raises(TypeError, match="weight dtype torch.bfloat16 differs"):
        fused(h, w.bfloat16(), y)
    with pytest.raises(ValueError, match="bias of shape"):
        fused(h, w, y, randn(11))
    with pytest.raises(ValueError, match="reduction must be 'mean', 'sum' or 'none'"):
        fused(h, w, y, reduction="avg")
    with pytest.raises(ValueError, match="num_items_in_batch replaces the mean's denominator"):
        fused(h, w, y, reduction="sum", num_items_in_batch=3)
    with pytest.raises(ValueError, match="label_smoothing must be in"):
        fused(h, w, y, label_smoothing=1.5)
    with pytest.raises(ValueError, match="softcap must be a positive number"):
        fused(h, w, y, softcap=0.0)
    with pytest.raises(ValueError, match="labels for 8 positions"):
        loss.causal_lm_loss(randn(2, 4, 8), w, torch.zeros(2, 3, dtype=torch.long))


def test_second_backward_is_a_clear_error(loss):
    h = randn(3, 8).requires_grad_()
    out = loss.fused_linear_cross_entropy(h, randn(10, 8), torch.tensor([1, 2, 3], device=DEVICE))
    out.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran twice through the same loss"):
        out.backward()


@pytest.mark.parametrize("rows_per_sm", [0, 10**9], ids=["one-kernel", "two-kernels"])
def test_label_out_of_range_gives_nan(loss, monkeypatch, rows_per_sm):
    monkeypatch.setattr(_op_module(loss), "FUSED_ROWS_PER_SM", rows_per_sm)
    h, w = randn(3, 8), randn(10, 8)
    out = loss.fused_linear_cross_entropy(
        h, w, torch.tensor([1, 10, 3], device=DEVICE), reduction="none"
    )
    assert torch.isnan(out[1]) and torch.isfinite(out[[0, 2]]).all()


# Chunks of whole rows take one kernel (a program a row) where they have enough rows, else the
# statistics and gradient kernels with rows split between programs: each case both ways.
@pytest.mark.parametrize("rows_per_sm", [0, 10**9], ids=["one-kernel", "two-kernels"])
@pytest.mark.parametrize(
    "name", ["ignored", "softcap-smoothing", "sum", "num-items", "resident-then-chunks"]
)
def test_row_kernels_one_or_two(loss, monkeypatch, name, rows_per_sm):
    ops = _op_module(loss)
    monkeypatch.setattr(ops, "FUSED_ROWS_PER_SM", rows_per_sm)
    launched = []
    for kernel in ("_row_loss_grad", "_loss_grad"):
        original = getattr(ops, kernel)
        monkeypatch.setattr(
            ops,
            kernel,
            lambda *a, _k=kernel, _f=original, **kw: launched.append(_k) or _f(*a, **kw),
        )
    _, shape, options = next(case for case in CASES if case[0] == name)
    torch.manual_seed(0)
    _check_against_reference(loss, SHAPES[shape], options, torch.float32)
    assert set(launched) == {"_loss_grad" if rows_per_sm else "_row_loss_grad"}


def test_work_buffers_only_for_chunks_that_split_rows(loss, monkeypatch):
    """The row kernels' partial sums are sized for the chunks that split their rows: none for
    chunks the one-kernel row path takes (their logits are the loss's only transient), and per
    chunk size, not for the worst case of one row split the most ways."""
    ops = _op_module(loss)
    device = torch.device(DEVICE)
    monkeypatch.setattr(ops, "FUSED_ROWS_PER_SM", 0)
    assert all(t.numel() == 0 for t in ops._work_buffers((512, 100), 1000, 1, device))
    monkeypatch.setattr(ops, "FUSED_ROWS_PER_SM", 10**9)
    splits = ops._row_config(64, 1000, device)[3]
    m_part, s_part, sum_part, zy = ops._work_buffers((64, 3), 1000, 2, device)
    assert m_part.numel() == s_part.numel() == sum_part.numel()
    assert m_part.numel() == max(64 * 2 * splits, 3 * 2 * ops._row_config(3, 1000, device)[3])
    assert zy.numel() == 64
