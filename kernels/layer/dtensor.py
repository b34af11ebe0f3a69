"""Kernel layers on DTensors: what a kernel does when tensor parallelism hands its layer DTensors.

Triton kernels take plain tensors. Under tensor or sequence parallelism (``parallelize_module``,
a transformers ``tp_plan``) a layer may get DTensors instead: a norm under ``SequenceParallel``
gets the sequence-sharded hidden states and holds its weight as a replicated DTensor. So
`kernelize` binds each kernel layer's forward through `shard_aware_forward`: a call without
DTensors goes straight to the kernel, and a call with DTensors follows the *shard rule* the
kernel declares as an attribute of its forward function (``SiLU.forward.shard_rule =
"elementwise"``; a function kernel sets it on the function, beside ``has_backward``):

``"elementwise"``
    each output element depends only on the input elements at its position (activations):
    any sharding will do.
``"gated"``
    ``[..., 2d] -> [..., d]`` (``SiluAndMul`` and co.): the last dimension must be whole.
``"norm"``
    normalises over the trailing dimensions (``len(module.normalized_shape)``, else the last
    one): those must be whole; the module's parameters must be replicated DTensors.
``"rotary"``
    ``apply_rotary_pos_emb(q, k, cos, sin, ...)``: q and k placed alike with head_dim whole
    (sharded by heads, batch or sequence), and cos and sin sharded the way q's positions are:
    replicated where q is sharded by heads, sharded along their own batch or sequence
    dimension where q is sharded along it.
``"dtensor"``
    the kernel takes DTensors itself (``SwiGLUMLP`` calls the module's own projections, which
    are the parallelised modules): its forward is bound as it is.
``"plain"``
    the kernel takes plain tensors only: on DTensors the module runs its own forward.

In every rule no input may be a partial sum (``Partial``), and DTensor and plain tensor
arguments may not be mixed (a DTensor op refuses that too). When the rule holds, the kernel
runs on each rank's local shard: DTensor arguments become their local tensors, the module's
DTensor parameters are read as theirs (through a view of the module, which is not changed),
and each tensor output becomes a DTensor with its input's mesh and placements. Gradients flow
through both conversions: a replicated parameter's gradient is marked as a partial sum over
the mesh dimensions where the input is sharded, as DTensor's own ops mark it. Otherwise, or
for a kernel that declares no rule, the call runs the module's own forward (whose DTensor ops
redistribute as they need), logged once per layer class, kernel and reason on the
``kernels.layer.dtensor`` logger: never a wrong result. A rule decides from meshes, placements
and global shapes only, which every rank sees alike, so the ranks all run locally or all fall
back (whose collectives they must run together).

The rule is an attribute of the forward function rather than a class member, so a kernel layer
keeps only the members Hugging Face's ``kernels`` allows, and loads there unchanged.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .own_forward import own_forward

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.distributed.tensor import DTensor

logger = logging.getLogger(__name__)

#: The attribute of a kernel's forward function (or of a function kernel) naming its rule.
SHARD_RULE_ATTRIBUTE = "shard_rule"
#: The rule of kernels that take DTensors themselves: their forward is bound unwrapped.
TAKES_DTENSORS = "dtensor"


def shard_rule_of(kernel: type) -> str | None:
    """The shard rule `kernel` declares on its forward (or on the function a function kernel
    wraps), or None."""
    forward = getattr(kernel, "forward", None)
    while forward is not None:
        rule = getattr(forward, SHARD_RULE_ATTRIBUTE, None)
        if rule is not None:
            return rule
        forward = getattr(forward, "__wrapped__", None)
    return None


@functools.cache
def shard_aware_forward(kernel: type[nn.Module]) -> Callable:
    """The function `kernelize` binds to a module for `kernel`: ``kernel.forward`` itself for a
    kernel that takes DTensors (rule ``"dtensor"``), else a wrapper (``__wrapped__`` is
    ``kernel.forward``) that follows the kernel's shard rule when DTensors come."""
    forward = kernel.forward
    name = shard_rule_of(kernel)
    if name == TAKES_DTENSORS:
        return forward
    rule = RULES.get(name)

    @functools.wraps(forward)
    def shard_aware(self, *args, **kwargs):
        # DTensors exist only once their module is imported: until then, one dict lookup.
        dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
        if dtensor is None or not _has_dtensor(dtensor, self, args, kwargs):
            return forward(self, *args, **kwargs)
        return _run_on_dtensors(dtensor, kernel, name, rule, self, args, kwargs)

    return shard_aware


