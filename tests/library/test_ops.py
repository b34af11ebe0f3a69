"""The ops behind the kernels: torch.library.opcheck for every custom op, one namespace per
loaded copy of a repository, and torch.compile(fullgraph=True) of a small model made of our
layers, checked against eager PyTorch (forward and gradients)."""

import inspect
import math
import shutil
import sys
import types

import pytest
import torch
import torch.nn.functional as F
import triton
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_rotary

from kernels.library import library_path
from tests.support.library import (
    COMPILE_BACKEND,
    FusedAddRMSNorm,
    SiluAndMul,
    assert_close,
    grads,
    randn,
)
from tests.support.models import llama_config


def _p(*shape, dtype=torch.float32, shift=0.0):
    return randn(*shape, dtype=dtype, shift=shift).requires_grad_()


def _sub(package, name):
    # The op modules by name (package attributes like norm.rms_norm are the public functions).
    return sys.modules[f"{package.__name__}.{name}"]


def _op_modules(activation, norm, rotary):
    return (
        _sub(activation, "elementwise"),
        _sub(activation, "gated"),
        _sub(norm, "rms_norm"),
        _sub(norm, "layer_norm"),
        _sub(rotary, "rotary"),
    )


def _op_cases(activation, norm, rotary):
    el, ga, rms, ln, rot = _op_modules(activation, norm, rotary)
    x = _p(3, 37)
    w = _p(37, shift=1.0)
    rstd = torch.rand(3, device=x.device) + 0.5
    mean = randn(3)
    q, k = _p(2, 3, 5, 8), _p(2, 1, 5, 8)
    cos, sin = randn(1, 5, 8), randn(1, 5, 8)
    return {
        "activation": (el.activation_op, (x, 0)),
        "activation_gelu_bf16": (el.activation_op, (_p(4, 9, dtype=torch.bfloat16), 1)),
        "activation_backward": (el.activation_backward_op, (randn(3, 37), x.detach(), 2)),
        "gated_activation": (ga.gated_op, (_p(2, 3, 74), 0)),
        "gated_activation_backward": (ga.gated_backward_op, (randn(3, 37), randn(3, 74), 1)),
        "gated_pair_activation": (ga.gated_pair_op, (_p(2, 3, 37), _p(2, 3, 37), 0)),
        # gate and up as the two halves of one fused projection output (row-strided views)
        "gated_pair_activation_halves": (
            ga.gated_pair_op,
            (*_p(5, 2, 2 * 19, dtype=torch.bfloat16).split(19, dim=-1), 2),
        ),
        "gated_pair_activation_backward": (
            ga.gated_pair_backward_op,
            (randn(3, 37), randn(3, 37), randn(3, 37), 1),
        ),
        # swiglu_mlp's compiled backward: the gradients and silu(gate) * up again; gate strided
        "gated_pair_activation_backward_output": (
            ga.gated_pair_backward_output_op,
            (randn(3, 37), randn(37, 3).t(), randn(3, 37), 0),
        ),
        "rms_norm": (rms.rms_norm_op, (x, w, 1e-6, 0)),
        "rms_norm_gemma": (rms.rms_norm_op, (_p(2, 2, 37), w, 1e-6, 1)),
        "rms_norm_backward": (
            rms.rms_norm_backward_op,
            (randn(3, 37), None, x.detach(), w.detach(), rstd, 0, True),
        ),
        "fused_add_rms_norm": (rms.fused_add_rms_norm_op, (x, _p(3, 37), w, 1e-6)),
        "rms_norm_backward_dsum": (
            rms.rms_norm_backward_op,
            (randn(3, 37), randn(3, 37), x.detach(), w.detach(), rstd, 0, False),
        ),
        "layer_norm": (ln.layer_norm_op, (x, [37], w, _p(37), 1e-5)),
        "layer_norm_no_affine": (ln.layer_norm_op, (x, [37], None, None, 1e-5)),
        "layer_norm_backward": (
            ln.layer_norm_backward_op,
            (randn(3, 37), x.detach(), [37], w.detach(), mean, rstd, True, True, torch.float32),
        ),
        "rotary": (rot.rotary_op, (q, k, cos, sin, 1)),
        "rotary_backward": (
            rot.rotary_backward_op,
            (randn(2, 3, 5, 8), randn(2, 1, 5, 8), cos, sin, 1, torch.float32, torch.float32),
        ),
    }


