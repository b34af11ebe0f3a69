"""Each pattern, in each way models write it, found in the graph Dynamo hands the backend and
replaced by the library's kernel (eager downstream: the graph then runs our kernels as it is),
with the output and gradients checked against the same module in float64."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kernels.compile import kernels_backend
from tests.support.compile import (
    LlamaRMSNorm,
    assert_close,
    check_against_float64,
    on_device,
    randn,
)


class Apply(nn.Module):
    """A module whose forward is ``fn(x)`` (or ``fn(self, x)`` with ``uses_self``), with the
    given submodules."""

    def __init__(self, fn, uses_self=False, **modules):
        super().__init__()
        self.fn, self.uses_self = fn, uses_self
        for name, module in modules.items():
            setattr(self, name, module)

    def forward(self, *xs):
        return self.fn(self, *xs) if self.uses_self else self.fn(*xs)


def compile_and_check(registry, model, *inputs, downstream="eager", dtype=torch.float32):
    backend = kernels_backend(registry, downstream=downstream)
    compiled = torch.compile(model, backend=backend)
    check_against_float64(model, compiled, *inputs, dtype=dtype, what=type(model).__name__)
    return backend


# ---- single element-wise ops -----------------------------------------------------------------

ACTIVATION_FORMS = {
    "silu": [
        ("F.silu", lambda x: F.silu(x), {}),
        ("F.silu", lambda m, x: m.act(x), {"act": nn.SiLU()}),
    ],
    "gelu": [
        ("F.gelu", lambda x: F.gelu(x), {}),
        ("F.gelu", lambda m, x: m.act(x), {"act": nn.GELU()}),
    ],
    "gelu_tanh": [
        ("F.gelu", lambda x: F.gelu(x, approximate="tanh"), {}),
        ("F.gelu", lambda m, x: m.act(x), {"act": nn.GELU(approximate="tanh")}),
    ],
}


@pytest.mark.parametrize(
    "pattern,form,fn,modules",
    [(p, *form) for p, forms in ACTIVATION_FORMS.items() for form in forms],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_activation_replaced_under_eager_downstream(library, pattern, form, fn, modules):
    model = Apply(fn, uses_self=bool(modules), **modules)
    backend = compile_and_check(library, model, randn(3, 40) * 3)
    assert backend.count(pattern) == 1, backend.report()
    assert backend.reports[0].replaced[0].form == form


def test_gelu_variants_go_to_their_own_kernels(library):
    model = Apply(
        lambda x: F.gelu(x) + F.gelu(x, approximate="tanh") + F.gelu(x, approximate="none")
    )
    backend = compile_and_check(library, model, randn(2, 33))
    assert (backend.count("gelu"), backend.count("gelu_tanh")) == (2, 1)


# ---- gated activations -----------------------------------------------------------------------

GATED_FORMS = [
    ("silu_mul", lambda g, u: F.silu(g) * u),
    ("silu_mul", lambda g, u: u * F.silu(g)),
    ("silu_mul", lambda g, u: torch.mul(F.silu(g), u)),
    ("silu_mul", lambda g, u: F.silu(g).mul(u)),
    ("gelu_mul", lambda g, u: F.gelu(g) * u),
    ("gelu_tanh_mul", lambda g, u: u * F.gelu(g, approximate="tanh")),
]


@pytest.mark.parametrize("pattern,fn", GATED_FORMS)
def test_gated_activation_replaced(library, pattern, fn):
    backend = compile_and_check(library, Apply(fn), randn(2, 3, 24, seed=1), randn(2, 3, 24))
    assert backend.count(pattern) == 1, backend.report()
    # The activation went into the gated kernel, not into a lone activation's.
    assert backend.count() == 1


def test_gated_activation_through_an_nn_silu_module(library):
    model = Apply(lambda m, g, u: m.act(g) * u, uses_self=True, act=nn.SiLU())
    backend = compile_and_check(library, model, randn(4, 16, seed=1), randn(4, 16))
    assert backend.count("silu_mul") == 1


def test_gated_activation_that_broadcasts_is_left_alone(library):
    model = Apply(lambda g, u: F.silu(g) * u)
    backend = compile_and_check(library, model, randn(4, 16, seed=1), randn(1, 16))
    assert backend.count("silu_mul") == 0
    (kept,) = [r for r in backend.reports[0].kept if r.pattern == "silu_mul"]
    assert "broadcast" in kept.reason
    assert backend.count("silu") == 1  # the lone SiLU still gets the element-wise kernel


def test_gated_activation_whose_act_is_used_twice_keeps_the_product(library):
    model = Apply(lambda g, u: (lambda a: a * u + a)(F.silu(g)))
    backend = compile_and_check(library, model, randn(4, 16, seed=1), randn(4, 16))
    assert backend.count("silu_mul") == 0
    assert "also used outside the product" in backend.report()


# ---- RMSNorm ---------------------------------------------------------------------------------


def _formula(eps=1e-6, weight=True, square="pow", root="rsqrt", keep_dtype_cast=True):
    """An RMSNorm formula with a choice of spellings."""

    def forward(m, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        sq = {"pow": h.pow(2), "mul": h * h, "square": torch.square(h), "op": h**2}[square]
        var = (
            torch.mean(sq, dim=[-1], keepdim=True)
            if square == "square"
            else sq.mean(-1, keepdim=True)
        )
        h = h * torch.rsqrt(var + eps) if root == "rsqrt" else h / torch.sqrt(eps + var)
        h = h.to(dtype) if keep_dtype_cast else h
        return m.weight * h if weight else h

    return forward


@pytest.mark.parametrize(
    "spelling",
    [
        dict(),
        dict(square="mul"),
        dict(square="square"),
        dict(square="op", root="sqrt"),
        dict(weight=False),
        dict(keep_dtype_cast=False),
    ],
    ids=str,
)
def test_rms_norm_formula_spellings_are_found(spelling):
    from kernels.compile import KernelRegistry

    # A user kernel (plain PyTorch, run on any device) takes the weightless form too, which the
    # library's kernel refuses; it records the eps the graph held.
    seen = []
    registry = KernelRegistry()

    @registry.register("rms_norm", device_types=("cpu", "cuda"))
    def reference_rms_norm(x, weight, eps):
        seen.append(eps)
        y = F.rms_norm(x, (x.shape[-1],), weight, eps)
        return y

    model = Apply(_formula(eps=1e-5, **spelling), uses_self=True)
    model.weight = nn.Parameter(torch.linspace(0.5, 1.5, 24))
    backend = compile_and_check(registry, model, randn(3, 24))
    assert backend.count("rms_norm") == 1, backend.report()
    assert seen and seen[0] == 1e-5


def test_transformers_llama_rms_norm_is_found_and_replaced(library):
    module = LlamaRMSNorm(24, eps=1e-5)
    with torch.no_grad():
        module.weight.uniform_(0.5, 1.5)
    backend = compile_and_check(library, module, randn(2, 5, 24))
    (record,) = backend.reports[0].replaced
    assert (record.pattern, record.form) == ("rms_norm", "transformers formula")
    assert record.kernel == "library norm.rms_norm"
    assert len(record.nodes) == 8  # to, pow, mean, add, rsqrt, mul, to, mul


def test_rms_norm_call_and_module(library):
    norm = nn.RMSNorm(24, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    model = Apply(
        lambda m, x: m.norm(x) + F.rms_norm(x, (24,), m.norm.weight, 1e-5),
        uses_self=True,
        norm=norm,
    )
    backend = compile_and_check(library, model, randn(3, 24))
    assert backend.count("rms_norm") == 2
    assert {r.form for r in backend.reports[0].replaced} == {"torch.rms_norm"}


def test_rms_norm_without_eps_adds_float32s_epsilon(library):
    """``nn.RMSNorm(eps=None)`` adds the epsilon of the dtype torch computes in: float32's for
    float32, float16 and bfloat16 inputs. On inputs of 1e-3 that eps moves the result by 5%."""
    norm = on_device(nn.RMSNorm(24))
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    backend = kernels_backend(library, downstream="eager")
    x = randn(3, 24) * 1e-3
    out = torch.compile(norm, backend=backend)(x)
    eps = torch.finfo(torch.float32).eps
    reference = F.rms_norm(x.double(), (24,), norm.weight.double(), eps)
    assert_close(out, reference, torch.float32, "rms_norm, eps None")
    assert backend.count("rms_norm") == 1


def test_rms_norm_over_two_dimensions_is_left_alone(library):
    model = Apply(lambda x: F.rms_norm(x, (4, 6)))
    backend = compile_and_check(library, model, randn(3, 4, 6))
    assert backend.count() == 0
    assert "trailing dimensions (4, 6)" in backend.report()


def test_rms_norm_without_weight_is_left_to_torch_by_the_library(library):
    model = Apply(lambda x: F.rms_norm(x, (24,), None, 1e-6))
    backend = compile_and_check(library, model, randn(3, 24))
    assert backend.count() == 0
    assert "needs a weight" in backend.report()


def test_rms_norm_formula_whose_variance_is_used_elsewhere_is_left_alone(library):
    def forward(m, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return m.weight * (x * torch.rsqrt(var + 1e-6)) + var

    model = Apply(forward, uses_self=True)
    model.weight = nn.Parameter(torch.ones(16))
    backend = compile_and_check(library, model, randn(2, 16))
    assert backend.count() == 0
    assert "its intermediate value var is also used by" in backend.report()


def test_rms_norm_in_bf16_keeps_the_graphs_dtype(library):
    norm = LlamaRMSNorm(32).to(torch.bfloat16)
    backend = compile_and_check(
        library, norm, randn(4, 32, dtype=torch.bfloat16), dtype=torch.bfloat16
    )
    assert backend.count("rms_norm") == 1


def test_rms_norm_formula_with_a_float32_weight_over_bf16_promotes_as_llama_does(library):
    # weight (float32) * h.to(bfloat16) promotes to float32; the library's kernel follows
    # LlamaRMSNorm there (its result is float32 too), so the match is replaced.
    norm = on_device(LlamaRMSNorm(32))
    x = randn(4, 32, dtype=torch.bfloat16)
    backend = compile_and_check(library, norm, x, dtype=torch.bfloat16)
    assert backend.count("rms_norm") == 1
    assert torch.compile(norm, backend=backend)(x).dtype == torch.float32


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")
def test_torch_rms_norm_with_a_float32_weight_over_bf16_is_left_alone(library):
    # torch.rms_norm keeps the input's dtype whatever the weight's; the library's kernel (Llama
    # semantics) would promote: the ops stay, and the report says why.
    model = Apply(lambda m, x: F.rms_norm(x, (32,), m.weight, 1e-6), uses_self=True)
    model.weight = nn.Parameter(torch.linspace(0.5, 1.5, 32))
    backend = compile_and_check(
        library, model, randn(4, 32, dtype=torch.bfloat16), dtype=torch.bfloat16
    )
    assert backend.count() == 0
    assert "would return float32 [4, 32] where the graph has bfloat16 [4, 32]" in backend.report()


# ---- LayerNorm -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "form,fn,modules",
    [
        ("F.layer_norm", lambda m, x: m.norm(x), {"norm": nn.LayerNorm(24)}),
        ("F.layer_norm", lambda m, x: m.norm(x), {"norm": nn.LayerNorm(24, bias=False)}),
        ("F.layer_norm", lambda m, x: F.layer_norm(x, [24], eps=1e-5), {}),
        ("torch.layer_norm", lambda m, x: torch.layer_norm(x, (24,), None, None, 1e-3), {}),
        ("F.layer_norm", lambda m, x: m.norm(x), {"norm": nn.LayerNorm((3, 24))}),
    ],
    ids=["module", "no-bias", "functional", "torch", "two-dims"],
)
def test_layer_norm_replaced(library, form, fn, modules):
    model = Apply(fn, uses_self=True, **modules)
    for module in modules.values():
        with torch.no_grad():
            module.weight.uniform_(0.5, 1.5)
    backend = compile_and_check(library, model, randn(2, 3, 24) + 2.0)
    assert backend.count("layer_norm") == 1, backend.report()
    assert backend.reports[0].replaced[0].form == form


# ---- in-place ops ----------------------------------------------------------------------------


def test_inplace_relu_after_a_fresh_tensor_is_replaced():
    """ResNet's ``nn.ReLU(inplace=True)`` after a batch norm and after ``out += identity``:
    the kernel writes a new tensor, and what read the input afterwards reads it."""
    from kernels.compile import KernelRegistry
    from tests.support.compile import triton_relu

    registry = KernelRegistry()
    registry.register("relu", triton_relu)

    def forward(m, x):
        out = m.relu(m.lin(x))
        out = m.lin(out)
        out += x
        return m.relu(out), out  # out read after the second in-place ReLU

    model = on_device(
        Apply(forward, uses_self=True, relu=nn.ReLU(inplace=True), lin=nn.Linear(8, 8))
    )
    backend = kernels_backend(registry, downstream="eager")
    compiled = torch.compile(model, backend=backend)
    x = randn(4, 8)
    expected = model(x.clone())
    got = compiled(x.clone())
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e)
    assert backend.count("relu") == 2, backend.report()
    assert all(r.form == "F.relu (in place)" for r in backend.reports[0].replaced)


def test_inplace_relu_of_a_graph_input_is_left_alone():
    from kernels.compile import KernelRegistry
    from tests.support.compile import triton_relu

    registry = KernelRegistry()
    registry.register("relu", triton_relu)
    backend = kernels_backend(registry, downstream="eager")
    compiled = torch.compile(lambda x: F.relu(x, inplace=True) * 2, backend=backend)
    x = randn(4, 8)
    x_ref = x.clone()
    out = compiled(x)
    torch.testing.assert_close(out, F.relu(x_ref) * 2)
    torch.testing.assert_close(x, F.relu(x_ref))  # the caller still sees its tensor written
    assert backend.count() == 0
    assert "an input of the graph" in backend.report()


def test_inplace_relu_whose_view_is_read_later_is_left_alone():
    from kernels.compile import KernelRegistry
    from tests.support.compile import triton_relu

    registry = KernelRegistry()
    registry.register("relu", triton_relu)

    def fn(x):
        y = x * 2
        first_row = y[0]  # a view of y, read after y is written in place
        z = torch.relu_(y)
        return z + first_row

    backend = kernels_backend(registry, downstream="eager")
    x = randn(3, 5)
    torch.testing.assert_close(torch.compile(fn, backend=backend)(x), fn(x))
    assert backend.count() == 0
    assert "shares its memory and is read after it" in backend.report()


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_trains_through_its_op(library, affine):
    """Under aot_autograd (aot_eager) the graph calls the library's custom op and its
    registered backward, with and without weight and bias."""
    norm = nn.LayerNorm(24, elementwise_affine=affine)
    model = Apply(lambda m, x: m.norm(x) * 2, uses_self=True, norm=norm)
    backend = compile_and_check(library, model, randn(3, 24) + 1.0, downstream="aot_eager")
    assert backend.count("layer_norm") == 1
