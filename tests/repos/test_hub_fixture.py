"""The Hub tests fail, never skip, when the olah test server is not installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_missing_olah_fails_the_hub_tests_and_says_how_to_install_it(tmp_path):
    env = {
        **os.environ,
        "KERNELS_TEST_OLAH": str(tmp_path / "no-olah-here"),
        "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO_ROOT), os.environ.get("PYTHONPATH")))),
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            str(
                REPO_ROOT
                / "tests/hub/test_versions.py::test_highest_tag_satisfying_the_specifier_is_loaded"
            ),
        ],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stdout
    assert "make hub-server" in result.stdout
    assert "1 error" in result.stdout and "skipped" not in result.stdout
