"""Capture our kernel repositories' Triton binaries from a Triton cache, for the builds to ship.

Run the library's workloads on a GPU with a fresh Triton cache, then capture from it::

    export TRITON_CACHE_DIR=/tmp/triton-capture      # empty, on the GPU machine
    python -m benchmarks.cold_start ...              # and the GPU tests: every shape they launch
    python library/binaries.py capture /tmp/triton-capture            # every repository
    python library/binaries.py capture /tmp/a /tmp/b --repos norm     # several caches; some repos
    python library/binaries.py list                                    # what each one holds
    python library/binaries.py verify                                  # compile again, compare

For each repository it takes, from the cache:

* each compiled kernel whose name is one of the package's ``@triton.jit`` functions (their
  ``<kernel>.json`` metadata and ``<kernel>.cubin``/``.hsaco``, what a cache hit reads; the IR
  files, which only debugging reads, are left out, as Triton's ``TRITON_STORE_BINARY_ONLY``
  leaves them out);
* the C modules Triton 3.6 builds with the machine's C compiler (a launcher per kernel
  signature, and the driver's utils). A launcher's cache key hashes the C source Triton
  generates for a signature, which the cache does not record, so which kernel needs which
  launcher cannot be told from the cache: every repository with kernels in the capture takes
  every launcher of it (a few tens of kB each). Capture from a cache that only the library's
  workloads filled. ``--no-modules`` leaves them out.

and writes them, with a manifest (the shared ``_binaries.py`` reads and documents it), into::

    library/<repo>/binaries/manifest.json          the groups and their files' digests
    library/<repo>/binaries/files/<sha256><ext>    each content once

Beside the folder, ``library/<repo>/binaries-launches.json`` keeps each launch that compiled
one of its kernels (``kernels.library.triton_launches``: the kernel, its arguments as Triton
specializes on them, the options and the target), recorded by the capture runs
(``benchmarks.cold_start --keep-cache`` sets ``KERNELS_RECORD_LAUNCHES=1``). From those, no GPU
is needed any more::

    python library/binaries.py build --triton 3.6.0 3.9.0 --python python3.11 python3.12
    python library/binaries.py verify                                  # compile again, compare

``build`` compiles every launch again for its target with each Triton version, under each
Python's cache key (Triton's key hashes its own build, which differs between Pythons; the
binaries do not), and adds those sets to the folder: binaries for users of other torch
releases and Pythons than the capture's, made on the CPU. ``verify`` compiles the launches
with this machine's Triton and compares with the set shipped for it: the cache keys (the
inputs, the sources among them) and the binaries (the code; a cubin's debug sections name the
paths it was compiled at, so they are left out of the comparison).

A capture replaces what the folder held for the same Triton version, target and Python (or
C modules' platform), and keeps the rest when it was captured from the same sources; binaries of other sources are
dropped. ``library/build.py`` ships the folder into each CUDA variant as ``_binaries/`` while its
manifest's source digest is that of the sources, and leaves it out, with a note, once the
sources change: capture again then.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import types
from dataclasses import dataclass, replace
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def _load(name: str, path: Path) -> types.ModuleType:
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return module


build = _load("_kernels_library_build", _HERE / "build.py")
shared = build.binaries_module()

#: Beside a repository's binaries/: the launches its kernels were compiled for.
LAUNCHES = "binaries-launches.json"
#: The file a kernel's binary is in, by Triton backend.
BINARY_EXTENSIONS = {"cuda": "cubin", "hip": "hsaco"}
#: The largest metadata file read from a cache.
MAX_METADATA_BYTES = 1024 * 1024
_MODULE_FILE = re.compile(r"(" + "|".join(map(re.escape, shared.MODULES)) + r")\.(.+)\.(so|pyd)")
_KEY = re.compile(r"[A-Za-z0-9]{16,128}")


@dataclass(frozen=True)
class Cached:
    """A group found in a Triton cache, and the paths of the files to keep."""

    group: object  # shared.Group
    paths: dict[str, Path]


def jit_names(repo) -> set[str]:
    """The names of the functions of ``repo``'s package decorated with ``triton.jit`` (alone
    or under ``triton.autotune`` / ``triton.heuristics``): the names Triton gives its kernels."""
    names = set()
    source = repo.folder / build.SOURCE / repo.package
    for path in sorted(source.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and any(
                _dotted(d).rsplit(".", 1)[-1] == "jit" for d in node.decorator_list
            ):
                names.add(node.name)
    return names


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        return _dotted(node.func)
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def scan_cache(
    cache_dirs: Path | list[Path], triton_version: str | None
) -> tuple[list[Cached], list[Cached]]:
    """The complete kernel groups (those with their ``__grp__`` file, which Triton writes last)
    and the C modules of one or more Triton caches (a group in several is taken once). C
    modules record no Triton version: they get ``triton_version``, else the one version of the
    kernels found (none if several)."""
    if isinstance(cache_dirs, Path):
        cache_dirs = [cache_dirs]
    folders: dict[str, Path] = {}
    for cache_dir in cache_dirs:
        for folder in sorted(cache_dir.iterdir()):
            if folder.is_dir() and not folder.is_symlink():
                folders.setdefault(folder.name, folder)
    kernels, modules = [], []
    for folder in (folders[name] for name in sorted(folders)):
        if not _KEY.fullmatch(folder.name):
            continue
        names = {p.name for p in folder.iterdir() if p.is_file() and not p.is_symlink()}
        for group_file in sorted(
            n for n in names if n.startswith("__grp__") and n.endswith(".json")
        ):
            found = _kernel_group(
                folder, group_file.removeprefix("__grp__")[: -len(".json")], names
            )
            if found is not None:
                kernels.append(found)
    versions = {k.group.triton for k in kernels}
    if triton_version is None and len(versions) == 1:
        triton_version = versions.pop()
    for folder in (folders[name] for name in sorted(folders)):
        if not _KEY.fullmatch(folder.name) or triton_version is None:
            continue
        for path in sorted(folder.iterdir()):
            match = _MODULE_FILE.fullmatch(path.name)
            if match and path.is_file() and not path.is_symlink():
                group = shared.Group(
                    triton=triton_version,
                    key=folder.name,
                    files=(_described(path),),
                    platform=match.group(2),
                    module=match.group(1),
                )
                modules.append(Cached(group, {path.name: path}))
    return kernels, modules


def _kernel_group(folder: Path, stem: str, names: set[str]) -> Cached | None:
    if f"{stem}.json" not in names:
        return None
    metadata = json.loads(shared.read_bounded(str(folder / f"{stem}.json"), MAX_METADATA_BYTES))
    target = metadata.get("target") or {}
    extension = BINARY_EXTENSIONS.get(target.get("backend"))
    if extension is None or f"{stem}.{extension}" not in names or metadata.get("name") != stem:
        return None
    paths = {name: folder / name for name in (f"{stem}.json", f"{stem}.{extension}")}
    group = shared.Group(
        triton=str(metadata.get("triton_version")),
        key=folder.name,
        files=tuple(_described(path) for path in paths.values()),
        target=f"{target['backend']}:{target['arch']}",
        kernel=stem,
    )
    return Cached(group, paths)


def _described(path: Path):
    data = path.read_bytes()
    return shared.BinaryFile(path.name, shared.file_sha256(data), len(data))


def capture(
    repo,
    cache_dirs: Path | list[Path],
    *,
    triton_version: str | None = None,
    modules: bool = True,
    platform: str | None = None,
    launches: bool = True,
):
    """Write ``repo``'s binaries from the Triton cache(s) ``cache_dirs`` into ``repo/binaries/``
    (see the module's docstring), and the launches the caches' runs recorded into its launch
    records; return the manifest written, or None when the caches hold none of its kernels
    (the folder is then left as it was). ``platform``: the Python whose cache keys the
    kernels were compiled under (default: that of the caches' C modules, else this one's).
    ``launches=False`` leaves the launch records alone (`build_sets`, whose caches are made
    from them)."""
    names = jit_names(repo)
    kernels, c_modules = scan_cache(cache_dirs, triton_version)
    taken = [k for k in kernels if k.group.kernel in names]
    if not taken:
        return None
    if platform is None:
        platforms = {c.group.platform for c in c_modules}
        platform = platforms.pop() if len(platforms) == 1 else shared.platform_tag()
    taken = [replace(k, group=replace(k.group, platform=platform)) for k in taken]
    taken += c_modules if modules else []
    digest = build.source_digest(build.package_files(repo))
    folder = repo.folder / build.BINARIES
    files: dict[str, bytes] = {}
    groups = []
    sets = {_set(c.group) for c in taken}
    previous = shared.read_manifest(str(folder)) if folder.is_dir() else None
    keep = previous is not None and previous[0].source_digest == digest
    if keep:
        for group in previous[0].groups:
            if _set(group) not in sets:
                groups.append(group)
                for file in group.files:
                    files[shared.stored(file)] = (folder / shared.stored(file)).read_bytes()
    for cached in taken:
        data = {name: path.read_bytes() for name, path in cached.paths.items()}
        group = replace(
            cached.group,
            files=tuple(
                shared.BinaryFile(n, shared.file_sha256(d), len(d)) for n, d in data.items()
            ),
        )
        groups.append(group)
        files.update({shared.stored(f): data[f.name] for f in group.files})
    groups.sort(
        key=lambda g: (
            g.triton,
            g.target or "",
            g.platform or "",
            g.kernel or g.module or "",
            g.key,
        )
    )
    manifest = shared.Manifest(repo.name, digest, tuple(groups))
    files[shared.MANIFEST] = manifest.to_json().encode()
    shared.parse_manifest(files[shared.MANIFEST])  # what we write, the reader takes
    staging = folder.with_name(f"{build.BINARIES}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    build.write_files(files, staging)
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(staging, folder)
    if launches:
        _write_launches(repo, cache_dirs, names, keep=keep)
    return manifest


def _launches_module():
    try:
        from kernels.library import triton_launches
    except ImportError:  # run as a script from a checkout without the package installed
        sys.path.insert(0, str(_HERE.parent))
        from kernels.library import triton_launches
    return triton_launches


def read_launches(repo) -> list:
    """``repo``'s launch records (``triton_launches.Launch``); empty without a records file.

    Raises:
        ManifestError: the file is not a launch records file.
    """
    launches = _launches_module()
    path = repo.folder / LAUNCHES
    if not path.is_file():
        return []
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("format") != 1 or not isinstance(data.get("launches"), list):  # fmt: skip
        raise shared.ManifestError(f"{path} is not a launch records file of format 1")
    try:
        return [launches.Launch.from_json(entry) for entry in data["launches"]]
    except launches.LaunchError as exc:
        raise shared.ManifestError(f"{path}: {exc}") from None


def _write_launches(repo, cache_dirs, names: set[str], *, keep: bool) -> None:
    """The launches of ``repo``'s kernels that the caches' runs recorded, with those kept from
    the previous capture of the same sources. Caches that recorded none (runs without
    ``KERNELS_RECORD_LAUNCHES``) leave the records as they were."""
    launches = _launches_module()
    recorded = {}
    dirs = [cache_dirs] if isinstance(cache_dirs, Path) else list(cache_dirs)
    for cache_dir in dirs:
        for launch in launches.read_records(cache_dir):
            if launch.kernel in names:
                recorded[launch.identity] = launch
    if not recorded:
        return
    found = {launch.identity: launch for launch in (read_launches(repo) if keep else [])}
    found.update(recorded)
    path = repo.folder / LAUNCHES
    entries = [found[identity].to_json() for identity in sorted(found)]
    path.write_text(
        json.dumps({"format": 1, "launches": entries}, indent=1) + "\n", encoding="utf-8"
    )


# ---- compiling the launches again: build and verify ------------------------------------------


@dataclass(frozen=True)
class Installation:
    """A Triton version under one Python: the folder it is installed in (for ``PYTHONPATH``),
    the interpreter, its cache key (``triton_key()``) and its platform tag."""

    triton: str
    python: str
    folder: Path
    key: str
    platform: str


_ASK_INSTALLATION = (
    "import json, sysconfig, triton\n"
    "from triton.runtime.cache import triton_key\n"
    "suffix = sysconfig.get_config_var('EXT_SUFFIX') or '.so'\n"
    "print(json.dumps([triton.__version__, triton_key(), suffix]))\n"
)


def installation(triton_version: str, python: str, work: Path) -> Installation:
    """Triton ``triton_version`` installed for the interpreter ``python`` (by pip, into
    ``work``; nothing else is installed: its key and its platform need only Triton)."""
    try:
        tag = subprocess.run(
            [python, "-c", "import sys; print(sys.implementation.cache_tag)"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError) as exc:
        raise build.LibraryBuildError(
            f"cannot run the interpreter {python!r} ({exc}): install that Python, or leave it "
            "out (--python, or BINARY_PYTHONS for make binaries)"
        ) from None
    folder = work / f"triton-{triton_version}" / tag
    if not (folder / "triton" / "__init__.py").is_file():
        done = subprocess.run(
            [python, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(folder),
             f"triton=={triton_version}"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise build.LibraryBuildError(
                f"cannot install triton=={triton_version} for {python}: {done.stderr.strip()[-800:]}"
            )
    env = dict(os.environ, PYTHONPATH=str(folder))
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run(
        [python, "-c", _ASK_INSTALLATION], capture_output=True, text=True, env=env, check=False
    )
    if done.returncode != 0:
        raise build.LibraryBuildError(f"Triton {triton_version} under {python}: {done.stderr.strip()[-800:]}")  # fmt: skip
    version, key, suffix = json.loads(done.stdout.strip().splitlines()[-1])
    if version != triton_version:
        raise build.LibraryBuildError(f"{folder} holds Triton {version}, not {triton_version}")
    platform = suffix[1:].rsplit(".", 1)[0] if suffix.endswith((".so", ".pyd")) else suffix[1:]
    return Installation(triton_version, python, folder, key, platform)


def _package(repo):
    """``repo``'s package from its fresh build (the functions compiled are its sources')."""
    from kernels import get_local_kernel
    from kernels.library.paths import built_repository

    folder = built_repository(repo.folder)
    if folder == repo.folder:  # not one of this checkout's library folders: build it here
        build.write_build(repo, symbols=False)
    return get_local_kernel(folder, repo.package)


def replay_all(
    repo, package, cache_dir: Path, key: str | None
) -> tuple[dict[str, Path], list[str], list[dict]]:
    """Compile each of ``repo``'s launches with this process's Triton into ``cache_dir``
    (under ``key``, another installation's, if given). Returns the cache folders made, by key;
    a line for each launch that could not be compiled; and what Triton's C launcher of each
    kernel is made from (`launchers.py`'s input)."""
    launches = _launches_module()
    functions = launches.jit_functions(package)
    made, problems, signatures = {}, [], []
    previous = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = str(cache_dir)
    # Triton keeps compiled kernels in memory by specialization, not by its cache key: a
    # process that compiled them under another key would get those back. One key a call.
    for fn in functions.values():
        fn.device_caches.clear()
    try:
        for launch in read_launches(repo):
            try:
                with launches.standing_in_for(launch.target), launches.as_installation(key):
                    compiled = launches.replay(launch, functions)
            except launches.LaunchError as exc:
                problems.append(f"  {launch.kernel} {launch.target}: {exc}")
                continue
            made_key = launches.cache_key(compiled.hash)
            made[made_key] = cache_dir / made_key
            signatures.append(_launcher_input(compiled))
    finally:
        if previous is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = previous
    return made, problems, signatures


def _launcher_input(compiled) -> dict:
    """What Triton's CUDA launcher for ``compiled`` is generated from, as JSON."""

    def plain(value):
        return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)

    constants = compiled.src.constants
    return {
        "name": compiled.src.fn.__name__,
        "signature": dict(compiled.src.signature),
        "constants": [
            [list(k) if isinstance(k, tuple) else k, plain(v)] for k, v in constants.items()
        ],  # fmt: skip
        "arg_names": list(compiled.src.fn.arg_names),
        "tensordesc_meta": getattr(compiled.metadata, "tensordesc_meta", None),
    }


def _stub_libcuda(work: Path) -> Path:
    """A folder with an empty ``libcuda.so.1`` to link Triton's C modules against (their CUDA
    symbols resolve against the user's driver when they are loaded), and ``cc``, the C
    compiler to link with: the machine's ``gcc``, told to record ``libcuda.so.1`` as needed
    although the stub defines nothing (some distributions link ``--as-needed`` by default,
    which would drop it, and the module could not find the driver's symbols)."""
    folder = work / "libcuda-stub"
    stub, compiler = folder / "libcuda.so.1", folder / "cc"
    if not (stub.is_file() and compiler.is_file()):
        folder.mkdir(parents=True, exist_ok=True)
        source = folder / "stub.c"
        source.write_text("/* no symbols: the driver's are resolved at load time */\n")
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stub), str(source)],
            check=True, capture_output=True,
        )  # fmt: skip
        compiler.write_text('#!/bin/sh\nexec gcc -Wl,--no-as-needed "$@"\n')
        compiler.chmod(0o755)
    return folder


