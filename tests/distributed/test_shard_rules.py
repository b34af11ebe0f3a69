"""The shard rules (kernels/layer/dtensor.py): each library kernel on DTensors, on a two-rank mesh.

Where a rule holds, the kernel runs on the local shards: the output is a DTensor placed like the
input, and the output and every gradient (inputs and replicated parameters, gathered) equal the
untouched module's on the whole tensors, with nothing logged. Where it does not, the module runs
its own forward with one log line naming the reason, and the results are the same. The tests
at the top need no process group: what kernelize binds, and that every library kernel declares
a rule.
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
import textwrap

import pytest
import torch
import torch.nn.functional as F

from kernels import (
    Mode,
    kernelize,
    library_mapping,
    use_kernel_forward_from_hub,
    use_kernel_func_from_hub,
    use_kernel_mapping,
)
from kernels.layer import dtensor
from kernels.layer.swap import kernel_layer_of
from kernels.library import KERNELS
from tests.support.distributed import fail_unless_all_passed, run_cases, same_on_both_lines
from tests.support.distributed_llama import dtensor_fallbacks
from tests.support.library import FusedAddRMSNorm, SiluAndMul
from tests.support.models import llama_config

# ---- without a process group --------------------------------------------------------------------


def _library_kernel(kernel):
    from kernels.layer.loading import load_kernel_layer

    if kernel.layer_name == "MoeRouterCausalLMFusedLoss":
        import transformers  # (here: only this kernel's case needs it)
        from packaging.version import Version

        if Version(transformers.__version__).major < 5:
            pytest.skip(
                "transformers 4.57 has no forward, and the loss repository no layer, for it"
            )
    return load_kernel_layer(library_mapping(devices=["cpu"])[kernel.layer_name]["cpu"])


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.layer_name)
def test_every_library_kernel_declares_a_known_rule(kernel):
    layer = _library_kernel(kernel)
    assert dtensor.shard_rule_of(layer) in {*dtensor.RULES, dtensor.TAKES_DTENSORS}
    # The rule is no class member: the layer keeps the members Hugging Face's kernels allows.
    assert not {"shard_rule"} & set(vars(layer))


def test_kernelize_binds_the_shard_aware_forward():
    from transformers.activations import SiLUActivation

    act = SiLUActivation()
    with use_kernel_mapping(library_mapping(layers=["SiLU"])):
        kernelize(act, mode=Mode.TRAINING, device="cpu")
    kernel = kernel_layer_of(act)
    assert kernel.__name__ == "SiLU"
    assert act.forward.__func__ is dtensor.shard_aware_forward(kernel)
    assert act.forward.__func__.__wrapped__ is kernel.forward
    x = torch.randn(3, 5)
    assert torch.allclose(act(x), F.silu(x), atol=1e-6)


@same_on_both_lines("compiling the shard-aware forward")
def test_the_shard_aware_forward_compiles_in_one_graph():
    import torch.distributed.tensor  # noqa: F401  (so that the wrapper checks for DTensors)
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

    from kernels.library import tag_gated_mlps, untag

    config = llama_config(hidden_size=8, intermediate_size=16, hidden_act="silu")
    model = torch.nn.Sequential(LlamaRMSNorm(8), LlamaMLP(config))
    try:
        tag_gated_mlps(model)
        with use_kernel_mapping(library_mapping(layers=["RMSNorm", "SwiGLUMLP", "SiLU"])):
            kernelize(model, mode=Mode.TRAINING | Mode.TORCH_COMPILE, device="cpu")
        mlp = model[1]
        layer = kernel_layer_of(mlp)
        assert layer.__name__ == "SwiGLUMLP" and kernel_layer_of(mlp.act_fn).__name__ == "SiLU"
        # The gated MLP sees plain SiLU behind the wrapper, so it fuses in eager mode.
        assert sys.modules[layer.__module__]._is_plain_silu(mlp.act_fn)
        x = torch.randn(3, 8)
        h = type(model[0]).forward(model[0], x)
        expected = mlp.down_proj(F.silu(mlp.gate_proj(h)) * mlp.up_proj(h))
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        torch.testing.assert_close(compiled(x), expected)
    finally:
        untag()


def test_a_kernel_that_takes_dtensors_is_bound_as_it_is():
    swiglu = next(k for k in KERNELS if k.layer_name == "SwiGLUMLP")
    layer = _library_kernel(swiglu)
    assert dtensor.shard_aware_forward(layer) is layer.forward


def test_global_strides_keep_the_local_memory_order():
    local = torch.empty(2, 6, 3, 8).transpose(1, 2)  # (b, h, s, d) stored as (b, s, h, d)
    assert dtensor._strides_in_order_of(local, torch.Size([2, 6, 6, 8])) == (288, 8, 48, 1)
    assert dtensor._strides_in_order_of(torch.empty(4, 1, 8), torch.Size([4, 1, 8])) == (8, 8, 1)


# ---- on a two-rank mesh ---------------------------------------------------------------------


def _mesh():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (dist.get_world_size(),))


def _dtensor(full: torch.Tensor, placements) -> torch.Tensor:
    """`full` as a leaf DTensor that requires grad (a partial sum of halves for Partial)."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, distribute_tensor

    if any(p.is_partial() for p in placements):
        half = full.detach() / dist.get_world_size()
        return DTensor.from_local(half, _mesh(), placements).detach().requires_grad_()
    return distribute_tensor(full.detach(), _mesh(), placements).requires_grad_()


