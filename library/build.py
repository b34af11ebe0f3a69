"""Build kernel repositories' ``build/<variant>/`` folders from their source.

A repository is laid out as Hugging Face's kernel-builder lays out a pure-Python (Triton)
kernel::

    <repo>/build.toml             name, version, edition, license, backends; [torch-noarch]
    <repo>/torch-ext/<package>/   the package source
    <repo>/build/<variant>/       what the Hub serves, written here (never edit it by hand)

The variants:

* ``torch-<backend>`` for each backend of ``build.toml`` (``torch-cuda``, ``torch-rocm``,
  ``torch-xpu``): the current noarch layout, the package directly in the variant folder;
* ``torch-universal``: the legacy layout (``build/torch-universal/<package>/``) that older
  clients load.

Each variant gets the ``metadata.json`` that Hugging Face's client requires (``name``, ``id``,
``version``, ``license``, ``python-depends``, ``backend``) and, as kernel-builder writes it, the
``digest`` of every other file of the variant, which clients check before importing it. The
``id`` is the module name their client imports the variant under, so it is unique per variant
and per source: it ends with a digest of the package's files. The output depends only on the
source: building twice changes nothing.

Each variant also gets the ``symbols.json`` that kernel-builder writes and ``kernels
describe-api`` reads (schema_version 1): the package's public functions and its ``layers``
module's classes, with signatures, docstrings and the ``has_backward`` / ``can_torch_compile``
flags. As kernel-builder does, it is made by importing the package (under the variant's ``id``,
in a child Python, so the build's own process imports no kernel), which needs torch and triton
in the Python that runs this script; no function is called and no layer instantiated. A build
for loading only (``build_files(repo, symbols=False)``, ``--no-symbols``) leaves it out, which
takes milliseconds rather than seconds; its ``digest`` then covers the files it has.

A repository may also hold ``binaries/``: compiled Triton kernels captured on a GPU
(``library/binaries.py``). Its CUDA variants carry them as ``<package>/_binaries/``, covered by
the ``digest`` and in the variant's ``id``, only while their manifest's source digest is that
of the package's files; stale ones are left out, with a note.

In the ``kernels`` project this file is ``library/build.py``, and the files of
``library/_shared/`` (the launch helper every repository needs) are copied into each package,
byte for byte. git holds the sources only, never ``build/``; the builds are made where they are
needed, all with this file's functions:

* the package, run from a checkout, builds what it loads into a cache folder named by the
  build's digest (``kernels/library/builds.py``; no symbols.json);
* the wheel's build hook (``hatch_build.py``) writes them into the wheel (no symbols.json);
* ``kernels upload`` of a library repository uploads a fresh build (with symbols.json);
* ``make library`` writes ``library/<repo>/build/`` (ignored by git) for whoever wants it;
* the tests that need a Hub layout build into a temporary folder (``--out``).

``kernels init`` copies this file into a new repository, where it builds that repository
(which has no shared files); there ``build/`` is the author's to commit.

Usage::

    python library/build.py                 # every repository under library/ (or this one)
    python library/build.py norm rotary     # some of them
    python library/build.py --out DIR       # into DIR/<repo>/build/ instead
    python library/build.py --no-symbols    # without symbols.json (no torch needed)
    python library/build.py --check         # exit 1 if a build/ differs from its source
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.util
import inspect
import json
import re
import shutil
import subprocess
import sys
import tempfile
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

#: The folder of this script: our library/, or a repository it was copied into.
LIBRARY = Path(__file__).resolve().parent
#: Files every repository's package carries (the one source of each), where the folder exists.
SHARED = LIBRARY / "_shared"
CONFIG = "build.toml"
SOURCE = "torch-ext"
BUILD = "build"
METADATA = "metadata.json"
SYMBOLS = "symbols.json"
#: The symbols.json format version kernel-builder writes and ``kernels describe-api`` reads.
SYMBOLS_SCHEMA_VERSION = 1
#: Layer attributes symbols.json records (True/False, or None when not a bool).
LAYER_FLAGS = ("has_backward", "can_torch_compile")
#: The legacy variant, kept for clients that predate noarch variants.
UNIVERSAL = "torch-universal"
#: Its backend in metadata.json, which must name one: Hugging Face's client rejects
#: "universal" there. Our kernels are tested on CUDA.
UNIVERSAL_BACKEND = "cuda"
#: Backends a noarch ``torch-<backend>`` variant may name (kernel-builder's ``backends``).
BACKENDS = ("cpu", "cuda", "metal", "rocm", "xpu")
#: kernel-builder's default ``pyext``: the source files a package ships.
DEFAULT_PYEXT = ("py", "pyi")
LICENSE = "Apache-2.0"
#: Hex digits of the source digest in a variant's id.
ID_DIGEST_LENGTH = 10
#: A repository's captured Triton binaries (``library/binaries.py capture``), and the folder of
#: a variant's package that carries them (read by the shared ``_binaries.py``).
BINARIES = "binaries"
PACKAGE_BINARIES = "_binaries"
#: The backends whose variants carry them (Triton's CUDA targets).
BINARIES_BACKENDS = ("cuda",)

# kernel-builder's kernel names: lowercase letters, digits and dashes, a letter first.
_NAME = re.compile(r"[a-z][-a-z0-9]*[a-z0-9]")
_GENERAL_KEYS = {"name", "version", "edition", "license", "backends", "hub", "python-depends"}
_NOARCH_KEYS = {"pyext"}


class LibraryBuildError(Exception):
    """A repository's source cannot be built: the message names the file and the fix."""


