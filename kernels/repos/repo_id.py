"""Hub repository ids as the Hub defines them, checked before anything trusts or fetches one.

A repository id is ``name`` or ``owner/name``, each part made of ASCII letters, digits, ``_``,
``-`` and ``.``, beginning and ending with a letter, digit or ``_``, without ``--`` or ``..``,
not ending in ``.git``, each part at most 96 characters long (huggingface_hub's
``validate_repo_id``, restricted to ASCII).
The restriction to ASCII is what keeps trust decisions sound: Unicode look-alikes of a trusted
organisation (``"\\u212aernels-community"``, with KELVIN SIGN) are refused here instead of
being compared, case-folded, with the real name.
"""

from __future__ import annotations

import re
import reprlib
from typing import TypeGuard

from ..errors import KernelRepositoryNotFoundError, KernelsError

_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"(?:{_PART}/)?{_PART}")
MAX_LENGTH = 96


def is_repo_id(value: object) -> TypeGuard[str]:
    """Whether `value` is a well-formed Hub repository id (``owner/name`` or ``name``)."""
    return (
        isinstance(value, str)
        and len(value) <= 2 * MAX_LENGTH + 1
        and _REPO_ID.fullmatch(value) is not None
        and "--" not in value
        and ".." not in value
        and not value.endswith(".git")
        and all(len(part) <= MAX_LENGTH for part in value.split("/"))
    )


def check_repo_id(
    value: object,
    *,
    where: str = "repo_id",
    error: type[KernelsError] = KernelRepositoryNotFoundError,
) -> str:
    """Return `value` if it is a well-formed Hub repository id, else raise `error`.

    Args:
        value: the repository id to check (any object: it may come from a hostile file).
        where: what the id was given as, for the message.
        error: the package's error class to raise.
    """
    if is_repo_id(value):
        return value
    raise error(
        f"{where} {shown(value)} is not a Hub repository id: write it as 'org/name' with ASCII "
        "letters, digits, '-', '_' and '.' (e.g. 'kernels-community/activation'). For a folder "
        "on disk, use LocalLayerRepository or get_local_kernel."
    )


def shown(value: object) -> str:
    """`value` for an error message: short, and with non-ASCII characters escaped.

    The escapes show what makes a look-alike differ (``'\\u212aernels-community'``), where
    `repr` would print a convincing ``'Kernels-community'``.
    """
    try:
        text = repr(value[:200]) if isinstance(value, str) else reprlib.repr(value)
    except Exception:  # a hostile or broken __repr__ must not replace the real error
        text = "<unprintable>"
    text = text.encode("ascii", "backslashreplace").decode("ascii")
    if not isinstance(value, str):
        text = f"{type(value).__name__} {text}"
    return text if len(text) <= 120 else text[:117] + "..."


def owner_of(repo_id: str) -> str | None:
    """The owner (organisation or user) of a checked repository id; None for an owner-less id."""
    return repo_id.split("/", 1)[0] if "/" in repo_id else None


def fold(name: str) -> str:
    """Case-fold an ASCII name as the Hub compares them (ASCII letters only, nothing else)."""
    return name.translate(_ASCII_LOWER)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
