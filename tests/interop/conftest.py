"""The interoperability tests run in their own environment: Hugging Face's `kernels` client
installed, this package not (``make install-hf``, ``make test-hf``). Both are the `kernels`
distribution, so an environment holds one or the other; elsewhere these tests are not collected
(``pytest tests/interop`` says so in its header).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path

import pytest

#: The client release these tests pin: the Makefile's HF_KERNELS_VERSION.
HF_KERNELS_VERSION = "0.19.1"

REPO_ROOT = Path(__file__).resolve().parents[2]


def _installed_kernels_version() -> str | None:
    try:
        return importlib.metadata.version("kernels")
    except importlib.metadata.PackageNotFoundError:
        return None


def _installed_kernels_is_theirs() -> bool:
    """Whether the installed `kernels` distribution is Hugging Face's client: ours has the same
    name and, since 0.19.1, the same version; theirs ships its private ``_internals``."""
    try:
        files = importlib.metadata.distribution("kernels").files or []
    except importlib.metadata.PackageNotFoundError:
        return False
    return any(str(f).startswith("kernels/_internals/") for f in files)


IN_HF_ENVIRONMENT = (
    _installed_kernels_version() == HF_KERNELS_VERSION and _installed_kernels_is_theirs()
)

if IN_HF_ENVIRONMENT:
    # `python -m pytest` puts the working directory on sys.path, where this repository's own
    # `kernels` package would shadow the installed client.
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO_ROOT]
else:
    collect_ignore_glob = ["test_*.py"]


def pytest_report_header(config):
    if not IN_HF_ENVIRONMENT:
        return (
            f"tests/interop: not collected (the installed kernels {_installed_kernels_version()} "
            f"is not Hugging Face's client {HF_KERNELS_VERSION}); run them with `make test-hf`"
        )
    return None


@pytest.fixture(autouse=True)
def forked_variant_checks():
    """The suite's replacement of our `kernels check` children (tests/conftest.py) has nothing
    to replace here: the `kernels` of this environment is Hugging Face's client."""


@pytest.fixture(scope="session")
def library(tmp_path_factory) -> Path:
    """Our library as the package ships it (the wheel's ``kernels/_library``, the cache a
    checkout loads from): the sources and each repository's ``build/``, written by
    library/build.py's ``library_files()`` into a temporary folder, since git holds no build.
    This environment has no `kernels` of ours: the script is standalone."""
    spec = importlib.util.spec_from_file_location(
        "_interop_library_build", REPO_ROOT / "library" / "build.py"
    )
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = build  # dataclasses look their module up there
    folder = tmp_path_factory.mktemp("library")
    try:
        spec.loader.exec_module(build)
        build.write_files(build.library_files(symbols=False), folder)
    finally:
        del sys.modules[spec.name]
    return folder
