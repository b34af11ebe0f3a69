"""Exceptions raised by `kernels`.

Each error subclasses the built-in exception that code written for Hugging Face's
`kernels` catches for the same condition (``ValueError``, ``TypeError``,
``FileNotFoundError``), so callers that catch those keep working.
"""

from __future__ import annotations


def as_sentence(text: str) -> str:
    """`text` closed with a period, unless it already ends a sentence (messages embed causes
    and paths that may end in one, and a doubled period reads as a typo)."""
    return text if text.endswith((".", "?", "!")) else text + "."


class KernelsError(Exception):
    """Base class of every error raised by `kernels`."""


class KernelMappingError(KernelsError, ValueError):
    """A kernel mapping, a mode or a device given to `kernels` is malformed."""


class KernelTaggingError(KernelMappingError, TypeError):
    """A tagging decorator was misused, e.g. applied without its layer name."""


class NoKernelError(KernelsError, ValueError):
    """`kernelize(..., use_fallback=False)` found no usable kernel for a layer."""


class KernelLoadError(KernelsError):
    """A kernel repository could not be found, downloaded or imported."""


class BuildVariantNotFoundError(KernelLoadError, FileNotFoundError):
    """A kernel repository has no build variant that this machine can run."""


class KernelLayerError(KernelsError, TypeError):
    """A kernel layer breaks the rules a kernel layer must follow (see docs/layers.md)."""


# Errors of Hub repositories, versions, locks and trust (docs/hub.md). Each one is a
# KernelLoadError, so `kernelize(..., use_fallback=True)` falls back and logs it.


class KernelRepositoryNotFoundError(KernelLoadError, FileNotFoundError):
    """A Hub kernel repository does not exist, or it is private or gated and no token grants access."""


class KernelRevisionError(KernelLoadError, ValueError):
    """No branch, tag or commit of a kernel repository matches the revision or version asked for."""


class KernelVersionSpecError(KernelLoadError, ValueError):
    """A `version` is neither a PEP 440 specifier string nor a non-negative int."""


class KernelOfflineError(KernelLoadError, ConnectionError, FileNotFoundError):
    """The Hub is off limits (HF_HUB_OFFLINE=1) or unreachable and the cache cannot answer.

    Also a ``FileNotFoundError``: what is missing is a file of the cache, and callers written
    for Hugging Face's client (transformers' ``lazy_load_kernel``) catch only that.

    Attributes:
        reason: why the Hub did not answer, without the advice on what to do; the whole
            message when it was not given apart. What a fall-back to the cache logs.
    """

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = message if reason is None else reason


class KernelHubUnsupportedError(KernelLoadError, ImportError):
    """The installed huggingface_hub cannot ask for the Hub's kernel repository type (< 1.10)."""


class KernelDownloadError(KernelLoadError):
    """Downloading a kernel repository failed for a reason other than the ones above."""


class UntrustedKernelError(KernelLoadError, PermissionError, ValueError):
    """A kernel repository's organisation is not trusted to run code here (docs/hub.md#trust).

    Also a ``ValueError``, which Hugging Face's client raises for an untrusted publisher."""


class KernelMetadataError(KernelLoadError, ValueError):
    """A kernel build describes itself wrongly: its ``metadata.json``, its repository's
    ``kernel-variants.json`` or a build variant's name is malformed, too large or too deeply
    nested.

    Attributes:
        reason: what is wrong, without naming the file or variant (a list of variants shows
            it beside each name); the whole message when it was not given apart.
    """

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = message if reason is None else reason


class KernelArchiveError(KernelLoadError, ValueError):
    """A kernel in the zip build layout has a missing, broken or hostile package archive
    (``build/<variant>/<id>.zip``); nothing was imported."""


class KernelLockError(KernelLoadError):
    """A lock file is missing, malformed, or does not list the kernel asked for."""


class KernelHashMismatchError(KernelLockError):
    """A downloaded kernel file differs from the hash its lock records; nothing was imported."""


class KernelSignatureError(KernelLoadError, PermissionError):
    """Signatures are required (``KERNELS_REQUIRE_SIGNATURES=1``) and a kernel build is not
    signed by an accepted publisher, or its files do not match what the signature vouches
    for; nothing was imported. Also raised when the optional ``sigstore`` package is missing."""


class KernelVerificationError(KernelsError, ValueError):
    """`kernelize(..., verify=...)` found a kernel whose result differs from its layer's."""
