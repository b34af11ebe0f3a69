"""A tiny Llama kernelized with our library trains one step under DDP, FSDP2 and tensor
parallelism with the loss and gradients of one process running the untouched model.

Each engine is tried with the model kernelized before wrapping and after (kernelize finds the
tagged layers through the wrappers and leaves the wrappers as they were); FSDP2 with
``reshard_after_forward`` both ways, with and without bf16 mixed precision and activation
checkpointing; tensor parallelism with sequence parallel norms, whose kernels get DTensors and
must run on the local shards without a fallback. On the CPU: gloo, two processes, Triton's
interpreter. With two GPUs: NCCL (``torchrun --nproc-per-node 2 -m pytest tests/distributed -m
gpu -p no:cacheprovider``, or plain pytest on a machine with two GPUs).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist

from tests.support.distributed import device, run_cases, under_torchrun
from tests.support.distributed_llama import (
    assert_kernelized,
    batch,
    build,
    check_against_reference,
    dtensor_fallbacks,
    gathered_gradients,
    kernelize_with_library,
    mean_over_ranks,
    reference,
    step,
    tensor_parallel_plan,
    wrapper_state,
)


@dataclass(frozen=True)
class Run:
    engine: str  # "ddp", "fsdp2" or "tp"
    kernelize_first: bool
    bf16: bool = False  # FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)
    reshard: bool = True  # FSDP2 reshard_after_forward
    checkpoint: bool = False  # activation checkpointing of each decoder layer

    def __str__(self) -> str:
        options = [
            "bf16" if self.bf16 else "fp32",
            *(["reshard" if self.reshard else "no-reshard"] if self.engine == "fsdp2" else []),
            *(["checkpoint"] if self.checkpoint else []),
        ]
        when = "kernelize-first" if self.kernelize_first else "kernelize-wrapped"
        return f"{self.engine}-{'-'.join(options)}-{when}"


RUNS = [
    Run("ddp", kernelize_first=True),
    Run("ddp", kernelize_first=False),
    Run("fsdp2", kernelize_first=False),
    Run("fsdp2", kernelize_first=True, reshard=False, checkpoint=True),
    Run("fsdp2", kernelize_first=False, bf16=True, checkpoint=True),
    Run("fsdp2", kernelize_first=True, bf16=True, reshard=False),
    Run("tp", kernelize_first=True),
    Run("tp", kernelize_first=False),
]


def wrap(run: Run, model, dev: torch.device):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(dev.type, (dist.get_world_size(),))
    if run.engine == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(
            model, device_ids=[dev.index] if dev.type == "cuda" else None
        )
    if run.engine == "tp":
        from torch.distributed.tensor.parallel import parallelize_module

        return parallelize_module(model, mesh, tensor_parallel_plan(model))
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    options = dict(mesh=mesh, reshard_after_forward=run.reshard)
    if run.bf16:
        options["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    layers = model.model.layers
    for index, layer in enumerate(layers):
        if run.checkpoint:
            layers[index] = layer = checkpoint_wrapper(layer)
        fully_shard(layer, **options)
    fully_shard(model, **options)
    return model


def train_one_step(run: Run) -> None:
    from kernels.library import untag

    dev = device()
    reference(dev)  # before anything is tagged
    try:
        model = build(dev)
        if run.kernelize_first:
            kernelize_with_library(model)
        model = wrap(run, model, dev)
        if not run.kernelize_first:
            before = wrapper_state(model)
            kernelize_with_library(model)
            assert wrapper_state(model) == before, "kernelize changed the wrappers"
        assert_kernelized(model)
        ids = batch(dev)
        if run.engine != "tp":  # data parallel: each rank its share of the rows
            ids = ids.chunk(dist.get_world_size())[dist.get_rank()]
        with dtensor_fallbacks() as fallbacks:
            loss, fused = step(model, ids)
        assert not fallbacks, [r.getMessage() for r in fallbacks]
        # The fused loss needs a plain lm_head: under tensor parallelism it has the parallel
        # hooks, and the model's own forward computes the loss (from the logits).
        assert fused == (run.engine != "tp"), f"fused loss: {fused}"
        if run.engine != "tp":
            loss = mean_over_ranks(loss)
        dtype = torch.bfloat16 if run.bf16 else torch.float32
        check_against_reference(loss, gathered_gradients(model), dtype, dev)
    finally:
        untag()


CASES = {str(run): functools.partial(train_one_step, run) for run in RUNS}


@pytest.fixture(scope="module", params=["gloo", pytest.param("nccl", marks=pytest.mark.gpu)])
def outcomes(request):
    if request.param == "nccl" and not under_torchrun() and torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs (torchrun --nproc-per-node 2 -m pytest ... -m gpu)")
    return run_cases(__name__, list(CASES), backend=request.param)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_training_step_matches_one_process(outcomes, case):
    if outcomes[case] is not None:
        pytest.fail(outcomes[case], pytrace=False)
