"""The smaller seams of issue 56 (point 8): a clear limit on the depth of kernel-depends,
KERNELS_RESOLVE_REUSE_SECONDS=-1 meaning off, and `kernels check` flagging ops registered in a
fixed torch.library namespace."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from kernels.errors import KernelLoadError
from kernels.repos import download, kernel_deps
from kernels.repos.kernel_deps import dependencies_loaded
from kernels.repos.op_namespaces import fixed_op_namespaces
from tests.conftest import write_kernel_repo


def _chain(root: Path, length: int) -> list[Path]:
    """Local kernel packages k0 .. k<length-1>, each listing the next in its kernel-depends."""
    packages = []
    for i in range(length):
        package = root / f"k{i}"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        depends = [{"repo-id": f"org/k{i + 1}", "version": 1}] if i + 1 < length else []
        (package / "metadata.json").write_text(
            json.dumps({"name": f"k{i}", "version": 1, "kernel-depends": depends})
        )
        packages.append(package)
    return packages


def _loader(packages: list[Path]):
    def load(dependency):
        index = int(dependency.repo_id.removeprefix("org/k"))
        with dependencies_loaded(packages[index], dependency.repo_id, load):
            return object()

    return load


def test_a_deep_kernel_depends_chain_is_a_clear_depth_error(tmp_path):
    packages = _chain(tmp_path, 400)  # deeper than Python's recursion limit allows
    with pytest.raises(KernelLoadError) as caught:
        with dependencies_loaded(packages[0], "org/k0", _loader(packages)):
            pass
    message = str(caught.value)
    assert f"kernel-depends nest more than {kernel_deps.MAX_DEPTH} kernels deep" in message
    assert "org/k0 -> org/k1" in message and "malformed" not in message


def test_a_chain_within_the_limit_loads(tmp_path):
    packages = _chain(tmp_path, kernel_deps.MAX_DEPTH)
    with dependencies_loaded(packages[0], "org/k0", _loader(packages)) as modules:
        assert list(modules) == ["org/k1"]


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(None, download.DEFAULT_REUSE_SECONDS), ("0", 0.0), ("-1", 0.0), ("-0.5", 0.0), ("12", 12.0)],
)
def test_resolve_reuse_seconds(monkeypatch, value, seconds):
    if value is None:
        monkeypatch.delenv(download.REUSE_ENV, raising=False)
    else:
        monkeypatch.setenv(download.REUSE_ENV, value)
    assert download.reuse_seconds() == seconds


@pytest.mark.parametrize("value", ["soon", "nan", "inf"])
def test_a_malformed_reuse_setting_turns_reuse_off_with_a_warning(monkeypatch, caplog, value):
    monkeypatch.setenv(download.REUSE_ENV, value)
    with caplog.at_level(logging.WARNING):
        assert download.reuse_seconds() == 0.0
    assert download.REUSE_ENV in caplog.text


FIXED = """
import torch

lib = torch.library.Library("mykernel", "DEF")

@torch.library.custom_op("mykernel::silu", mutates_args=())
def silu(x: torch.Tensor) -> torch.Tensor:
    return x

@torch.library.custom_op("mykernel::gelu", mutates_args=())
def gelu(x: torch.Tensor) -> torch.Tensor:
    return x
"""

DERIVED = """
import torch
from ._ops import add_op_namespace_prefix

NAMESPACE = f"_k_{__name__.replace('.', '_')}"

@torch.library.custom_op(add_op_namespace_prefix("silu"), mutates_args=())
def silu(x: torch.Tensor) -> torch.Tensor:
    return x

torch.library.define(f"{NAMESPACE}::gelu", "(Tensor x) -> Tensor")
"""


def test_fixed_op_namespaces_are_found(tmp_path):
    (tmp_path / "ops.py").write_text(FIXED)
    (tmp_path / "derived.py").write_text(DERIVED)
    (tmp_path / "broken.py").write_text("def (:\n")
    found = fixed_op_namespaces(tmp_path)
    assert [(f.path.name, f.line, f.namespace) for f in found] == [("ops.py", 4, "mykernel")]
    assert "fixed namespace 'mykernel'" in found[0].describe(tmp_path)
    assert "ops.py:4" in found[0].describe(tmp_path)


def test_kernels_check_flags_a_fixed_namespace(tmp_path):
    from kernels.cli.check import check_repository

    repo = write_kernel_repo(tmp_path / "repo")
    (repo / "build" / "torch-universal" / "activation" / "ops.py").write_text(FIXED)
    report = check_repository(repo, where=str(repo))
    flagged = [text for status, text in report.lines if text.startswith("ops:")]
    assert len(flagged) == 1 and "fixed namespace 'mykernel'" in flagged[0]
    assert ("warn", flagged[0]) in report.lines