@dataclass(frozen=True)
class Repository:
    """One kernel repository's source, as its ``build.toml`` describes it."""

    folder: Path
    name: str
    version: int
    license: str
    backends: tuple[str, ...]
    pyext: tuple[str, ...]

    @property
    def package(self) -> str:
        """The Python package name: the kernel name with dashes as underscores."""
        return self.name.replace("-", "_")

    @property
    def variants(self) -> tuple[str, ...]:
        return (UNIVERSAL, *(f"torch-{backend}" for backend in self.backends))


def read_repository(folder: Path) -> Repository:
    """Read and check ``folder``'s ``build.toml``.

    Raises:
        LibraryBuildError: the file is missing, not TOML, or not a noarch kernel's build.toml.
    """
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise LibraryBuildError(
                "Reading build.toml needs Python 3.11 or later, or the tomli package."
            ) from None
    path = folder / CONFIG
    where = str(path.relative_to(LIBRARY.parent) if path.is_relative_to(LIBRARY.parent) else path)
    try:
        config = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LibraryBuildError(f"{where} is missing; a kernel repository needs one.") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise LibraryBuildError(f"{where} is not valid TOML: {exc}.") from None
    general = _table(config, "general", where)
    unknown = set(config) - {"general", "torch-noarch"}
    if unknown:
        raise LibraryBuildError(
            f"{where} has {', '.join(sorted(unknown))}: this script builds pure-Python (noarch) "
            "repositories only; a compiled kernel is built with kernel-builder."
        )
    if "torch-noarch" not in config:
        raise LibraryBuildError(f"{where} needs a [torch-noarch] table (a pure-Python kernel).")
    noarch = _table(config, "torch-noarch", where)
    for table, keys, label in ((general, _GENERAL_KEYS, "general"), (noarch, _NOARCH_KEYS, "torch-noarch")):  # fmt: skip
        extra = set(table) - keys
        if extra:
            raise LibraryBuildError(f"{where}: [{label}] has unknown keys {sorted(extra)}.")
    name = general.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise LibraryBuildError(
            f"{where}: name must be lowercase letters, digits and dashes, starting with a "
            f"letter (kernel-builder's rule), got {name!r}."
        )
    if name != folder.name:
        raise LibraryBuildError(f"{where}: name {name!r} differs from its folder {folder.name!r}.")
    version = general.get("version")
    if type(version) is not int or version < 1:
        raise LibraryBuildError(f"{where}: version must be a positive integer, got {version!r}.")
    edition = general.get("edition", 5)
    if type(edition) is not int:
        raise LibraryBuildError(f"{where}: edition must be an integer, got {edition!r}.")
    license_ = general.get("license")
    if not isinstance(license_, str) or not license_:
        raise LibraryBuildError(
            f"{where}: license must be a license identifier such as {LICENSE!r}, got {license_!r}."
        )
    if general.get("python-depends", []) != []:
        raise LibraryBuildError(
            f"{where}: python-depends is not supported here; a Triton kernel needs torch and "
            "triton only."
        )
    backends = general.get("backends")
    if (
        not isinstance(backends, list)
        or not backends
        or any(b not in BACKENDS for b in backends)
        or len(set(backends)) != len(backends)
    ):
        raise LibraryBuildError(
            f"{where}: backends must be a non-empty list of distinct names among "
            f"{', '.join(BACKENDS)}, got {backends!r}."
        )
    pyext = noarch.get("pyext", list(DEFAULT_PYEXT))
    if not isinstance(pyext, list) or not all(isinstance(e, str) and e.isalnum() for e in pyext):
        raise LibraryBuildError(f"{where}: pyext must be a list of file extensions, got {pyext!r}.")
    return Repository(folder, name, version, license_, tuple(sorted(backends)), tuple(pyext))


