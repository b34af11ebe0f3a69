"""`kernels.generation.projections`: an attention's q, k and v projections as one launch at
decode sizes (our activation library's ``grouped_linear_decode``), for the length of a block;
and `CudaGraphGenerator` with our kernels decoding through it. On the CPU through Triton's
interpreter, in bf16 (fp32 projections are left to ``F.linear``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kernels.generation.projections import grouped_projections
from tests.support.generation import check_generator_groups_q_k_v, counting_kernels

BF16 = torch.bfloat16
# The kernels run on a GPU, or on the CPU through the interpreter (set where there is no GPU).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class _Attention(nn.Module):
    """The projections of a grouped-query attention, called as transformers calls them."""

    def __init__(self, bias=False, dtype=BF16):
        super().__init__()
        torch.manual_seed(0)
        self.q_proj = nn.Linear(64, 64, bias=bias, dtype=dtype, device=DEVICE)
        self.k_proj = nn.Linear(64, 16, bias=bias, dtype=dtype, device=DEVICE)
        self.v_proj = nn.Linear(64, 16, bias=bias, dtype=dtype, device=DEVICE)

    def forward(self, x, order=("q_proj", "k_proj", "v_proj")):
        return {name: getattr(self, name)(x) for name in order}


def _plain(attention, x):
    return {n: F.linear(x, getattr(attention, n).weight, getattr(attention, n).bias) for n in
            ("q_proj", "k_proj", "v_proj")}  # fmt: skip


def _assert_one_rounding(got, x, linear):
    want = F.linear(x.double(), linear.weight.double(), _f64(linear.bias))
    bound = 2.0**-7 * want.abs() + 1e-5 * (want.abs().max() + 1)
    assert ((got.double() - want).abs() <= bound).all()


def _f64(t):
    return None if t is None else t.double()


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("rows", [(1, 1), (3, 1), (8,)], ids=str)
def test_one_launch_gives_the_three_projections(bias, rows):
    attention = _Attention(bias)
    kernels, calls = counting_kernels()
    x = torch.randn(*rows, 64, dtype=BF16, device=DEVICE)
    with torch.no_grad(), grouped_projections(attention, kernels) as grouped:
        out = attention(x)
    assert len(grouped) == 1 and calls == [x.shape]
    for name, y in out.items():
        _assert_one_rounding(y, x, getattr(attention, name))
    for name in ("q_proj", "k_proj", "v_proj"):  # the block leaves nothing behind
        assert "forward" not in vars(getattr(attention, name))


@pytest.mark.parametrize(
    "case", ["9 rows", "grad", "k first", "fp32", "another input", "hooked", "mixed bias"]
)
def test_other_calls_are_f_linear(case):
    attention = _Attention(dtype=torch.float32 if case == "fp32" else BF16)
    if case == "hooked":
        attention.k_proj.register_forward_hook(lambda *args: None)
    if case == "mixed bias":
        attention.v_proj = nn.Linear(64, 16, dtype=BF16, device=DEVICE)
    kernels, calls = counting_kernels()
    x = torch.randn(
        9 if case == "9 rows" else 2, 64, dtype=attention.q_proj.weight.dtype, device=DEVICE
    )
    order = ("k_proj", "q_proj", "v_proj") if case == "k first" else ("q_proj", "k_proj", "v_proj")
    with torch.set_grad_enabled(case == "grad"), grouped_projections(attention, kernels):
        if case == "grad":
            x.requires_grad_()
        if case == "another input":
            q = attention.q_proj(x)
            other = x.clone()
            out = {
                "q_proj": q,
                "k_proj": attention.k_proj(other),
                "v_proj": attention.v_proj(other),
            }
        else:
            out = attention(x, order)
    expected_calls = {"k first": 1, "another input": 1}.get(case, 0)
    assert len(calls) == expected_calls
    plain = _plain(attention, x)
    for name, y in out.items():
        if case == "k first" and name != "k_proj":  # q's call grouped: q and v from the kernel
            _assert_one_rounding(y, x, getattr(attention, name))
        elif case == "another input" and name == "q_proj":
            _assert_one_rounding(y, x, attention.q_proj)
        else:
            assert torch.equal(y, plain[name]), name


def test_global_hooks_leave_the_projections_alone():
    attention = _Attention()
    kernels, calls = counting_kernels()
    handle = nn.modules.module.register_module_forward_hook(lambda *args: None)
    try:
        with torch.no_grad(), grouped_projections(attention, kernels) as grouped:
            attention(torch.randn(1, 64, dtype=BF16, device=DEVICE))
    finally:
        handle.remove()
    assert not grouped and not calls


def test_the_generator_groups_q_k_v_with_our_kernels(untagged, monkeypatch):
    check_generator_groups_q_k_v(monkeypatch)


def test_a_weight_of_a_tensor_subclass_is_not_grouped():
    """A DTensor (tensor parallelism) or a quantized weight is a tensor subclass whose data the
    kernel cannot read as a plain tensor's: its attention is left to ``F.linear``."""

    class Sharded(torch.Tensor):
        pass

    attention = _Attention()
    weight = attention.k_proj.weight
    attention.k_proj._parameters["weight"] = torch.Tensor._make_subclass(Sharded, weight.data)
    kernels, calls = counting_kernels()
    with torch.no_grad(), grouped_projections(attention, kernels) as grouped:
        attention(torch.randn(1, 64, dtype=BF16, device=DEVICE))
    assert not grouped and not calls
