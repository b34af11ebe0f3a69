"""`KernelizeFallback`: when `kernelize` keeps a layer's original forward instead of raising.

The members are those of Hugging Face's kernels 0.19, one per cause a layer can end up
without a kernel, plus ours for ``kernelize(..., verify=...)``. A flag set says for which
causes the layer falls back (logged) and for which `kernelize` raises. ``use_fallback=True``
(the default) is `DEFAULT`: no kernel registered, or none usable in the mode, falls back,
but a registered kernel that cannot be loaded raises. transformers 5.x passes `ALL`.
"""

from __future__ import annotations

import enum


class KernelizeFallback(enum.Flag):
    """For which causes `kernelize` keeps a layer's original forward instead of raising.

    Combine members with ``|``; a cause not in the set raises the error named below.
    ``use_fallback=True`` is `DEFAULT` and ``use_fallback=False`` is `NONE`.

    - `NONE`: raise for every cause.
    - `NO_LAYER`: the mapping has no entry for the layer name (`NoKernelError`).
    - `NO_DEVICE`: the layer name has no entry for the device type (`NoKernelError`).
    - `NO_COMPATIBLE_PROPERTIES`: no entry's capability range admits the device
      (`NoKernelError`).
    - `NO_COMPATIBLE_MODE`: no repository is registered for a mode that serves the one asked
      for, or the loaded kernel lacks what the mode needs: a backward for TRAINING,
      ``can_torch_compile = True`` for TORCH_COMPILE (`NoKernelError`).
    - `CANNOT_LOAD`: the chosen repository cannot be loaded: Hub unreachable or offline,
      organisation not trusted, no build variant for this machine, import error, missing
      layer (`KernelLoadError` or its subclass, or what a third-party repository's ``load()``
      raised). Logged as a WARNING.
    - `VERIFICATION_FAILURE` (ours): ``kernelize(..., verify=...)`` found the kernel's result
      differs from the layer's (`KernelVerificationError`). Logged as a WARNING.
    - `DEFAULT`: the four "no kernel" causes; a kernel that cannot be loaded or fails
      verification raises. What ``use_fallback=True`` means.
    - `ALL`: every cause above; what transformers 5.x passes.

    Deprecated names of kernels 0.18 (ours), kept so older code runs: `NO_KERNEL` (the four
    "no kernel" causes, i.e. `DEFAULT`), `UNSUPPORTED_MODE` (`NO_COMPATIBLE_MODE`) and
    `LOAD_FAILURE` (`CANNOT_LOAD`).

    Example:
        ```python
        from kernels import KernelizeFallback, Mode, kernelize

        # Also keep the original forward where a registered kernel cannot be loaded:
        kernelize(model, mode=Mode.TRAINING, use_fallback=KernelizeFallback.ALL)
        ```
    """

    NONE = 0
    NO_LAYER = enum.auto()
    NO_DEVICE = enum.auto()
    NO_COMPATIBLE_PROPERTIES = enum.auto()
    NO_COMPATIBLE_MODE = enum.auto()
    CANNOT_LOAD = enum.auto()
    VERIFICATION_FAILURE = enum.auto()

    DEFAULT = NO_LAYER | NO_DEVICE | NO_COMPATIBLE_PROPERTIES | NO_COMPATIBLE_MODE
    ALL = DEFAULT | CANNOT_LOAD | VERIFICATION_FAILURE

    # Deprecated (kernels 0.18): aliases of the members above.
    NO_KERNEL = DEFAULT
    UNSUPPORTED_MODE = NO_COMPATIBLE_MODE
    LOAD_FAILURE = CANNOT_LOAD


# Each member's own line for help(): without one, a member shows the class docstring,
# whose example tools that run documented code would then attribute to the member.
for _member in KernelizeFallback.__members__.values():
    _member.__doc__ = f"KernelizeFallback.{_member.name}: the class docstring says what it covers."


def as_fallback(use_fallback: bool | KernelizeFallback) -> KernelizeFallback:
    """`use_fallback` as a flag set: ``True`` is `DEFAULT`, ``False`` is `NONE`."""
    if isinstance(use_fallback, KernelizeFallback):
        return use_fallback
    if isinstance(use_fallback, bool):
        return KernelizeFallback.DEFAULT if use_fallback else KernelizeFallback.NONE
    raise TypeError(
        f"use_fallback must be True, False or a KernelizeFallback (e.g. KernelizeFallback.ALL), "
        f"got {use_fallback!r}."
    )
