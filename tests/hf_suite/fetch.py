"""Fetch Hugging Face's own test suite of their `kernels` client into an ignored cache folder.

``python -m tests.hf_suite.fetch [VERSION]`` prints the folder. Their suite ships only in the
source distribution. The sdist builds with Rust (maturin), so pip stops at its build step, but
by then it has unpacked the source into its temporary download folder and ``--no-clean`` leaves
it there. pip runs with ``TMPDIR`` pointed at a fresh private folder, so the one
``pip-download-*/kernels_*`` folder in it is the unpacked sdist: no log is parsed and no host
is named here, the package index is pip's own configuration.

What is kept (their files, never committed): ``tests/`` with its data folders, ``pytest.ini``
(their markers), ``pyproject.toml`` (a test reads the project version from it, one folder above
``tests/``) and ``PKG-INFO`` (checked to be the version asked for). A cached copy whose
``PKG-INFO`` names the version is reused: the fetch costs a download only once.
"""

from __future__ import annotations

import email.parser
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT_VERSION = "0.19.1"
REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_ROOT = REPO_ROOT / ".cache" / "hf-suite"
#: The sdist is a few MB; anything larger is not what we asked for.
MAX_BYTES = 64 * 1024 * 1024


class FetchError(RuntimeError):
    """The suite could not be fetched, or what was fetched is not the release asked for."""


def suite_dir(version: str = DEFAULT_VERSION) -> Path:
    """The cache folder of release `version`'s suite (``<repo>/.cache/hf-suite/kernels-<v>``)."""
    return CACHE_ROOT / f"kernels-{version}"


def _pkg_info(path: Path) -> tuple[str, str]:
    headers = email.parser.Parser().parsestr(path.read_text(encoding="utf-8", errors="replace"))
    return headers.get("Name", ""), headers.get("Version", "")


def is_fetched(version: str = DEFAULT_VERSION) -> bool:
    folder = suite_dir(version)
    pkg_info = folder / "PKG-INFO"
    return (
        pkg_info.is_file()
        and _pkg_info(pkg_info) == ("kernels", version)
        and (folder / "tests" / "conftest.py").is_file()
    )


def _check_tree(root: Path) -> None:
    """Refuse links (which could point outside the cache) and an oversized tree."""
    total = 0
    for path in root.rglob("*"):
        if path.is_symlink():
            raise FetchError(f"the sdist holds a link, refused: {path.relative_to(root)}")
        if path.is_file():
            total += path.stat().st_size
    if total > MAX_BYTES:
        raise FetchError(f"the sdist's tests are {total} bytes, more than {MAX_BYTES}: refused")


def _unpacked_sdist(tmp: Path, version: str) -> Path:
    env = dict(os.environ, TMPDIR=str(tmp), PIP_DISABLE_PIP_VERSION_CHECK="1")
    command = [
        sys.executable, "-m", "pip", "download", "-v", "--no-deps", "--no-binary", ":all:",
        "--no-clean", "-d", str(tmp / "download"), f"kernels=={version}",
    ]  # fmt: skip
    # pip fails at the sdist's metadata step (no Rust toolchain): expected, the exit status
    # is not the test. What it left behind is.
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    found = sorted(tmp.glob("pip-download-*/kernels_*"))
    if len(found) != 1:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
        raise FetchError(
            f"pip left {len(found)} unpacked kernels sdists in {tmp} (expected 1); is "
            f"kernels=={version} on the package index? pip said:\n{tail}"
        )
    source = found[0]
    if _pkg_info(source / "PKG-INFO") != ("kernels", version):
        raise FetchError(
            f"the unpacked sdist is {_pkg_info(source / 'PKG-INFO')}, not kernels {version}"
        )
    return source


def fetch(version: str = DEFAULT_VERSION) -> Path:
    """Return the folder of release `version`'s test suite, fetching it the first time."""
    target = suite_dir(version)
    if is_fetched(version):
        return target
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE_ROOT, prefix=".fetch-") as scratch:
        tmp = Path(scratch)
        source = _unpacked_sdist(tmp, version)
        staged = tmp / "staged"
        staged.mkdir()
        tests = source / "kernels" / "tests"
        if not (tests / "conftest.py").is_file():
            raise FetchError(f"kernels {version}'s sdist has no kernels/tests/conftest.py")
        _check_tree(tests)
        shutil.copytree(tests, staged / "tests", symlinks=True)
        for name, origin in (
            ("pytest.ini", source / "kernels" / "pytest.ini"),
            ("pyproject.toml", source / "pyproject.toml"),
            ("PKG-INFO", source / "PKG-INFO"),
        ):
            if origin.is_file() and not origin.is_symlink():
                shutil.copyfile(origin, staged / name)
        if target.exists():
            shutil.rmtree(target)
        # PKG-INFO is what marks the cache complete; the rename makes it appear with the rest.
        staged.rename(target)
    return target


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    version = args[0] if args else DEFAULT_VERSION
    try:
        print(fetch(version))
    except FetchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