def build_sets(repos, installations: list[Installation], work: Path) -> list[str]:
    """Compile every launch of ``repos`` with each installation's Triton, on this machine's
    CPU, and add the kernels, and the C modules their launches need under that Python, to
    each repository's binaries as that installation's set. Returns the report's lines.

    Each Triton version compiles in a child of this interpreter (which has torch) with that
    Triton first on its path; another Python's set is made under that Python's key, and its C
    modules are built by that Python (`launchers.py`)."""
    lines = []
    stub = _stub_libcuda(work)
    # This interpreter's install of each Triton version, which compiles for every Python.
    compilers = {v: installation(v, sys.executable, work) for v in {i.triton for i in installations}}  # fmt: skip
    for inst in installations:
        compiler = compilers[inst.triton]
        for repo in repos:
            cache = work / "caches" / inst.triton / inst.platform / repo.name
            shutil.rmtree(cache, ignore_errors=True)
            cache.mkdir(parents=True)
            key_file = cache.with_suffix(".key")
            key_file.write_text(inst.key, encoding="utf-8")
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(compiler.folder), str(_HERE.parent)]))  # fmt: skip
            env.pop("TRITON_INTERPRET", None)
            _run_step(
                f"compiling {repo.name} for Triton {inst.triton} ({inst.platform})",
                [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "_replay",
                    str(cache),
                    str(key_file),
                    str(repo.folder),
                ],  # fmt: skip
                env,
            )
            env = dict(os.environ, PYTHONPATH=str(inst.folder), TRITON_CACHE_DIR=str(cache), TRITON_LIBCUDA_PATH=str(stub), CC=str(stub / "cc"))  # fmt: skip
            env.pop("TRITON_INTERPRET", None)
            _run_step(
                f"building {repo.name}'s C modules for Triton {inst.triton} ({inst.platform})",
                [inst.python, str(_HERE / "launchers.py"), str(cache / LAUNCHER_INPUT)],
                env,
            )
            manifest = capture(repo, [cache], triton_version=inst.triton, platform=inst.platform, launches=False)  # fmt: skip
            if manifest is not None:
                mine = [g for g in manifest.groups if (g.triton, g.platform) == (inst.triton, inst.platform)]  # fmt: skip
                kernels = sum(1 for g in mine if g.kernel is not None)
                lines.append(f"{repo.name}: Triton {inst.triton} {inst.platform}: {kernels} kernels, {len(mine) - kernels} C modules")  # fmt: skip
    return lines


