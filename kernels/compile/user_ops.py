"""A user's kernel as a ``torch.library`` op: what lets a plain Triton launcher live in a graph
that aot_autograd and inductor trace, and train.

A function that launches a Triton kernel (``relu_kernel[grid](x, y, n)``) cannot be traced
with fake tensors: the launcher wants real memory. Wrapped as a custom op it is one opaque
node, and the wrapping supplies what tracing and training need:

- a fake implementation: the pattern's result has the shape and dtype of the kernel's first
  argument (every pattern's does), contiguous;
- a backward: the user's, when they register one (wrapped as a second op, so it is traced
  the same way), else the gradient of the pattern's PyTorch reference (``torch.func.vjp``),
  computed from the saved inputs;
- checks that turn a kernel's wrong result into an error that names it, rather than wrong
  numbers further on.

The kernel receives contiguous tensors (a copy is made of a strided input), so a kernel that
indexes memory as one flat array, as most hand-written ones do, is right for any input.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence

import torch

from .errors import KernelOutputError
from .patterns import Pattern

#: The ``torch.library`` namespace of the ops made for user kernels.
NAMESPACE = "kernels_compile"

# Ops live in one process-wide registry and cannot be removed: each registration gets a
# fresh name, so a kernel registered twice (in two registries, say) makes two ops.
_serial = itertools.count()


def tensor_positions(pattern: Pattern) -> tuple[int, ...]:
    """The positions of the pattern's tensor parameters (``Tensor`` or ``Tensor?``)."""
    schema = torch._C.parse_schema("f" + pattern.signature)
    optional_tensor = torch._C.OptionalType.ofTensor()
    return tuple(
        i for i, arg in enumerate(schema.arguments) if arg.type.isSubtypeOf(optional_tensor)
    )


def _parameter_list(signature: str) -> str:
    """The parameters of a schema string, without the parentheses and the result."""
    return signature[signature.index("(") + 1 : signature.rindex(")")].strip()


def _contiguous(args: Sequence) -> tuple:
    return tuple(a.contiguous() if isinstance(a, torch.Tensor) else a for a in args)


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')} {list(t.shape)} on {t.device}"


def check_output(out: object, args: Sequence, label: str, pattern: str) -> torch.Tensor:
    """``out`` if it is what a kernel of ``pattern`` must return for ``args``: a new tensor of
    the first argument's shape, dtype and device; else `KernelOutputError` naming ``label``."""
    like = args[0]
    if not isinstance(out, torch.Tensor):
        raise KernelOutputError(
            f"The kernel {label} registered for '{pattern}' returned {type(out).__name__}; it "
            f"must return one tensor like its first argument ({_describe(like)})."
        )
    if out.shape != like.shape or out.dtype != like.dtype or out.device != like.device:
        raise KernelOutputError(
            f"The kernel {label} registered for '{pattern}' returned {_describe(out)} for an "
            f"input of {_describe(like)}; it must return a tensor of the input's shape, dtype "
            "and device."
        )
    for arg in args:
        if isinstance(arg, torch.Tensor) and _shares_memory(out, arg):
            raise KernelOutputError(
                f"The kernel {label} registered for '{pattern}' returned its input (or a view of "
                "it); it must write a new tensor (torch.empty_like(x)) and leave its inputs "
                "as they are."
            )
    return out


def _reference_grads(
    pattern: Pattern, args: Sequence, positions: Sequence[int], grad: torch.Tensor
) -> tuple:
    """The gradients of the pattern's reference at ``args`` for the tensors at ``positions``."""

    def reference(*tensors):
        full = list(args)
        for position, tensor in zip(positions, tensors, strict=True):
            full[position] = tensor
        return pattern.reference(*full)

    vjp = torch.func.vjp(reference, *(args[p] for p in positions))[1]
    return vjp(grad)


