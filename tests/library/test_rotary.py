"""Rotary kernel (library/rotary) against transformers' apply_rotary_pos_emb in float64: both
layouts, broadcast cos/sin, odd head counts and head dims; gradients to q and k (and to cos and
sin when they require grad)."""

import importlib
import inspect

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as reference

from tests.support.library import COMPILE_BACKEND, ON_GPU, assert_close, covering, grads, randn

# (batch, seq, q_heads, kv_heads, head_dim)
SIZES = [
    (2, 5, 3, 1, 12),
    (1, 7, 4, 2, 80),
    (3, 1, 2, 2, 6),
    (0, 4, 2, 1, 8),
    # More heads than one block holds (32 of 128): the kernel loops over blocks of heads.
    (1, 3, 40, 5, 128),
    pytest.param(2, 512, 32, 8, 128, marks=pytest.mark.gpu),
    pytest.param(1, 4096, 32, 8, 128, marks=pytest.mark.gpu),
]
# How q and k are laid out: "bshd-view" is transformers' (the projection's (b, s, h, d) output
# transposed to (b, h, s, d)); "bhsd" contiguous (b, h, s, d); "bshd" with unsqueeze_dim=2.
LAYOUTS = ["bshd-view", "bhsd", "bshd"]
# Every size and layout in fp32 (tests.support.library.covering); fp16 and bf16 with every
# layout over odd head counts and head dim, and bf16 over the heads looped in blocks.
ROTARY = covering(
    SIZES,
    options={layout: layout for layout in LAYOUTS},
    every_dtype=[(2, 5, 3, 1, 12)],
    every_option=[(1, 7, 4, 2, 80), (3, 1, 2, 2, 6), (0, 4, 2, 1, 8), (1, 3, 40, 5, 128)],
    last_dtype_too=[(1, 3, 40, 5, 128)],
)


def _qk(batch, seq, heads, dim, layout, dtype):
    if layout == "bhsd":
        x = randn(batch, heads, seq, dim, dtype=dtype)
    else:
        x = randn(batch, seq, heads, dim, dtype=dtype)
        if layout == "bshd-view":
            x = x.transpose(1, 2)
    return x.requires_grad_()


def _cos_sin(batch, seq, dim, dtype):
    # Real rotary tables: cat(freqs, freqs), the same first and second halves.
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    pos = torch.arange(seq, dtype=torch.float32)[None, :].expand(batch, seq)
    freqs = pos[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1).to(randn(1).device)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _assert_matches_reference(qo, ko, q, k, cos, sin, unsqueeze_dim, what=""):
    """(qo, ko) = rotary(q, k, cos, sin) and the gradients of q and k match transformers'
    formula in float64, within the tolerance of q's dtype; the gradients keep q's and k's dtype."""
    dtype = q.dtype
    q64, k64 = (t.detach().double().requires_grad_() for t in (q, k))
    qo64, ko64 = reference(q64, k64, cos.double(), sin.double(), unsqueeze_dim=unsqueeze_dim)
    assert_close(qo, qo64, dtype, f"{what}q_embed")
    assert_close(ko, ko64, dtype, f"{what}k_embed")
    gq, gk = randn(*qo.shape, dtype=qo.dtype), randn(*ko.shape, dtype=ko.dtype)
    dq, dk = grads((qo, ko), (q, k), (gq, gk))
    dq64, dk64 = grads((qo64, ko64), (q64, k64), (gq.double(), gk.double()))
    assert dq.dtype == dtype and dk.dtype == k.dtype
    assert_close(dq, dq64, dtype, f"{what}grad q")
    assert_close(dk, dk64, dtype, f"{what}grad k")


@pytest.mark.parametrize("batch,seq,hq,hk,dim,dtype,layout", ROTARY)
def test_rotary(rotary, batch, seq, hq, hk, dim, dtype, layout):
    unsqueeze_dim = 2 if layout == "bshd" else 1
    q = _qk(batch, seq, hq, dim, layout, dtype)
    k = _qk(batch, seq, hk, dim, layout, dtype)
    cos, sin = _cos_sin(batch, seq, dim, dtype)
    qo, ko = rotary.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    assert qo.dtype == dtype and ko.dtype == dtype
    _assert_matches_reference(qo, ko, q, k, cos, sin, unsqueeze_dim)


def test_cos_sin_broadcast_over_batch_and_requiring_grad(rotary):
    # cos/sin of batch 1 broadcast over a batch of 3, random (not a rotary table), and
    # requiring grad: their gradients are computed too (in PyTorch, summed over heads/batch).
    q = randn(3, 4, 6, 10).requires_grad_()
    k = randn(3, 2, 6, 10).requires_grad_()
    cos = randn(1, 6, 10).requires_grad_()
    sin = randn(1, 6, 10).requires_grad_()
    out = rotary.apply_rotary_pos_emb(q, k, cos, sin)
    ins64 = [t.detach().double().requires_grad_() for t in (q, k, cos, sin)]
    out64 = reference(*ins64)
    for o, o64 in zip(out, out64, strict=False):
        assert_close(o, o64, torch.float32, "forward")
    seeds = [randn(*o.shape) for o in out]
    got = grads(out, (q, k, cos, sin), seeds)
    want = grads(out64, ins64, [s.double() for s in seeds])
    for g, g64, what in zip(got, want, ("q", "k", "cos", "sin"), strict=False):
        assert_close(g, g64, torch.float32, f"grad {what}")


