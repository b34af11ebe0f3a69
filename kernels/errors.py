"""Exceptions raised by `kernels`.

Each error subclasses the built-in exception that code written for Hugging Face's
`kernels` catches for the same condition (``ValueError``, ``TypeError``,
``FileNotFoundError``), so callers that catch those keep working.
"""

from __future__ import annotations


class KernelsError(Exception):
    """Base class of every error raised by `kernels`."""


class KernelMappingError(KernelsError, ValueError):
    """A kernel mapping, a mode or a device given to `kernels` is malformed."""


class NoKernelError(KernelsError, ValueError):
    """`kernelize(..., use_fallback=False)` found no usable kernel for a layer."""


class KernelLoadError(KernelsError):
    """A kernel repository could not be found, downloaded or imported."""


class BuildVariantNotFoundError(KernelLoadError, FileNotFoundError):
    """A kernel repository has no build variant that this machine can run."""


class KernelLayerError(KernelsError, TypeError):
    """A kernel layer breaks the rules a kernel layer must follow (see docs/layers.md)."""
