"""``kernels describe-api KERNEL``: a kernel's public functions and layers, from its
``symbols.json``, without importing it."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from . import CommandError, add_repo_type_argument
from ._kernel_refs import add_kernel_selection

HELP = "list a kernel's public functions and layers (from its symbols.json; nothing is imported)"
DESCRIPTION = """\
Describe the public API of a kernel: its functions, with their signatures, and its layers,
with their has_backward and can_torch_compile flags. It reads the symbols.json that
kernel-builder (and our library/build.py) writes beside each build variant's metadata.json,
for the variant this machine would load; no kernel code is imported or run.

KERNEL is a Hub repository id (its newest version by default; --version N for the v<N>
branch, --revision for a branch, tag or commit) or a local folder: a kernel repository, its
build/ folder or one build/<variant>/ folder.

--json prints the symbols.json with "repo_id" and "revision" (or "path") and "variant" added,
as Hugging Face's `kernels describe-api --json` does."""
EPILOG = """\
examples:
  kernels describe-api kernels-community/activation
  kernels describe-api kernels-community/activation --version 1 --json
  kernels describe-api ./library/norm"""

#: symbols.json of real kernels are tens of KiB; this bounds what a hostile one can make us read.
MAX_SYMBOLS_SIZE = 8 * 1024 * 1024
SCHEMA_VERSION = 1
LAYER_FLAGS = ("has_backward", "can_torch_compile")


def configure(parser: argparse.ArgumentParser) -> None:
    add_kernel_selection(parser)
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="accepted for compatibility with Hugging Face's CLI; not needed, since nothing "
        "is imported or run",
    )
    add_repo_type_argument(parser)


def run(args: argparse.Namespace) -> int:
    from ._kernel_files import local_kernel_folder

    path = local_kernel_folder(args.kernel, version=args.version, revision=args.revision)
    with tempfile.TemporaryDirectory(prefix="kernels-symbols-") as scratch:
        if path is not None:
            symbols_path, variant = _local_symbols(path, Path(scratch))
            source: dict[str, Any] = {"path": str(path)}
        else:
            symbols_path, revision, variant = _hub_symbols(args)
            source = {"repo_id": args.kernel, "revision": revision}
        info = {**read_symbols(symbols_path), **source, "variant": variant}
    if args.json:
        print(json.dumps(info, indent=2, ensure_ascii=False))
    else:
        _print_text(info)
    return 0


def _local_symbols(path: Path, scratch: Path) -> tuple[Path, str]:
    """symbols.json of the variant of the local folder `path` this machine would load; for a
    build of our library's sources (a checkout's ``library/norm``), made into ``scratch``."""
    from ._kernel_files import local_variant_file

    found = local_variant_file(path, "symbols.json")
    if found.path is None:
        made = _library_symbols(path, found.variant, scratch)
        if made is None:
            raise CommandError(_missing(str(path), found.variant))
        return made, found.variant
    return found.path, found.variant


def _library_symbols(path: Path, variant: str, scratch: Path) -> Path | None:
    """The symbols.json ``library/build.py`` makes for ``variant`` of the library repository
    whose checkout build is ``path`` (that build leaves it out: it is made by importing the
    package, in a child process, which loading need not pay); None for any other folder."""
    from ..library.builds import build_script
    from ..library.paths import library_path, library_source

    if path.resolve().parent != library_path().resolve():
        return None
    script = build_script(library_source())
    repo = script.read_repository(library_source() / path.name)
    data = script.build_files(repo, symbols=True).get(f"{variant}/symbols.json")
    if data is None:
        return None
    target = scratch / "symbols.json"
    target.write_bytes(data)
    return target


def _missing(where: str, variant: str) -> str:
    return (
        f"No symbols.json found in {where} (variant: {variant}). It is written by "
        "kernel-builder (and by library/build.py for our kernels): rebuild the kernel with a "
        "recent one."
    )


def _hub_symbols(args: argparse.Namespace) -> tuple[Path, str, str]:
    """symbols.json of the variant this machine would load, at the asked version."""
    from ..repos.repo_id import check_repo_id
    from ._kernel_files import describe_where, hub_variant_file
    from ._kernel_refs import select_revision

    repo_id, repo_type = check_repo_id(args.kernel, where="KERNEL"), args.repo_type
    version, revision = select_revision(
        repo_id, repo_type, version=args.version, revision=args.revision
    )
    where = describe_where(repo_id, version, revision)
    found = hub_variant_file(repo_id, repo_type, revision, "symbols.json", where=where)
    if found.path is None:
        raise CommandError(_missing(where, found.variant))
    return found.path, revision, found.variant


