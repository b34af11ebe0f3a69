"""A tiny Llama for the distributed tests, built for the transformers line installed (4.57 or
5.x): the model, its batch, our kernels, the parallel plans, one training step and the checks
against one process.

Every rank builds the same model from the same seed; the reference is a single-process step of
the untouched model on the whole batch, in fp32, computed on each rank before anything is tagged.

What differs between the lines is what transformers tags itself: 4.57 tags the RMSNorm only, so
the user tags the gated MLP, the rotary function and the ``*ForCausalLM`` forward; 5.x tags the
RMSNorm and makes ``apply_rotary_pos_emb`` a kernelizable function module itself (one object per
modelling module, for the whole process), so the user tags the gated MLP and the forward. Either
way the same kernels run (`KERNELS`).
"""

from __future__ import annotations

import contextlib
import functools
import logging

import torch
import torch.distributed as dist

# The tensor parallel plan (Megatron-style, sequence parallel norms) is the one the benchmark times.
from benchmarks.distributed import tensor_parallel_plan  # noqa: F401
from tests.support.distributed import on_transformers_5
from tests.support.models import llama_config

#: Whether the installed transformers is of the 5.x line (which tags the rotary function itself).
TRANSFORMERS_5 = on_transformers_5()

# One decoder layer: every engine wraps, shards or parallelises it as it would each of many, and
# on the CPU the kernels run through Triton's interpreter, whose cost grows with every layer.
CONFIG = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=64,
    max_position_embeddings=64,
)
#: The whole batch: data parallel ranks take a share of its rows, tensor parallel ranks all.
BATCH, SEQUENCE = 2, 4

#: Largest relative L2 error of the loss and of any parameter's gradient against the fp32
#: reference, by device type and dtype: fp32 differs by summation order only (4e-7 measured on
#: the CPU; GPU kernels and NCCL sum in other orders); under bf16 mixed precision
#: every matmul rounds to bf16 (unit roundoff 2^-8; 2.3e-2 measured on the CPU).
TOLERANCE = {
    ("cpu", torch.float32): 1e-5,
    ("cuda", torch.float32): 1e-4,
    ("cpu", torch.bfloat16): 5e-2,
    ("cuda", torch.bfloat16): 5e-2,
}

#: The layers of the model that get our kernels, by kernel layer (the rotary kernel is a
#: function kernel named after the function; CausalLMFusedLoss is the whole model's forward),
#: on both lines.
KERNELS = {"RMSNorm", "SiLU", "SwiGLUMLP", "apply_rotary_pos_emb", "CausalLMFusedLoss"}


def build(device: torch.device, use_cache: bool = False):
    """The tiny Llama on `device`; with `use_cache` as models come (a forward builds its KV
    cache, in training too), else without one."""
    from transformers import LlamaForCausalLM

    config = llama_config(**CONFIG, use_cache=use_cache, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    # Norm weights start at one; perturb them, so that a kernel that dropped them would show.
    # On the CPU's generator before moving: the GPU's draws other numbers from the same seed, and
    # the model must be the one a rank loads from a checkpoint written by a CPU-built model.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model.to(device)


def batch(device: torch.device) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQUENCE), generator=generator).to(device)


def kernelize_with_library(model, compiled: bool = False) -> None:
    """What a user does: tag what the installed transformers leaves untagged, kernelize for
    training (for training under torch.compile if `compiled`)."""
    from kernels import Mode, kernelize, library_mapping, use_kernel_mapping
    from kernels.library import tag_causal_lm_losses, tag_gated_mlps, tag_rotary_embeddings

    tag_gated_mlps(model)
    if not TRANSFORMERS_5:  # 5.x's rotary function is kernelizable as it comes
        tag_rotary_embeddings(model)
    tag_causal_lm_losses(model)
    mode = Mode.TRAINING | Mode.TORCH_COMPILE if compiled else Mode.TRAINING
    with use_kernel_mapping(library_mapping()):
        kernelize(model, mode=mode)


