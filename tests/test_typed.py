"""The package is typed (PEP 561): type checkers read our annotations instead of treating
`kernels` as untyped (`kernelize(...)` would be `Any`)."""

import importlib.resources
from pathlib import Path

import tomllib

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def test_the_package_carries_the_py_typed_marker():
    assert importlib.resources.files("kernels").joinpath("py.typed").is_file()


def test_the_wheel_ships_the_whole_package_folder_with_its_marker():
    wheel = tomllib.loads(PYPROJECT.read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert wheel["packages"] == ["kernels"]
    assert not any("py.typed" in pattern for pattern in wheel.get("exclude", []))
