"""``kernels check REPO_OR_PATH``: validate a kernel repository before publishing or using it."""

from __future__ import annotations

import argparse
import importlib
import inspect
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import CommandError, add_repo_type_argument

if TYPE_CHECKING:
    from torch import nn

HELP = "validate a kernel repository (a folder or a Hub repo): layout, variants, imports, layers"
DESCRIPTION = """\
Check a kernel repository, a folder on disk or a repository on the Hub:

  layout        build/<variant>/<package>/__init__.py (or build/<variant>/__init__.py)
  variants      folder names follow the variant naming; one runs on this machine
  imports       every variant this machine can run imports without error
  layers        the `layers` module's kernel layers follow the rules kernelize enforces
                (no __init__, no members besides forward / has_backward / can_torch_compile)
  signatures    forward takes `self` first, and matches the layer given with --layer-of

A Hub repository is downloaded whole (all variants) into the Hugging Face cache; its code is
imported, so its organisation must be trusted (--trust-remote-code otherwise).
Exit status 0 when nothing failed (warnings allowed), 1 otherwise."""
EPILOG = """\
examples:
  kernels check ./my-kernel
  kernels check kernels-community/activation --version '>=0.1,<0.2'
  kernels check ./my-kernel --layer-of SiLU=torch.nn:SiLU"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target", metavar="REPO_OR_PATH", help="a kernel repository folder, or a Hub repo id"
    )
    pin = parser.add_mutually_exclusive_group()
    pin.add_argument("--revision", help="Hub repos: a branch, tag or commit")
    pin.add_argument(
        "--version", help="Hub repos: a version specifier such as '>=0.1,<0.2', or N for branch vN"
    )
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="Hub repos: import code from an untrusted organisation",
    )
    parser.add_argument(
        "--layer-of",
        action="append",
        default=[],
        metavar="LAYER=MODULE:CLASS",
        help="compare kernel layer LAYER's forward signature with that of MODULE:CLASS (repeatable)",
    )
    parser.add_argument(
        "--rebuild-binaries",
        action="store_true",
        help="a library source folder (library/<repo>): compile its recorded launches again "
        "with this Triton (no GPU needed) and compare with the binaries shipped for it",
    )
    add_repo_type_argument(parser)


@dataclass
class Report:
    lines: list[tuple[str, str]] = field(default_factory=list)

    def ok(self, text: str) -> None:
        self.lines.append(("ok", text))

    def warn(self, text: str) -> None:
        self.lines.append(("warn", text))

    def fail(self, text: str) -> None:
        self.lines.append(("FAIL", text))

    def info(self, text: str) -> None:
        """A fact that is neither a success nor a problem (e.g. a variant for another machine)."""
        self.lines.append(("-", text))

    @property
    def failed(self) -> int:
        return sum(1 for status, _ in self.lines if status == "FAIL")


def run(args: argparse.Namespace) -> int:
    originals = [_parse_layer_of(spec) for spec in args.layer_of]
    repo_dir, where = _repository_folder(args)
    report = check_repository(repo_dir, where=where, originals=dict(originals))
    if args.rebuild_binaries:
        _rebuild_binaries(report, Path(args.target).expanduser())
    for status, text in report.lines:
        print(f"{status:<4}  {text}")
    warnings = sum(1 for status, _ in report.lines if status == "warn")
    print(f"{where}: {report.failed} failed, {warnings} warning(s)")
    return 1 if report.failed else 0


def _parse_layer_of(spec: str) -> tuple[str, type[nn.Module]]:
    name, _, target = spec.partition("=")
    module_name, _, class_name = target.partition(":")
    if not (name and module_name and class_name):
        raise CommandError(
            f"--layer-of {spec!r}: write LAYER=MODULE:CLASS, e.g. SiLU=torch.nn:SiLU"
        )
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise CommandError(
            f"--layer-of {spec!r}: cannot import {module_name}:{class_name} ({exc})"
        ) from exc
    import torch.nn as nn

    # Its forward is what the kernel layer's is compared with.
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise CommandError(
            f"--layer-of {spec!r}: {module_name}:{class_name} is not a torch.nn.Module "
            "subclass; name the layer class whose forward the kernel layer replaces."
        )
    return name, cls


def _repository_folder(args: argparse.Namespace) -> tuple[Path, str]:
    path = Path(args.target).expanduser()
    if path.is_dir():
        if args.revision or args.version:
            raise CommandError("--revision and --version apply to Hub repositories, not folders")
        from ..library.paths import built_repository

        # Resolved: a flat build's package is named after its folder, and `Path(".").name` is "".
        # A library source folder of a checkout (library/norm) is checked as built.
        return built_repository(path.resolve()), str(path.resolve())
    from ..repos.repo_id import is_repo_id, shown

    if path.exists() or "/" not in args.target or not is_repo_id(args.target):
        # A plain name as typed; anything else escaped, so a look-alike shows what differs.
        target = args.target if args.target.isascii() and args.target.isprintable() else None
        raise CommandError(
            f"{target or shown(args.target)} is neither a kernel repository folder nor a Hub "
            "repo id 'org/name' (ASCII letters, digits, '-', '_' and '.')"
        )
    return _download_all_variants(args)


def _download_all_variants(args: argparse.Namespace) -> tuple[Path, str]:
    from huggingface_hub import snapshot_download

    from ..repos.trust import require_trust
    from ..repos.variants import PREFERENCE_FILE
    from ..repos.versions import hub_error, resolve_revision

    repo_id, repo_type = args.target, args.repo_type
    require_trust(repo_id, bool(args.trust_remote_code))
    version = int(args.version) if args.version and args.version.isdigit() else args.version
    resolved = resolve_revision(
        repo_id, revision=args.revision, version=version, repo_type=repo_type
    )
    try:
        folder = snapshot_download(
            repo_id,
            revision=resolved.revision,
            repo_type=repo_type,
            allow_patterns=["build/*", PREFERENCE_FILE, "README.md"],
        )
    except Exception as exc:
        raise hub_error(exc, repo_id, f"download {repo_id} ({resolved.how})", repo_type) from exc
    return Path(folder), f"{repo_id} ({resolved.how})"


def check_repository(
    repo_dir: Path, *, where: str, originals: dict[str, type[nn.Module]] | None = None
) -> Report:
    """Run every check on the repository folder `repo_dir`; nothing is raised, all is reported."""
    from ..errors import KernelLoadError
    from ..repos.layout import locate_package, read_preference
    from ..repos.variants import (
        VARIANT_PATTERN,
        VariantAccepted,
        VariantRejected,
        decide_variants,
    )

    report = Report()
    build = repo_dir / "build"
    if not (repo_dir / "README.md").is_file():
        report.warn("layout: no README.md (the Hub shows it as the kernel's card)")
    if not build.is_dir():
        report.fail(
            f"layout: {build} does not exist; a kernel repository holds build/<variant>/<package>/"
        )
        return report

    variants, packages = [], {}
    for entry in sorted(build.iterdir()):
        if not entry.is_dir():
            report.warn(
                f"layout: build/{entry.name} is a file; only variant folders belong in build/"
            )
        elif not VARIANT_PATTERN.match(entry.name):
            report.warn(
                f"variants: build/{entry.name} is not named like a build variant and is ignored"
            )
        else:
            variants.append(entry.name)
    if not variants:
        report.fail(
            "variants: build/ holds no build variants (torch-universal, torch28-cxx11-cu128-x86_64-linux, ...)"
        )
        return report
    try:
        prefer = read_preference(repo_dir, where=where)
    except KernelLoadError as exc:
        report.fail(f"variants: {exc}")
        prefer = "compiled"
    for variant in variants:
        try:
            location = locate_package(repo_dir, None, where=where, variant=variant)
        except KernelLoadError as exc:
            report.fail(f"layout: {exc}")
            continue
        packages[variant] = location
    if packages:
        from ..repos.op_namespaces import fixed_op_namespaces

        for variant, location in sorted(packages.items()):
            for fixed in fixed_op_namespaces(location.package_dir):
                report.warn(f"ops: {variant}: {fixed.describe(location.package_dir)}")
        for variant, location in sorted(packages.items()):
            _check_binaries(report, variant, location.package_dir)
        names = {loc.package_name for loc in packages.values()}
        summary = ", ".join(f"{v} ({packages[v].package_name})" for v in sorted(packages))
        (report.ok if len(names) == 1 else report.warn)(f"layout: packages in {summary}")

    decisions = decide_variants(variants, prefer=prefer)
    runnable = [d.variant.variant_str for d in decisions if isinstance(d, VariantAccepted)]
    for decision in decisions:
        name = decision.variant.variant_str
        if isinstance(decision, VariantRejected):
            if decision.variant.kind == "unknown":
                report.warn(f"variants: {name} is not a build variant name ({decision.reason})")
            else:
                report.info(f"variants: {name} does not run here: {decision.reason}")
        elif decision.rank == 0:
            report.ok(f"variants: {name} runs here, and is the one this machine loads")
        else:
            report.ok(f"variants: {name} runs here")
    if not runnable:
        report.warn(
            f"variants: none of the {len(variants)} variant(s) runs on this machine; "
            "imports are not checked here"
        )
        return report
    for variant in (v for v in runnable if v in packages):
        _check_variant_apart(report, packages[variant], variant, where, originals or {})
    return report


def _rebuild_binaries(report: Report, folder: Path) -> None:
    """``library/binaries.py verify`` on a library source folder, in a child process without
    Triton's interpreter: each recorded launch compiled again and compared with the kernels
    shipped for this Triton and Python."""
    import os
    import sys

    from ..library import triton_launches
    from ..library.paths import library_source

    tool = library_source() / "binaries.py"
    if not (folder.is_dir() and (folder / "build.toml").is_file() and tool.is_file()):
        report.fail(
            "binaries: --rebuild-binaries needs a library source folder of a checkout "
            "(library/<repo>: its sources, binaries/ and binaries-launches.json); a built or "
            "downloaded repository carries no launch records"
        )
        return
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(tool), "verify", str(folder.resolve())],
        capture_output=True,
        text=True,
        env=env,
        timeout=VARIANT_TIMEOUT_SECONDS,
        check=False,
    )
    lines = done.stdout.strip().splitlines() or [done.stderr.strip()[-2000:]]
    if done.returncode == 0:
        say = report.ok
    elif done.returncode == triton_launches.NOTHING_COMPARED:  # none for this Triton/Python
        say = report.warn
    else:
        say = report.fail
    say(f"binaries: rebuilt: {lines[0]}")
    for line in lines[1:]:
        report.fail(f"binaries: {line.strip()}")


def _binaries_reader():
    """Our library's ``_binaries.py`` (the manifest reader), as ``library/build.py`` loads it:
    our own code, never the checked repository's copy."""
    from ..library.builds import build_script
    from ..library.paths import library_source

    reader = build_script(library_source()).binaries_module()
    assert reader is not None  # our library/ has its shared files
    return reader


