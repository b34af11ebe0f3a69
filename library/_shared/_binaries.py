"""Compiled Triton kernels this package ships, seeded into Triton's cache before it compiles.

Triton compiles a kernel the first time a process launches it with a new signature and writes
the result into its cache folder (``triton.knobs.cache.dir``: ``$TRITON_CACHE_DIR``, by
default ``~/.triton/cache``), one folder per cache key::

    <cache>/<key>/<kernel>.json           metadata (what a cache hit reads)
    <cache>/<key>/<kernel>.cubin          the binary (.hsaco on ROCm)
    <cache>/<key>/__grp__<kernel>.json    the group: {"child_paths": {file: absolute path}}
    <cache>/<key>/__triton_launcher<EXT_SUFFIX>   a C module (Triton 3.6 builds one launcher
                                                  per kernel signature, and its driver utils)

The key hashes everything the result depends on (the kernel's source, its argument types and
constexprs, the options, Triton's own build, the target GPU; for a C module its C source and
the platform), so a file found under a key is the one Triton would write there. This package
may ship a subset of such a cache, captured on a GPU after running the library's workloads
(``library/binaries.py capture``) or compiled from its launch records (``build``), in
``_binaries/``::

    _binaries/manifest.json          the groups: each file's name in the cache, SHA-256, size
    _binaries/files/<sha256><ext>    each file's content, once, with its name's extension
                                     (.json, .cubin, .hsaco, .so, .pyd), so that a compiled
                                     module is seen as one (a ZIP build refuses them)

The manifest lists groups: kernel groups (a Triton version, a target, a cache key, the
kernel's metadata and binary) and C module groups (a Triton version, a platform, a key, the
module). Contents are stored by their digest, once: a kernel's key hashes Triton's own build,
whose shared library differs between Pythons, so a kernel group is for one Python (its
``platform``), and each Python's set holds the same binaries under other keys.
`seed` copies into the user's cache the files of the groups made by the running Triton for the
current GPU and this interpreter's platform that the cache lacks, each after
checking its SHA-256 against the manifest; a group's ``__grp__`` file, which holds absolute
paths, is written by us, last, once its files are in place. Triton then finds them and
compiles nothing. Whatever does not match (another Triton, another GPU, a shape whose key was
not captured) is simply compiled as before. A file whose digest differs is never copied, and
Triton loads only from its cache, so it is never loaded.

This file is shared by every kernel repository of the ``kernels`` project (one source:
``library/_shared/_binaries.py``); it imports neither torch nor triton at module level, so
``kernels check`` and the capture tool use its manifest reader too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import stat
import sysconfig
import threading
import uuid
from dataclasses import dataclass

logger = logging.getLogger("kernels.binaries")

#: The folder of a package that holds its binaries, and the manifest in it.
FOLDER = "_binaries"
MANIFEST = "manifest.json"
#: The manifest's format version (2: contents stored once, by digest, under ``files/``).
FORMAT = 2
#: The folder of ``_binaries/`` that holds each file's content, named by its SHA-256.
STORE = "files"
#: Bounds on what is read: a manifest is hostile input until its digests have been checked.
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_TOTAL_BYTES = 1024 * 1024 * 1024
MAX_FILES = 20_000
#: The marker a seeding leaves in the cache folder, so that later processes check one file.
MARKER_PREFIX = "kernels-seeded-"
#: Set to 0 to seed nothing (every kernel compiles, as without binaries).
ENV_SWITCH = "KERNELS_TRITON_BINARIES"
#: C modules Triton's drivers build (launchers, and the driver's utils).
MODULES = ("__triton_launcher", "cuda_utils", "hip_utils")

_VERSION = re.compile(r"[0-9]+\.[0-9]+(\.[0-9]+)?([-+.][A-Za-z0-9.+-]{1,40})?")
_TARGET = re.compile(r"(cuda|hip):[A-Za-z0-9_]{1,32}")
_PLATFORM = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
# Triton's cache keys: base32 of a SHA-256 (Triton 3), or hex (earlier).
_KEY = re.compile(r"[A-Za-z0-9]{16,128}")
_KERNEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,149}")
_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,199}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_GROUP_KEYS = {"triton", "target", "platform", "key", "kernel", "module", "files"}


class ManifestError(ValueError):
    """A binaries manifest that does not follow the format: the message says where."""


@dataclass(frozen=True)
class BinaryFile:
    """One file of a group: its name in the cache folder, its SHA-256 (hex) and size."""

    name: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Group:
    """Files that Triton keeps under one cache key: a compiled kernel (``kernel`` set, for
    ``target``, compiled under the cache key of the Python of ``platform`` where set) or a C
    module (``module`` set, for ``platform``)."""

    triton: str
    key: str
    files: tuple[BinaryFile, ...]
    target: str | None = None
    kernel: str | None = None
    platform: str | None = None
    module: str | None = None

    @property
    def group_file(self) -> str | None:
        """The ``__grp__`` file Triton looks for (kernel groups), which `seed` writes."""
        return None if self.kernel is None else f"__grp__{self.kernel}.json"


@dataclass(frozen=True)
class Manifest:
    """``_binaries/manifest.json``: the repository, the digest of the package sources the
    binaries were compiled from (``library/build.py``'s ``source_digest``), and the groups."""

    repository: str
    source_digest: str
    groups: tuple[Group, ...]

    def to_json(self) -> str:
        groups = []
        for g in self.groups:
            entry: dict = {"triton": g.triton}
            if g.kernel is not None:
                entry.update(target=g.target, kernel=g.kernel)
                if g.platform is not None:
                    entry.update(platform=g.platform)
            else:
                entry.update(platform=g.platform, module=g.module)
            entry["key"] = g.key
            entry["files"] = {f.name: {"sha256": f.sha256, "size": f.size} for f in g.files}
            groups.append(entry)
        document = {
            "format": FORMAT,
            "repository": self.repository,
            "source_digest": self.source_digest,
            "groups": groups,
        }
        return json.dumps(document, indent=1, sort_keys=False) + "\n"


def parse_manifest(data: bytes) -> Manifest:
    """Read a manifest strictly: every key known, every name a plain one, sizes bounded.

    Raises:
        ManifestError: anything else, with what and where.
    """
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"is larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ManifestError(f"is not JSON ({exc})") from None
    if not isinstance(document, dict) or set(document) != {
        "format",
        "repository",
        "source_digest",
        "groups",
    }:
        raise ManifestError("must be an object with format, repository, source_digest, groups")
    if document["format"] != FORMAT or type(document["format"]) is not int:
        raise ManifestError(f"has format {document['format']!r}; this reader knows {FORMAT}")
    repository, digest, raw_groups = (
        document["repository"],
        document["source_digest"],
        document["groups"],
    )
    if not isinstance(repository, str) or not _KERNEL.fullmatch(repository.replace("-", "_")):
        raise ManifestError(f"repository {repository!r} is not a kernel name")
    if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
        raise ManifestError("source_digest must be 64 lowercase hex digits")
    if not isinstance(raw_groups, list):
        raise ManifestError("groups must be a list")
    groups, seen, contents, total = [], set(), {}, 0
    for index, raw in enumerate(raw_groups):
        group = _parse_group(raw, f"groups[{index}]")
        for file in group.files:
            where = f"{group.key}/{file.name}"
            if where in seen:
                raise ManifestError(f"groups[{index}] lists {where} a second time")
            seen.add(where)
            if contents.setdefault(file.sha256, file.size) != file.size:
                raise ManifestError(f"groups[{index}] gives {file.sha256} another size")
            total += file.size
        if len(contents) > MAX_FILES or total > MAX_TOTAL_BYTES:
            raise ManifestError(f"lists more than {MAX_FILES} files or {MAX_TOTAL_BYTES} bytes")
        groups.append(group)
    return Manifest(repository, digest, tuple(groups))


def _parse_group(raw, where: str) -> Group:
    if not isinstance(raw, dict) or not set(raw) <= _GROUP_KEYS:
        raise ManifestError(f"{where} must be an object with keys among {sorted(_GROUP_KEYS)}")
    triton, key, files = raw.get("triton"), raw.get("key"), raw.get("files")
    if not isinstance(triton, str) or not _VERSION.fullmatch(triton):
        raise ManifestError(f"{where}.triton {triton!r} is not a Triton version")
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise ManifestError(f"{where}.key {key!r} is not a Triton cache key")
    if not isinstance(files, dict) or not files:
        raise ManifestError(f"{where}.files must be a non-empty object")
    kernel_group = set(raw) - {"platform"} == {"triton", "target", "kernel", "key", "files"}
    module_group = set(raw) == {"triton", "platform", "module", "key", "files"}
    if "platform" in raw and not (
        isinstance(raw["platform"], str) and _PLATFORM.fullmatch(raw["platform"])
    ):
        raise ManifestError(f"{where}.platform {raw['platform']!r} is not a platform tag")
    if kernel_group:
        target, kernel = raw["target"], raw["kernel"]
        if not isinstance(target, str) or not _TARGET.fullmatch(target):
            raise ManifestError(f"{where}.target {target!r} is not a target such as 'cuda:90'")
        if not isinstance(kernel, str) or not _KERNEL.fullmatch(kernel):
            raise ManifestError(f"{where}.kernel {kernel!r} is not a kernel name")
        prefix = f"{kernel}."
        if f"{kernel}.json" not in files:
            raise ManifestError(f"{where} lacks {kernel}.json, the kernel's metadata")
    elif module_group:
        module = raw["module"]
        if module not in MODULES:
            raise ManifestError(f"{where}.module {module!r} is not one of {', '.join(MODULES)}")
        prefix = f"{module}."
        if len(files) != 1:
            raise ManifestError(f"{where}: a C module group holds one file")
    else:
        raise ManifestError(
            f"{where} must have either target and kernel, and perhaps platform (a kernel), or "
            "platform and module (a C module)"
        )
    parsed = []
    for name, entry in files.items():
        if (
            not _FILE.fullmatch(name)
            or name.startswith("__grp__")
            or not name.startswith(prefix)
            or (module_group and not name.endswith((".so", ".pyd")))
        ):
            raise ManifestError(f"{where}.files: {name!r} is not a file name this group may hold")
        if not isinstance(entry, dict) or set(entry) != {"sha256", "size"}:
            raise ManifestError(f"{where}.files[{name!r}] must be {{sha256, size}}")
        sha, size = entry["sha256"], entry["size"]
        if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
            raise ManifestError(f"{where}.files[{name!r}].sha256 must be 64 lowercase hex digits")
        if type(size) is not int or not 0 <= size <= MAX_FILE_BYTES:
            raise ManifestError(
                f"{where}.files[{name!r}].size must be an integer from 0 to {MAX_FILE_BYTES}"
            )
        parsed.append(BinaryFile(name, sha, size))
    return Group(
        triton=triton,
        key=key,
        files=tuple(parsed),
        target=raw.get("target"),
        kernel=raw.get("kernel"),
        platform=raw.get("platform"),
        module=raw.get("module"),
    )


def read_bounded(path: str, limit: int) -> bytes:
    """The bytes of the regular file ``path`` (never through a link), at most ``limit``.

    Raises:
        OSError: it is missing, a link or not a regular file, or larger than ``limit``.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(f"{path} is not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(f"{path} is larger than {limit} bytes")
    return data


def read_manifest(binaries_dir: str) -> tuple[Manifest, bytes] | None:
    """The manifest of ``binaries_dir`` (a package's ``_binaries/``) and its bytes; None when
    there is none.

    Raises:
        ManifestError: it is not a regular file, too large, or not in the format.
    """
    path = os.path.join(binaries_dir, MANIFEST)
    if not os.path.lexists(path):
        return None
    try:
        data = read_bounded(path, MAX_MANIFEST_BYTES)
    except OSError as exc:
        raise ManifestError(f"cannot be read ({exc})") from None
    return parse_manifest(data), data


def file_sha256(data: bytes) -> str:
    """The hex SHA-256 of ``data`` (a function of its own, so tests can count the hashing)."""
    return hashlib.sha256(data).hexdigest()


#: The extensions a stored content keeps (of the file names a group may hold).
STORED_EXTENSIONS = (".json", ".cubin", ".hsaco", ".so", ".pyd")


def stored(file: BinaryFile) -> str:
    """Where ``file``'s content is, relative to ``_binaries/``: its checked digest and its
    name's extension, one of `STORED_EXTENSIONS` (no other part of a name from the manifest
    reaches the file system)."""
    extension = next((e for e in STORED_EXTENSIONS if file.name.endswith(e)), "")
    return f"{STORE}/{file.sha256}{extension}"


def verify_files(binaries_dir: str, manifest: Manifest) -> list[str]:
    """What is wrong with the files of ``binaries_dir`` against ``manifest``, one line each:
    missing, a link, of another size or digest, or not listed. Empty when all is right."""
    problems, listed = [], {MANIFEST}
    for group in manifest.groups:
        for file in group.files:
            relative = stored(file)
            if relative in listed:
                continue
            listed.add(relative)
            try:
                path = os.path.join(binaries_dir, *relative.split("/"))
                data = read_bounded(path, MAX_FILE_BYTES)
            except OSError as exc:
                problems.append(f"{relative} ({file.name}): cannot be read ({exc})")
                continue
            if len(data) != file.size or file_sha256(data) != file.sha256:
                problems.append(
                    f"{relative} ({file.name}): its SHA-256 differs from the manifest's"
                )
    for root, dirs, names in os.walk(binaries_dir):
        for name in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            relative = os.path.relpath(os.path.join(root, name), binaries_dir).replace(os.sep, "/")
            if relative not in listed:
                problems.append(f"{relative}: not listed in the manifest")
    return sorted(problems)


#: Files of a variant's package that the build writes, not its sources.
BUILD_OUTPUTS = ("metadata.json", "metadata.json.sigstore", "symbols.json")


def shipped_source_digest(package_dir: str) -> str:
    """The digest of the sources of the built package in ``package_dir`` (every file but
    ``_binaries/``, bytecode and the build's ``metadata.json``/``symbols.json``): what
    ``library/build.py``'s ``source_digest`` gave for the files it built the package from,
    and what a manifest's ``source_digest`` must be."""
    files = {}
    for root, dirs, names in os.walk(package_dir):
        relative_root = os.path.relpath(root, package_dir).replace(os.sep, "/")
        if relative_root == ".":
            dirs[:] = [d for d in dirs if d != FOLDER]
            names = [n for n in names if n not in BUILD_OUTPUTS]
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in names:
            relative = name if relative_root == "." else f"{relative_root}/{name}"
            with open(os.path.join(root, name), "rb") as f:
                files[relative] = f.read()
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(f"{name}\0{len(files[name])}\0".encode())
        digest.update(files[name])
    return digest.hexdigest()


# ---- seeding ----------------------------------------------------------------------------------


def platform_tag() -> str:
    """This interpreter's tag for C modules: its extension suffix without the dot and ``.so``
    (``cpython-311-x86_64-linux-gnu``), which Triton's module file names end with."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    stem = suffix[1:] if suffix.startswith(".") else suffix
    return stem.rsplit(".", 1)[0] if stem.endswith((".so", ".pyd")) else stem


def device_target(index: int) -> str | None:
    """The Triton target of CUDA device ``index`` (``cuda:90``, ``hip:gfx942``), as Triton's
    drivers name it, found through torch, so that Triton's driver (whose utils are one of the
    C modules we may seed) is not started to ask."""
    import torch

    if getattr(torch.version, "hip", None):
        arch = getattr(torch.cuda.get_device_properties(index), "gcnArchName", "")
        return f"hip:{arch.split(':')[0]}" if arch else None
    major, minor = torch.cuda.get_device_capability(index)
    return f"cuda:{major * 10 + minor}"


@dataclass
class SeedReport:
    """What one `seed` did: files written, files already in the cache, groups refused (a
    digest mismatch), and why nothing was done, if so."""

    written: int = 0
    present: int = 0
    refused: int = 0
    skipped: str | None = None


def _triton_cache_dir() -> tuple[str | None, str | None]:
    """Triton's cache folder, or None and why seeding must not touch it."""
    import triton

    knobs = getattr(triton, "knobs", None)
    if os.environ.get("TRITON_CACHE_MANAGER") or os.environ.get("TRITON_REMOTE_CACHE_BACKEND"):
        return None, "a cache manager of the user's own is set (TRITON_CACHE_MANAGER)"
    if knobs is None:  # Triton before 3.4
        home = os.environ.get("TRITON_HOME", os.path.expanduser("~"))
        return os.environ.get("TRITON_CACHE_DIR") or os.path.join(home, ".triton", "cache"), None
    cache = knobs.cache
    from triton.runtime.cache import FileCacheManager

    if cache.manager_class not in (None, FileCacheManager):
        return None, f"a cache manager of the user's own is set ({cache.manager_class!r})"
    if getattr(cache, "remote_manager_class", None) is not None:
        return None, "a remote cache is set"
    if getattr(knobs.compilation, "always_compile", False):
        return None, "TRITON_ALWAYS_COMPILE is set"
    return cache.dir or None, None


def seed(
    package_dir: str,
    *,
    target: str,
    triton_version: str | None = None,
    platform: str | None = None,
    cache_dir: str | None = None,
) -> SeedReport:
    """Copy the binaries of ``package_dir/_binaries`` made by this Triton for ``target`` (and
    this interpreter's ``platform``) into Triton's cache folder, where it lacks them.

    Never raises for what it meets on disk: a refused manifest or file, or a cache that cannot
    be written, is logged (a WARNING) and seeding stops or goes on without that file.
    ``triton_version``, ``platform`` and ``cache_dir`` default to the running ones.
    """
    report = SeedReport()
    if os.environ.get(ENV_SWITCH) == "0":
        report.skipped = f"{ENV_SWITCH}=0"
        return report
    binaries_dir = os.path.join(package_dir, FOLDER)
    where = os.path.basename(os.path.normpath(package_dir))
    try:
        found = read_manifest(binaries_dir)
    except ManifestError as exc:
        logger.warning(
            "%s: its binaries manifest %s %s; its Triton kernels compile as usual.",
            where,
            os.path.join(binaries_dir, MANIFEST),
            exc,
        )
        report.skipped = "manifest refused"
        return report
    if found is None:
        report.skipped = "no binaries"
        return report
    manifest, manifest_bytes = found
    if triton_version is None:
        import triton

        triton_version = triton.__version__
    if cache_dir is None:
        cache_dir, reason = _triton_cache_dir()
        if cache_dir is None:
            logger.debug("%s: binaries not seeded: %s.", where, reason)
            report.skipped = reason
            return report
    platform = platform_tag() if platform is None else platform

    def wanted(g: Group) -> bool:
        if g.triton != triton_version:
            return False
        if g.kernel is None:
            return g.platform == platform
        # A kernel's cache key hashes Triton's build for one Python: its group is that
        # Python's (one without a platform is taken for any).
        return g.target == target and g.platform in (None, platform)

    groups = [g for g in manifest.groups if wanted(g)]
    if not groups:
        logger.debug(
            "%s: no binaries for Triton %s on %s (%s).", where, triton_version, target, platform
        )
        report.skipped = "no matching binaries"
        return report
    selection = f"\0{triton_version}\0{target}\0{platform}".encode()
    marker = os.path.join(cache_dir, MARKER_PREFIX + file_sha256(manifest_bytes + selection)[:32])
    if os.path.exists(marker):
        report.skipped = "seeded before"
        return report
    try:
        for group in groups:
            _seed_group(binaries_dir, cache_dir, group, where, report)
        if not report.refused:
            _write_atomically(marker, b"")
    except OSError as exc:
        logger.warning(
            "%s: cannot write its Triton binaries into %s (%s); its kernels compile as usual.",
            where,
            cache_dir,
            exc,
        )
        report.skipped = "cache not writable"
    return report


def _seed_group(
    binaries_dir: str, cache_dir: str, group: Group, where: str, report: SeedReport
) -> None:
    destination = os.path.join(cache_dir, group.key)
    if group.group_file is not None and os.path.exists(os.path.join(destination, group.group_file)):
        report.present += len(group.files)
        return
    missing = [f for f in group.files if not os.path.exists(os.path.join(destination, f.name))]
    report.present += len(group.files) - len(missing)
    contents = []
    for file in missing:
        relative = stored(file)
        try:
            data = read_bounded(os.path.join(binaries_dir, *relative.split("/")), file.size)
        except OSError:
            data = None
        if data is None or len(data) != file.size or file_sha256(data) != file.sha256:
            # Not copied, so never loaded: Triton reads only its own cache, and without this
            # group's files (and its __grp__ file) it compiles the kernel itself.
            logger.warning(
                "%s: the shipped binary %s (%s/%s) is missing or its SHA-256 differs from the "
                "manifest's; it is not used (that kernel compiles as usual). Reinstall or "
                "re-download the kernel repository.",
                where,
                file.name,
                FOLDER,
                relative,
            )
            report.refused += 1
            return
        contents.append((file.name, data))
    os.makedirs(destination, exist_ok=True)
    for name, data in contents:
        _write_atomically(os.path.join(destination, name), data)
        report.written += 1
    if group.group_file is not None:
        # Triton's group file names its files by absolute path: written here, for this cache,
        # and last, so that Triton never finds a group whose files are not all there.
        children = {f.name: os.path.join(destination, f.name) for f in group.files}
        text = json.dumps({"child_paths": children})
        _write_atomically(os.path.join(destination, group.group_file), text.encode())


def _write_atomically(path: str, data: bytes) -> None:
    # A temporary file beside the target, created with the user's umask (as Triton's own
    # files are), then renamed: no reader sees a partial file.
    temporary = f"{path}.tmp.kernels-{os.getpid()}-{uuid.uuid4().hex}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(temporary, flags | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


# Once per process and target, for this package (each package carries its own copy).
_seeded: set = set()
_targets: dict = {}
_lock = threading.Lock()


def seed_for_device(index: int) -> None:
    """Seed this package's binaries for CUDA device ``index``, once per process and target.

    Called by ``_library.launch`` where a launch is not in its cache, before Triton compiles
    (nothing happens on the CPU or under Triton's interpreter). Never raises.
    """
    target = _targets.get(index)
    if target is not None and target in _seeded:
        return
    with _lock:
        try:
            if index not in _targets:
                _targets[index] = device_target(index)
            target = _targets[index]
            if target is None or target in _seeded:
                return
            _seeded.add(target)
            seed(os.path.dirname(os.path.abspath(__file__)), target=target)
        except Exception as exc:  # seeding only saves time: it must never stop a launch
            logger.warning("Seeding the shipped Triton binaries failed (%r); they compile.", exc)