def _table(config: Mapping, key: str, where: str) -> Mapping:
    table = config.get(key, {})
    if not isinstance(table, dict):
        raise LibraryBuildError(f"{where}: [{key}] must be a table.")
    return table


def package_files(repo: Repository) -> dict[str, bytes]:
    """The package's files by path relative to the package: its source under
    ``torch-ext/<package>/`` (the ``pyext`` extensions) and the shared files.

    Raises:
        LibraryBuildError: the source folder is missing, lacks ``__init__.py``, or holds a file
            of the same name as a shared one (which would be overwritten).
    """
    source = repo.folder / SOURCE / repo.package
    if not (source / "__init__.py").is_file():
        raise LibraryBuildError(
            f"{source} has no __init__.py: a repository's package source lives in "
            f"{SOURCE}/<package>/ (kernel-builder's layout)."
        )
    files = _files_under(source, repo.pyext)
    shared = _files_under(SHARED, DEFAULT_PYEXT) if SHARED.is_dir() else {}
    for name, content in shared.items():
        if name in files:
            raise LibraryBuildError(
                f"{source / name} has the name of a shared file ({SHARED / name}), which the "
                "build copies into every package: rename it, or edit the shared file."
            )
        files[name] = content
    return files


def _files_under(folder: Path, extensions: Iterable[str]) -> dict[str, bytes]:
    suffixes = {f".{e}" for e in extensions}
    files = {}
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if "__pycache__" in relative.parts or path.suffix not in suffixes:
            continue
        if path.is_symlink():
            raise LibraryBuildError(f"{path} is a symbolic link; a package ships plain files.")
        if path.is_file():
            files[relative.as_posix()] = path.read_bytes()
    return files


def source_digest(files: Mapping[str, bytes]) -> str:
    """A digest of a package's files (names and contents), in hex."""
    digest = hashlib.sha256()
    for name in sorted(files):
        content = files[name]
        digest.update(f"{name}\0{len(content)}\0".encode())
        digest.update(content)
    return digest.hexdigest()


