"""Checking each chosen kernel against the layer it replaces, on the layer's real input.

A kernel can load, pass the layer rules and still compute something else: an RMSNorm
kernel mapped onto a Gemma-style norm that scales by ``(1 + weight)`` has the right
signature and the wrong result. `kernelize(..., verify=example_inputs)` runs the model once
on the example, with hooks that capture what each tagged layer receives, then calls the
layer's own forward and the kernel's forward on that same input and compares outputs (and,
for TRAINING, the gradients with respect to the inputs and the layer's parameters).

All of it runs inside `left_as_it_was`: the model, its gradients, the random generators and
torch's global flags are put back as they were afterwards, whether verification passes, falls
back or raises, so the next forward is the one it would have been without ``verify=``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from ..errors import KernelsError, KernelVerificationError, as_sentence
from ..mapping.mode import Mode
from .decisions import ExampleInputs, Plan
from .own_forward import own_forward
from .swap import kernel_layer_of, use_kernel_forward, use_original_forward
from .untouched import left_as_it_was

if TYPE_CHECKING:
    import torch
    from torch import nn

logger = logging.getLogger(__name__)

#: Marks a captured input's detached copy whose original needed grad (a tensor attribute, so
#: that it travels inside nested arguments).
_NEEDS_GRAD = "_kernels_needs_grad"

#: Largest relative error ‖kernel − layer‖ / ‖layer‖ accepted per dtype: a few units of the
#: dtype's rounding error, far below what a kernel with other semantics produces.
TOLERANCE = {"float64": 1e-9, "float32": 1e-4, "float16": 5e-3, "bfloat16": 3e-2}


@dataclasses.dataclass(frozen=True)
class _Call:
    args: tuple
    kwargs: dict


def verify_plan(
    model: nn.Module, plan: Plan, example: ExampleInputs, *, use_fallback: bool
) -> Plan:
    """Return `plan` with every kernel that disagrees with its layer turned into a fallback.

    The model is left exactly as it was (`left_as_it_was`), whether this returns or raises.
    """
    _check_example(example)
    chosen = [d for d in plan.decisions if d.kernel is not None]
    if not chosen:
        return plan
    _refuse_lazy_modules(model)
    with left_as_it_was(model, [d.module for d in plan.decisions]):
        return _verified(model, plan, chosen, example, use_fallback=use_fallback)


def _verified(
    model: nn.Module, plan: Plan, chosen: list, example: ExampleInputs, *, use_fallback: bool
) -> Plan:
    training = Mode.TRAINING in plan.mode
    calls = capture_layer_inputs(
        model, [d.module for d in chosen], example, keep_graph_flags=training
    )
    decisions = []
    for decision in plan.decisions:
        if decision.kernel is None:
            decisions.append(decision)
            continue
        label = f"{decision.path or '<model>'} ({type(decision.module).__name__})"
        call = calls.get(id(decision.module))
        if call is None:
            logger.warning(
                "%s: not verified, the example inputs never reached this layer",
                decision.path or "<model>",
            )
            decisions.append(decision)
            continue
        try:
            problem = compare_kernel(decision.module, decision.kernel, call, training=training)
        except KernelVerificationError as exc:
            raise KernelVerificationError(f"{label}: {exc}") from exc.__cause__
        if problem is None:
            decisions.append(decision)
            continue
        candidate = decision.resolution.chosen
        assert candidate is not None  # a decision with a kernel loaded it from the chosen one
        reason = (
            f"kernel layer {decision.kernel.__name__} from {candidate.repository} "
            f"failed verification: {problem}"
        )
        if not use_fallback:
            raise KernelVerificationError(as_sentence(f"{label}: {reason}"))
        decisions.append(
            dataclasses.replace(
                decision, kernel=None, fallback_reason=reason, fallback_level=logging.WARNING
            )
        )
    return dataclasses.replace(plan, decisions=tuple(decisions))


def capture_layer_inputs(
    model: nn.Module, modules: list[nn.Module], example: ExampleInputs, *, keep_graph_flags: bool
) -> dict[int, _Call]:
    """Run `model` on `example` with the layers' own forwards and record each one's first input."""
    import torch

    current = {id(m): kernel for m in modules if (kernel := kernel_layer_of(m)) is not None}
    calls: dict[int, _Call] = {}
    handles = []
    for module in modules:
        use_original_forward(module)

        def record(mod, args, kwargs):
            if id(mod) not in calls:
                calls[id(mod)] = _Call(
                    _detach(args, keep_graph_flags), _detach(kwargs, keep_graph_flags)
                )

        handles.append(module.register_forward_pre_hook(record, with_kwargs=True))
    try:
        with torch.set_grad_enabled(keep_graph_flags):
            _run(model, example)
    except KernelsError:
        raise
    except Exception as exc:
        raise KernelVerificationError(
            f"verify=: the model raised {type(exc).__name__} on the example inputs: "
            f"{as_sentence(str(exc))} Pass inputs the model itself runs on (model(x), model(*args) or model(**kwargs))."
        ) from exc
    finally:
        for handle in handles:
            handle.remove()
        for module in modules:
            if id(module) in current:
                use_kernel_forward(module, current[id(module)], path="")
    return calls


def compare_kernel(
    module: nn.Module, kernel: type[nn.Module], call: _Call, *, training: bool
) -> str | None:
    """Why `kernel.forward` disagrees with the module's own forward on `call`, or None.

    A kernel that raises disagrees (the reason names the exception); the layer's own forward
    raising is `KernelVerificationError`, since then there is nothing to compare with.
    """
    original = own_forward(module)
    try:
        expected = _outputs(original, module, call, training=training)
    except Exception as exc:
        raise KernelVerificationError(
            f"the layer's own forward raised {type(exc).__name__} on the input the example "
            f"gave it: {exc}"
        ) from exc
    try:
        got = _outputs(kernel.forward, module, call, training=training)
    except Exception as exc:
        return f"it raised {type(exc).__name__}: {exc}"
    return _compare_outputs(expected[0], got[0]) or _compare_gradients(expected[1], got[1])


def _outputs(forward: Any, module: nn.Module, call: _Call, *, training: bool):
    """The tensors `forward` returns on `call`, and (TRAINING) their gradients by input/parameter."""
    import torch

    if training:
        return _forward_backward(forward, module, call)
    with torch.no_grad():
        return _tensors(forward(module, *call.args, **call.kwargs)), []


def _forward_backward(forward: Any, module: nn.Module, call: _Call):
    """Outputs of `forward` on `call`, and the gradients of a fixed random loss by input/parameter."""
    import torch

    args, kwargs = _with_grad(call.args), _with_grad(call.kwargs)
    inputs = [t for t in _tensors((args, kwargs)) if t.requires_grad]
    params = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
    names = [f"input {i}" for i in range(len(inputs))] + [name for name, _ in params]
    with torch.enable_grad():
        outputs = [t for t in _tensors(forward(module, *args, **kwargs)) if t.is_floating_point()]
        differentiable = [t for t in outputs if t.requires_grad]
        grads: tuple = (None,) * len(names)
        if differentiable and names:
            # Both forwards get the same cotangents: drawn from a fixed seed, by output shape.
            generator = torch.Generator().manual_seed(0)
            cotangents = [
                torch.randn(t.shape, generator=generator).to(t.device, t.dtype)
                for t in differentiable
            ]
            grads = torch.autograd.grad(
                differentiable, inputs + [p for _, p in params], cotangents, allow_unused=True
            )
    return [o.detach() for o in outputs], list(zip(names, grads, strict=True))


def _compare_outputs(expected: list, got: list) -> str | None:
    if len(expected) != len(got):
        return f"it returns {len(got)} tensors where the layer returns {len(expected)}"
    for index, (e, g) in enumerate(zip(expected, got, strict=True)):
        problem = _tensor_difference("output" if len(expected) == 1 else f"output {index}", e, g)
        if problem:
            return problem
    return None


def _compare_gradients(expected: list, got: list) -> str | None:
    for (name, e), (_, g) in zip(expected, got, strict=True):
        if e is None and g is None:
            continue
        if e is None or g is None:
            return f"{'the kernel' if g is None else 'the layer'} gives no gradient for {name}"
        problem = _tensor_difference(f"gradient of {name}", e, g)
        if problem:
            return problem
    return None


def _tensor_difference(label: str, expected: torch.Tensor, got: torch.Tensor) -> str | None:
    import torch

    if expected.shape != got.shape:
        return f"{label} has shape {tuple(got.shape)} where the layer gives {tuple(expected.shape)}"
    if expected.dtype != got.dtype:
        return f"{label} has dtype {got.dtype} where the layer gives {expected.dtype}"
    if not expected.is_floating_point():
        return None if torch.equal(expected, got) else f"{label} differs"
    e, g = expected.detach().double(), got.detach().double()
    if not torch.equal(e.isnan(), g.isnan()):
        return f"{label} has NaNs where the layer has none (or the other way round)"
    e, g = e.nan_to_num(), g.nan_to_num()
    error = ((g - e).norm() / e.norm().clamp_min(1e-30)).item()
    tolerance = TOLERANCE.get(str(expected.dtype).removeprefix("torch."), 1e-4)
    if error > tolerance:
        return (
            f"{label} differs from the layer's by {error:.3g} (relative; tolerance {tolerance:g} "
            f"for {expected.dtype})"
        )
    return None


def _check_example(example: ExampleInputs) -> None:
    import torch

    if not isinstance(example, (torch.Tensor, dict, tuple, list)):
        raise KernelVerificationError(
            f"verify= takes a tensor, a tuple of positional arguments or a dict of keyword arguments "
            f"for the model, got {type(example).__name__}."
        )


def _run(model: nn.Module, example: ExampleInputs) -> None:
    import torch

    if isinstance(example, torch.Tensor):
        model(example)
    elif isinstance(example, dict):
        model(**example)
    else:
        model(*example)


def _refuse_lazy_modules(model: nn.Module) -> None:
    """Lazy parameters are created, at random, by the first forward: not a change to undo."""
    from torch.nn.parameter import is_lazy

    for path, module in model.named_modules():
        tensors = [*module._parameters.values(), *module._buffers.values()]
        if any(t is not None and is_lazy(t) for t in tensors):
            raise KernelVerificationError(
                f"verify= cannot run {path or '<model>'} ({type(module).__name__}): its parameters "
                "are not initialised yet and the first forward would create them. Run the model "
                "once before kernelize(..., verify=...), or kernelize without verify=."
            )


def _detach(value: Any, keep_grad_flag: bool) -> Any:
    """A copy of `value` whose tensors are detached clones (remembering who needed grad)."""
    import torch

    if isinstance(value, torch.Tensor):
        copy = value.detach().clone()
        if keep_grad_flag and value.requires_grad:
            setattr(copy, _NEEDS_GRAD, True)
        return copy
    if isinstance(value, tuple):
        return tuple(_detach(v, keep_grad_flag) for v in value)
    if isinstance(value, list):
        return [_detach(v, keep_grad_flag) for v in value]
    if isinstance(value, dict):
        return {k: _detach(v, keep_grad_flag) for k, v in value.items()}
    return value


def _with_grad(value: Any) -> Any:
    """Fresh leaf copies of the captured tensors, requiring grad where the real ones did."""
    import torch

    if isinstance(value, torch.Tensor):
        copy = value.detach().clone()
        if getattr(value, _NEEDS_GRAD, False):
            copy.requires_grad_(True)
        return copy
    if isinstance(value, tuple):
        return tuple(_with_grad(v) for v in value)
    if isinstance(value, list):
        return [_with_grad(v) for v in value]
    if isinstance(value, dict):
        return {k: _with_grad(v) for k, v in value.items()}
    return value


def _tensors(value: Any) -> list:
    """The tensors in a (nested) output, in order."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []
