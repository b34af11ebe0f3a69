"""`KernelizeFallback`: when `kernelize` keeps a layer's original forward instead of raising.

transformers 5.x passes ``use_fallback=KernelizeFallback.ALL`` ("keep the original forward
instead of raising when a kernel can't be loaded, e.g. no compatible build"). Each member
names one cause a layer can end up without a kernel; a flag set says for which causes the
layer falls back (logged) and for which `kernelize` raises. ``True`` and ``False``, the
older spelling, mean `ALL` and `NONE`.
"""

from __future__ import annotations

import enum


class KernelizeFallback(enum.Flag):
    """For which causes `kernelize` keeps a layer's original forward instead of raising.

    Combine members with ``|``; a cause not in the set raises the error named below.
    ``use_fallback=True`` is `ALL` and ``use_fallback=False`` is `NONE`.

    Example:
        ```python
        from kernels import KernelizeFallback, Mode, kernelize

        # Fall back where no kernel is registered or a kernel lacks the mode, but fail loudly
        # when a registered kernel cannot be loaded:
        kernelize(
            model,
            mode=Mode.TRAINING,
            use_fallback=KernelizeFallback.NO_KERNEL | KernelizeFallback.UNSUPPORTED_MODE,
        )
        ```
    """

    #: Raise for every cause.
    NONE = 0
    #: No kernel is registered for the layer name, device type, capability or mode
    #: (otherwise `NoKernelError`).
    NO_KERNEL = enum.auto()
    #: The chosen kernel lacks what the mode needs: a backward for TRAINING, or
    #: ``can_torch_compile = True`` for TORCH_COMPILE (otherwise `NoKernelError`).
    UNSUPPORTED_MODE = enum.auto()
    #: The chosen repository cannot be loaded: Hub unreachable or offline, organisation not
    #: trusted, no build variant for this machine, import error, missing layer (otherwise
    #: `KernelLoadError` or its subclass). Logged as a WARNING.
    LOAD_FAILURE = enum.auto()
    #: ``kernelize(..., verify=...)`` found the kernel's result differs from the layer's
    #: (otherwise `KernelVerificationError`). Logged as a WARNING.
    VERIFICATION_FAILURE = enum.auto()
    #: Every cause above: what transformers 5.x passes, and what ``True`` means.
    ALL = NO_KERNEL | UNSUPPORTED_MODE | LOAD_FAILURE | VERIFICATION_FAILURE


def as_fallback(use_fallback: bool | KernelizeFallback) -> KernelizeFallback:
    """`use_fallback` as a flag set: ``True`` is `ALL`, ``False`` is `NONE`."""
    if isinstance(use_fallback, KernelizeFallback):
        return use_fallback
    if isinstance(use_fallback, bool):
        return KernelizeFallback.ALL if use_fallback else KernelizeFallback.NONE
    raise TypeError(
        f"use_fallback must be True, False or a KernelizeFallback (e.g. KernelizeFallback.ALL), "
        f"got {use_fallback!r}."
    )