def _replicate_parameters(module: torch.nn.Module) -> None:
    """Make the module's own parameters replicated DTensors, as SequenceParallel does."""
    from torch.distributed.tensor import Replicate, distribute_tensor

    for name, p in list(module.named_parameters(recurse=False)):
        module.register_parameter(
            name, torch.nn.Parameter(distribute_tensor(p.detach(), _mesh(), [Replicate()]))
        )


def _kernelized(module: torch.nn.Module, layer: str, compiled: bool = False) -> torch.nn.Module:
    mode = Mode.TRAINING | Mode.TORCH_COMPILE if compiled else Mode.TRAINING
    with use_kernel_mapping(library_mapping(layers=[layer])):
        kernelize(module, mode=mode, device="cpu")
    assert kernel_layer_of(module) is not None
    return module


def _outputs(out) -> list[torch.Tensor]:
    return list(out) if isinstance(out, tuple) else [out]


def _forward_backward(module, inputs: dict, cotangents=None):
    """Outputs (whole tensors) and gradients (inputs, then parameters; whole) of `module` on
    `inputs`, against fixed cotangents (drawn here when not given)."""
    from torch.distributed.tensor import DTensor

    def whole(t):
        return t.full_tensor() if isinstance(t, DTensor) else t

    raw = _outputs(module(**inputs))
    outs = [whole(o) for o in raw]
    if cotangents is None:
        generator = torch.Generator().manual_seed(2)
        cotangents = [torch.randn(o.shape, generator=generator) for o in outs]
    loss = sum((o * c).sum() for o, c in zip(outs, cotangents, strict=True))
    leaves = [t for t in inputs.values() if isinstance(t, torch.Tensor) and t.requires_grad]
    leaves += [p for p in module.parameters()]
    grads = torch.autograd.grad(loss, leaves)
    return raw, [o.detach() for o in outs], [whole(g) for g in grads], cotangents


