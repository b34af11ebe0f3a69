"""Running code on a model and leaving it exactly as it was: `left_as_it_was`.

`kernelize(..., verify=...)` runs the model (forwards, backwards) to compare kernels with the
layers they replace; the user's model must come out of it bit for bit as it went in.
"""

from __future__ import annotations

import contextlib
import functools
import random
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn


@contextlib.contextmanager
def left_as_it_was(model: nn.Module, modules: Iterable[nn.Module] = ()) -> Iterator[None]:
    """Run the body, then put `model` (and `modules`) back as they were, whether it raised or not.

    Restored: each module's attributes (``training``, hooks, which tensor each parameter and
    buffer name is bound to, attributes the body added or rebound); the values of parameters
    and buffers, copied back in place so the tensor objects stay the ones the caller may hold;
    each parameter's ``.grad`` (object and values; None stays None); the random generators
    (Python's, numpy's, torch's CPU generator and those of initialised accelerators); and
    torch's grad mode, default dtype, deterministic-algorithms, autocast and cuDNN flags.
    Not restored: tensors or objects held in plain attributes and changed in place.

    Costs one copy of every parameter, buffer and existing gradient, on its own device, while
    the body runs. Tensors whose bits did not change are not written back, so their autograd
    version counters only move when the body itself changed them.
    """
    unique = list({id(m): m for m in [*model.modules(), *modules]}.values())
    attributes = [_ModuleAttributes(m) for m in unique]
    values = _TensorValues(unique)
    randomness = _RandomState({t.device.type for t, _ in values.tensors})
    flags = _GlobalFlags()
    try:
        yield
    finally:
        for saved in attributes:
            saved.restore()
        values.restore()
        randomness.restore()
        flags.restore()


# Containers torch keeps in a module's __dict__ and mutates in place: hooks, _parameters,
# _buffers, _modules, _non_persistent_buffers_set. Only these exact types are refilled, so a
# dict subclass with its own rules (transformers' ModelOutput refuses update) is only rebound.
_CONTAINERS = (dict, OrderedDict, set, list)


class _ModuleAttributes:
    """A module's __dict__: which object each name is bound to, and its containers' contents."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.bound = dict(vars(module))
        self.contents = {
            name: list(value.items()) if isinstance(value, dict) else list(value)
            for name, value in self.bound.items()
            if type(value) in _CONTAINERS
        }

    def restore(self) -> None:
        current = vars(self.module)
        for name in [n for n in current if n not in self.bound]:
            del current[name]
        current.update(self.bound)
        for name, items in self.contents.items():
            container = self.bound[name]
            container.clear()
            if isinstance(container, (dict, set)):
                container.update(items)
            else:
                container.extend(items)


class _TensorValues:
    """A copy of every parameter, buffer and gradient of `modules`, to copy back in place."""

    def __init__(self, modules: list[nn.Module]):
        import torch

        owned = [
            t
            for m in modules
            for t in [*m._parameters.values(), *m._buffers.values()]
            if t is not None
        ]
        unique = list({id(t): t for t in owned}.values())
        with torch.no_grad():
            self.tensors = [(t, t.detach().clone()) for t in unique]
            self.grads = [
                (t, t.grad, None if t.grad is None else t.grad.detach().clone())
                for t in unique
                if isinstance(t, torch.nn.Parameter)
            ]

    def restore(self) -> None:
        import torch

        with torch.no_grad():
            for tensor, saved in self.tensors:
                _write_back(tensor, saved)
            for param, grad, saved_grad in self.grads:
                if param.grad is not grad:
                    param.grad = grad
                # saved_grad is None exactly when grad is (both taken from one param.grad).
                if grad is not None and saved_grad is not None:
                    _write_back(grad, saved_grad)


def _write_back(tensor: torch.Tensor, saved: torch.Tensor) -> None:
    if _same_bits(tensor, saved):
        return
    if tensor.shape == saved.shape and tensor.dtype == saved.dtype:
        tensor.copy_(saved)
    else:  # resized or retyped in place: copy_ cannot undo that, rebinding the data can
        tensor.data = saved


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality: torch.equal calls -0.0 and 0.0 equal and a NaN unequal to itself."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    a, b = a.detach(), b.detach()
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    if a.is_floating_point() and a.layout == torch.strided and a.element_size() in ints:
        a, b = a.view(ints[a.element_size()]), b.view(ints[b.element_size()])
    return torch.equal(a, b)


class _RandomState:
    """The global random generators a forward draws from (dropout, sampling, LayerDrop)."""

    def __init__(self, device_types: set[str]):
        import torch

        self.python = random.getstate()
        numpy = sys.modules.get("numpy")
        self.numpy = (numpy, numpy.random.get_state()) if numpy is not None else None
        self.cpu = torch.get_rng_state()
        self.devices = []
        # Only initialised accelerators: reading an uninitialised one's state would initialise
        # it (torch.random.fork_rng does), which is itself a change to the process.
        for device_type in sorted((device_types | {"cuda", "xpu"}) - {"cpu", "meta"}):
            module = getattr(torch, device_type, None)
            is_initialized = getattr(module, "is_initialized", None)
            if module is None or is_initialized is None or not is_initialized():
                continue
            if hasattr(module, "get_rng_state_all"):
                self.devices.append((module.set_rng_state_all, module.get_rng_state_all()))
            elif hasattr(module, "get_rng_state"):
                self.devices.append((module.set_rng_state, module.get_rng_state()))

    def restore(self) -> None:
        import torch

        random.setstate(self.python)
        if self.numpy is not None:
            self.numpy[0].random.set_state(self.numpy[1])
        torch.set_rng_state(self.cpu)
        for set_state, state in self.devices:
            set_state(state)


class _GlobalFlags:
    """Process-wide torch settings a forward can switch and forget to switch back.

    Matmul precision (``allow_tf32``, ``fp32_precision``) is left out: on torch 2.9+ merely
    reading it raises once a program has mixed its legacy and new APIs.
    """

    def __init__(self):
        import torch

        cudnn = torch.backends.cudnn
        accessors: list[tuple[Callable[[], Any], Callable[[Any], Any]]] = [
            (torch.is_grad_enabled, torch.set_grad_enabled),
            (torch.get_default_dtype, torch.set_default_dtype),
            (
                lambda: (
                    torch.are_deterministic_algorithms_enabled(),
                    torch.is_deterministic_algorithms_warn_only_enabled(),
                ),
                lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1]),
            ),
            (torch.is_autocast_cache_enabled, torch.set_autocast_cache_enabled),
        ]
        for device_type in ("cpu", "cuda"):
            accessors += [
                (
                    functools.partial(torch.is_autocast_enabled, device_type),
                    functools.partial(torch.set_autocast_enabled, device_type),
                ),
                (
                    functools.partial(torch.get_autocast_dtype, device_type),
                    functools.partial(torch.set_autocast_dtype, device_type),
                ),
            ]
        for name in ("enabled", "benchmark", "deterministic"):
            accessors.append(
                (functools.partial(getattr, cudnn, name), functools.partial(setattr, cudnn, name))
            )
        self.saved = [(get, set_, get()) for get, set_ in accessors]

    def restore(self) -> None:
        for get, set_, value in self.saved:
            if get() != value:
                set_(value)
