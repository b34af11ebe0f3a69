"""Errors raised by the torch.compile backend (`kernels.compile`).

Each subclasses `kernels.KernelsError` and the built-in exception a caller would catch for the
same condition, as the rest of `kernels` does.
"""

from __future__ import annotations

from ..errors import KernelsError


class UnknownPatternError(KernelsError, ValueError):
    """A pattern name that the backend does not know (see `kernels.compile.PATTERNS`)."""


class KernelRegistrationError(KernelsError, TypeError):
    """A kernel, backward, policy or guard given to `KernelRegistry.register` is malformed."""


class KernelOutputError(KernelsError, RuntimeError):
    """A registered kernel returned something other than the tensor its pattern promises."""


class DrawingUnavailableError(KernelsError, ImportError):
    """Graph pictures were asked for, but pydot or Graphviz's ``dot`` program is missing."""


class DownstreamError(KernelsError, ValueError):
    """The compiler named as ``downstream`` of the backend is not one it can hand graphs to."""