def _run_step(what: str, command: list[str], env: dict) -> None:
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise build.LibraryBuildError(f"{what} failed:\n" + (done.stdout + done.stderr).strip()[-3000:])  # fmt: skip


#: The file, in a build's cache, of what each kernel's C launcher is generated from.
LAUNCHER_INPUT = "kernels-launchers.json"


def _replay_command(cache: Path, key_file: Path, folders: list[str]) -> int:
    key = key_file.read_text(encoding="utf-8")
    failed, signatures = False, []
    for repo in build.repositories(folders):
        made, problems, found = replay_all(repo, _package(repo), cache, key)
        signatures += found
        print(f"{repo.name}: {len(made)} kernels compiled")
        print("\n".join(problems))
        failed |= bool(problems)
    (cache / LAUNCHER_INPUT).write_text(json.dumps(signatures), encoding="utf-8")
    return 1 if failed else 0


@dataclass(frozen=True)
class Verified:
    """What `verify` found: its report lines, and how many kernels it compiled again and
    compared, and how many of those differed."""

    lines: list[str]
    compared: int
    differ: int

    @property
    def ok(self) -> bool:
        return self.differ == 0


def verify(repo, package) -> Verified:
    """Compile each of ``repo``'s launch records again with this machine's Triton and compare
    with the set shipped for this Triton and this Python; ``package``: the repository's
    package, imported (its ``@triton.jit`` functions are what is compiled). Kernels of other
    Triton versions or Pythons are counted, not compiled."""
    import tempfile

    import triton

    found = shared.read_manifest(str(repo.folder / build.BINARIES))
    if found is None:
        return Verified([f"{repo.name}: no binaries"], 0, 0)
    platform = shared.platform_tag()
    mine = [
        g
        for g in found[0].groups
        if g.kernel is not None
        and g.triton == triton.__version__
        and g.platform in (None, platform)
    ]
    others = sum(1 for g in found[0].groups if g.kernel is not None) - len(mine)
    if not mine:
        head = f"{repo.name}: nothing compared: no kernels shipped for Triton {triton.__version__} on {platform} ({others} for others)"  # fmt: skip
        return Verified([head], 0, 0)
    with tempfile.TemporaryDirectory(prefix="kernels-verify-") as cache:
        made, problems, _ = replay_all(repo, package, Path(cache), None)
        lines, same, differ = list(problems), 0, len(problems)
        for group in mine:
            folder = made.get(group.key)
            if folder is None:
                differ += 1
                lines.append(f"  {group.kernel} {group.target} {group.key}: no launch record compiles to it (other sources, or a launch not recorded)")  # fmt: skip
                continue
            compared = _compare(repo, group, folder)
            if compared:
                differ += 1
                lines.append(f"  {group.kernel} {group.target} {group.key}: {'; '.join(compared)}")
            else:
                same += 1
        shipped = {g.key for g in mine}
        targets = {g.target for g in mine}
        for key, folder in sorted(made.items()):
            if key not in shipped and _made_target(folder) in targets:
                differ += 1
                lines.append(f"  {key}: a recorded launch compiles to a kernel not shipped")
    head = (
        f"{repo.name}: {same} kernel(s) compiled again to the same binary, {differ} differ, "
        f"{others} of other Tritons or Pythons than Triton {triton.__version__} on {platform}"
    )
    return Verified([head, *lines], same + differ, differ)


def _made_target(folder: Path) -> str | None:
    for path in folder.glob("*.json"):
        if not path.name.startswith("__grp__"):
            target = json.loads(path.read_text(encoding="utf-8")).get("target") or {}
            return f"{target.get('backend')}:{target.get('arch')}"
    return None


def _compare(repo, group, made: Path) -> list[str]:
    problems = []
    folder = repo.folder / build.BINARIES
    for file in group.files:
        shipped = (folder / shared.stored(file)).read_bytes()
        path = made / file.name
        if not path.is_file():
            problems.append(f"{file.name} not made")
            continue
        data = path.read_bytes()
        if file.name.endswith(".json"):
            if _metadata(data) != _metadata(shipped):
                problems.append(f"{file.name} differs")
        elif _code(data) != _code(shipped):
            problems.append(f"{file.name}'s code differs ({len(data)} bytes made, {len(shipped)} shipped)")  # fmt: skip
    return problems


def _metadata(data: bytes) -> dict:
    # libdevice's path is the machine's (its content is in the key).
    return {k: v for k, v in json.loads(data).items() if k != "extern_libs"}


#: ELF sections a comparison leaves out: debug information, which names the paths the kernel's
#: sources and Triton were at when it was compiled.
_DEBUG_SECTIONS = (
    ".debug",
    ".nv_debug",
    ".rel.debug",
    ".rel.nv_debug",
    ".rela.debug",
    ".rela.nv_debug",
)


