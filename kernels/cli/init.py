"""``kernels init NAME``: scaffold a new Triton kernel repository."""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
import shutil
import sys
from pathlib import Path

from . import CommandError

HELP = "scaffold a new Triton kernel repository with a layer, tests and a benchmark"
DESCRIPTION = """\
Create the folder NAME (or DIR/NAME) with a Triton kernel repository in kernel-builder's
layout, then build it once:
  build.toml            name, version, license, backends (kernel-builder's format)
  torch-ext/<package>/  the package source: an example element-wise SiLU kernel with a
                        backward pass, and a kernel layer that can replace torch.nn.SiLU
  build.py              writes build/ from torch-ext/; run it after every change
  build/                the torch-cuda, torch-rocm, torch-xpu and torch-universal variants,
                        each with the metadata.json Hugging Face's client needs
  tests/                tests against PyTorch that run on the CPU through Triton's
                        interpreter (TRITON_INTERPRET=1), and check that build/ is current
  benchmarks/           workloads for `kernels benchmark .`
  README.md             the Hub model card
  .gitignore            caches and benchmarks/results/
NAME may be a Hub repo id (org/name); its last part names the kernel and the folder
(two or more lowercase letters, digits and dashes, starting with a letter and not ending
with a dash: kernel-builder's rule) and, with dashes as underscores, the package."""
EPILOG = """\
examples:
  kernels init my-org/fused-silu
  cd fused-silu && python -m pytest tests && kernels check .
The scaffold's tests need pytest (`python -m pip install pytest`), which kernels does not
install."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name", metavar="NAME", help="repository name or Hub repo id, e.g. my-org/fused-silu"
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path("."),
        help="create the repository in this folder (default: .)",
    )
    parser.add_argument(
        "--force", action="store_true", help="write into an existing, non-empty folder"
    )


def run(args: argparse.Namespace) -> int:
    from ..library import library_source
    from ..repos.repo_id import is_repo_id, shown
    from .scaffold import files

    repo_id = args.name
    # ASCII only: the name becomes a Hub repository id and a Python package name.
    if not (
        re.fullmatch(r"(?:[A-Za-z0-9][A-Za-z0-9_.-]*/)?[A-Za-z][A-Za-z0-9_-]*", repo_id)
        and is_repo_id(repo_id)
    ):
        raise CommandError(
            f"{shown(repo_id)} is not a usable name: use ASCII letters, digits, '-' and '_', "
            "starting with a letter, optionally prefixed by an organisation "
            "('my-org/fused-silu')"
        )
    name = repo_id.split("/")[-1]
    if not re.fullmatch(r"[a-z][-a-z0-9]*[a-z0-9]", name):
        raise CommandError(
            f"{shown(name)} is not a kernel name: use at least two characters, lowercase "
            "letters, digits and dashes, starting with a letter and not ending with a dash "
            "(kernel-builder's rule, which Hugging Face's client checks), e.g. 'fused-silu'"
        )
    package = name.replace("-", "_")
    if "/" not in repo_id:
        repo_id = f"<your-org>/{name}"
    target = args.dir / name
    for folder in (args.dir, target):
        if folder.exists() and not folder.is_dir():
            raise CommandError(f"{folder} is not a folder; pass --dir a folder to create {name} in")
    if target.exists() and any(target.iterdir()) and not args.force:
        raise CommandError(f"{target} exists and is not empty; choose another NAME or pass --force")
    builder = library_source() / "build.py"
    for relative, content in files(
        repo_id=repo_id, name=name, package=package, builder=builder
    ).items():
        path = target / relative
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
        except OSError as exc:  # e.g. no permission, a full disk, a file where a folder goes
            raise CommandError(f"cannot write {path}: {exc.strerror or exc}") from None
        print(f"wrote {path}")
    for variant in _build(target):
        print(f"wrote {target / 'build' / variant}/")
    print(f"\nNext: {next_steps(target)}")
    return 0


def next_steps(target: Path) -> str:
    """The commands that test and check the new repository, with this Python's pytest.

    `kernels` does not depend on pytest (``make demo``'s environment has none), so where this
    Python lacks it the first step installs it. The interpreter is named in full unless it is
    what ``python`` means here: a bare ``pytest`` may be another environment's, without torch.
    """
    on_path = shutil.which("python")
    python = "python"
    if on_path is None or Path(on_path).resolve() != Path(sys.executable).resolve():
        python = shlex.quote(sys.executable)
    steps = [f"cd {shlex.quote(str(target))}"]
    if importlib.util.find_spec("pytest") is None:
        steps.append(f"{python} -m pip install pytest")
    steps += [f"{python} -m pytest tests", "kernels check ."]
    return " && ".join(steps)


def _build(target: Path) -> tuple[str, ...]:
    """Run the repository's own build.py (as `python build.py` would) and return its variants."""
    spec = importlib.util.spec_from_file_location("_kernels_init_build", target / "build.py")
    if spec is None or spec.loader is None:  # not for a .py file; said in case it ever is
        raise CommandError(f"{target / 'build.py'} cannot be imported as a Python module")
    build = importlib.util.module_from_spec(spec)
    # dataclasses look their module up in sys.modules while the class is created.
    sys.modules[spec.name] = build
    try:
        spec.loader.exec_module(build)
        repo = build.read_repository(target)
        build.write_build(repo)
    except build.LibraryBuildError as exc:
        raise CommandError(f"building {target}: {exc}") from None
    finally:
        sys.modules.pop(spec.name, None)
    return repo.variants
