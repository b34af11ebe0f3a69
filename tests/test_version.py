"""One version number: pyproject.toml, kernels.__version__ and the installed distribution."""

import importlib.metadata
import re
from pathlib import Path

import kernels

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def test_version_is_stated_once_and_installed():
    declared = re.search(r'^version = "([^"]+)"', PYPROJECT.read_text(), re.MULTILINE).group(1)
    assert kernels.__version__ == declared
    assert importlib.metadata.version("kernels") == declared, (
        "the installed kernels distribution is stale; reinstall: pip install --no-deps -e ."
    )


def test_version_is_the_kernels_api_level_we_implement():
    """0.19.x: the layer API of Hugging Face's kernels 0.19, which transformers 5.25 pins
    (0.19.1 <= version < 0.20.0); README.md, Versions."""
    major, minor, *_ = (int(p) for p in kernels.__version__.split("."))
    assert (major, minor) == (0, 19)