def binaries_module() -> types.ModuleType | None:
    """The shared ``_binaries.py`` (its manifest reader), loaded by path; None where this script
    has no shared files (a repository of its own, whose package cannot use binaries)."""
    path = SHARED / "_binaries.py"
    if not path.is_file():
        return None
    module = sys.modules.get("_kernels_build_binaries")
    if module is None:
        spec = importlib.util.spec_from_file_location("_kernels_build_binaries", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return module


def shipped_binaries(repo: Repository, digest: str) -> tuple[dict[str, bytes], str | None]:
    """The files of ``repo``'s ``binaries/`` that its CUDA variants carry as ``_binaries/``
    (by path relative to it), and a note when there are binaries but they are not shipped.

    They ship only when their manifest's ``source_digest`` is ``digest`` (the package's
    sources now): binaries captured from other sources are left out, with the note, until
    they are captured again on a GPU.

    Raises:
        LibraryBuildError: the manifest is malformed, names another repository, or a file
            differs from its digest, is missing, or is not listed.
    """
    folder = repo.folder / BINARIES
    if not folder.exists():
        return {}, None
    reader = binaries_module()
    if reader is None:
        return {}, f"{repo.name}: {BINARIES}/ left out: the package has no _binaries.py to use it"
    manifest_path = folder / reader.MANIFEST
    try:
        found = reader.read_manifest(str(folder))
    except reader.ManifestError as exc:
        raise LibraryBuildError(f"{manifest_path} {exc}.") from None
    if found is None:
        raise LibraryBuildError(
            f"{folder} has no {reader.MANIFEST}: capture the binaries with "
            "`python library/binaries.py capture`, or delete the folder."
        )
    manifest, data = found
    if manifest.repository != repo.name:
        raise LibraryBuildError(
            f"{manifest_path} is for {manifest.repository!r}, not {repo.name!r}."
        )
    if manifest.source_digest != digest:
        return {}, (
            f"{repo.name}: {BINARIES}/ left out: captured from other sources than these "
            "(capture them again on a GPU: docs/writing-kernels.md, Shipped Triton binaries)"
        )
    problems = reader.verify_files(str(folder), manifest)
    if problems:
        raise LibraryBuildError(
            f"{folder}: {'; '.join(problems[:5])}. Capture the binaries again, or delete the folder."
        )
    files = {reader.MANIFEST: data}
    for group in manifest.groups:
        for file in group.files:
            files[reader.stored(file)] = (folder / reader.stored(file)).read_bytes()
    return files, None


def metadata(repo: Repository, variant: str, digest: str) -> dict:
    """A variant's ``metadata.json`` as Hugging Face's client reads it."""
    backend = UNIVERSAL_BACKEND if variant == UNIVERSAL else variant.removeprefix("torch-")
    kind = "universal" if variant == UNIVERSAL else backend
    return {
        "name": repo.name,
        "id": f"_{repo.package}_{kind}_{digest[:ID_DIGEST_LENGTH]}",
        "version": repo.version,
        "license": repo.license,
        "python-depends": [],
        "backend": {"type": backend},
    }


def build_files(repo: Repository, *, symbols: bool = True) -> dict[str, bytes]:
    """Every file of ``repo``'s ``build/`` folder, by path relative to it.

    Args:
        symbols: write each variant's ``symbols.json``, which imports the package in a child
            Python (seconds, and torch and triton must be installed). Without it the build is
            what a loader needs, made in milliseconds; each ``metadata.json``'s ``digest``
            covers the files the variant has either way.
    """
    files = package_files(repo)
    digest = source_digest(files)
    binaries, _ = shipped_binaries(repo, digest)
    # A variant's id names its content: one that carries binaries is another build than one
    # of the same sources without them (Hugging Face's client refuses to load two builds of
    # one id in a process).
    shipped = {f"{PACKAGE_BINARIES}/{name}": content for name, content in binaries.items()}
    with_binaries = source_digest({**files, **shipped}) if binaries else digest
    metas = {
        variant: metadata(repo, variant, with_binaries if _carries_binaries(variant) else digest)
        for variant in repo.variants
    }
    described = (
        describe(files, [meta["id"] for meta in metas.values()], where=repo.name) if symbols else {}
    )
    out = {}
    for variant, meta in metas.items():
        # torch-universal keeps the package in a folder of its own name (the legacy layout);
        # noarch variants are the package.
        prefix = f"{repo.package}/" if variant == UNIVERSAL else ""
        variant_files = {prefix + name: content for name, content in files.items()}
        if _carries_binaries(variant):
            variant_files.update({prefix + name: content for name, content in shipped.items()})
        if symbols:
            text = json.dumps(described[meta["id"]], indent=2, ensure_ascii=False) + "\n"
            variant_files[SYMBOLS] = text.encode()
        meta = {**meta, "digest": file_digests(variant_files)}
        variant_files[METADATA] = (json.dumps(meta, indent=2) + "\n").encode()
        out.update({f"{variant}/{name}": content for name, content in variant_files.items()})
    return out


def _carries_binaries(variant: str) -> bool:
    backend = UNIVERSAL_BACKEND if variant == UNIVERSAL else variant.removeprefix("torch-")
    return backend in BINARIES_BACKENDS


def file_digests(files: Mapping[str, bytes]) -> dict:
    """The ``digest`` entry of a variant's ``metadata.json``, as kernel-builder writes it: the
    SHA-256 of every file of the variant but ``metadata.json`` itself, in base64, by path.
    Clients check a download against it before importing anything."""
    return {
        "algorithm": "sha256",
        "files": {
            name: base64.b64encode(hashlib.sha256(files[name]).digest()).decode()
            for name in sorted(files)
            if name not in (METADATA, f"{METADATA}.sigstore")
        },
    }


# Imports are what take the time (torch, triton), and a package's symbols depend only on its
# files and the module name: one child Python per source, remembered for this process.
_SYMBOLS_CACHE: dict[tuple[str, tuple[str, ...]], dict[str, dict]] = {}


def describe(files: Mapping[str, bytes], modules: Iterable[str], *, where: str) -> dict[str, dict]:
    """The ``symbols.json`` of the package made of ``files`` when imported as each of
    ``modules``, by module name.

    The package is written to a temporary folder and imported there by a child Python (this
    interpreter, running this script with ``--describe``), so no kernel is imported here and
    each import registers its ops in a process that ends.

    Raises:
        LibraryBuildError: the package cannot be imported or its ``__all__`` is malformed.
    """
    modules = tuple(modules)
    key = (source_digest(files), modules)
    if key not in _SYMBOLS_CACHE:
        with tempfile.TemporaryDirectory(prefix="kernels-symbols-") as tmp:
            package = Path(tmp) / "package"
            write_files(files, package)
            command = [sys.executable, str(Path(__file__).resolve()), "--describe", str(package)]
            result = subprocess.run(
                [*command, *modules], capture_output=True, text=True, encoding="utf-8"
            )
        if result.returncode != 0:
            lines = (result.stderr.strip() or result.stdout.strip()).splitlines()
            raise LibraryBuildError(
                f"{where}: cannot import the package to write {SYMBOLS} ("
                + (lines[-1] if lines else f"exit status {result.returncode}")
                + "). symbols.json is made by importing the package, as kernel-builder does: "
                "run this script with a Python that has torch and triton."
            )
        _SYMBOLS_CACHE[key] = json.loads(result.stdout.splitlines()[-1])
    return _SYMBOLS_CACHE[key]


def describe_package(package_dir: Path, module_name: str) -> dict:
    """Import the package in ``package_dir`` as ``module_name`` and describe its public API
    in kernel-builder's ``symbols.json`` format (run in the child Python `describe` starts)."""
    import importlib
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        module_name, package_dir / "__init__.py", submodule_search_locations=[str(package_dir)]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {package_dir} as {module_name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # relative imports look the package up there
    try:
        spec.loader.exec_module(module)
        layers = getattr(module, "layers", None)
        if not inspect.ismodule(layers):
            # The package need not import its layers module itself.
            try:
                layers = importlib.import_module(f"{module_name}.layers")
            except ModuleNotFoundError as exc:
                if exc.name != f"{module_name}.layers":
                    raise
                layers = None
        return {
            "schema_version": SYMBOLS_SCHEMA_VERSION,
            "module": module_name,
            "functions": _exports(module, inspect.isfunction),
            "layers": _exports(layers, inspect.isclass) if layers is not None else [],
        }
    finally:
        for name in [n for n in sys.modules if n == module_name or n.startswith(f"{module_name}.")]:
            del sys.modules[name]


def _exports(module: types.ModuleType, predicate) -> list[dict]:
    """The public names of ``module`` that satisfy ``predicate``, described, in ``__all__``
    order; without ``__all__``, the public ones defined in the module itself (our layers
    modules have none; kernel-builder would list nothing there)."""
    exported = getattr(module, "__all__", None)
    if exported is None:
        exported = [
            name
            for name, value in vars(module).items()
            if getattr(value, "__module__", None) == module.__name__
        ]
    elif not isinstance(exported, (list, tuple)) or not all(isinstance(n, str) for n in exported):
        raise ValueError(f"{module.__name__}.__all__ must be a list or tuple of strings")
    described = []
    for name in dict.fromkeys(exported):
        if name.startswith("_") or name == "layers":
            continue
        try:
            value = getattr(module, name)
        except AttributeError:
            raise ValueError(f"{module.__name__}.__all__ names {name!r}, which it lacks") from None
        if predicate(value):
            described.append(_symbol(name, value))
    return described


def _symbol(name: str, value) -> dict:
    # A class's own docstring only: inspect.getdoc would give a layer without one the
    # docstring of torch.nn.Module, which changes with torch.
    doc = value.__doc__ if inspect.isclass(value) else inspect.getdoc(value)
    symbol = {
        "name": name,
        "qualname": value.__qualname__,
        "module": value.__module__,
        "kind": "class" if inspect.isclass(value) else "function",
        "doc": inspect.cleandoc(doc) if isinstance(doc, str) else None,
        "signature": _signature(value),
    }
    if inspect.isclass(value):
        symbol["attributes"] = {
            flag: flag_value if isinstance(flag_value := getattr(value, flag, None), bool) else None
            for flag in LAYER_FLAGS
        }
    return symbol


def _signature(value) -> dict | None:
    try:
        signature = inspect.signature(value, eval_str=False)
    except (TypeError, ValueError):  # builtins and some callables have none
        return None

    def text(annotation) -> str | None:
        return (
            None if annotation is inspect.Parameter.empty else inspect.formatannotation(annotation)
        )

    return {
        "parameters": [
            {
                "name": p.name,
                "kind": p.kind.name,
                "default": None if p.default is inspect.Parameter.empty else repr(p.default),
                "annotation": text(p.annotation),
            }
            for p in signature.parameters.values()
        ],
        "return_annotation": text(signature.return_annotation),
    }


def repositories(names: Iterable[str] | None = None) -> list[Repository]:
    """The repositories named (folders, relative to this script's), else this script's folder
    when it is a repository, else the folders under it with a build.toml."""
    if names:
        return [read_repository(LIBRARY / name) for name in names]
    if (LIBRARY / CONFIG).is_file():
        return [read_repository(LIBRARY)]
    return [read_repository(p.parent) for p in sorted(LIBRARY.glob(f"*/{CONFIG}"))]


def library_files(*, symbols: bool = False) -> dict[str, bytes]:
    """Every file of this script's folder as an installed ``kernels`` package carries it
    (``kernels/_library``), by path relative to the folder: the sources (this script, the
    shared files, each repository's ``build.toml``, ``torch-ext/``, README and benchmarks) and
    each repository's fresh ``build/`` (`build_files`; ``symbols``: as there, default without).
    Left out: any ``build/`` already there, bytecode, hidden files and folders (tool caches),
    ``benchmarks/results/``, and each repository's captured ``binaries/``: the CUDA variants of
    its fresh build carry the ones that match its sources, and nothing loads them from there
    (a second copy of every cubin in the wheel would be weight and nothing else).

    Raises:
        LibraryBuildError: a repository cannot be built, or the folder holds a link.
    """
    repos = repositories()
    builds = {repo.folder.relative_to(LIBRARY).joinpath(BUILD).parts: repo for repo in repos}
    repo_folders = {repo.folder.relative_to(LIBRARY).parts for repo in repos}
    files = {}
    for path in sorted(LIBRARY.rglob("*")):
        parts = path.relative_to(LIBRARY).parts
        if (
            any(part.startswith(".") or part == "__pycache__" for part in parts)
            or path.suffix in (".pyc", ".pyo")
            or any(parts[: len(b)] == b for b in builds)
            or any(parts[i : i + 2] == ("benchmarks", "results") for i in range(len(parts)))
            or (len(parts) > 1 and parts[1] == BINARIES and parts[:1] in repo_folders)
        ):
            continue
        if path.is_symlink():
            raise LibraryBuildError(f"{path} is a symbolic link; the library ships plain files.")
        if path.is_file():
            files["/".join(parts)] = path.read_bytes()
    for parts, repo in builds.items():
        for name, content in build_files(repo, symbols=symbols).items():
            files["/".join((*parts, name))] = content
    return files


def write_files(files: Mapping[str, bytes], folder: Path) -> None:
    """Write ``files`` (by path relative to ``folder``, as `build_files` and `library_files`
    give them) under ``folder``, making the folders they need. The one writer of the library's
    files: the builds here, the capture tool, the package's cache and the wheel's build hook."""
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)


def write_build(repo: Repository, out: Path | None = None, *, symbols: bool = True) -> Path:
    """Write ``repo``'s ``build/`` folder afresh under ``out`` (default: the repository's own
    folder) and return it. Files of an earlier build that the source no longer has go too.
    ``symbols``: as for `build_files`."""
    files = build_files(repo, symbols=symbols)
    target = (out if out is not None else repo.folder) / BUILD
    if target.exists():
        shutil.rmtree(target)
    write_files(files, target)
    return target


def tree(folder: Path) -> dict[str, bytes]:
    """The files under ``folder`` by relative path, without Python's byte-code caches."""
    if not folder.is_dir():
        return {}
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.relative_to(folder).parts
    }


