"""The Hub tests fail, never skip, when the olah test server is not installed."""

from __future__ import annotations

from tests.support.children import run_python
from tests.support.paths import REPO_ROOT, subprocess_env


def test_missing_olah_fails_the_hub_tests_and_says_how_to_install_it(tmp_path):
    env = subprocess_env(KERNELS_TEST_OLAH=str(tmp_path / "no-olah-here"))
    result = run_python(
        *[
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            str(
                REPO_ROOT
                / "tests/repos/hub/test_versions.py::test_highest_tag_satisfying_the_specifier_is_loaded"
            ),
        ],
        env=env,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert result.returncode == 1, result.stdout
    assert "make hub-server" in result.stdout
    assert "1 error" in result.stdout and "skipped" not in result.stdout