CASES = [
    "activation",
    "activation_gelu_bf16",
    "activation_backward",
    "gated_activation",
    "gated_activation_backward",
    "gated_pair_activation",
    "gated_pair_activation_halves",
    "gated_pair_activation_backward",
    "gated_pair_activation_backward_output",
    "rms_norm",
    "rms_norm_gemma",
    "rms_norm_backward",
    "rms_norm_backward_dsum",
    "fused_add_rms_norm",
    "layer_norm",
    "layer_norm_no_affine",
    "layer_norm_backward",
    "rotary",
    "rotary_backward",
]


@pytest.mark.parametrize("case", CASES)
def test_opcheck(activation, norm, rotary, case):
    op, args = _op_cases(activation, norm, rotary)[case]
    torch.library.opcheck(op, args)


def test_every_op_is_checked(activation, norm, rotary):
    checked = {op._qualname for op, _ in _op_cases(activation, norm, rotary).values()}
    registered = {
        value._qualname
        for module in _op_modules(activation, norm, rotary)
        for value in vars(module).values()
        if isinstance(value, torch._library.custom_ops.CustomOpDef)
    }
    assert registered == checked, registered ^ checked


def test_namespace_follows_the_module_name(activation, norm, rotary, tmp_path):
    # Each loaded copy registers under its own namespace, so a second version of a repository
    # (here: a copy of the same files in another folder) loads beside the first.
    import kernels

    el, ga, rms, ln, rot = _op_modules(activation, norm, rotary)
    for package, op in (
        (activation, el.activation_op),
        (norm, rms.rms_norm_op),
        (rotary, rot.rotary_op),
    ):
        assert package.__name__.replace(".", "_") in op._qualname.split("::")[0]
    copy = tmp_path / "norm"
    shutil.copytree(library_path() / "norm", copy)
    other = kernels.get_local_kernel(copy, "norm")
    assert other is not norm
    other_op = _sub(other, "rms_norm").rms_norm_op
    assert other_op._qualname != rms.rms_norm_op._qualname
    x, w = randn(2, 16), randn(16)
    assert torch.equal(other.rms_norm(x, w, 1e-6), norm.rms_norm(x, w, 1e-6))


class _Block(torch.nn.Module):
    """A small transformer-like block built from the modules our layers replace."""

    def __init__(self, hidden=64, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.norm1 = LlamaRMSNorm(hidden, eps=1e-6)
        self.qkv = torch.nn.Linear(hidden, (heads + 2 * kv_heads) * self.head_dim, bias=False)
        self.o = torch.nn.Linear(heads * self.head_dim, hidden, bias=False)
        self.norm2 = FusedAddRMSNorm(hidden, eps=1e-6)
        self.up = torch.nn.Linear(hidden, 2 * 96, bias=False)
        self.act = SiluAndMul()
        self.down = torch.nn.Linear(96, hidden, bias=False)
        self.norm3 = GemmaRMSNorm(hidden, eps=1e-6)
        self.ln = torch.nn.LayerNorm(hidden)
        self.rotary = hf_rotary
        with torch.no_grad():
            for m in (self.norm1, self.norm2, self.norm3, self.ln):
                m.weight.add_(torch.randn_like(m.weight) * 0.1)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        h = self.norm1(x)
        q, k, v = self.qkv(h).split(
            [
                self.heads * self.head_dim,
                self.kv_heads * self.head_dim,
                self.kv_heads * self.head_dim,
            ],
            dim=-1,
        )
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = self.rotary(q, k, cos, sin)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        att = (q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)).softmax(-1) @ v
        att = self.o(att.transpose(1, 2).reshape(b, s, -1))
        h, residual = self.norm2(att, x)
        h = self.down(self.act(self.up(h))) + residual
        return self.ln(self.norm3(h))