def differences(repo: Repository, out: Path | None = None, *, symbols: bool = True) -> list[str]:
    """How the ``build/`` of ``repo`` under ``out`` (default: the repository's own folder)
    differs from a fresh build: one line a file."""
    expected = build_files(repo, symbols=symbols)
    actual = tree((out if out is not None else repo.folder) / BUILD)
    lines = []
    for name in sorted(set(expected) | set(actual)):
        if name not in actual:
            lines.append(f"missing   {BUILD}/{name}")
        elif name not in expected:
            lines.append(f"extra     {BUILD}/{name}")
        elif actual[name] != expected[name]:
            lines.append(f"differs   {BUILD}/{name}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "repos", nargs="*", help="repository folders (default: this one, or all under library/)"
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        type=Path,
        help="write (or --check) DIR/<repo>/build/ rather than each repository's own build/",
    )
    parser.add_argument(
        "--no-symbols",
        dest="symbols",
        action="store_false",
        help="leave out symbols.json (made by importing the package: needs torch and triton)",
    )
    parser.add_argument(
        "--check", action="store_true", help="compare the build/ folders, write nothing"
    )
    parser.add_argument("--describe", metavar="PACKAGE_DIR", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.describe is not None:
        # The child Python of `describe`: one JSON line, {module name: symbols.json}, last.
        described = {name: describe_package(args.describe, name) for name in args.repos}
        print(json.dumps(described, ensure_ascii=False))
        return 0

    def out(repo: Repository) -> Path | None:
        return None if args.out is None else args.out / repo.name

    try:
        repos = repositories(args.repos)
        if args.check:
            stale = {
                repo.name: differences(repo, out(repo), symbols=args.symbols) for repo in repos
            }
            for name, lines in stale.items():
                for line in lines:
                    print(f"{name}: {line}")
            if any(stale.values()):
                print(
                    "Rebuild from torch-ext/ with `make library` (our library) or "
                    "`python build.py` (a repository of its own)."
                )
                return 1
            return 0
        for repo in repos:
            target = write_build(repo, out(repo), symbols=args.symbols)
            print(f"{target}: {', '.join(repo.variants)}")
            note = shipped_binaries(repo, source_digest(package_files(repo)))[1]
            if note:
                print(f"note: {note}")
    except LibraryBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
