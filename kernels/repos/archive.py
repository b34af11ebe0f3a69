"""Kernels in the ZIP build layout, imported from their archive in memory.

kernel-builder can pack a variant's Python package into one archive: its ``metadata.json``
says ``"build-layout": "zip"`` and the package is ``build/<variant>/<id>.zip``, named by the
metadata's ``id``. The archive's top level is the package (``__init__.py``, ``_ops.py``,
``layers/``...); compiled extension modules are not in it but sit beside it in the variant
folder, where the package's ``__path__`` finds them too (Hugging Face's `kernels` 0.19 reads
the layout the same way).

The archive is a file of the variant like any other, so the digests of ``metadata.json``,
a lock's hashes and a signature cover it byte for byte, and they are checked before this
module reads it. It is then read once into memory and every module and resource is served
from those bytes: nothing is extracted, nothing written beside it, and the bytes that run are
the bytes that were checked (when ``metadata.json`` records a digest, the bytes read here
are hashed again against it, so a file swapped after the check is refused, not run).

An archive is hostile input. It is refused, with a `KernelArchiveError` that names it and
the member at fault, when it is too large (`MAX_ARCHIVE_SIZE`, `MAX_MEMBERS`,
`MAX_UNPACKED_SIZE`: a zip bomb), encrypted, holds a member with an absolute path, a ``..``,
a backslash or a duplicate name, a symbolic link, or a compiled extension module (those must
sit beside the archive, where digests and locks list them by name), or when its top level has
no ``__init__.py``. Like any kernel package it runs from source only: bytecode is never read.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import os
import re
import stat
import sys
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
from pathlib import Path, PurePosixPath
from typing import IO, Any

if sys.version_info >= (3, 11):
    from importlib.resources.abc import Traversable, TraversableResources
else:  # moved in 3.11; the old names are deprecated there
    from importlib.abc import Traversable, TraversableResources

from ..errors import KernelArchiveError, KernelHashMismatchError, KernelMetadataError
from .bounded_json import MiB, quoted
from .info import METADATA_FILE, Metadata

#: The ``build-layout`` values of ``metadata.json`` (absent means "files").
FILES, ZIP = "files", "zip"

#: The largest archive read (it holds Python sources and data, never compiled code).
MAX_ARCHIVE_SIZE = 256 * MiB
#: The most members an archive may have.
MAX_MEMBERS = 10_000
#: The most bytes an archive may unpack to, all members together.
MAX_UNPACKED_SIZE = 512 * MiB

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Compiled code must sit beside the archive, where digests and locks name each file.
_COMPILED_SUFFIXES = (".so", ".pyd", ".dylib", ".dll")
_SOURCE_SUFFIXES = tuple(importlib.machinery.SOURCE_SUFFIXES)
_BYTECODE_SUFFIXES = tuple(importlib.machinery.BYTECODE_SUFFIXES)
_CHUNK = 1 << 20


def build_layout(metadata: Metadata, *, where: str) -> str:
    """`FILES` or `ZIP`: how the variant described by `metadata` ships its package.

    Raises:
        KernelMetadataError: ``build-layout`` is neither "files" nor "zip" (`where` names
            the file).
    """
    value = metadata.extra.get("build-layout", FILES)
    if value in (FILES, ZIP):
        return str(value)
    raise KernelMetadataError(
        f'{where}: \'build-layout\' is {quoted(value)}; it must be "files" or "zip". '
        "Rebuild the kernel with kernel-builder, or upgrade kernels if a newer layout exists."
    )


def archive_path(metadata: Metadata, variant_dir: Path) -> Path:
    """The archive ``<id>.zip`` of a ZIP-layout variant, which must exist.

    Raises:
        KernelMetadataError: the metadata's ``id`` is missing or not a Python identifier (it
            names a file in the variant folder: a path separator or ``..`` could name any).
        KernelArchiveError: the archive is not there.
    """
    where = variant_dir / METADATA_FILE
    kernel_id = metadata.id
    if kernel_id is None or not _IDENTIFIER.match(kernel_id):
        raise KernelMetadataError(
            f"{where}: 'id' is {quoted(kernel_id)}; a kernel in the zip build layout needs an "
            "id that is a Python identifier such as '_activation_cuda_1a2b3c4' (its package is "
            "build/<variant>/<id>.zip). Rebuild the kernel with kernel-builder."
        )
    path = variant_dir / f"{kernel_id}.zip"
    if not path.is_file():
        raise KernelArchiveError(
            f"{variant_dir} is in the zip build layout ({where} says so), but its archive "
            f"{path.name} is missing. Download the kernel again, or rebuild it."
        )
    return path


def has_archive(variant_dir: Path) -> bool:
    """Whether a variant folder holds what looks like a package archive (``<id>.zip``); only
    its ``metadata.json``, read once the variant is trusted, says whether it is one."""
    try:
        return any(
            entry.suffix == ".zip" and _IDENTIFIER.match(entry.stem) is not None
            for entry in variant_dir.iterdir()
        )
    except OSError:
        return False


@dataclass(frozen=True)
class KernelArchive:
    """The unpacked members of a package archive, held in memory.

    Attributes:
        path: the archive file.
        files: member path (``"layers/__init__.py"``) -> contents.
        dirs: every folder of the package inside the archive (``""`` is its top level).
    """

    path: Path
    files: Mapping[str, bytes]
    dirs: frozenset[str]

    def location(self, member: str) -> str:
        """The path of a member as ``__file__`` and tracebacks show it: ``<archive>/<member>``."""
        return f"{self.path}/{member}" if member else str(self.path)

    def member(self, location: str) -> str | None:
        """The member a `location` names (the inverse of `location`); None if it names
        nothing inside the archive."""
        root = str(self.path)
        if location == root:
            return ""
        if not location.startswith(root + "/"):
            return None
        return location[len(root) + 1 :].rstrip("/")


def read_archive(path: Path, metadata: Metadata) -> KernelArchive:
    """Read and check the archive `path` of a variant, and unpack it in memory.

    When `metadata` records a digest for the archive, the bytes read are checked against it
    (`kernels.repos.digests` checked the file before; this closes the window between that
    check and this read).

    Raises:
        KernelArchiveError: the archive is hostile or broken (see the module docstring).
        KernelHashMismatchError: the bytes read differ from the digest in ``metadata.json``.
    """
    data = _read_bounded(path)
    _check_digest(path, data, metadata)
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as exc:
        _refuse(path, f"is not a readable zip archive ({exc})")
    with archive:
        infos = archive.infolist()
        if len(infos) > MAX_MEMBERS:
            _refuse(path, f"has {len(infos)} members, more than the {MAX_MEMBERS} allowed")
        files: dict[str, bytes] = {}
        dirs = {""}
        seen: set[str] = set()
        total = 0
        for info in infos:
            name = _check_member(path, info, seen)
            total += info.file_size
            if total > MAX_UNPACKED_SIZE:
                _refuse(path, f"unpacks to more than {MAX_UNPACKED_SIZE} bytes (a zip bomb?)")
            if info.is_dir():
                dirs.add(name)
                continue
            files[name] = _unpack(path, archive, info)
            parent = PurePosixPath(name).parent
            while str(parent) != ".":
                dirs.add(str(parent))
                parent = parent.parent
    clash = sorted(set(files) & dirs)
    if clash:
        _refuse(path, f"holds {quoted(clash[0])} both as a file and as a folder")
    if "__init__.py" not in files:
        _refuse(
            path,
            "has no __init__.py at its top level: the archive's top level must be the package "
            f"itself (__init__.py, _ops.py, ...), not a folder holding it (top level: "
            f"{', '.join(sorted(_top_level(files))) or 'nothing'})",
        )
    return KernelArchive(path, files, frozenset(dirs))


def _refuse(path: Path, why: str) -> Any:
    raise KernelArchiveError(
        f"Refusing to load the kernel archive {path}: it {why}. Nothing was imported. "
        "Download the kernel again; if it persists, report it to the kernel's authors."
    )


def _read_bounded(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_ARCHIVE_SIZE + 1)
    except OSError as exc:
        raise KernelArchiveError(
            f"Cannot read the kernel archive {path} ({exc.strerror or exc}); check its "
            "permissions, or download the kernel again."
        ) from exc
    if len(data) > MAX_ARCHIVE_SIZE:
        _refuse(path, f"is larger than {MAX_ARCHIVE_SIZE} bytes")
    return data


def _check_digest(path: Path, data: bytes, metadata: Metadata) -> None:
    raw = metadata.extra.get("digest")
    if not isinstance(raw, Mapping):
        return
    files, algorithm = raw.get("files"), raw.get("algorithm")
    expected = files.get(path.name) if isinstance(files, Mapping) else None
    if not isinstance(expected, str) or algorithm not in ("sha256", "sha512"):
        # check_digests refused any malformed digest, and an archive it does not list.
        return
    try:
        recorded = base64.b64decode(expected, validate=True)
    except (binascii.Error, ValueError):
        recorded = b""
    if hashlib.new(algorithm, data).digest() != recorded:
        raise KernelHashMismatchError(
            f"Refusing to load the kernel archive {path}: the bytes read differ from its "
            f"{algorithm} digest in {path.parent / METADATA_FILE} (the file changed after it "
            "was checked). Nothing was imported. Download the kernel again."
        )


def _check_member(path: Path, info: zipfile.ZipInfo, seen: set[str]) -> str:
    """The member's name in the package (a folder's without its trailing slash), once it
    is known to be a plain relative path to a file or folder not seen before."""
    raw = info.filename
    shown = quoted(raw)
    if info.flag_bits & 0x1:
        _refuse(path, f"holds an encrypted member {shown}")
    if "\\" in raw or "\0" in raw or raw.startswith("/") or re.match(r"^[A-Za-z]:", raw):
        _refuse(path, f"holds a member with an absolute or non-portable path {shown}")
    name = raw.rstrip("/") if info.is_dir() else raw
    parts = name.split("/")
    if any(part in ("", ".", "..") or not part.isprintable() for part in parts):
        _refuse(path, f"holds a member whose path {shown} is not a plain relative path")
    mode = info.external_attr >> 16
    if info.create_system == 3 and stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):
        kind = "a symbolic link" if stat.S_ISLNK(mode) else "a special file"
        _refuse(path, f"holds {kind} {shown}; an archive may only hold files and folders")
    if name in seen:
        _refuse(path, f"holds the member {shown} twice")
    seen.add(name)
    if not info.is_dir() and (
        name.lower().endswith(_COMPILED_SUFFIXES) or ".so." in parts[-1].lower()
    ):
        _refuse(
            path,
            f"holds a compiled module {shown}; compiled modules must sit beside the archive "
            "in the variant folder, not inside it",
        )
    return name


def _unpack(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    # The declared size bounds what is read: a member that inflates beyond it is refused
    # without being inflated further.
    try:
        with archive.open(info) as member:
            data = member.read(info.file_size + 1)
    except (zipfile.BadZipFile, NotImplementedError, RuntimeError, ValueError, EOFError) as exc:
        _refuse(path, f"holds a member {quoted(info.filename)} that cannot be read ({exc})")
    except Exception as exc:  # zlib/lzma/bz2 errors of a corrupt stream
        _refuse(path, f"holds a corrupt member {quoted(info.filename)} ({exc})")
    if len(data) != info.file_size:
        _refuse(path, f"holds a member {quoted(info.filename)} whose size is not the one declared")
    return data


def _top_level(files: Mapping[str, bytes]) -> set[str]:
    return {name.split("/", 1)[0] for name in files}


class ArchiveLoader(importlib.abc.InspectLoader, importlib.abc.ResourceLoader):
    """Loads one module of a package archive from memory, from its source only.

    ``inspect.getsource`` (which Triton's ``@jit`` needs), ``pkgutil.get_data`` and
    ``importlib.resources`` read the archive's members through it.
    """

    def __init__(self, archive: KernelArchive, fullname: str, member: str) -> None:
        self.archive = archive
        self.name = fullname
        self.member = member

    def create_module(self, spec: ModuleSpec) -> None:
        return None

    def exec_module(self, module) -> None:
        code = self.get_code(module.__name__)
        exec(code, module.__dict__)

    def is_package(self, fullname: str) -> bool:
        return self.member.endswith("/__init__.py") or self.member == "__init__.py"

    def get_filename(self, fullname: str) -> str:
        return self.archive.location(self.member)

    def get_source(self, fullname: str) -> str:
        return importlib.util.decode_source(self.archive.files[self.member])

    def get_code(self, fullname: str):
        # dont_inherit: the kernel's code must not pick up our own __future__ flags.
        return compile(
            self.archive.files[self.member], self.get_filename(fullname), "exec", dont_inherit=True
        )

    def get_data(self, path: str) -> bytes:
        member = self.archive.member(os.fspath(path))
        if member is None or member not in self.archive.files:
            raise FileNotFoundError(path)
        return self.archive.files[member]

    def get_resource_reader(self, fullname: str) -> TraversableResources | None:
        if not self.is_package(fullname):
            return None
        folder = self.member.rpartition("/")[0]  # "" for the package at the archive's top
        return _ArchiveResources(ArchiveTraversable(self.archive, folder))


class _ArchiveResources(TraversableResources):
    def __init__(self, root: Traversable) -> None:
        self._root = root

    def files(self) -> Traversable:
        return self._root


class ArchiveTraversable(Traversable):
    """A file or folder inside a package archive, for ``importlib.resources.files``."""

    def __init__(self, archive: KernelArchive, member: str) -> None:
        self._archive = archive
        self._member = member

    @property
    def name(self) -> str:
        return PurePosixPath(self._member).name

    def __repr__(self) -> str:
        return f"ArchiveTraversable({self._archive.location(self._member)!r})"

    def __str__(self) -> str:
        return self._archive.location(self._member)

    def is_dir(self) -> bool:
        return self._member in self._archive.dirs

    def is_file(self) -> bool:
        return self._member in self._archive.files

    def iterdir(self) -> Iterator[ArchiveTraversable]:
        if not self.is_dir():
            raise NotADirectoryError(str(self))
        prefix = f"{self._member}/" if self._member else ""
        children = {
            prefix + name[len(prefix) :].split("/", 1)[0]
            for name in (*self._archive.files, *self._archive.dirs)
            if name.startswith(prefix) and name != self._member
        }
        return iter([ArchiveTraversable(self._archive, child) for child in sorted(children)])

    def joinpath(self, *descendants: str) -> ArchiveTraversable:
        parts = [p for d in descendants for p in PurePosixPath(d).parts]
        if any(p in ("..", "/") for p in parts):
            raise ValueError(f"{descendants!r} leaves the kernel archive")
        member = "/".join([self._member, *parts] if self._member else parts)
        return ArchiveTraversable(self._archive, member)

    def __truediv__(self, child: str) -> ArchiveTraversable:
        return self.joinpath(child)

    def read_bytes(self) -> bytes:
        if not self.is_file():
            raise FileNotFoundError(str(self))
        return self._archive.files[self._member]

    def read_text(self, encoding: str | None = None) -> str:
        return self.read_bytes().decode(encoding or "utf-8")

    def open(self, mode: str = "r", *args: Any, **kwargs: Any) -> IO[Any]:
        if mode not in ("r", "rb"):
            raise ValueError(f"kernel archive members are read-only, not opened {mode!r}")
        data = self.read_bytes()
        if mode == "rb":
            return io.BytesIO(data)
        return io.TextIOWrapper(io.BytesIO(data), *args, **kwargs)


def find_in_archive(archive: KernelArchive, fullname: str, entry: str) -> ModuleSpec | None:
    """The spec of module `fullname` in the archive folder `entry` (an item of a package's
    ``__path__`` that lies inside `archive`); None when the archive has no such module.

    Raises:
        ImportError: the module exists there only as bytecode.
    """
    folder = archive.member(entry)
    if folder is None or folder not in archive.dirs:
        return None
    tail = fullname.rpartition(".")[2]
    base = f"{folder}/{tail}" if folder else tail
    init = f"{base}/__init__.py"
    if init in archive.files:
        return _spec(archive, fullname, init, package=base)
    for suffix in _SOURCE_SUFFIXES:
        if base + suffix in archive.files:
            return _spec(archive, fullname, base + suffix, package=None)
    for suffix in _BYTECODE_SUFFIXES:
        if base + suffix in archive.files:
            raise ImportError(
                f"{archive.location(base + suffix)} is bytecode without its source; kernel "
                "packages are imported from source only. Ship the .py file instead.",
                name=fullname,
            )
    return None


def package_spec(name: str, variant_dir: Path, archive: KernelArchive) -> ModuleSpec:
    """The spec of the archive's package, imported as `name`: its submodules are looked for
    beside the archive (compiled modules) and in it."""
    spec = _spec(archive, name, "__init__.py", package="")
    spec.submodule_search_locations = [str(variant_dir), str(archive.path)]
    return spec


def _spec(archive: KernelArchive, fullname: str, member: str, *, package: str | None) -> ModuleSpec:
    loader = ArchiveLoader(archive, fullname, member)
    spec = ModuleSpec(
        fullname, loader, origin=archive.location(member), is_package=package is not None
    )
    if package is not None:
        spec.submodule_search_locations = [archive.location(package)]
    spec.has_location = True
    return spec
