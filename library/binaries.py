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

    library/<repo>/binaries/manifest.json
    library/<repo>/binaries/<triton version>/<target, e.g. cuda-90>/<key>/<file>
    library/<repo>/binaries/<triton version>/<platform tag>/<key>/<file>

Beside the folder, ``library/<repo>/binaries-recipes.json`` keeps each kernel's recipe: what
its compile read (``kernels.library.triton_recipes``), recorded by the capture runs
(``benchmarks.cold_start --keep-cache`` sets ``KERNELS_RECORD_COMPILES=1``). ``verify``
compiles each recipe again with this machine's Triton (the same version; no GPU needed) and
compares: the cache key (the inputs, the sources among them) and the binary (the output).

A capture replaces what the folder held for the same Triton version and target (or platform),
and keeps the rest when it was captured from the same sources; binaries of other sources are
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

#: Beside a repository's binaries/: each kernel's recipe (how it was compiled), by cache key.
RECIPES = "binaries-recipes.json"
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
    repo, cache_dirs: Path | list[Path], *, triton_version: str | None = None, modules: bool = True
):
    """Write ``repo``'s binaries from the Triton cache(s) ``cache_dirs`` into ``repo/binaries/``
    (see the module's docstring) and return the manifest written, or None when the caches hold
    none of its kernels (the folder is then left as it was)."""
    names = jit_names(repo)
    kernels, c_modules = scan_cache(cache_dirs, triton_version)
    taken = [k for k in kernels if k.group.kernel in names]
    if not taken:
        return None
    taken += c_modules if modules else []
    digest = build.source_digest(build.package_files(repo))
    folder = repo.folder / build.BINARIES
    files: dict[str, bytes] = {}
    groups = []
    sets = {_set(c.group) for c in taken}
    previous = shared.read_manifest(str(folder)) if folder.is_dir() else None
    if previous is not None and previous[0].source_digest == digest:
        for group in previous[0].groups:
            if _set(group) not in sets:
                groups.append(group)
                for file in group.files:
                    files[f"{group.folder}/{file.name}"] = (folder / group.folder / file.name).read_bytes()  # fmt: skip
    for cached in taken:
        data = {name: path.read_bytes() for name, path in cached.paths.items()}
        group = replace(
            cached.group,
            files=tuple(
                shared.BinaryFile(n, shared.file_sha256(d), len(d)) for n, d in data.items()
            ),
        )
        groups.append(group)
        files.update({f"{group.folder}/{name}": content for name, content in data.items()})
    groups.sort(key=lambda g: (g.folder, g.kernel or g.module or ""))
    manifest = shared.Manifest(repo.name, digest, tuple(groups))
    files[shared.MANIFEST] = manifest.to_json().encode()
    shared.parse_manifest(files[shared.MANIFEST])  # what we write, the reader takes
    staging = folder.with_name(f"{build.BINARIES}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    for name, content in files.items():
        path = staging / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(staging, folder)
    _write_recipes(
        repo,
        manifest,
        cache_dirs,
        keep=previous is not None and previous[0].source_digest == digest,
    )
    return manifest


def _recipes_module():
    try:
        from kernels.library import triton_recipes
    except ImportError:  # run as a script from a checkout without the package installed
        sys.path.insert(0, str(_HERE.parent))
        from kernels.library import triton_recipes
    return triton_recipes


def read_recipes(repo) -> dict[str, dict]:
    """``repo``'s recipes (as JSON) by cache key; empty without a recipes file."""
    path = repo.folder / RECIPES
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("format") != 1 or not isinstance(data.get("recipes"), dict):
        raise shared.ManifestError(f"{path} is not a recipes file of format 1")
    return data["recipes"]


def _write_recipes(repo, manifest, cache_dirs, *, keep: bool) -> None:
    """The recipes of the manifest's kernels: recorded by the caches' runs, or kept from the
    previous capture of the same sources for the groups it kept."""
    recipes_module = _recipes_module()
    found = read_recipes(repo) if keep else {}
    dirs = [cache_dirs] if isinstance(cache_dirs, Path) else list(cache_dirs)
    for cache_dir in dirs:
        for recipe in recipes_module.read_records(cache_dir):
            found[recipe.key] = recipe.to_json()
    keys = {g.key for g in manifest.groups if g.kernel is not None}
    kept = {key: found[key] for key in sorted(keys & set(found))}
    path = repo.folder / RECIPES
    if not kept:
        path.unlink(missing_ok=True)
        return
    path.write_text(json.dumps({"format": 1, "recipes": kept}, indent=1) + "\n", encoding="utf-8")


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
    """Compile each of ``repo``'s shipped kernels again from its recipe with this machine's
    Triton and compare with what is shipped; ``package``: the repository's package, imported
    (its ``@triton.jit`` functions are what is compiled). Kernels of another Triton version,
    and those without a recipe, are counted, not compiled."""
    import triton

    recipes_module = _recipes_module()
    found = shared.read_manifest(str(repo.folder / build.BINARIES))
    if found is None:
        return Verified([f"{repo.name}: no binaries"], 0, 0)
    recipes = read_recipes(repo)
    functions = recipes_module.jit_functions(package)
    lines, same, other, missing, differ = [], 0, 0, 0, 0
    for group in (g for g in found[0].groups if g.kernel is not None):
        if group.triton != triton.__version__:
            other += 1
            continue
        if group.key not in recipes:
            missing += 1
            continue
        try:
            recipe = recipes_module.Recipe.from_json(recipes[group.key])
            rebuilt = recipes_module.rebuild(recipe, functions)
        except recipes_module.RecipeError as exc:
            differ += 1
            lines.append(f"  {group.kernel} {group.target} {group.key}: {exc}")
            continue
        problems = _compare(repo, group, rebuilt)
        if problems:
            differ += 1
            lines.append(f"  {group.kernel} {group.target} {group.key}: {'; '.join(problems)}")
        else:
            same += 1
    head = (
        f"{repo.name}: {same} kernel(s) compiled again to the same binary, {differ} differ, "
        f"{missing} without a recipe, {other} of another Triton than {triton.__version__}"
    )
    return Verified([head, *lines], same + differ, differ)


def _compare(repo, group, rebuilt) -> list[str]:
    if rebuilt.key != group.key:
        return [
            f"the recipe compiles under key {rebuilt.key}: other inputs (sources?) than shipped"
        ]
    problems = []
    folder = repo.folder / build.BINARIES / group.folder
    for file in group.files:
        shipped = (folder / file.name).read_bytes()
        made = rebuilt.files.get(file.name)
        if made is None:
            problems.append(f"{file.name} not made")
        elif file.name.endswith(".json"):
            if _metadata(made) != _metadata(shipped):
                problems.append(f"{file.name} differs")
        elif made != shipped:
            problems.append(f"{file.name} differs ({len(made)} bytes made, {len(shipped)} shipped)")
    return problems


def _metadata(data: bytes) -> dict:
    # libdevice's path is the machine's (its content is in the key).
    return {k: v for k, v in json.loads(data).items() if k != "extern_libs"}


def _set(group) -> tuple:
    return (group.triton, group.target or group.platform)


def describe(manifest) -> str:
    """One line a (Triton version, target or platform) set: groups, files, bytes."""
    sets: dict[tuple, list] = {}
    for group in manifest.groups:
        sets.setdefault(_set(group), []).append(group)
    lines = []
    for (triton, where), groups in sorted(sets.items()):
        sizes = [f.size for g in groups for f in g.files]
        kind = "kernels" if groups[0].kernel is not None else "C modules"
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
        "verify", help="compile the kernels again from their recipes and compare"
    )
    verify_parser.add_argument("repos", nargs="*", help="repository folders (default: all)")
    args = parser.parse_args(argv)
    try:
        if args.command == "verify":
            return _verify_command(args.repos)
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
    except (build.LibraryBuildError, shared.ManifestError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _verify_command(names: list[str]) -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("error: run without TRITON_INTERPRET=1: interpreted kernels cannot be compiled", file=sys.stderr)  # fmt: skip
        return 2
    from kernels import get_local_kernel
    from kernels.library.paths import built_repository

    failed, compared = False, 0
    for repo in build.repositories(names):
        # A library source folder loads its fresh build (with the binaries): the functions
        # compiled are its sources'.
        package = get_local_kernel(built_repository(repo.folder), repo.package)
        verified = verify(repo, package)
        print("\n".join(verified.lines))
        failed |= not verified.ok
        compared += verified.compared
    if failed:
        return 1
    return 0 if compared else _recipes_module().NOTHING_COMPARED


if __name__ == "__main__":
    sys.exit(main())