def test_fp32_tables_with_bf16_q_promote_like_pytorch(rotary):
    q = randn(1, 2, 3, 8, dtype=torch.bfloat16)
    k = randn(1, 1, 3, 8, dtype=torch.bfloat16)
    cos, sin = _cos_sin(1, 3, 8, torch.float32)
    qo, ko = rotary.apply_rotary_pos_emb(q, k, cos, sin)
    qr, kr = reference(q, k, cos, sin)
    assert (qo.dtype, ko.dtype) == (qr.dtype, kr.dtype) == (torch.float32, torch.float32)
    assert_close(
        qo, reference(q.double(), k.double(), cos.double(), sin.double())[0], torch.float32
    )


def test_other_layouts_fall_back_to_pytorch(rotary):
    # 3-D q and k (no heads axis) is not what the kernel takes: the PyTorch formula runs.
    q, k = randn(2, 5, 8), randn(2, 5, 8)
    cos, sin = _cos_sin(2, 5, 8, torch.float32)
    qo, ko = rotary.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=0)
    qr, kr = reference(q, k, cos, sin, unsqueeze_dim=0)
    assert torch.equal(qo, qr) and torch.equal(ko, kr)


def test_cpu_tensors_without_the_interpreter_take_pytorch(rotary, monkeypatch):
    # A kernelized rotary function stands for a module global shared by every model of that
    # modelling module, some of which may run on the CPU: there it must not launch Triton.
    module = importlib.import_module(rotary.__name__ + ".rotary")
    monkeypatch.setattr(module, "_CPU_RUNS_KERNELS", False)
    monkeypatch.setattr(module, "_launch", lambda *a: pytest.fail("launched a kernel on the CPU"))
    q, k = randn(1, 2, 3, 8, device="cpu"), randn(1, 1, 3, 8, device="cpu")
    cos, sin = (t.cpu() for t in _cos_sin(1, 3, 8, torch.float32))
    qo, ko = rotary.apply_rotary_pos_emb(q, k, cos, sin)
    qr, kr = reference(q, k, cos, sin)
    assert torch.equal(qo, qr) and torch.equal(ko, kr)


def test_signature_is_transformers_5x(rotary):
    """transformers 5.x's signature (kernelize compares names and defaults). 4.57's had an
    unused position_ids before unsqueeze_dim; tag_rotary_embeddings bridges the two."""
    signature = inspect.signature(rotary.apply_rotary_pos_emb)
    assert str(signature) == "(q, k, cos, sin, unsqueeze_dim=1)"
    theirs = inspect.signature(reference).parameters
    assert [p for name, p in theirs.items() if name != "position_ids"] == list(
        signature.parameters.values()
    )


@pytest.mark.skipif(not ON_GPU, reason="cos/sin in fp32 with fp16 q: exercised on the GPU")
def test_half_q_fp32_tables_gpu(rotary):
    q = randn(2, 32, 256, 128, dtype=torch.float16)
    k = randn(2, 8, 256, 128, dtype=torch.float16)
    cos, sin = _cos_sin(2, 256, 128, torch.float32)
    qo, _ = rotary.apply_rotary_pos_emb(q, k, cos, sin)
    assert_close(
        qo, reference(q.double(), k.double(), cos.double(), sin.double())[0], torch.float32
    )


@pytest.mark.parametrize("layout", ["bshd-view", "bshd"])
def test_under_compile_matches_the_reference(rotary, layout):
    """Under torch.compile rotary hands inductor its formula (fp32, rounded once to the kernel's
    output dtypes) rather than the custom op: outputs, dtypes and gradients match float64, also
    with fp32 tables and bf16 q and k (which promote, as in PyTorch), with no graph break."""
    unsqueeze_dim = 2 if layout == "bshd" else 1
    torch._dynamo.reset()
    compiled = torch.compile(rotary.apply_rotary_pos_emb, backend=COMPILE_BACKEND, fullgraph=True)
    for dtype, table_dtype in ((torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)):
        q = _qk(2, 5, 3, 12, layout, dtype)
        k = _qk(2, 5, 1, 12, layout, dtype)
        cos, sin = _cos_sin(2, 5, 12, table_dtype)
        qo, ko = compiled(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
        out_dtype = torch.promote_types(dtype, table_dtype)
        assert qo.dtype == out_dtype and ko.dtype == out_dtype
        _assert_matches_reference(qo, ko, q, k, cos, sin, unsqueeze_dim, "compiled ")