def _kernelized(block, activation, norm, rotary):
    fast = _Block()
    fast.load_state_dict(block.state_dict())
    fast.to(randn(1).device)
    fast.norm1.forward = types.MethodType(norm.layers.RMSNorm.forward, fast.norm1)
    fast.norm2.forward = types.MethodType(norm.layers.FusedAddRMSNorm.forward, fast.norm2)
    fast.norm3.forward = types.MethodType(norm.layers.GemmaRMSNorm.forward, fast.norm3)
    fast.ln.forward = types.MethodType(norm.layers.LayerNorm.forward, fast.ln)
    fast.act.forward = types.MethodType(activation.layers.SiluAndMul.forward, fast.act)
    # transformers 5.x's apply_rotary_pos_emb is a function module (a child of the block): drop
    # it before binding our plain function in its place.
    del fast.rotary
    fast.rotary = rotary.apply_rotary_pos_emb
    return fast


def _assert_matches_reference(y, y_ref, x, fast, reference):
    """The compiled output ``y`` of ``fast`` and its gradients (input and every parameter, in
    name order) match ``reference``'s fp32 PyTorch output ``y_ref``."""
    assert_close(y, y_ref.double(), torch.float32, "compiled forward")
    dy = randn(*y.shape)
    params = [p for _, p in sorted(fast.named_parameters())]
    ref_params = [p for _, p in sorted(reference.named_parameters())]
    got = grads(y, (x, *params), dy)
    want = grads(y_ref, (x, *ref_params), dy)
    for g, w in zip(got, want, strict=True):
        assert_close(g, w.double(), torch.float32, "compiled grad")


def test_compile_fullgraph_matches_eager(activation, norm, rotary):
    torch.manual_seed(0)
    device = randn(1).device
    block = _Block().to(device)
    fast = _kernelized(block, activation, norm, rotary)
    x = randn(2, 6, 64).requires_grad_()
    inv = 1.0 / (10000 ** (torch.arange(0, 16, 2, dtype=torch.float32, device=device) / 16))
    emb = torch.arange(6, dtype=torch.float32, device=device)[None, :, None] * inv
    emb = torch.cat((emb, emb), -1)
    cos, sin = emb.cos(), emb.sin()

    torch._dynamo.reset()
    # Our custom ops stay opaque nodes (fullgraph: no graph break allowed anywhere); on a GPU
    # inductor compiles the model's own ops around them.
    compiled = torch.compile(fast, backend=COMPILE_BACKEND, fullgraph=True)
    y = compiled(x, cos, sin)
    y_ref = block(x, cos, sin)
    _assert_matches_reference(y, y_ref, x, fast, block)
    # The eager kernelized model agrees too.
    y_eager = fast(x, cos, sin)
    assert_close(y_eager, y_ref.double(), torch.float32, "eager forward")


class _MLPStack(torch.nn.Module):
    """Two pre-norm residual Llama MLPs (odd intermediate size, with biases)."""

    def __init__(self, hidden=40):
        super().__init__()
        config = llama_config(hidden_size=hidden, intermediate_size=67, mlp_bias=True)
        self.norms = torch.nn.ModuleList(LlamaRMSNorm(hidden) for _ in range(2))
        self.mlps = torch.nn.ModuleList(LlamaMLP(config) for _ in range(2))

    def forward(self, x):
        for norm, mlp in zip(self.norms, self.mlps, strict=True):
            x = x + mlp(norm(x))
        return x