def _has_dtensor(dtensor: type, module: nn.Module, args: tuple, kwargs: dict) -> bool:
    for values in (args, kwargs.values(), module._parameters.values()):
        for value in values:
            if isinstance(value, dtensor):
                return True
    return False


@dataclass(frozen=True)
class LocalCall:
    """How a rule runs one call on the local shards."""

    #: Arguments to replace (by name), each DTensor by its local tensor.
    arguments: dict[str, Any]
    #: The module's DTensor parameters (by name) as the local tensors the kernel reads.
    parameters: dict[str, torch.Tensor]
    #: For each tensor output, by position, the DTensor argument whose mesh, placements and
    #: global sizes (along its sharded dimensions) it takes; the last one serves the rest.
    references: tuple[DTensor, ...]


#: A rule: (module, bound arguments without self) -> how to run locally, or why not.
Rule = Callable[["nn.Module", dict], "LocalCall | str"]


def _run_on_dtensors(
    dtensor: type, kernel: type[nn.Module], name, rule, module: nn.Module, args, kwargs
):
    bound = inspect.signature(kernel.forward).bind(module, *args, **kwargs)
    bound.apply_defaults()
    self_name, *names = bound.arguments
    if rule is None:
        call = (
            "the kernel declares no shard rule"
            if name is None
            else f"the kernel declares shard rule {name!r}, which this version does not know"
        )
    else:
        call = rule(module, {n: bound.arguments[n] for n in names})
    if isinstance(call, LocalCall):
        bound.arguments.update(call.arguments)
        left = [
            *bound.args[1:],
            *bound.kwargs.values(),
            *(p for n, p in module._parameters.items() if n not in call.parameters),
        ]
        if any(isinstance(value, dtensor) for value in left):
            call = "a DTensor is left that its shard rule does not cover"
        else:
            if call.parameters:
                bound.arguments[self_name] = _LocalParameters(module, call.parameters)
            return _to_dtensors(kernel.forward(*bound.args, **bound.kwargs), call.references)
    _log_fallback(module, kernel, call)
    return own_forward(module)(module, *args, **kwargs)


_logged: set = set()


def _log_fallback(module: nn.Module, kernel: type, reason: str) -> None:
    key = (type(module), kernel, reason)
    if key in _logged:
        return
    _logged.add(key)
    logger.info(
        "%s runs its own forward, not kernel layer %s, on DTensor inputs: %s (logged once)",
        type(module).__name__,
        kernel.__name__,
        reason,
    )


class _LocalParameters:
    """The module as a kernel sees it on local shards: its DTensor parameters replaced by their
    local tensors, every other attribute read from the module itself."""

    __slots__ = ("_module", "_local")

    def __init__(self, module: nn.Module, local: dict) -> None:
        self._module = module
        self._local = local

    def __getattr__(self, name: str):
        if name in _LocalParameters.__slots__:  # not set yet: torch.compile makes the object
            raise AttributeError(name)  # before it runs __init__
        local = self._local.get(name)
        return local if local is not None else getattr(self._module, name)


# ---- the rules ---------------------------------------------------------------------------------


def _local(t: DTensor, grad_placements: list | None = None) -> torch.Tensor:
    """`t`'s local tensor (differentiably), waited for."""
    return _waited(t.to_local(grad_placements=grad_placements))


