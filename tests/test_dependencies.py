"""The package's declared dependencies cover what it imports on every Python it supports."""

from __future__ import annotations

import tomllib
from packaging.requirements import Requirement

from tests.support.paths import REPO_ROOT


def _dependencies() -> list[Requirement]:
    data = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return [Requirement(line) for line in data["project"]["dependencies"]]


def test_tomli_is_installed_where_the_standard_library_has_no_tomllib():
    # `import kernels` imports kernels.repos.project (through the lock API), which needs
    # tomllib or, on Python 3.10, tomli: without tomli declared, `pip install kernels` gave a
    # package whose import failed there.
    assert "import tomli as tomllib" in (REPO_ROOT / "kernels/repos/project.py").read_text()
    tomli = [r for r in _dependencies() if r.name == "tomli"]
    assert len(tomli) == 1, "pyproject.toml must declare tomli for Python 3.10"
    marker = tomli[0].marker
    assert marker is not None
    assert marker.evaluate({"python_version": "3.10"})
    assert not marker.evaluate({"python_version": "3.11"})