def _code(data: bytes) -> dict[str, bytes] | bytes:
    """A binary's sections but its debug information (by name), or the bytes themselves for
    what is not a 64-bit little-endian ELF file."""
    if data[:6] != b"\x7fELF\x02\x01" or len(data) < 64:
        return data
    try:
        (shoff,) = struct.unpack_from("<Q", data, 0x28)
        entry_size, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
        headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * entry_size) for i in range(count)]  # fmt: skip
        names_offset = headers[names_index][4]
        sections = {}
        for name_at, kind, _, _, offset, size, *_ in headers:
            start = names_offset + name_at
            name = data[start : data.index(b"\0", start)].decode("ascii", "replace")
            if not name.startswith(_DEBUG_SECTIONS):
                sections[name] = b"" if kind == 8 else data[offset : offset + size]  # 8: NOBITS
        return sections
    except (struct.error, ValueError, IndexError):
        return data


def _set(group) -> tuple:
    """What a capture replaces: a Triton version's kernels for a target under one Python (or
    its C modules for one platform)."""
    return (group.triton, group.target, group.platform)


def describe(manifest) -> str:
    """One line a (Triton version, target, Python) set: groups, files, bytes."""
    sets: dict[tuple, list] = {}
    for group in manifest.groups:
        sets.setdefault(_set(group), []).append(group)
    lines = []
    for (triton, target, platform), groups in sorted(sets.items(), key=lambda item: str(item[0])):
        sizes = [f.size for g in groups for f in g.files]
        kind = "kernels" if groups[0].kernel is not None else "C modules"
        where = " ".join(w for w in (target, platform) if w)
        lines.append(f"  Triton {triton} {where}: {len(groups)} {kind}, {sum(sizes)} bytes")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    capture_parser = commands.add_parser("capture", help="take the binaries from a Triton cache")
    capture_parser.add_argument(
        "caches", nargs="+", type=Path, help="the Triton cache folder(s) the runs filled"
    )
    capture_parser.add_argument(
        "--repos", nargs="+", default=[], help="repository folders (default: all)"
    )
    capture_parser.add_argument(
        "--triton",
        help="the Triton version the cache's C modules were built by (default: the "
        "kernels' own, when the cache holds one)",
    )
    capture_parser.add_argument(
        "--no-modules", dest="modules", action="store_false", help="leave the C modules out"
    )
    list_parser = commands.add_parser("list", help="what each repository's binaries/ holds")
    list_parser.add_argument("repos", nargs="*", help="repository folders (default: all)")
    verify_parser = commands.add_parser(
        "verify", help="compile the launch records again with this Triton and compare"
    )
    verify_parser.add_argument("repos", nargs="*", help="repository folders (default: all)")
    build_parser = commands.add_parser(
        "build", help="compile the launch records for other Tritons and Pythons, on the CPU"
    )
    build_parser.add_argument("--triton", nargs="+", required=True, help="Triton versions")
    build_parser.add_argument(
        "--python", nargs="+", default=[sys.executable], help="interpreters (default: this one)"
    )
    build_parser.add_argument("--repos", nargs="+", default=[], help="repository folders")
    build_parser.add_argument(
        "--work", type=Path, default=Path.home() / ".cache" / "kernels" / "binaries-build",
        help="where the Tritons are installed and the caches made",
    )  # fmt: skip
    replay_parser = commands.add_parser("_replay")  # build's child, in a Triton of its own
    replay_parser.add_argument("cache", type=Path)
    replay_parser.add_argument("key_file", type=Path)
    replay_parser.add_argument("repos", nargs="+")
    args = parser.parse_args(argv)
    try:
        if args.command == "verify":
            return _verify_command(args.repos)
        if args.command == "_replay":
            return _replay_command(args.cache, args.key_file, args.repos)
        if args.command == "build":
            repos = [r for r in build.repositories(args.repos) if read_launches(r)]
            if not repos:
                print("error: no repository has launch records: capture on a GPU first", file=sys.stderr)  # fmt: skip
                return 2
            installations = [installation(t, p, args.work) for t in args.triton for p in args.python]  # fmt: skip
            print("\n".join(build_sets(repos, installations, args.work)))
            return 0
        repos = build.repositories(args.repos)
        for repo in repos:
            if args.command == "capture":
                manifest = capture(repo, args.caches, triton_version=args.triton, modules=args.modules)  # fmt: skip
                if manifest is None:
                    print(f"{repo.name}: none of its kernels is in the cache(s); left as it was")
                    continue
            else:
                found = shared.read_manifest(str(repo.folder / build.BINARIES))
                if found is None:
                    print(f"{repo.name}: no binaries")
                    continue
                manifest = found[0]
            print(f"{repo.name}: {repo.folder / build.BINARIES}\n{describe(manifest)}")
            note = build.shipped_binaries(repo, build.source_digest(build.package_files(repo)))[1]
            if note:
                print(f"note: {note}")
    except (
        build.LibraryBuildError,
        shared.ManifestError,
        OSError,
        subprocess.CalledProcessError,
    ) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _verify_command(names: list[str]) -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("error: run without TRITON_INTERPRET=1: interpreted kernels cannot be compiled", file=sys.stderr)  # fmt: skip
        return 2
    failed, compared = False, 0
    for repo in build.repositories(names):
        verified = verify(repo, _package(repo))
        print("\n".join(verified.lines))
        failed |= not verified.ok
        compared += verified.compared
    if failed:
        return 1
    return 0 if compared else _launches_module().NOTHING_COMPARED


if __name__ == "__main__":
    sys.exit(main())