def _check_binaries(report: Report, variant: str, package_dir: Path) -> None:
    """A variant's shipped Triton binaries (``_binaries/``): the manifest's format, every file's
    SHA-256, nothing unlisted, and the source digest of the package they were compiled from."""
    folder = package_dir / "_binaries"
    if not folder.exists():
        return
    reader = _binaries_reader()
    try:
        found = reader.read_manifest(str(folder))
    except reader.ManifestError as exc:
        report.fail(f"binaries: {variant}: _binaries/manifest.json {exc}")
        return
    if found is None:
        report.fail(f"binaries: {variant}: _binaries/ has no manifest.json")
        return
    manifest = found[0]
    problems = reader.verify_files(str(folder), manifest)
    for problem in problems:
        report.fail(f"binaries: {variant}: _binaries/{problem}")
    if manifest.source_digest != reader.shipped_source_digest(str(package_dir)):
        report.fail(
            f"binaries: {variant}: compiled from other sources than the package ships "
            "(capture them again from these sources: library/binaries.py)"
        )
    elif not problems:
        files = sum(len(g.files) for g in manifest.groups)
        report.ok(
            f"binaries: {variant}: {len(manifest.groups)} group(s), {files} file(s) match the "
            "manifest, from these sources"
        )
        report.info(
            f"binaries: {variant}: not recompiled here (--rebuild-binaries on the library source "
            "folder compiles its recorded launches again with this Triton)"
        )


