"""The modes a model is kernelized for, and which registered modes serve each of them."""

from __future__ import annotations

import enum

from ..errors import KernelMappingError


class Mode(enum.Flag):
    """What a kernelized model will be used for.

    Pass ``Mode.INFERENCE`` or ``Mode.TRAINING`` to `kernelize`, optionally combined with
    ``Mode.TORCH_COMPILE`` (``Mode.TRAINING | Mode.TORCH_COMPILE``) when the model will be
    compiled. In a kernel mapping, a mode says what a repository's kernel is meant for;
    ``Mode.FALLBACK`` marks the repository used when no mode-specific one fits, and a
    repository registered without a mode is registered as ``Mode.FALLBACK``.

    Example:
        ```python
        from kernels import Mode, kernelize

        model = kernelize(model, mode=Mode.INFERENCE | Mode.TORCH_COMPILE)
        ```
    """

    FALLBACK = enum.auto()
    TRAINING = enum.auto()
    INFERENCE = enum.auto()
    TORCH_COMPILE = enum.auto()

    def __or__(self, other: Mode) -> Mode:
        union = super().__or__(other)
        # NotImplemented for an operand that is not a Mode (typed or not), so that Python
        # tries the operand's __ror__ and then raises its usual TypeError.
        if not isinstance(union, Mode):
            return union
        if Mode.INFERENCE in union and Mode.TRAINING in union:
            raise KernelMappingError(
                "Mode.INFERENCE and Mode.TRAINING are mutually exclusive and cannot be combined: "
                "a model kernelized for TRAINING also serves inference, so use Mode.TRAINING."
            )
        if Mode.FALLBACK in union and union != Mode.FALLBACK:
            raise KernelMappingError(
                "Mode.FALLBACK cannot be combined with other modes: it already applies to every "
                "mode that has no kernel of its own."
            )
        return union

    def __str__(self) -> str:
        names = [member.name for member in Mode if member in self and member.name]
        return " | ".join(names) if names else "Mode(0)"


#: The modes a repository can be registered for in a kernel mapping.
REGISTRABLE_MODES: tuple[Mode, ...] = (
    Mode.INFERENCE,
    Mode.INFERENCE | Mode.TORCH_COMPILE,
    Mode.TRAINING,
    Mode.TRAINING | Mode.TORCH_COMPILE,
    Mode.FALLBACK,
)

# For each mode kernelize accepts, the registered modes that can serve it, best first.
# A kernel meant for training also works for inference, and one meant for torch.compile
# also works eagerly, never the other way round.
# Each member's own line for help(): without one, a member shows the class docstring,
# whose example tools that run documented code would then attribute to the member.
for _member, _doc in {
    Mode.FALLBACK: "Registers the repository used when no mode-specific one fits.",
    Mode.TRAINING: "Kernels for training (a backward is needed); also serve inference.",
    Mode.INFERENCE: "Kernels for inference only.",
    Mode.TORCH_COMPILE: "Kernels that torch.compile can trace; combined with another mode.",
}.items():
    _member.__doc__ = _doc

_PREFERENCE: dict[Mode, tuple[Mode, ...]] = {
    Mode.INFERENCE: (
        Mode.INFERENCE,
        Mode.INFERENCE | Mode.TORCH_COMPILE,
        Mode.TRAINING,
        Mode.TRAINING | Mode.TORCH_COMPILE,
        Mode.FALLBACK,
    ),
    Mode.INFERENCE | Mode.TORCH_COMPILE: (
        Mode.INFERENCE | Mode.TORCH_COMPILE,
        Mode.TRAINING | Mode.TORCH_COMPILE,
        Mode.FALLBACK,
    ),
    Mode.TRAINING: (Mode.TRAINING, Mode.TRAINING | Mode.TORCH_COMPILE, Mode.FALLBACK),
    Mode.TRAINING | Mode.TORCH_COMPILE: (Mode.TRAINING | Mode.TORCH_COMPILE, Mode.FALLBACK),
}


def validate_kernelize_mode(mode: object) -> Mode:
    """Return `mode` if `kernelize` accepts it, else raise a `KernelMappingError` saying why."""
    if not isinstance(mode, Mode):
        raise KernelMappingError(
            f"kernelize expects `mode` to be a kernels.Mode, got {mode!r}; use e.g. "
            "mode=Mode.INFERENCE or mode=Mode.TRAINING | Mode.TORCH_COMPILE."
        )
    if Mode.FALLBACK in mode:
        raise KernelMappingError(
            "Mode.FALLBACK can only be used to register kernel mappings; kernelize with "
            "Mode.INFERENCE or Mode.TRAINING (optionally | Mode.TORCH_COMPILE)."
        )
    if mode not in _PREFERENCE:
        raise KernelMappingError(
            f"kernelize mode must contain Mode.INFERENCE or Mode.TRAINING, got {mode}; use e.g. "
            "Mode.INFERENCE | Mode.TORCH_COMPILE."
        )
    return mode


def validate_registered_mode(mode: object) -> Mode:
    """Return `mode` if a repository may be registered for it in a mapping."""
    if not isinstance(mode, Mode) or mode not in REGISTRABLE_MODES:
        allowed = ", ".join(str(m) for m in REGISTRABLE_MODES)
        raise KernelMappingError(
            f"A kernel mapping cannot register a repository for mode {mode!r}; the modes are: "
            f"{allowed}."
        )
    return mode


def preferred_modes(mode: Mode) -> tuple[Mode, ...]:
    """The registered modes that can serve a model kernelized for `mode`, best first."""
    return _PREFERENCE[validate_kernelize_mode(mode)]