def test_compile_fullgraph_swiglu_mlp_matches_eager(activation, norm):
    """SwiGLUMLP bound to transformers' LlamaMLP (its act_fn kernelized too, in the first layer)
    compiles with fullgraph=True and matches eager PyTorch; under compile it hands inductor the
    fused formula (no custom op in the graph), as RMSNorm does. Training, the MLP is
    ``swiglu_mlp``'s autograd function, whose forward and backward Dynamo traces as subgraphs."""
    torch.manual_seed(0)
    device = randn(1).device
    model = _MLPStack().to(device)
    fast = _MLPStack().to(device)
    fast.load_state_dict(model.state_dict())
    for n, mlp in zip(fast.norms, fast.mlps, strict=True):
        n.forward = types.MethodType(norm.layers.RMSNorm.forward, n)
        mlp.forward = types.MethodType(activation.layers.SwiGLUMLP.forward, mlp)
    fast.mlps[0].act_fn.forward = types.MethodType(
        activation.layers.SiLU.forward, fast.mlps[0].act_fn
    )
    x = randn(2, 5, 40).requires_grad_()

    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    backend = CompileCounterWithBackend(COMPILE_BACKEND)  # keeping dynamo's graphs
    y = torch.compile(fast, backend=backend, fullgraph=True)(x)
    code = "\n".join(
        m.code for g in backend.graphs for m in g.modules() if isinstance(m, torch.fx.GraphModule)
    )
    # Our layers hand inductor their formulas under compile (it fuses them with what surrounds
    # them): the plain norm's rsqrt and the fused F.silu, no custom op.
    assert "kernels_lib_" not in code and "rsqrt" in code and "silu" in code, code
    _assert_matches_reference(y, model(x), x, fast, model)


@pytest.mark.parametrize("dtype", [torch.bfloat16], ids=str)
def test_compile_inference_mode(activation, norm, dtype):
    # Inference under torch.compile: no autograd, the forward ops alone.
    torch._dynamo.reset()
    module = LlamaRMSNorm(48).to(device=randn(1).device, dtype=dtype)
    module.forward = types.MethodType(norm.layers.RMSNorm.forward, module)
    act = SiluAndMul()
    act.forward = types.MethodType(activation.layers.SiluAndMul.forward, act)

    def f(x):
        return act(module(x))

    compiled = torch.compile(f, backend=COMPILE_BACKEND, fullgraph=True)
    x = randn(5, 48, dtype=dtype)
    with torch.inference_mode():
        y = compiled(x)
    x64 = x.double()
    h = module.weight.double() * x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert_close(y, F.silu(h[..., :24]) * h[..., 24:], dtype, "compiled inference")


def _launch_call(repo, activation, norm, rotary):
    """(the package's _library module, a call of one of its ops on fixed CUDA inputs)."""
    package = {"activation": activation, "norm": norm, "rotary": rotary}[repo]
    library = sys.modules[f"{package.__name__}._library"]
    x = torch.randn(37, 1000, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1000, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(2, 4, 9, 64, device="cuda", dtype=torch.bfloat16)
    cos, sin = torch.randn(2, 2, 9, 64, device="cuda", dtype=torch.bfloat16).unbind(1)

    def call():
        if repo == "activation":
            return (package.silu_and_mul(x),)
        if repo == "norm":
            return (package.rms_norm(x, w, 1e-6),)
        return package.apply_rotary_pos_emb(q, q[:, :2], cos, sin)

    return library, call


_needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="launches run through Triton's interpreter on the CPU"
)