#: How long one variant's import and checks may take in their own process.
VARIANT_TIMEOUT_SECONDS = 600

# The line the child process writes its result on; kernel code may print anything else.
_RESULT_MARK = "kernels-check-result: "

_CHILD = "import sys; from kernels.cli.check import _variant_child; _variant_child(sys.argv[1])"


def _check_variant_apart(
    report: Report, location, variant: str, where: str, originals: dict[str, type[nn.Module]]
) -> None:
    """Import one variant and check its layers in a process of its own.

    Variants cannot share a process: each registers the kernel's ``TORCH_LIBRARY`` namespace,
    which torch accepts once per process, and a variant's import may change global state.
    """
    import json
    import os

    import kernels

    request = {
        "package_dir": str(location.package_dir),
        "package_name": location.package_name,
        "variant": variant,
        "where": where,
        "originals": {name: [cls.__module__, cls.__qualname__] for name, cls in originals.items()},
    }
    # The child imports this very `kernels`, wherever it is installed or checked out.
    root = str(Path(kernels.__file__).resolve().parent.parent)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH")))),
    }
    try:
        child = run_python(["-c", _CHILD, json.dumps(request)], env, VARIANT_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        report.fail(
            f"imports: {variant}: importing and checking it took more than "
            f"{VARIANT_TIMEOUT_SECONDS} s; its import may hang"
        )
        return
    results = [line for line in child.stdout.splitlines() if line.startswith(_RESULT_MARK)]
    lines = _child_lines(results[-1][len(_RESULT_MARK) :]) if results else None
    if lines is None:
        tail = " | ".join(child.stderr.strip().splitlines()[-5:]) or "no output"
        report.fail(
            f"imports: {variant}: the process importing it ended with status {child.returncode} "
            f"before reporting ({tail})"
        )
        return
    report.lines.extend(lines)


def run_python(
    args: list[str], env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in a new interpreter of this Python, with environment `env`, its output
    captured as text; `subprocess.TimeoutExpired` after `timeout` seconds. The test suite puts
    its own in place (children forked with torch already imported: the interpreter's start is
    most of a variant's check)."""
    import sys

    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        errors="replace",
        env=env,
        timeout=timeout,
    )


def _child_lines(text: str) -> list[tuple[str, str]] | None:
    """The report lines a child wrote, or None when they are not what `_variant_child` writes."""
    import json

    try:
        data = json.loads(text)
    except ValueError:
        return None
    statuses = ("ok", "warn", "FAIL", "-")
    if not isinstance(data, list) or not all(
        isinstance(item, list)
        and len(item) == 2
        and item[0] in statuses
        and isinstance(item[1], str)
        for item in data
    ):
        return None
    return [(status, text) for status, text in data]


def _variant_child(request_json: str) -> None:
    """The child process of `_check_variant_apart`: check one variant, write the result line."""
    import json
    import sys

    request = json.loads(request_json)
    report = Report()
    originals = {}
    for name, (module_name, qualname) in request["originals"].items():
        value: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            value = getattr(value, part)
        originals[name] = value
    location = _ChildLocation(Path(request["package_dir"]), request["package_name"])
    _check_variant(report, location, request["variant"], request["where"], originals)
    # On a line of its own, whatever the kernel printed without a newline.
    sys.stdout.write("\n" + _RESULT_MARK + json.dumps(report.lines) + "\n")
    sys.stdout.flush()


@dataclass(frozen=True)
class _ChildLocation:
    package_dir: Path
    package_name: str


def _check_variant(
    report: Report, location, variant: str, where: str, originals: dict[str, type[nn.Module]]
) -> None:
    import torch.nn as nn

    from ..errors import KernelLayerError, KernelLoadError
    from ..layer.validation import signature_difference, validate_kernel_layer
    from ..repos.download import dependency_loader
    from ..repos.kernel_deps import dependencies_loaded
    from ..repos.loader import import_package

    try:
        # Its kernel-depends load first (trusted organisations only), as when it is used.
        with dependencies_loaded(location.package_dir, where, dependency_loader()):
            module = import_package(location.package_dir, location.package_name)
    except KernelLoadError as exc:
        report.fail(f"imports: {variant}: {exc}")
        return
    report.ok(f"imports: {variant}: package {location.package_name} imports")

    layers = getattr(module, "layers", None)
    if layers is None:
        report.warn(f"layers: {variant}: no `layers` module, so no kernel layers (functions only)")
        return
    found = {
        name: value
        for name, value in vars(layers).items()
        if inspect.isclass(value)
        and issubclass(value, nn.Module)
        and value.__module__.startswith(module.__name__)
    }
    for name in originals:
        # A `layers` module may resolve a name on first look-up (a module-level __getattr__,
        # as our loss repository does per transformers line); kernels loads layers that way.
        value = found.get(name) or getattr(layers, name, None)
        if inspect.isclass(value) and issubclass(value, nn.Module):
            found[name] = value
    if not found:
        report.warn(f"layers: {variant}: the `layers` module defines no torch.nn.Module classes")
    for name, layer in sorted(found.items()):
        source = f"{where}, {variant}"
        try:
            validate_kernel_layer(layer, layer, kernel_source=source, layer_name=name)
        except KernelLayerError as exc:
            report.fail(f"layers: {exc}")
            continue
        flags = f"has_backward={getattr(layer, 'has_backward', True)}, can_torch_compile={getattr(layer, 'can_torch_compile', False)}"
        report.ok(f"layers: {variant}: {name} follows the kernel layer rules ({flags})")
        params = list(inspect.signature(layer.forward).parameters)
        if not params or params[0] != "self":
            report.fail(
                f"signatures: {variant}: {name}.forward must take `self` first, takes ({', '.join(params)})"
            )
        original = originals.get(name)
        if original is not None:
            difference = signature_difference(layer.forward, original.forward)
            if difference is None:
                report.ok(
                    f"signatures: {variant}: {name}.forward matches {original.__module__}.{original.__qualname__}"
                )
            else:
                report.fail(
                    f"signatures: {variant}: {name}.forward differs from "
                    f"{original.__module__}.{original.__qualname__}.forward: {difference}"
                )
    for name in sorted(set(originals) - set(found)):
        report.fail(
            f"signatures: {variant}: --layer-of names {name}, which `layers` does not define"
        )
