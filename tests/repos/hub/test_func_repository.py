"""FuncRepository: function kernels from repositories on the test server."""

from __future__ import annotations

import copy
import json
import pickle

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels import (
    FuncRepository,
    KernelLoadError,
    KernelMappingError,
    KernelVersionSpecError,
    Mode,
    kernelize,
    use_kernel_func_from_hub,
    use_kernel_mapping,
)
from kernels.layer.swap import kernel_layer_of

pytestmark = pytest.mark.hub


@use_kernel_func_from_hub("silu_and_mul")
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = silu_and_mul

    def forward(self, x):
        return self.act(x)


def offset_of(model, x):
    return round((model(x) - F.silu(x[..., :4]) * x[..., 4:]).mean().item())


def test_the_function_of_the_resolved_version_replaces_the_tagged_one(released):
    repo = released("0.1.0", "0.1.1", "0.2.0")  # offsets 1, 2, 3
    model, x = Block(), torch.randn(3, 8)
    func_repo = FuncRepository(repo.repo_id, func_name="silu_and_mul", version=">=0.1,<0.2")
    with use_kernel_mapping({"silu_and_mul": {"cpu": func_repo}}):
        kernelize(model, device="cpu", mode=Mode.INFERENCE)
    assert kernel_layer_of(model.act) is not None
    assert offset_of(model, x) == 2  # v0.1.1, the highest below 0.2
    assert func_repo.commit is not None
    assert str(func_repo).endswith(", function silu_and_mul")
    assert f"commit {func_repo.commit[:12]}" in str(func_repo)


def test_a_missing_function_lists_what_the_package_has(released):
    repo = released("0.1.0")
    func_repo = FuncRepository(repo.repo_id, func_name="gelu_and_mul", version=">=0.1")
    with pytest.raises(KernelLoadError, match="has no function 'gelu_and_mul'.*silu_and_mul"):
        func_repo.load()


def test_arguments_are_checked_when_the_mapping_is_written():
    with pytest.raises(KernelMappingError, match="both revision"):
        FuncRepository("org/kernel", func_name="f", revision="main", version=">=0.1")
    with pytest.raises(KernelVersionSpecError):
        FuncRepository("org/kernel", func_name="f", version="not a spec")


def test_a_value_that_pickles_and_copies_as_what_was_asked():
    repo = FuncRepository(
        "kernels-community/rotary", func_name="apply_rotary_pos_emb", version=">=0.1,<0.2"
    )
    assert copy.deepcopy(repo) is repo
    again = pickle.loads(pickle.dumps(repo))
    assert again == repo and hash(again) == hash(repo)
    assert again.commit is None


def test_a_locked_function_kernel_loads_the_locked_commit_verified(released, tmp_path, capsys):
    from kernels import KernelHashMismatchError, LockedFuncRepository
    from kernels.cli import main

    repo = released("0.1.0")  # offset 1
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        f'[project]\nname = "p"\nversion = "0"\n[tool.kernels.dependencies]\n"{repo.repo_id}" = ">=0.1"\n'
    )
    assert main(["lock", str(project)]) == 0, capsys.readouterr().err
    repo.release("0.1.1")  # published after locking: the lock keeps 0.1.0
    lockfile = project / "kernels.lock"
    func_repo = LockedFuncRepository(repo.repo_id, func_name="silu_and_mul", lockfile=lockfile)
    model, x = Block(), torch.randn(3, 8)
    with use_kernel_mapping({"silu_and_mul": {"cpu": func_repo}}):
        kernelize(model, device="cpu", mode=Mode.INFERENCE)
    assert offset_of(model, x) == 1
    assert str(func_repo).endswith(", function silu_and_mul")
    assert "verified" in str(func_repo)
    assert copy.deepcopy(func_repo) is func_repo

    # A lock whose hash does not match fails before anything is imported.
    entries = json.loads(lockfile.read_text())
    tampered = tmp_path / "tampered.lock"
    entries[0]["files"] = {}
    variant = next(iter(entries[0]["variants"]))
    entries[0]["variants"][variant]["hash"] = "sha256-" + "0" * 64
    tampered.write_text(json.dumps(entries))
    with pytest.raises(KernelHashMismatchError):
        LockedFuncRepository(repo.repo_id, func_name="silu_and_mul", lockfile=tampered).load()
