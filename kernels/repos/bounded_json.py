"""JSON from files nobody vouches for: bounded in size and nesting, strict in encoding.

Lock files, ``metadata.json`` and ``kernel-variants.json`` come from a project, a
download or a shared cache, so any byte may be in them. `load_json_file` and `parse_json`
turn every way such a file can be wrong into one error class chosen by the caller (a
`kernels.errors.KernelsError`), never ``UnicodeDecodeError``, ``RecursionError`` or
``MemoryError``:

* size: the file's size is checked before it is read, and no more than the bound is read
  even when the file grows meanwhile;
* encoding: UTF-8, strictly (a byte-order mark, as JSON allows no other encoding, is refused);
* nesting: depth is measured by a linear scan before parsing, because the ``json`` module
  recurses once per level and fails with ``RecursionError`` deep down;
* values: duplicate keys (which JSON parsers resolve differently, so two tools could read
  two different documents) and the non-JSON constants ``NaN`` and ``Infinity`` are refused.
"""

from __future__ import annotations

import json
import os
import re
from itertools import accumulate
from pathlib import Path

from ..errors import KernelsError

#: The nesting depth any of our JSON formats needs is under 5; 64 leaves room for extras.
MAX_DEPTH = 64

MiB = 1024 * 1024

# A JSON string (escapes included) or a bracket: the scan skips the first and counts the rest.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def describe_size(size: int) -> str:
    """``1048576`` -> ``"1 MiB"``; smaller sizes in bytes."""
    if size >= MiB and size % MiB == 0:
        return f"{size // MiB} MiB"
    return f"{size} bytes"


def read_bounded(path: str | os.PathLike[str], *, limit: int, error: type[KernelsError]) -> bytes:
    """The bytes of `path`, refusing a file larger than `limit` bytes before reading it.

    Raises:
        error: the file is larger than `limit` (the message names it, its size and the bound).
        OSError: it cannot be opened or read (callers say what the file was for).
    """
    path = Path(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise error(_too_large(path, size, limit))
        # st_size is 0 for pipes and some special files, and a file may grow: read one
        # byte past the bound to know.
        data = f.read(limit + 1)
    if len(data) > limit:
        raise error(_too_large(path, None, limit))
    return data


def _too_large(path: Path, size: int | None, limit: int) -> str:
    shown = f"{size} bytes" if size is not None else "more than that"
    return (
        f"{path} is {shown}; a file of this kind may be at most {describe_size(limit)}, so it "
        "is refused unread. It is not a file kernels wrote; replace it."
    )


def parse_json(
    data: bytes | str,
    *,
    where: str,
    error: type[KernelsError],
    limit: int,
    max_depth: int = MAX_DEPTH,
) -> object:
    """Parse a JSON document under the bounds of this module.

    Args:
        data: the document, as bytes (decoded as strict UTF-8) or text.
        where: how to name the document in messages (a path, or "the kernels.lock of ...").
        error: the package's error class to raise.
        limit: the largest document accepted, in bytes (characters for text).
        max_depth: the deepest nesting of arrays and objects accepted.

    Raises:
        error: the document is too large, not UTF-8, not JSON, too deep, has duplicate keys
            or a ``NaN`` / ``Infinity``.
    """
    if not isinstance(data, (bytes, str)):
        raise error(f"{where}: expected JSON text, got {type(data).__name__}.")
    if len(data) > limit:
        raise error(
            f"{where} is {len(data)} {'bytes' if isinstance(data, bytes) else 'characters'}; "
            f"it may be at most {describe_size(limit)}, so it is refused unread."
        )
    text = decode_utf8(data, where=where, error=error) if isinstance(data, bytes) else data
    if text.startswith("\ufeff"):
        raise error(f"{where} starts with a byte-order mark; JSON files must be plain UTF-8.")
    depth = json_depth(text)
    if depth > max_depth:
        raise error(
            f"{where} nests arrays and objects {depth} levels deep; at most {max_depth} are "
            "accepted. It is not a file kernels wrote; replace it."
        )
    try:
        return json.loads(
            text,
            object_pairs_hook=lambda pairs: _object(pairs, where, error),
            parse_constant=lambda name: _constant(name, where, error),
        )
    except KernelsError:
        raise
    except RecursionError:
        # Only reachable when the caller's own stack is nearly exhausted already.
        raise error(f"{where} is nested too deeply to parse here.") from None
    except ValueError as exc:  # JSONDecodeError, or an integer of more than 4300 digits
        raise error(f"{where} is not valid JSON: {exc}") from None


def decode_utf8(data: bytes, *, where: str, error: type[KernelsError], kind: str = "JSON") -> str:
    """`data` decoded as strict UTF-8 (what JSON and TOML files must be).

    Raises:
        error: it is not UTF-8; the message names the first bad byte and its offset.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"{where} is not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x}); {kind} "
            "files must be UTF-8."
        ) from None


def load_json_file(
    path: str | os.PathLike[str],
    *,
    error: type[KernelsError],
    limit: int,
    max_depth: int = MAX_DEPTH,
) -> object:
    """Read and parse the JSON file `path` under the bounds of this module.

    Raises:
        error: as `read_bounded` and `parse_json`.
        OSError: the file cannot be opened or read.
    """
    data = read_bounded(path, limit=limit, error=error)
    return parse_json(data, where=str(path), error=error, limit=limit, max_depth=max_depth)


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in `text`, in one linear pass.

    Strings are skipped, so brackets inside them do not count. For text that is not JSON the
    answer is an upper bound, which is all a guard before parsing needs.
    """
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)


def quoted(value: object) -> str:
    """A value from a file nobody vouches for, quoted briefly for a message (at most 80
    characters, non-printable characters escaped)."""
    try:
        shown = repr(value)
    except ValueError:  # an int of more digits than Python prints
        return "an integer too long to show"
    return shown if len(shown) <= 80 else shown[:77] + "..."


def json_type(value: object) -> str:
    """How JSON names the type of a parsed value, with its article: ``"an array"``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return f"a Python {type(value).__name__}"


def _object(pairs: list[tuple[str, object]], where: str, error: type[KernelsError]) -> dict:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise error(
                    f"{where} gives the key {key!r} twice in one object; JSON readers disagree "
                    "on which one counts, so it is refused."
                )
            seen.add(key)
    return result


def _constant(name: str, where: str, error: type[KernelsError]) -> object:
    raise error(f"{where} contains {name}, which is not JSON.")