def check(
    make_module,
    layer: str,
    inputs: dict,
    placements: dict,
    *,
    fallback: str | None = None,
    replicate_parameters: bool = True,
    compiled: bool = False,
):
    """Run the kernelized module on `inputs` placed as `placements` (by argument name) and the
    untouched module on the whole tensors: same outputs and gradients; the outputs placed like
    the inputs when the rule holds, else one fallback line containing `fallback`. `compiled`:
    kernelized for TORCH_COMPILE and run under torch.compile (AOTAutograd, no inductor)."""
    reference = make_module()
    expected = _forward_backward(
        reference, {n: t.clone().requires_grad_() for n, t in inputs.items()}
    )
    _, want_outs, want_grads, cotangents = expected

    module = make_module()
    if replicate_parameters:
        _replicate_parameters(module)
    _kernelized(module, layer, compiled)
    if compiled:
        module = torch.compile(module, backend="aot_eager")
    dinputs = {n: _dtensor(t, placements[n]) for n, t in inputs.items()}
    with dtensor_fallbacks() as logged:
        raw, outs, grads, _ = _forward_backward(module, dinputs, cotangents)
        module(**dinputs)  # a second call logs nothing new
    messages = [r.getMessage() for r in logged]
    if fallback is None:
        assert not messages, messages
        first = next(iter(dinputs.values()))
        for out in raw:
            assert out.placements == first.placements, (out.placements, first.placements)
    else:
        assert len(messages) == 1 and fallback in messages[0], messages
    for got, want in zip(outs + grads, want_outs + want_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _perturbed(norm: torch.nn.Module) -> torch.nn.Module:
    """`norm` with its parameters moved off their initial ones and zeros (the same on every
    call), so that a kernel that dropped one would show."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in norm.parameters():
            p.add_(torch.randn(p.shape) * 0.1)
    return norm


def _rms_norm():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    return _perturbed(LlamaRMSNorm(8))


@use_kernel_forward_from_hub("LayerNorm")
class _LayerNorm(torch.nn.LayerNorm):
    pass


def _layer_norm(shape=(4, 8), affine=True):
    return _perturbed(_LayerNorm(shape, elementwise_affine=affine))


@use_kernel_forward_from_hub("SiluAndMul")
class _SiluAndMul(SiluAndMul):
    pass


@use_kernel_forward_from_hub("FusedAddRMSNorm")
class _FusedAddRMSNorm(FusedAddRMSNorm):
    pass


def _fused_add_rms_norm():
    return _perturbed(_FusedAddRMSNorm(8))


def _silu():
    from transformers.activations import SiLUActivation

    return SiLUActivation()


def _randn(*shape, seed=3):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _shard(dim):
    from torch.distributed.tensor import Shard

    return [Shard(dim)]


def _replicate():
    from torch.distributed.tensor import Replicate

    return [Replicate()]


def _partial():
    from torch.distributed.tensor import Partial

    return [Partial()]


def silu(placements, fallback=None, shape=(2, 6, 8)):
    x = {"input": _randn(*shape)}
    check(_silu, "SiLU", x, {"input": placements()}, fallback=fallback)


def gated(placements, fallback=None):
    x = {"x": _randn(2, 6, 16)}
    check(_SiluAndMul, "SiluAndMul", x, {"x": placements()}, fallback=fallback)


def rms_norm(placements, fallback=None, shape=(2, 6, 8), compiled=False):
    x = {"hidden_states": _randn(*shape)}
    check(
        _rms_norm,
        "RMSNorm",
        x,
        {"hidden_states": placements()},
        fallback=fallback,
        compiled=compiled,
    )


def layer_norm(placements, fallback=None, affine=True):
    x = {"input": _randn(2, 6, 4, 8)}
    make = functools.partial(_layer_norm, affine=affine)
    check(make, "LayerNorm", x, {"input": placements()}, fallback=fallback)


def fused_add_rms_norm(placements, fallback=None):
    x = {"hidden_states": _randn(2, 6, 8), "residual": _randn(2, 6, 8, seed=4)}
    check(
        _fused_add_rms_norm, "FusedAddRMSNorm", x, {n: placements() for n in x}, fallback=fallback
    )


def _rotary_module():
    """transformers' rotate-half RoPE as a function module with the signature of 5.x (and of our
    kernel), as `kernels.library.tag_rotary_embeddings` makes it for 4.57 models."""
    from transformers.models.llama.modeling_llama import rotate_half

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

    return use_kernel_func_from_hub("rotary_pos_emb")(apply_rotary_pos_emb)


def rotary(q_placements, cos_placements, fallback=None):
    """q (2, 4 heads, 6, 8) and k (2, 2 heads, 6, 8); cos and sin (2, 6, 8), all with grads."""
    angles = _randn(2, 6, 4, seed=5)
    inputs = {
        "q": _randn(2, 4, 6, 8),
        "k": _randn(2, 2, 6, 8, seed=6),
        "cos": torch.cat([angles.cos()] * 2, dim=-1),
        "sin": torch.cat([angles.sin()] * 2, dim=-1),
    }
    placements = {"q": q_placements(), "k": q_placements()}
    placements |= {"cos": cos_placements(), "sin": cos_placements()}
    check(_rotary_module, "rotary_pos_emb", inputs, placements, fallback=fallback)


def swiglu_mlp_with_dtensor_projections():
    """Projections parallelised with use_local_output=False hand SwiGLUMLP DTensors, which it
    multiplies with the module's act_fn (our SiLU, on the local shards): no fallback line."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    from transformers.models.llama.modeling_llama import LlamaMLP

    from kernels.library import tag_gated_mlps, untag

    config = llama_config(hidden_size=8, intermediate_size=16, hidden_act="silu")
    torch.manual_seed(0)
    reference = LlamaMLP(config)
    mlp = LlamaMLP(config)
    mlp.load_state_dict(reference.state_dict())
    plan = {
        "gate_proj": ColwiseParallel(use_local_output=False),
        "up_proj": ColwiseParallel(use_local_output=False),
        "down_proj": RowwiseParallel(input_layouts=Shard(-1)),
    }
    try:
        tag_gated_mlps(mlp)
        parallelize_module(mlp, _mesh(), plan)
        with use_kernel_mapping(library_mapping(layers=["SwiGLUMLP", "SiLU"])):
            kernelize(mlp, mode=Mode.TRAINING, device="cpu")
        assert kernel_layer_of(mlp).__name__ == "SwiGLUMLP"
        assert kernel_layer_of(mlp.act_fn).__name__ == "SiLU"
        x = _randn(2, 6, 8)
        with dtensor_fallbacks() as logged:
            _, outs, grads, cotangents = _forward_backward(mlp, {"x": x.clone().requires_grad_()})
        assert not logged, [r.getMessage() for r in logged]
        _, want_outs, want_grads, _ = _forward_backward(
            reference, {"x": x.clone().requires_grad_()}, cotangents
        )
        for got, want in zip(outs + grads, want_outs + want_grads, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    finally:
        untag()


_OUTSIDE_LAYER = """
import torch
import torch.nn.functional as F


class SiluAndMul(torch.nn.Module):
    def forward(self, x):
        return F.silu(x[..., : x.shape[-1] // 2]) * x[..., x.shape[-1] // 2 :]
"""


def kernel_falls_back(rule_line: str, reason: str):
    """A kernel layer from outside the library, declaring `rule_line` (or nothing), gets no
    DTensors: the module runs its own forward, with one line giving `reason`."""
    from kernels import LocalLayerRepository

    with tempfile.TemporaryDirectory() as root:
        package = os.path.join(root, "build", "torch-universal", "outside")
        os.makedirs(package)
        with open(os.path.join(package, "__init__.py"), "w") as f:
            f.write("from . import layers\n")
        with open(os.path.join(package, "layers.py"), "w") as f:
            f.write(textwrap.dedent(_OUTSIDE_LAYER) + rule_line)
        repository = LocalLayerRepository(root, package_name="outside", layer_name="SiluAndMul")
        module = _SiluAndMul()
        with use_kernel_mapping({"SiluAndMul": {"cpu": repository}}):
            kernelize(module, mode=Mode.TRAINING, device="cpu")
        assert kernel_layer_of(module) is not None
        x = _dtensor(_randn(2, 6, 16), _shard(1))
        with dtensor_fallbacks() as logged:
            out = module(x)
            module(x)
        messages = [r.getMessage() for r in logged]
        assert len(messages) == 1 and reason in messages[0], messages
        torch.testing.assert_close(out.full_tensor(), SiluAndMul()(x.full_tensor()))


HEADS, SEQUENCE, HEAD_DIM = 1, 2, 3
P = functools.partial
CASES = {
    "silu/sequence-sharded": P(silu, P(_shard, 1)),
    "silu/last-dim-sharded": P(silu, P(_shard, 2)),
    "silu/uneven-shards": P(silu, P(_shard, 1), shape=(2, 5, 8)),
    "silu/replicated": P(silu, _replicate),
    "silu/partial-falls-back": P(silu, _partial, "partial sum"),
    "gated/batch-sharded": P(gated, P(_shard, 0)),
    "gated/last-dim-falls-back": P(gated, P(_shard, 2), "gate and up halves"),
    "rms-norm/sequence-parallel": P(rms_norm, P(_shard, 1)),
    # The kernel's view of the module (local parameters) as torch.compile traces it.
    "rms-norm/sequence-parallel-compiled": P(rms_norm, P(_shard, 1), compiled=True),
    "rms-norm/uneven-sequence": P(rms_norm, P(_shard, 1), shape=(2, 7, 8)),
    "rms-norm/replicated": P(rms_norm, _replicate),
    "rms-norm/hidden-sharded-falls-back": P(rms_norm, P(_shard, 2), "normalises over"),
    "layer-norm/sequence-parallel": P(layer_norm, P(_shard, 1)),
    "layer-norm/no-affine": P(layer_norm, P(_shard, 1), affine=False),
    "layer-norm/normalised-dim-falls-back": P(layer_norm, P(_shard, 2), "normalises over"),
    "fused-add-rms-norm/sequence-parallel": P(fused_add_rms_norm, P(_shard, 1)),
    "rotary/heads-sharded": P(rotary, P(_shard, HEADS), _replicate),
    "rotary/sequence-sharded": P(rotary, P(_shard, SEQUENCE), P(_shard, 1)),
    "rotary/batch-sharded": P(rotary, P(_shard, 0), P(_shard, 0)),
    "rotary/head-dim-falls-back": P(rotary, P(_shard, HEAD_DIM), _replicate, "head_dim"),
    "rotary/cos-misplaced-falls-back": P(rotary, P(_shard, SEQUENCE), _replicate, "cos is placed"),
    "swiglu-mlp/dtensor-projections": swiglu_mlp_with_dtensor_projections,
    "kernel-without-a-rule-falls-back": P(kernel_falls_back, "", "declares no shard rule"),
    "plain-rule-falls-back": P(
        kernel_falls_back, 'SiluAndMul.forward.shard_rule = "plain"\n', "plain tensors only"
    ),
    "unknown-rule-falls-back": P(
        kernel_falls_back, 'SiluAndMul.forward.shard_rule = "later"\n', "does not know"
    ),
}


@pytest.mark.slow
@same_on_both_lines("the shard rules of kernels on single modules")
def test_rules_on_two_ranks():
    """Every case of `CASES` in one two-rank job: every one must pass."""
    fail_unless_all_passed(run_cases(__name__, list(CASES)))