@_needs_cuda
@pytest.mark.parametrize("repo", ["activation", "norm", "rotary"])
def test_repeated_launches_skip_tritons_runner(repo, activation, norm, rotary, monkeypatch):
    """After the first launch, each kernel is launched through its compiled launcher directly
    (Triton's runner, ``CompiledKernel.__getitem__``, is not called), with the results of an
    ordinary launch."""
    library, call = _launch_call(repo, activation, norm, rotary)
    first = call()  # an ordinary launch, which caches the compiled kernel
    entries = list(library._compiled.values())
    runner = inspect.getsource(type(entries[0][0]).__getitem__) if entries else ""
    assert entries and all(direct is not None for _, direct in entries), (
        f"Triton {triton.__version__}'s runner calls its launcher in a way launch() does not "
        f"know:\n{runner}"
    )

    def no_runner(self, grid):
        pytest.fail("a repeated launch went through Triton's runner")

    monkeypatch.setattr(type(entries[0][0]), "__getitem__", no_runner)
    again = call()
    torch.cuda.synchronize()
    for a, b in zip(first, again, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@_needs_cuda
def test_a_cpu_tensor_where_a_cuda_one_was_is_refused_after_direct_launches(norm):
    """Direct launches pass tensors as addresses, unchecked by Triton's launcher: a CPU tensor
    given to a kernel already launched with CUDA tensors must still get Triton's error, not a
    launch that reads host memory from the GPU."""
    library = sys.modules[f"{norm.__name__}._library"]
    reduction = sys.modules[f"{norm.__name__}._partials"]
    partials = torch.randn(33, 256, device="cuda")
    for _ in range(2):  # the second launch goes the direct way
        out = reduction.sum_partials(partials, torch.float32)
    torch.testing.assert_close(out, partials.sum(0))
    with pytest.raises(ValueError, match="cpu tensor"):
        library.launch(
            reduction._sum_partials_kernel,
            (4,),
            (partials, out.cpu(), 33, 256, 256, 64, 64),
            4,
            partials.device,
        )


@_needs_cuda
@pytest.mark.parametrize("repo", ["activation", "norm", "rotary"])
def test_launch_hooks_see_every_launch(repo, activation, norm, rotary):
    """A profiler's launch hooks (Triton's ``knobs.runtime``) are called for repeated launches
    too, with the launch metadata Triton's runner gives them."""
    from triton import knobs

    library, call = _launch_call(repo, activation, norm, rotary)
    call()
    call()  # cached now: the direct path, unless a hook is installed
    seen = []

    def hook(metadata):
        seen.append(metadata.get()["name"])

    knobs.runtime.launch_enter_hook.add(hook)
    try:
        call()
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    torch.cuda.synchronize()
    assert seen and all(name.startswith("_") and name.endswith("_kernel") for name in seen), seen
    count = len(seen)
    call()  # the hook is gone: nothing more is recorded
    assert len(seen) == count


@pytest.mark.parametrize("repo", ["activation", "norm", "rotary"])
def test_launch_cache_key_tells_specialisations_apart(repo, activation, norm, rotary):
    """The launch cache's key changes exactly where Triton compiles another kernel: tensor dtype
    and 16-byte alignment, integers equal to 1, divisible by 16 or past int32, constexpr values
    and num_warps; not for other integer values or tensor addresses."""
    package = {"activation": activation, "norm": norm, "rotary": rotary}[repo]
    library = sys.modules[f"{package.__name__}._library"]

    class Kernel:  # what _key reads of a JITFunction: its parameters
        params = [types.SimpleNamespace(is_constexpr=c) for c in (False, False, False, True)]

    kernel = Kernel()
    buf = torch.zeros(64, dtype=torch.float32)

    def key(t, n, flag, c, num_warps=4):
        return library._key(kernel, 0, num_warps, (t, n, flag, c))

    base = key(buf, 37, True, 128)
    assert key(buf[4:], 37, True, 128) == base  # 16 bytes on: still aligned
    assert key(buf[8:], 53, True, 128) == base  # another odd integer
    assert key(buf[1:], 37, True, 128) != base  # 4 bytes on: not 16-byte aligned
    assert key(buf.double(), 37, True, 128) != base
    assert key(buf, 1, True, 128) != base
    assert key(buf, 48, True, 128) != base
    assert key(buf, 2**31 + 1, True, 128) != base
    assert key(buf, 37, False, 128) != base
    assert key(buf, 37, True, 256) != base
    assert key(buf, 37, True, 128, num_warps=8) != base
    assert key(buf, 37.0, True, 128) != base  # a float where an int was
    # Stages, where a launch gives them (the attention kernels' tables do).
    assert key(buf, 37, True, 128, num_warps=(4, 3)) != base
    assert key(buf, 37, True, 128, num_warps=(4, 3)) != key(buf, 37, True, 128, num_warps=(4, 2))


def test_launch_key_tells_tensor_descriptors_apart_by_dtype_and_block(norm):
    """Triton compiles a kernel per tensor descriptor's dtype and block shape (its mangled type),
    not per base address or tensor shape."""
    descriptor = pytest.importorskip("triton.tools.tensor_descriptor").TensorDescriptor
    library = sys.modules[f"{norm.__name__}._library"]
    t = torch.zeros(2, 64, 4, 128, dtype=torch.bfloat16)
    spec = library._spec(descriptor.from_tensor(t, [1, 64, 1, 128]))
    assert library._spec(descriptor.from_tensor(t[1:], [1, 64, 1, 128])) == spec
    assert library._spec(descriptor.from_tensor(t.half(), [1, 64, 1, 128])) != spec
    assert library._spec(descriptor.from_tensor(t, [1, 32, 1, 128])) != spec


@pytest.mark.parametrize("repo", ["activation", "norm", "rotary"])
def test_launch_key_function_gives_each_arguments_spec_whatever_its_kind(
    repo, activation, norm, rotary
):
    """The key function is written out from a kernel's first launch, fast paths ordered by that
    call's kinds of argument; a later call with another kind at a position (a tensor where an
    integer was, an integer or None where a tensor was, a parameter, a bool, a float) still gets
    each argument's ``_spec``."""
    package = {"activation": activation, "norm": norm, "rotary": rotary}[repo]
    library = sys.modules[f"{package.__name__}._library"]
    constexprs = (False, False, False, True)

    class Kernel:
        params = [types.SimpleNamespace(is_constexpr=c) for c in constexprs]

    kernel = Kernel()
    t = torch.zeros(8)
    calls = [
        (t, 5, 2.0, 3),  # the first: tensor, int, float
        (5, t, 2.0, 3),
        (None, True, t, "constexpr"),
        (torch.nn.Parameter(t[1:]), 2**40, False, 3),
        (t.double(), -16, 7, None),
    ]
    for args in calls:
        expected = (
            kernel,
            1,
            4,
            *(arg if c else library._spec(arg) for arg, c in zip(args, constexprs, strict=True)),
        )
        assert library._key(kernel, 1, 4, args) == expected, args
        # What the compiled kernel's launcher gets: every tensor as its address, the rest as is.
        _, launched = library._key_and_args(kernel, 1, 4, args)
        assert launched == tuple(
            a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args
        ), args
    # A tensor's spec says whether it is on a CUDA device: the direct launch passes addresses,
    # which Triton's launcher does not check, so a CPU tensor must miss the cache (Triton's
    # ordinary launch then refuses it).
    assert library._spec(t[1:]) == (torch.float32, False, False)
    assert library._spec(-16) == (False, True, True)
    assert library._spec(True) == (bool, True)


def test_launch_hooks_count_as_installed_only_with_functions(norm):
    """Triton 3.4+ keeps each launch hook as an always-present ``HookChain``: an empty chain is
    no hook (repeated launches take the direct path), one with a function is."""
    from triton import knobs

    library = sys.modules[f"{norm.__name__}._library"]
    chain = type(knobs.runtime.launch_enter_hook)()
    assert not library._hook_installed(None)
    assert not library._hook_installed(chain)
    chain.add(print)
    assert library._hook_installed(chain)
    assert library._hook_installed(print)  # Tritons before 3.4 hold the function itself


def test_grid_arithmetic_matches_triton(norm):
    """The launchers' ``cdiv`` and ``next_power_of_2`` (plain ints, without the call cost of
    Triton's ``ConstexprFunction``s) give Triton's results, 0 included."""
    helpers = sys.modules[f"{norm.__name__}._library"]
    values = [*range(0, 70), 127, 128, 129, 1000, 4095, 4096, 4097, 14336, 65535, 65536, 2**31 + 5]
    for n in values:
        assert helpers.next_power_of_2(n) == triton.next_power_of_2(n), n
        for d in (1, 2, 3, 7, 64, 2048, 4096):
            assert helpers.cdiv(n, d) == triton.cdiv(n, d), (n, d)


def test_row_blocks_count_warps_from_the_elements_a_block_holds(norm):
    """Warps follow the elements a block holds, not its power-of-two padding (a row of 5120 in a
    block of 8192 runs 8 warps; 16 were slower on the H100); rows past MAX_ONE_PASS are chunked
    and their backward split into blocks of columns; rows up to NARROW_ROW take the narrow
    backward configuration, the others their norm's own."""
    helpers = sys.modules[f"{norm.__name__}._tuning"]
    assert [helpers.previous_power_of_2(n) for n in (0, 1, 2, 3, 10, 16, 17)] == [
        0,
        1,
        2,
        2,
        8,
        16,
        16,
    ]
    assert helpers.row_block(4096) == (True, 4096, 1, 8)
    assert helpers.row_block(8192) == (True, 8192, 1, 16)
    assert helpers.row_block(5120) == (True, 8192, 1, 8)
    assert helpers.row_block(1000) == (True, 1024, 4, 4)
    assert helpers.row_block(3) == (True, 4, 64, 1)
    wide = helpers.MAX_ONE_PASS + 1
    assert helpers.row_block(wide) == (False, helpers.CHUNK, 1, helpers.WIDE_ROW_WARPS)
    narrow = helpers.narrow_bwd_block(helpers.NARROW_ROW)
    assert narrow[1:] == (helpers.NARROW_ROW, helpers.NARROW_BWD_ELEMENTS // helpers.NARROW_ROW,
                          helpers.NARROW_BWD_WARPS, helpers.NARROW_BWD_PROGRAMS_PER_SM)  # fmt: skip
    assert helpers.narrow_bwd_block(helpers.NARROW_ROW + 1) is None
    assert helpers.wide_bwd_block(helpers.MAX_ONE_PASS) is None
    assert helpers.wide_bwd_block(wide)[:2] == (False, helpers.WIDE_BWD_COLUMNS)
    assert helpers.bwd_block(helpers.NARROW_ROW) == narrow
    assert helpers.bwd_block(wide) == helpers.wide_bwd_block(wide)
    assert helpers.bwd_block(4096) == (True, 4096, 2, 16, helpers.BWD_PROGRAMS_PER_SM)
    assert helpers.bwd_block(2048) == (True, 2048, 4, 8, helpers.BWD_PROGRAMS_PER_SM)
    assert helpers.bwd_block(8192)[:3] == (True, 8192, 1)


def test_forward_blocks_follow_each_norms_sweep(norm):
    """The forward's launch configuration, as each norm's sweep chose it (H200, 2026-11-24):
    rows up to 2048 share blocks of 2048 elements (4 warps); RMSNorm reads rows of two or more
    whole 8 KB chunks (below MAX_ONE_PASS) in those chunks with 16 warps and keeps other rows
    past 4096 in registers at 32 elements a thread; LayerNorm reads rows up to MAX_ONE_PASS in
    the largest power-of-two chunks (1024 to 4096) that divide them into two or more, bf16 rows of
    4096 only with many rows, and packs the others into blocks of 8192 elements."""
    helpers = sys.modules[f"{norm.__name__}._tuning"]
    rms = sys.modules[f"{norm.__name__}.rms_norm"]
    ln = sys.modules[f"{norm.__name__}.layer_norm"]
    for n in (3, 1000, 1024, 2048):
        assert rms._fwd_block(n, 2) == ln._fwd_block(n, 2) == helpers.row_block(n, 2048), n
    assert rms._fwd_block(1024, 2) == (True, 1024, 2, 4)
    assert rms._fwd_block(2048, 2) == (True, 2048, 1, 4)
    assert rms._fwd_block(2048, 4) == (True, 2048, 1, 4)  # fp32: one 8 KB chunk, one pass
    assert rms._fwd_block(4096, 2) == helpers.row_block(4096) == (True, 4096, 1, 8)
    assert rms._fwd_block(8192, 2) == (False, 4096, 1, rms.FWD_CHUNK_WARPS)
    assert rms._fwd_block(12288, 2) == (False, 4096, 1, rms.FWD_CHUNK_WARPS)
    assert rms._fwd_block(4096, 4) == (False, 2048, 1, rms.FWD_CHUNK_WARPS)  # fp32: 16 KB rows
    assert rms._fwd_block(5120, 2) == (True, 8192, 1, 4)
    assert rms._fwd_block(11008, 2) == (True, 16384, 1, 8)
    assert rms._fwd_block(helpers.MAX_ONE_PASS, 2) == (True, helpers.MAX_ONE_PASS, 1, 16)
    assert ln._fwd_block(4096, 2) == (False, 2048, 1, 8)
    assert ln._fwd_block(4096, 2, False) == (True, 4096, 2, ln.FWD_MAX_WARPS)
    assert ln._fwd_block(4096, 4, False) == (False, 2048, 1, 16)
    assert ln._fwd_block(3000, 2) == (True, 4096, 2, ln.FWD_MAX_WARPS)
    assert ln._fwd_block(5120, 2) == (False, 1024, 1, 8)
    assert ln._fwd_block(8192, 2) == (False, 4096, 1, 8)
    assert ln._fwd_block(8192, 4) == (False, 4096, 1, 16)
    assert ln._fwd_block(10240, 2) == (False, 2048, 1, 16)
    assert ln._fwd_block(12288, 2) == (False, 4096, 1, 16)
    assert ln._fwd_block(11008, 2) == (True, 16384, 1, ln.FWD_MAX_WARPS)  # no chunk divides it
    assert ln._fwd_block(helpers.MAX_ONE_PASS, 2) == (False, 4096, 1, 16)
    wide = helpers.MAX_ONE_PASS + 1
    assert rms._fwd_block(wide, 2) == ln._fwd_block(wide, 2) == helpers.row_block(wide)


def test_layer_norm_backward_takes_fp32_rows_as_swept(norm):
    """LayerNorm's backward runs bf16 rows and narrow fp32 rows as ``bwd_block`` says, fp32
    rows of 4096 one to a step, and wider fp32 rows one to a step without the look-ahead (the
    H200 sweep of 2026-11-24)."""
    helpers = sys.modules[f"{norm.__name__}._tuning"]
    ln = sys.modules[f"{norm.__name__}.layer_norm"]
    for n in (1000, 2048, 4096, 8192, 12288, 20000):
        assert ln._bwd_config(n, 2) == (*helpers.bwd_block(n), True), n
    for n in (1000, 2048, 20000):
        assert ln._bwd_config(n, 4) == (*helpers.bwd_block(n), True), n
    assert ln._bwd_config(4096, 4) == (True, 4096, 1, 16, helpers.BWD_PROGRAMS_PER_SM, True)
    for n in (5120, 8192, 16384):
        one_pass, block_n, rows, warps, per_sm, lookahead = ln._bwd_config(n, 4)
        assert (one_pass, rows, warps, lookahead) == (True, 1, ln.FP32_NO_LOOKAHEAD_WARPS, False)
        assert (block_n, per_sm) == helpers.bwd_block(n)[1:5:3]