def _waited(t: torch.Tensor) -> torch.Tensor:
    """`t`, or the tensor a redistribution still in flight will give (an
    ``AsyncCollectiveTensor``, which torch ops wait for but a kernel reading the memory itself
    does not), differentiably."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor, wait_tensor

    return wait_tensor(t) if isinstance(t, AsyncCollectiveTensor) else t


def _spec(t: DTensor) -> tuple:
    return t.device_mesh, tuple(t.placements)


def _sharded_dims(t: DTensor) -> set[int]:
    from torch.distributed.tensor import Shard

    # isinstance rather than is_shard(), which is the same test but does not narrow the type.
    return {p.dim % t.ndim for p in t.placements if isinstance(p, Shard)}


def _unshardable(what: str, t: DTensor, whole: int, kind: str) -> str | None:
    """Why `t`'s placements keep a kernel from running on its local shard, or None: a partial
    sum, a placement other than Shard and Replicate, or a shard of its last `whole` dims."""
    from torch.distributed.tensor import Shard

    for index, placement in enumerate(t.placements):
        if placement.is_partial():
            return f"{what} is a partial sum ({placement}) on mesh dimension {index}"
        if isinstance(placement, Shard):
            dim = placement.dim % t.ndim
            if dim >= t.ndim - whole:
                return f"{what} is sharded along dimension {dim}, which the kernel {kind}"
        elif not placement.is_replicate():
            return f"{what} has placement {placement} on mesh dimension {index}"
    return None


def _same_placements(arguments: dict) -> DTensor | str:
    """The first tensor argument when every tensor argument is a DTensor placed like it (same
    mesh and placements), else why not."""
    import torch
    from torch.distributed.tensor import DTensor

    reference = None
    for name, value in arguments.items():
        if not isinstance(value, torch.Tensor):
            continue
        if not isinstance(value, DTensor):
            return f"argument {name!r} is a plain tensor beside DTensors"
        if reference is None:
            reference = value
        elif _spec(value) != _spec(reference):
            return (
                f"its DTensor arguments are placed differently ({reference.placements} and "
                f"{name!r} {value.placements})"
            )
    return "only its parameters are DTensors" if reference is None else reference


def _local_parameters(module: nn.Module, reference: DTensor) -> dict | str:
    """The module's own parameters as local tensors for a call whose input is placed like
    `reference`: each must be a DTensor replicated on its mesh. Its gradient on a rank is a
    partial sum over the mesh dimensions where the input is sharded."""
    from torch.distributed.tensor import DTensor, Partial, Replicate

    grad_placements = [Partial() if p.is_shard() else Replicate() for p in reference.placements]
    local = {}
    for name, param in module._parameters.items():
        if param is None:
            continue
        if not isinstance(param, DTensor):
            return f"its parameter {name!r} is a plain tensor beside DTensor inputs"
        if param.device_mesh != reference.device_mesh or not all(
            p.is_replicate() for p in param.placements
        ):
            return (
                f"its parameter {name!r} is not replicated on the input's mesh ({param.placements})"
            )
        local[name] = _local(param, grad_placements)
    return local


def _trailing_whole(whole: Callable[[nn.Module], int], kind: str) -> Rule:
    """A rule for kernels that work along the trailing `whole(module)` dimensions of their
    tensor arguments, placed alike, and independently at every other position."""

    def rule(module: nn.Module, arguments: dict) -> LocalCall | str:
        from torch.distributed.tensor import DTensor

        reference = _same_placements(arguments)
        if isinstance(reference, str):
            return reference
        problem = _unshardable("the input", reference, whole(module), kind)
        if problem is not None:
            return problem
        parameters = _local_parameters(module, reference)
        if isinstance(parameters, str):
            return parameters
        # Every tensor argument is a DTensor here (_same_placements).
        local = {n: _local(v) for n, v in arguments.items() if isinstance(v, DTensor)}
        return LocalCall(local, parameters, (reference,))

    return rule


def _normalised_dims(module: nn.Module) -> int:
    """How many trailing dimensions a norm normalises over: ``len(normalized_shape)`` where
    the module has one (``torch.nn.LayerNorm``), else 1 (transformers' RMSNorms)."""
    shape = getattr(module, "normalized_shape", None)
    return len(shape) if isinstance(shape, (tuple, list)) and shape else 1


def _rotary(module: nn.Module, arguments: dict) -> LocalCall | str:
    from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard

    names = ("q", "k", "cos", "sin")
    tensors = [t for name in names if isinstance(t := arguments.get(name), DTensor)]
    if len(tensors) != len(names):
        return "q, k, cos and sin are not all DTensors"
    q, k, cos, sin = tensors
    if q.ndim != 4 or _spec(q) != _spec(k):
        return f"q and k are not 4-D DTensors placed alike ({q.placements}, {k.placements})"
    problem = _unshardable("q", q, 1, "rotates (head_dim)")
    if problem is not None:
        return problem
    heads = arguments.get("unsqueeze_dim", 1) % 4
    # cos and sin are (batch, seq, head_dim): q's dimensions without the heads one.
    expected: list[Placement] = []
    grads: list[Placement] = []
    for placement in q.placements:
        if isinstance(placement, Shard) and placement.dim % 4 != heads:
            dim = placement.dim % 4
            expected.append(Shard(dim if dim < heads else dim - 1))
            grads.append(expected[-1])
        else:
            expected.append(Replicate())
            # Sharded by heads, a rank's cos gradient sums over its own heads only.
            grads.append(Partial() if placement.is_shard() else Replicate())
    for name, t in (("cos", cos), ("sin", sin)):
        if _spec(t) != (q.device_mesh, tuple(expected)):
            return (
                f"{name} is placed {t.placements}, not {tuple(expected)} as q's placements "
                f"{q.placements} need"
            )
    local = {"q": _local(q), "k": _local(k), "cos": _local(cos, grads), "sin": _local(sin, grads)}
    return LocalCall(local, {}, (q, k))


RULES: dict[str | None, Rule] = {
    "elementwise": _trailing_whole(lambda module: 0, "computes over whole"),
    "gated": _trailing_whole(lambda module: 1, "splits into gate and up halves"),
    "norm": _trailing_whole(_normalised_dims, "normalises over"),
    "rotary": _rotary,
    "plain": lambda module, arguments: "the kernel takes plain tensors only",
}


# ---- outputs -----------------------------------------------------------------------------------


def _to_dtensors(out: Any, references: tuple) -> Any:
    """The kernel's output with each tensor made a DTensor placed like its reference."""
    import torch

    if isinstance(out, torch.Tensor):
        return _from_local(out, references[0])
    if isinstance(out, tuple):
        items = [
            _from_local(o, references[min(i, len(references) - 1)])
            if isinstance(o, torch.Tensor)
            else o
            for i, o in enumerate(out)
        ]
        return tuple(items) if type(out) is tuple else type(out)(*items)
    return out


def _from_local(local: torch.Tensor, reference: DTensor) -> DTensor:
    """`local` as the shard of a DTensor with `reference`'s mesh and placements. Its global size
    is `reference`'s along the sharded dimensions (shards may be uneven) and its own along the
    others; its global strides keep the local tensor's memory order."""
    import torch
    from torch.distributed.tensor import DTensor

    if local.requires_grad and not torch.compiler.is_compiling():
        # The output's gradient comes back through the DTensor, maybe still in flight (an
        # AsyncCollectiveTensor, in eager mode only: a compiled graph waits for its collectives
        # itself). Traced, the hook would also cost the graph: with one registered on a tensor
        # made inside the graph, Dynamo (torch 2.13) loses later attribute stores on objects made
        # there too (transformers 5.x's DynamicLayer.device), and the whole forward runs eagerly.
        local.register_hook(_waited)
    sharded = _sharded_dims(reference)
    shape = torch.Size(
        reference.shape[d] if d in sharded else local.shape[d] for d in range(local.ndim)
    )
    return DTensor.from_local(
        local,
        reference.device_mesh,
        reference.placements,
        shape=shape,
        stride=_strides_in_order_of(local, shape),
    )


def _strides_in_order_of(local: torch.Tensor, shape: torch.Size) -> tuple[int, ...]:
    """Dense strides for `shape` with the dimensions in `local`'s memory order (outermost first)."""
    now = local.stride()
    order = sorted(range(local.ndim), key=lambda d: (-now[d], d))
    strides = [0] * local.ndim
    step = 1
    for d in reversed(order):
        strides[d] = step
        step *= shape[d]
    return tuple(strides)
