"""Tests of transformers 5.x as a client; they run in the `.venv-tf5` environment (`make test-5`).

In the transformers 4.57 environment every test here is skipped: the two release lines
cannot share one environment (their huggingface_hub ranges conflict).
"""

from __future__ import annotations

import pytest
from packaging.version import Version

transformers = pytest.importorskip("transformers")

if Version(transformers.__version__).major < 5:
    pytest.skip(
        f"transformers {transformers.__version__} is installed; these tests run in the "
        "transformers 5.x environment (`make test-5`)",
        allow_module_level=True,
    )

from tests.support.tf5_models import restore_function_modules  # noqa: E402


@pytest.fixture
def clean_kernels():
    """Put back the process-wide mapping and the library's tags and tagger afterwards."""
    from kernels.library import untag
    from kernels.mapping import registry

    saved = registry._global_mapping
    yield
    untag()
    registry._global_mapping = saved
    restore_function_modules()
