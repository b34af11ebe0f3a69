"""Our version lies inside the window of `kernels` versions the installed transformers accepts.

transformers 5.x treats a `kernels` outside ``KERNELS_MIN_VERSION <= version < KERNELS_MAX_VERSION``
(``transformers/utils/import_utils.py``) as absent: it tags no layer and use_kernels raises.
"""

import importlib.metadata

import transformers
from packaging.version import Version
from transformers.utils import import_utils

import kernels


def test_our_version_is_inside_the_window_transformers_accepts():
    low = Version(import_utils.KERNELS_MIN_VERSION)
    high = Version(import_utils.KERNELS_MAX_VERSION)
    installed = Version(importlib.metadata.version("kernels"))
    assert low <= installed < high, (
        f"kernels {installed} is outside the window transformers {transformers.__version__} "
        f"accepts ({low} <= version < {high}): it would treat kernels as absent. Set the "
        f"version in pyproject.toml and kernels/__init__.py to the API level that window "
        f"stands for (README.md, Versions), then reinstall: pip install --no-deps -e ."
    )
    assert import_utils.is_kernels_available()


def test_the_imported_package_is_the_installed_one():
    assert kernels.__version__ == importlib.metadata.version("kernels"), (
        "the kernels imported here is not the installed distribution transformers checks; "
        "reinstall from this checkout: pip install --no-deps -e ."
    )