def user_kernel_op(
    pattern: Pattern,
    kernel: Callable,
    label: str,
    backward: Callable | None = None,
) -> torch._ops.OpOverload:
    """``kernel`` as a custom op with the pattern's signature, a fake implementation and a
    backward (``backward``, or the reference's gradient).

    ``backward(grad_output, *args)`` returns the gradient of each tensor argument that is not
    None, in order (one tensor, or a tuple).
    """
    name = f"{pattern.name}_{re.sub(r'[^0-9A-Za-z_]', '_', label)[:40]}_{next(_serial)}"
    positions = tensor_positions(pattern)

    def forward(*args):
        out = kernel(*_contiguous(args))
        out = check_output(out, args, label, pattern.name)
        return out if out.is_contiguous() else out.contiguous()

    op = torch.library.custom_op(
        f"{NAMESPACE}::{name}", forward, mutates_args=(), schema=pattern.signature
    )

    @op.register_fake
    def _(*args):
        return torch.empty_like(args[0], memory_format=torch.contiguous_format)

    backward_op = None
    if backward is not None:
        backward_op = _user_backward_op(pattern, backward, label, name)

    def setup_context(ctx, inputs, output):
        present = tuple(p for p in positions if inputs[p] is not None)
        ctx.save_for_backward(*(inputs[p] for p in present))
        ctx.present = present
        ctx.inputs = tuple(None if i in present else a for i, a in enumerate(inputs))

    def backward_formula(ctx, grad):
        args = list(ctx.inputs)
        for position, tensor in zip(ctx.present, ctx.saved_tensors, strict=True):
            args[position] = tensor
        if backward_op is not None:
            grads = backward_op(grad, *args)
        else:
            grads = _reference_grads(pattern, args, ctx.present, grad)
        result = [None] * len(args)
        for position, g in zip(ctx.present, grads, strict=True):
            result[position] = g
        return tuple(result)

    op.register_autograd(backward_formula, setup_context=setup_context)
    return getattr(getattr(torch.ops, NAMESPACE), name).default


def _user_backward_op(
    pattern: Pattern, backward: Callable, label: str, name: str
) -> torch._ops.OpOverload:
    schema = f"(Tensor grad_output, {_parameter_list(pattern.signature)}) -> Tensor[]"

    def run(grad, *args):
        inputs = _contiguous(args)
        grads = backward(grad.contiguous(), *inputs)
        if isinstance(grads, torch.Tensor):
            grads = (grads,)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if not isinstance(grads, (tuple, list)) or len(grads) != len(tensors):
            raise KernelOutputError(
                f"The backward of {label} (pattern '{pattern.name}') must return the gradient of "
                f"each of its {len(tensors)} tensor argument(s), in order; it returned "
                f"{type(grads).__name__}"
                + (f" of {len(grads)}" if isinstance(grads, (tuple, list)) else "")
                + "."
            )
        out = []
        for g, t in zip(grads, tensors, strict=True):
            if not isinstance(g, torch.Tensor) or g.shape != t.shape:
                raise KernelOutputError(
                    f"The backward of {label} (pattern '{pattern.name}') returned a gradient "
                    f"{_describe(g) if isinstance(g, torch.Tensor) else type(g).__name__} for an "
                    f"argument of {_describe(t)}; gradients have their argument's shape."
                )
            # An op's outputs may not alias its inputs: the gradient of an identity is a copy.
            if any(_shares_memory(g, a) for a in (grad, *tensors)):
                g = g.clone()
            out.append(g.to(t.dtype).contiguous())
        return out

    op = torch.library.custom_op(
        f"{NAMESPACE}::{name}_backward", run, mutates_args=(), schema=schema
    )

    @op.register_fake
    def _(grad, *args):
        return [
            torch.empty_like(a, memory_format=torch.contiguous_format)
            for a in args
            if isinstance(a, torch.Tensor)
        ]

    return getattr(getattr(torch.ops, NAMESPACE), f"{name}_backward").default
