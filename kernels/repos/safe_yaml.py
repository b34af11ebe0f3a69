"""YAML read from files a user or the disk supplies: no aliases, bounded size and depth.

PyYAML's ``safe_load`` refuses arbitrary objects but not aliases: ``*name`` shares a node, so a
few hundred bytes of nested anchors (the "billion laughs") stand for billions of strings, which
exhaust memory as soon as anything walks them. Its composer also recurses once per nesting
level, so a megabyte of ``[`` raises `RecursionError`. Configuration files never need either:
this loader refuses anchors and aliases outright, bounds the nesting depth, and the readers
bound the size, so every input ends in the caller's error class or a plain value.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from ..errors import KernelsError

#: The largest YAML file read (1 MiB): configuration files are a few lines long.
MAX_BYTES = 1 << 20
#: The deepest nesting of lists and mappings accepted; configuration needs two or three.
MAX_DEPTH = 32


class _Refused(yaml.YAMLError):
    """A construct this loader does not accept (an alias, an anchor, too deep a nesting)."""


class NoAliasSafeLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses anchors (``&name``) and aliases (``*name``) and bounds
    the nesting depth to `MAX_DEPTH`; each refusal is a `yaml.YAMLError`."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise _Refused(f"aliases (*{event.anchor}) are not allowed{_where(event)}")
        if getattr(event, "anchor", None) is not None:
            raise _Refused(f"anchors (&{event.anchor}) are not allowed{_where(event)}")
        if self._depth >= MAX_DEPTH:
            raise _Refused(f"nesting deeper than {MAX_DEPTH} levels is not allowed{_where(event)}")
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _where(event: yaml.Event) -> str:
    mark = event.start_mark
    return f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""


def load_yaml(text: str | bytes, *, where: str, error: type[KernelsError]) -> object:
    """Parse one YAML document with `NoAliasSafeLoader`.

    Args:
        text: the document (bytes are decoded as YAML does: UTF-8 or UTF-16 with a BOM).
        where: what the document is (e.g. a file path), for the message.
        error: the package's error class to raise.

    Raises:
        error: the text is not YAML, or uses what the loader refuses.
    """
    if len(text) > MAX_BYTES:
        raise error(_too_large(where))
    loader = None
    try:
        # The reader checks the encoding and the characters already when it is constructed.
        loader = NoAliasSafeLoader(text)
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        raise error(f"{where} is not valid YAML for kernels: {exc}") from exc
    except RecursionError as exc:  # a parser stage that recurses below the composer
        raise error(f"{where} nests too deeply (at most {MAX_DEPTH} levels).") from exc
    finally:
        if loader is not None:
            loader.dispose()


def read_yaml_file(path: Path, *, error: type[KernelsError]) -> object:
    """Read and parse the YAML file `path` (at most `MAX_BYTES`) with `load_yaml`.

    Raises:
        error: the file cannot be read, is larger than `MAX_BYTES`, or is not acceptable YAML.
    """
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise error(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    if len(data) > MAX_BYTES:
        raise error(_too_large(str(path)))
    return load_yaml(data, where=str(path), error=error)


def _too_large(where: str) -> str:
    return (
        f"{where} is larger than {MAX_BYTES // 1024} KiB, the most kernels reads from a YAML "
        "configuration file; it should hold a few lines (e.g. 'trusted_orgs: [my-org]')."
    )
