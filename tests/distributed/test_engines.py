"""A tiny Llama kernelized with our library trains one step under DDP, FSDP2, tensor parallelism
and FSDP2 x tensor parallelism on a 2-D mesh with the loss and gradients of one process running
the untouched model, on the transformers line installed (4.57 or 5.x).

Each engine is tried with the model kernelized before wrapping and after (kernelize finds the
tagged layers through the wrappers and leaves the wrappers as they were); FSDP2 with
``reshard_after_forward`` both ways, with bf16 mixed precision, with bf16 weights and with
activation checkpointing (torch's ``checkpoint_wrapper`` and transformers'
``gradient_checkpointing_enable``), always with the fused loss; tensor parallelism with sequence
parallel norms, whose kernels get DTensors and must run on the local shards without a fallback.
On transformers 5.x also its own tensor parallelism, ``from_pretrained(path, tp_plan="auto",
use_kernels=True)`` (with and without ``device_mesh=``), and its own 2-D loading
(``DistributedConfig(tp_size=2, fsdp_size=2)``).

The cases run in two jobs: two ranks (the 1-D engines) and four (the 2 x 2 mesh). On the CPU:
gloo, spawned processes, Triton's interpreter. On GPUs: NCCL, ``torchrun --nproc-per-node 2 -m
pytest tests/distributed -m gpu -p no:cacheprovider`` runs the two-rank job and
``--nproc-per-node 4`` the four-rank one (each skips the other), or plain pytest on a machine with
four GPUs runs both.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import tempfile
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist

from tests.distributed import test_benchmark
from tests.support.distributed import (
    device,
    fail_unless_all_passed,
    nccl_skip_reason,
    run_cases,
)
from tests.support.distributed_llama import (
    TRANSFORMERS_5,
    assert_kernelized,
    batch,
    build,
    check_against_reference,
    clean_up,
    dtensor_fallbacks,
    gathered_gradients,
    kernelize_with_library,
    mean_over_ranks,
    reference,
    step,
    tensor_parallel_plan,
    wrapper_state,
)

#: Precisions: fp32; FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) ("bf16");
#: bf16 weights, gradients and reductions throughout ("bf16-weights", what benchmarks/distributed.py
#: times); DDP's fp32 weights under ``torch.autocast(bf16)`` ("autocast").
BF16 = ("bf16", "bf16-weights", "autocast")


@dataclass(frozen=True)
class Run:
    engine: str  # "ddp", "fsdp2", "tp" or "2d" (FSDP2 over "dp" x tensor parallel over "tp")
    kernelize_first: bool
    precision: str = "fp32"  # "fp32" or one of BF16
    reshard: bool = True  # FSDP2 reshard_after_forward
    checkpoint: str | None = None  # "wrapper" (checkpoint_wrapper per layer) or "transformers"
    # Kernelized for TORCH_COMPILE and torch.compile'd whole (fullgraph) after wrapping, with
    # AOTAutograd but no code generation: what it checks is how the wrapped model traces.
    compiled: bool = False

    def __str__(self) -> str:
        options = [
            self.precision,
            *(["reshard" if self.reshard else "no-reshard"] if self.engine == "fsdp2" else []),
            *([f"checkpoint-{self.checkpoint}"] if self.checkpoint else []),
            *(["compiled"] if self.compiled else []),
        ]
        when = "kernelize-first" if self.kernelize_first else "kernelize-wrapped"
        return f"{self.engine}-{'-'.join(options)}-{when}"


RUNS = [
    Run("ddp", kernelize_first=True),
    Run("ddp", kernelize_first=False),
    Run("ddp", kernelize_first=True, precision="autocast", checkpoint="wrapper"),
    Run("fsdp2", kernelize_first=False),
    Run("fsdp2", kernelize_first=True, reshard=False, checkpoint="wrapper"),
    Run("fsdp2", kernelize_first=False, precision="bf16", checkpoint="wrapper"),
    Run("fsdp2", kernelize_first=True, precision="bf16", reshard=False),
    Run("fsdp2", kernelize_first=True, precision="bf16", checkpoint="transformers"),
    Run("fsdp2", kernelize_first=False, precision="bf16-weights", checkpoint="wrapper"),
    Run("tp", kernelize_first=True),
    Run("tp", kernelize_first=False),
    Run("tp", kernelize_first=True, compiled=True),
]
RUNS_2D = [Run("2d", kernelize_first=False, checkpoint="wrapper")]


def mesh_of(run: Run, dev: torch.device):
    from torch.distributed.device_mesh import init_device_mesh

    if run.engine == "2d":
        return init_device_mesh(
            dev.type, (2, dist.get_world_size() // 2), mesh_dim_names=("dp", "tp")
        )
    return init_device_mesh(dev.type, (dist.get_world_size(),))


def fsdp2(run: Run, model, mesh):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    options = dict(mesh=mesh, reshard_after_forward=run.reshard)
    if run.precision == "bf16":
        options["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    layers = model.model.layers
    for index, layer in enumerate(layers):
        if run.checkpoint == "wrapper":
            layers[index] = layer = checkpoint_wrapper(layer)
        fully_shard(layer, **options)
    fully_shard(model, **options)
    return model


def wrap(run: Run, model, dev: torch.device):
    mesh = mesh_of(run, dev)
    if run.checkpoint == "transformers":  # as TRL and the Trainer's users set it
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if run.engine == "ddp":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
        from torch.nn.parallel import DistributedDataParallel

        if run.checkpoint == "wrapper":
            layers = model.model.layers
            for index, layer in enumerate(layers):
                layers[index] = checkpoint_wrapper(layer)
        return DistributedDataParallel(
            model, device_ids=[dev.index] if dev.type == "cuda" else None
        )
    from torch.distributed.tensor.parallel import parallelize_module

    if run.engine == "tp":
        return parallelize_module(model, mesh, tensor_parallel_plan(model))
    if run.engine == "2d":  # tensor parallel within each "tp" row first, then FSDP2 across them
        parallelize_module(model, mesh["tp"], tensor_parallel_plan(model))
        return fsdp2(run, model, mesh["dp"])
    return fsdp2(run, model, mesh)


def this_ranks_rows(run: Run, ids: torch.Tensor) -> torch.Tensor:
    """Data parallel ranks each take a share of the batch's rows; tensor parallel ranks of one
    data parallel rank share theirs."""
    if run.engine == "tp":
        return ids
    if run.engine == "2d":
        rank = dist.get_rank() // (dist.get_world_size() // 2)  # this rank's "dp" coordinate
        return ids.chunk(2)[rank]
    return ids.chunk(dist.get_world_size())[dist.get_rank()]


def train_one_step(run: Run) -> None:
    dev = device()
    reference(dev)  # before anything is tagged
    try:
        # The compiled case builds a KV cache in the traced forward, as models come: Dynamo lost
        # an attribute stored on it when a kernel's DTensor output carried a gradient hook.
        model = build(dev, use_cache=run.compiled)
        if run.precision == "bf16-weights":
            model = model.to(torch.bfloat16)
        if run.kernelize_first:
            kernelize_with_library(model, run.compiled)
        model = wrap(run, model, dev)
        if not run.kernelize_first:
            before = wrapper_state(model)
            kernelize_with_library(model, run.compiled)
            assert wrapper_state(model) == before, "kernelize changed the wrappers"
        assert_kernelized(model)
        if run.compiled:
            model = torch.compile(model, backend="aot_eager", fullgraph=True)
        ids = this_ranks_rows(run, batch(dev))
        autocast = (
            torch.autocast(dev.type, dtype=torch.bfloat16)
            if run.precision == "autocast"
            else contextlib.nullcontext()
        )
        with dtensor_fallbacks() as fallbacks, autocast:
            loss, fused = step(model, ids)
        assert not fallbacks, [r.getMessage() for r in fallbacks]
        # The fused loss needs a plain lm_head: under tensor parallelism it has the parallel
        # hooks, and the model's own forward computes the loss (from the logits).
        tensor_parallel = run.engine in ("tp", "2d")
        assert fused == (not tensor_parallel), f"fused loss: {fused}"
        # Every rank of a data parallel group has its own rows' loss (the same on the tensor
        # parallel ranks of one row): the mean over all ranks is the whole batch's.
        if run.engine != "tp":
            loss = mean_over_ranks(loss)
        dtype = torch.bfloat16 if run.precision in BF16 else torch.float32
        check_against_reference(loss, gathered_gradients(model), dtype, dev)
    finally:
        clean_up()


# ---- transformers 5.x's own tensor parallelism ----------------------------------------------


@contextlib.contextmanager
def saved(make_model):
    """The model `make_model` builds (the same on every rank), saved by rank 0 in a folder every
    rank reads (transformers 5.x writes a checkpoint from rank 0 only when a process group is
    up)."""
    folder = [tempfile.mkdtemp() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(folder, src=0)
    try:
        if dist.get_rank() == 0:
            make_model().save_pretrained(folder[0])
        dist.barrier()
        yield folder[0]
    finally:
        dist.barrier()  # every rank has loaded it
        if dist.get_rank() == 0:
            shutil.rmtree(folder[0], ignore_errors=True)


@contextlib.contextmanager
def library_kernels_registered(dev: torch.device):
    """`register_library_kernels` for the block: the process-wide mapping put back after."""
    from kernels.library import register_library_kernels
    from kernels.mapping import registry

    saved = registry._global_mapping
    try:
        register_library_kernels(devices=[dev.type])
        yield
    finally:
        registry._global_mapping = saved


@contextlib.contextmanager
def inputs_seen_by_kernels(model):
    """{"RMSNorm" / "rotary": the set of input types (DTensor or Tensor) the model's RMSNorms
    and its modelling module's rotary function module see in the block}."""
    import sys

    from torch.distributed.tensor import DTensor

    seen: dict[str, set] = {"RMSNorm": set(), "rotary": set()}

    def recorder(kind):
        def hook(module, args, kwargs):
            for value in [*args, *kwargs.values()]:
                if isinstance(value, torch.Tensor):
                    seen[kind].add("DTensor" if isinstance(value, DTensor) else "Tensor")

        return hook

    targets = [(m, "RMSNorm") for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    targets.append((sys.modules[type(model).__module__].apply_rotary_pos_emb, "rotary"))
    handles = [m.register_forward_pre_hook(recorder(k), with_kwargs=True) for m, k in targets]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def _qwen3():
    from tests.support.tf5_models import make_model

    return make_model("qwen3")


#: The models transformers' own tensor parallelism is tried on: {family: (build function,
#: reference function of the device)}.
FAMILIES = {
    "llama": (lambda: build(torch.device("cpu")), reference),
    "qwen3": (_qwen3, None),
}


@contextlib.contextmanager
def kernelize_log():
    """The lines kernelize logs in the block."""
    import logging

    records: list[logging.LogRecord] = []
    # DEBUG: a reason several layers share is logged once, each layer's line at DEBUG.
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    logger = logging.getLogger("kernels.layer.kernelize")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def tp_plan_auto(family: str, with_device_mesh: bool) -> None:
    """``from_pretrained(path, tp_plan="auto", use_kernels=True)``: transformers shards the
    projections (Llama's plan: q, k, v, gate, up column-wise, o, down row-wise, lm_head
    column-wise gathering its output) and hands every module's output back as a local tensor,
    so our norm and rotary kernels get plain tensors (no fallback), the gated MLP calls the
    sharded projections, and the loss is not fused (lm_head has transformers' parallel
    forward). Qwen3's plan also gives its per-head ``q_norm`` / ``k_norm`` transformers' own
    forward (``replicated_with_grad_allreduce``, which all-reduces their weights' gradients):
    on 5.24, which parallelised before kernelizing, they keep it, with a kernelize line each
    naming the layer and why; 5.25 kernelizes first, and that forward wraps our kernel."""
    import warnings

    import transformers
    from packaging.version import Version
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForCausalLM

    dev = device()
    make_model, make_reference = FAMILIES[family]
    if make_reference is not None:
        want = make_reference(dev)
    else:  # the untouched model on the whole batch, before anything is tagged
        model = make_model().to(dev)
        want_loss, _ = step(model, batch(dev))
        want = want_loss, {name: p.grad.float() for name, p in model.named_parameters()}
    options = {}
    if with_device_mesh:  # transformers 5.24 builds its own mesh all the same
        options["device_mesh"] = init_device_mesh(
            dev.type, (dist.get_world_size(),), mesh_dim_names=("tp",)
        )
    try:
        with saved(make_model) as folder, library_kernels_registered(dev):
            with warnings.catch_warnings():  # tp_plan= is deprecated for distributed_config=
                warnings.simplefilter("ignore", FutureWarning)
                model = AutoModelForCausalLM.from_pretrained(
                    folder, tp_plan="auto", use_kernels=True, attn_implementation="sdpa", **options
                )
            with kernelize_log() as logged:
                model.train()  # transformers kernelizes again, for training
            kept = [
                r.getMessage()
                for r in logged
                if "tensor parallelism set" in r.getMessage()
                and " keeps its original forward" in r.getMessage()
            ]
            per_head_norms = [f"model.layers.0.self_attn.{n}_norm" for n in "qk"]
            # transformers 5.25 kernelizes before it installs the parallel styles, so their
            # forward wraps the kernel and nothing is kept; 5.24 parallelised first.
            parallelised_first = Version(transformers.__version__) < Version("5.25")
            expected = per_head_norms if family == "qwen3" and parallelised_first else []
            assert [m.split(" ", 1)[0] for m in kept] == expected, kept
            if family == "llama":
                assert_kernelized(model)
            gate = model.model.layers[0].mlp.gate_proj.weight
            assert isinstance(gate, DTensor) and gate.to_local().shape[0] * 2 == gate.shape[0]
            with dtensor_fallbacks() as fallbacks, inputs_seen_by_kernels(model) as seen:
                loss, fused = step(model, batch(dev))
        assert not fallbacks, [r.getMessage() for r in fallbacks]
        assert seen == {"RMSNorm": {"Tensor"}, "rotary": {"Tensor"}}, seen
        assert not fused, "lm_head is parallelised: the model's own forward computes the loss"
        check_against_reference(loss, gathered_gradients(model), torch.float32, dev, want)
    finally:
        clean_up()


def distributed_config_2d() -> None:
    """transformers 5.x's own 2-D loading: ``DistributedConfig(tp_size=2, fsdp_size=2)`` (its
    tensor parallel plan over "tp", its FSDP2 plan over "fsdp"), ``use_kernels=True``."""
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    dev = device()
    reference(dev)
    try:
        with saved(FAMILIES["llama"][0]) as folder, library_kernels_registered(dev):
            model = AutoModelForCausalLM.from_pretrained(
                folder,
                distributed_config=DistributedConfig(tp_size=2, fsdp_size=2),
                use_kernels=True,
                attn_implementation="sdpa",
            )
            model.train()
            assert_kernelized(model)
            ids = this_ranks_rows(Run("2d", kernelize_first=False), batch(dev))
            with dtensor_fallbacks() as fallbacks:
                loss, fused = step(model, ids)
        assert not fallbacks, [r.getMessage() for r in fallbacks]
        assert not fused
        check_against_reference(
            mean_over_ranks(loss), gathered_gradients(model), torch.float32, dev
        )
    finally:
        clean_up()


CASES = {str(run): functools.partial(train_one_step, run) for run in [*RUNS, *RUNS_2D]}
# The benchmark's case runs in the two-rank job too: a job pays process start and imports once.
CASES |= {f"benchmark/{name}": case for name, case in test_benchmark.CASES.items()}
#: The cases of each job, by its number of ranks.
JOBS = {
    2: [str(run) for run in RUNS] + [f"benchmark/{name}" for name in test_benchmark.CASES],
    4: [str(run) for run in RUNS_2D],
}
if TRANSFORMERS_5:
    CASES |= {
        "transformers-tp-plan-auto": functools.partial(tp_plan_auto, "llama", False),
        "transformers-tp-plan-auto-device-mesh": functools.partial(tp_plan_auto, "llama", True),
        "transformers-tp-plan-auto-qwen3": functools.partial(tp_plan_auto, "qwen3", False),
        "transformers-distributed-config-2d": distributed_config_2d,
    }
    JOBS[2] += [
        "transformers-tp-plan-auto",
        "transformers-tp-plan-auto-device-mesh",
        "transformers-tp-plan-auto-qwen3",
    ]
    JOBS[4] += ["transformers-distributed-config-2d"]


_BACKENDS = ["gloo", pytest.param("nccl", marks=pytest.mark.gpu)]


@pytest.mark.slow
@pytest.mark.parametrize("backend", _BACKENDS)
@pytest.mark.parametrize("world_size", list(JOBS))
def test_training_steps_match_one_process(backend, world_size):
    """Each job's cases (`JOBS`): every one must pass."""
    if backend == "nccl" and (reason := nccl_skip_reason(world_size)):
        pytest.skip(reason)
    outcomes = run_cases(
        __name__, JOBS[world_size], backend=backend, world_size=world_size, timeout=420
    )
    fail_unless_all_passed(outcomes)