def read_symbols(path: Path) -> dict[str, Any]:
    """A ``symbols.json`` (schema_version 1), checked, as a dict.

    Raises:
        CommandError: the file is not JSON, too large, of another schema, or malformed.
    """
    from ..errors import KernelMetadataError
    from ..repos.bounded_json import load_json_file

    try:
        symbols = load_json_file(path, error=KernelMetadataError, limit=MAX_SYMBOLS_SIZE)
    except KernelMetadataError as exc:
        raise CommandError(f"Invalid symbols.json at {path}: {exc}") from exc
    except OSError as exc:
        raise CommandError(f"Cannot read {path}: {exc.strerror or exc}") from exc
    if not isinstance(symbols, dict) or symbols.get("schema_version") != SCHEMA_VERSION:
        raise CommandError(
            f"Unsupported symbols.json schema at {path}; expected schema_version "
            f"{SCHEMA_VERSION}. Upgrade kernels if the kernel was built by a newer kernel-builder."
        )
    for group in ("functions", "layers"):
        exports = symbols.get(group)
        if not isinstance(exports, list) or not all(
            isinstance(s, dict) and isinstance(s.get("name"), str) for s in exports
        ):
            raise CommandError(
                f"Invalid symbols.json at {path}: {group} must be a list of named symbols."
            )
    for layer in symbols["layers"]:
        flags = layer.get("attributes", {})
        if not isinstance(flags, dict) or not all(v is None or isinstance(v, bool) for v in flags.values()):  # fmt: skip
            raise CommandError(
                f"Invalid symbols.json at {path}: layer attributes must be booleans or null."
            )
    return symbols


def _print_text(info: dict[str, Any]) -> None:
    from ._kernel_files import print_kernel_source

    print_kernel_source(info)
    print("\nFunctions:")
    for function in info["functions"]:
        print(f"  {function['name']}{signature_text(function.get('signature'))}")
        summary = _summary(function.get("doc"))
        if summary:
            print(f"      {summary}")
    if not info["functions"]:
        print("  (none)")
    print("\nLayers:")
    for layer in info["layers"]:
        flags = layer.get("attributes") or {}
        shown = "  ".join(
            f"{flag}={'unknown' if flags.get(flag) is None else flags[flag]}"
            for flag in LAYER_FLAGS
        )
        print(f"  {layer['name']}  {shown}")
        summary = _summary(layer.get("doc"))
        if summary:
            print(f"      {summary}")
    if not info["layers"]:
        print("  (none)")


_PREFIXES = {"VAR_POSITIONAL": "*", "VAR_KEYWORD": "**"}


def signature_text(signature: object) -> str:
    """``(x: torch.Tensor, /, *, eps=1e-06) -> torch.Tensor`` from a symbols.json signature;
    empty when it is missing or malformed (the file is not trusted to be well formed)."""
    if not isinstance(signature, dict) or not isinstance(signature.get("parameters"), list):
        return ""
    parts: list[str] = []
    kinds: list[object] = []
    for parameter in signature["parameters"]:
        if not isinstance(parameter, dict) or not isinstance(parameter.get("name"), str):
            return ""
        kind = parameter.get("kind")
        # "/" closes the positional-only parameters, then a bare "*" opens keyword-only ones.
        if kinds and kinds[-1] == "POSITIONAL_ONLY" and kind != "POSITIONAL_ONLY":
            parts.append("/")
        if kind == "KEYWORD_ONLY" and "VAR_POSITIONAL" not in kinds and "*" not in parts:
            parts.append("*")
        text = _PREFIXES.get(str(kind), "") + parameter["name"]
        annotation, default = parameter.get("annotation"), parameter.get("default")
        if isinstance(annotation, str):
            text += f": {annotation}"
        if isinstance(default, str):
            # PEP 8 spacing: "x: int = 1" but "x=1".
            text += f" = {default}" if isinstance(annotation, str) else f"={default}"
        parts.append(text)
        kinds.append(kind)
    if kinds and kinds[-1] == "POSITIONAL_ONLY":
        parts.append("/")
    returns = signature.get("return_annotation")
    return f"({', '.join(parts)})" + (f" -> {returns}" if isinstance(returns, str) else "")


def _summary(doc: object) -> str:
    """The first line of a docstring, shortened to fit a terminal line."""
    if not isinstance(doc, str) or not doc.strip():
        return ""
    first = doc.strip().splitlines()[0].strip()
    return first if len(first) <= 100 else first[:97] + "..."