def untouched() -> bool:
    """Whether transformers' Llama runs its own code: nothing tagged by us, and the rotary
    function transformers' own (4.57: the plain function; 5.x: its function module, unswapped)."""
    import inspect

    from transformers.models.llama import modeling_llama

    from kernels.layer.swap import kernel_layer_of
    from kernels.layer.tagging import tag_of

    if tag_of(modeling_llama.LlamaMLP) or tag_of(modeling_llama.LlamaForCausalLM):
        return False
    rotary = modeling_llama.apply_rotary_pos_emb
    if TRANSFORMERS_5:
        return isinstance(rotary, torch.nn.Module) and kernel_layer_of(rotary) is None
    return inspect.isfunction(rotary)


def clean_up() -> None:
    """Give the process back as transformers made it: our tags gone, and on 5.x the rotary
    function module (one for the process) running its own forward again."""
    from kernels.library import untag

    untag()
    if TRANSFORMERS_5:
        from tests.support.tf5_models import restore_function_modules

        restore_function_modules()


def step(model, ids: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """One forward and backward: the loss, and whether it was fused (no logits returned)."""
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return out.loss.detach().float(), out.logits is None


@functools.cache
def reference(device: torch.device) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The untouched model's loss and gradients on the whole batch, in this process alone."""
    assert untouched(), "tagged or kernelized already: compute the reference first"
    model = build(device)
    loss, _ = step(model, batch(device))
    return loss, {name: p.grad.float() for name, p in model.named_parameters()}


def canonical(name: str) -> str:
    """A parameter's name in the unwrapped model (without DDP's, checkpointing's and
    torch.compile's prefixes)."""
    name = name.replace("_checkpoint_wrapped_module.", "").removeprefix("_orig_mod.")
    return name.removeprefix("module.")


def gathered_gradients(model) -> dict[str, torch.Tensor]:
    """Every parameter's whole gradient, gathered from its shards (on every rank)."""
    from torch.distributed.tensor import DTensor

    grads = {}
    for name, p in model.named_parameters():
        grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        grads[canonical(name)] = grad.float()
    return grads


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got - expected).norm() / expected.norm().clamp_min(1e-30)).item()


def check_against_reference(loss, grads: dict, dtype: torch.dtype, device, expected=None) -> None:
    """`loss` and `grads` against `expected` ((loss, {name: gradient})), by default the tiny
    Llama's `reference`, within `TOLERANCE` (relative L2)."""
    ref_loss, ref_grads = reference(device) if expected is None else expected
    tolerance = TOLERANCE[device.type, dtype]
    error = relative_error(loss, ref_loss)
    assert error <= tolerance, f"loss {loss.item()} vs {ref_loss.item()} (relative {error:.3g})"
    assert grads.keys() == ref_grads.keys(), sorted(grads.keys() ^ ref_grads.keys())
    errors = {name: relative_error(grads[name], ref_grads[name]) for name in ref_grads}
    worst = max(errors, key=errors.get)
    assert errors[worst] <= tolerance, (
        f"gradient of {worst} differs by {errors[worst]:.3g} (relative L2; tolerance "
        f"{tolerance:g}); all: { {n: f'{e:.2g}' for n, e in errors.items()} }"
    )


def mean_over_ranks(value: torch.Tensor) -> torch.Tensor:
    value = value.clone()
    dist.all_reduce(value)
    return value / dist.get_world_size()


def wrapper_state(model) -> list:
    """What kernelize must leave as it is: every module's class (its own: kernelize may bind a
    kernel on a class made over it) and hooks, every parameter."""
    from kernels.layer.own_forward import own_class

    return [
        (name, own_class(m), tuple(m._forward_pre_hooks), tuple(m._forward_hooks))
        for name, m in model.named_modules()
    ] + [(name, id(p)) for name, p in model.named_parameters()]


def assert_kernelized(model) -> None:
    """Every tagged layer of `model` runs one of our kernels."""
    from kernels.layer.kernelize import _kernelizable_modules
    from kernels.layer.swap import kernel_layer_of

    bound = {path: kernel_layer_of(m) for path, m, _ in _kernelizable_modules(model)}
    missing = [path for path, kernel in bound.items() if kernel is None]
    assert not missing, f"no kernel for {missing}"
    assert {kernel.__name__ for kernel in bound.values()} == KERNELS, bound


@contextlib.contextmanager
def dtensor_fallbacks():
    """The fallback lines the DTensor rules log inside the block (each logged anew)."""
    from kernels.layer import dtensor

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append
    logger = logging.getLogger(dtensor.__name__)
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    dtensor._logged.clear()
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
