"""The overrides registered with PyTorch's dispatcher, counted so that scopes can nest.

Each (operator, dispatch key) is registered once, by the first scope or switch that asks for it,
through its own ``torch.library.Library("aten", "IMPL")``; later holders only count. When the
last holder lets go, that library is destroyed, which removes our kernel from the dispatcher's
list for the key and makes the kernel registered before it (PyTorch's) the one that runs again:
the dispatch table is what it was before, entry for entry.

PyTorch's kernel is captured with ``torch.library.get_kernel`` just before ours is registered,
and every call that ours does not take goes to it. get_kernel came with torch 2.9 (pytorch
#158393); on an older torch no override is registered (`enable` raises): there is no exact way
there to call the kernel an override replaced.

The dispatcher is process-wide: a registration serves every thread, whichever one made it.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from ..errors import KernelsError
from .spec import OverrideSpec

logger = logging.getLogger("kernels.overrides")

#: Device types our overrides can be registered for, and their dispatch keys.
DISPATCH_KEYS = {"cuda": "CUDA", "cpu": "CPU"}

# The key of one registration: (operator, dispatch key).
Key = tuple[str, str]


@dataclass
class _Registration:
    library: torch.library.Library
    holders: int = 0


_lock = threading.RLock()
_registrations: dict[Key, _Registration] = {}


def _get_kernel():
    get_kernel = getattr(torch.library, "get_kernel", None)
    if get_kernel is None:
        raise KernelsError(
            f"aten overrides need torch 2.9 or newer (torch.library.get_kernel, to call PyTorch's "
            f"own kernel for the inputs ours do not take); this is torch {torch.__version__}."
        )
    return get_kernel


@functools.cache
def _impl_options() -> dict:
    # torch 2.11's Library.impl refuses to replace a kernel registered from Python unless told
    # (allow_override defaults to False there, to True in 2.13); say it either way.
    parameters = inspect.signature(torch.library.Library.impl).parameters
    return {"allow_override": True} if "allow_override" in parameters else {}


def _exists(spec: OverrideSpec) -> bool:
    try:
        getattr(torch.ops.aten, spec.op).default  # noqa: B018  (raises when absent)
    except (AttributeError, RuntimeError):
        return False
    return True


def _register(spec: OverrideSpec, dispatch_key: str) -> _Registration:
    get_kernel = _get_kernel()
    kernels = spec.load()
    original = get_kernel(spec.qualname, dispatch_key)
    library = torch.library.Library("aten", "IMPL")
    impl = functools.partial(spec.impl, kernels, original)
    with warnings.catch_warnings():
        # PyTorch warns (once a process) that a kernel is overridden: that is the point here.
        warnings.filterwarnings(
            "ignore", message=r"(?s).*Overriding a previously registered kernel"
        )
        library.impl(spec.op, impl, dispatch_key, with_keyset=True, **_impl_options())
    logger.debug("%s: our kernel registered for %s", spec.qualname, dispatch_key)
    return _Registration(library)


def _registrable(spec: OverrideSpec, dispatch_key: str) -> bool:
    if not _exists(spec):
        logger.info(
            "%s does not exist in torch %s: not overridden", spec.qualname, torch.__version__
        )
        return False
    # Only a kernel PyTorch has for this key is replaced. Registering one where it has none (the
    # CUDA keys of a CPU-only build; _fused_rms_norm's CPU key, which PyTorch decomposes above
    # autograd) would change how the dispatcher routes the operator, autograd included.
    if not torch._C._dispatch_has_kernel_for_dispatch_key(spec.qualname, dispatch_key):
        logger.info(
            "%s has no %s kernel in this torch build to override: left alone",
            spec.qualname,
            dispatch_key,
        )
        return False
    return True


def acquire(specs: Iterable[OverrideSpec], dispatch_keys: Iterable[str]) -> tuple[Key, ...]:
    """Hold the override of each spec for each dispatch key, registering those not held yet.

    Returns the keys held, to be given to `release`; an operator that does not exist in this
    torch, or has no kernel for a key, is skipped (and logged). All or nothing: when one
    registration fails, those made by this call are undone before the error propagates.
    """
    held: list[Key] = []
    with _lock:
        try:
            for spec in specs:
                for dispatch_key in dispatch_keys:
                    key = (spec.op, dispatch_key)
                    registration = _registrations.get(key)
                    if registration is None:
                        if not _registrable(spec, dispatch_key):
                            continue
                        registration = _registrations[key] = _register(spec, dispatch_key)
                    registration.holders += 1
                    held.append(key)
        except BaseException:
            release(held)
            raise
    return tuple(held)


def release(held: Iterable[Key]) -> None:
    """Let go of keys `acquire` returned; the last holder of a key unregisters its override."""
    with _lock:
        for key in held:
            registration = _registrations[key]
            registration.holders -= 1
            if registration.holders == 0:
                del _registrations[key]
                # Library._destroy is how torch.library itself unregisters (its finalizer calls
                # the same); waiting for garbage collection would leave the override in place
                # for an unknown time.
                registration.library._destroy()
                logger.debug("aten::%s: our kernel unregistered for %s", *key)


def registered() -> dict[str, tuple[str, ...]]:
    """``{operator: dispatch keys}`` of the overrides registered now."""
    with _lock:
        out: dict[str, tuple[str, ...]] = {}
        for op, dispatch_key in _registrations:
            out[op] = (*out.get(op, ()), dispatch_key)
        return out
