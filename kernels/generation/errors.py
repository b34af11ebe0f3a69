"""Errors of `kernels.generation`."""

from __future__ import annotations

from ..errors import KernelsError


class UnsupportedGenerationError(KernelsError, ValueError):
    """A ``generate()`` setting that decoding from CUDA graphs does not support; the message
    names the setting and what to do instead."""
