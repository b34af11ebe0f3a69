"""Call forms, settings and layout rules of Hugging Face's `kernels` client 0.17 that work here.

Local folders are built in tmp: `get_local_kernel` with a backend and with a repository's
``build/`` or one variant folder, the flat package preferred over its compatibility copy,
and the ``LOCAL_KERNELS`` redirect of Hub loads.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import kernels.repos.variants as variants
from kernels import (
    BuildVariantNotFoundError,
    KernelLoadError,
    KernelMappingError,
    get_local_kernel,
)
from kernels.repos.variants import BuildVariant, machine_build


def write_variant(repo, variant, *, marker, flat=True, compat=None):
    """A variant folder with a flat package (and a compatibility package `compat` if named)."""
    folder = repo / "build" / variant
    folder.mkdir(parents=True, exist_ok=True)
    metadata = {"name": "relu", "id": f"_relu_{marker}", "version": 1, "license": "MIT"}
    backend = BuildVariant.parse(variant).backend
    metadata |= {"python-depends": [], "backend": {"type": backend}}
    (folder / "metadata.json").write_text(json.dumps(metadata))
    if flat:
        (folder / "__init__.py").write_text(f"MARKER = {marker!r}\nLAYOUT = 'flat'\n")
    if compat:
        (folder / compat).mkdir()
        (folder / compat / "__init__.py").write_text(f"MARKER = {marker!r}\nLAYOUT = 'compat'\n")
    return folder


@pytest.fixture
def on_cuda(monkeypatch):
    """This machine as a CUDA one: builds for the CPU then need ``backend="cpu"``."""
    here = machine_build()
    cuda = replace(here, backend="cuda", backend_version=variants.Version("12.8"))
    monkeypatch.setattr(variants, "machine_build", lambda: cuda)
    return cuda


def test_backend_cpu_loads_the_cpu_build_where_torch_runs_cuda(tmp_path, on_cuda):
    repo = tmp_path / "relu"
    write_variant(repo, "torch-cuda", marker="cuda")
    write_variant(repo, "torch-cpu", marker="cpu")
    assert get_local_kernel(repo).MARKER == "cuda"
    assert get_local_kernel(repo, backend="cpu").MARKER == "cpu"
    # Their 0.10-era positional form (repo_path, package_name) combines with the keyword.
    assert get_local_kernel(repo, "relu", backend="cpu").MARKER == "cpu"
    assert get_local_kernel(repo, backend="cuda").MARKER == "cuda"


def test_backend_cpu_with_no_cpu_build_says_what_it_offers(tmp_path, on_cuda):
    repo = tmp_path / "relu"
    write_variant(repo, "torch-cuda", marker="cuda")
    with pytest.raises(BuildVariantNotFoundError, match="torch-cuda: rejected"):
        get_local_kernel(repo, backend="cpu")


@pytest.mark.parametrize("backend", ["rocm", "universal", "", 3, ["cpu"]])
def test_a_backend_this_machine_does_not_run_is_refused(tmp_path, on_cuda, backend):
    repo = tmp_path / "relu"
    write_variant(repo, "torch-cpu", marker="cpu")
    with pytest.raises(KernelMappingError, match="backend must be None, 'cpu' or 'cuda'"):
        get_local_kernel(repo, backend=backend)


def test_the_build_folder_or_one_variant_folder_may_be_given(tmp_path):
    repo = tmp_path / "relu"
    write_variant(repo, "torch-cpu", marker="cpu")
    other = write_variant(repo, "torch-cuda", marker="cuda")
    assert get_local_kernel(repo / "build").MARKER == "cpu"
    assert get_local_kernel(repo / "build") is get_local_kernel(repo)
    # A variant folder named by the user is imported as it is, even one for another backend.
    assert get_local_kernel(other).MARKER == "cuda"
    assert get_local_kernel(repo / "build" / "torch-cpu") is get_local_kernel(repo)


def test_a_variant_folder_in_the_older_layout(tmp_path):
    folder = write_variant(tmp_path / "relu", "torch-cpu", marker="old", flat=False, compat="relu")
    module = get_local_kernel(folder)
    assert (module.MARKER, module.LAYOUT) == ("old", "compat")


def test_a_folder_that_is_no_kernel_says_which_forms_are_accepted(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(KernelLoadError, match=r"Give the repository folder, its build/ or one"):
        get_local_kernel(tmp_path / "empty")


def test_the_flat_package_is_preferred_over_its_compatibility_copy(tmp_path):
    repo = tmp_path / "relu"
    write_variant(repo, "torch-cpu", marker="both", compat="relu")
    named = get_local_kernel(repo, "relu")
    assert named.LAYOUT == "flat"
    # One module for the folder whichever way it is asked for: the compatibility package is
    # never imported beside it (it would register the kernel's ops a second time).
    assert get_local_kernel(repo) is named
    assert get_local_kernel(repo / "build" / "torch-cpu", "relu") is named


def test_the_older_layout_alone_still_loads_by_name(tmp_path):
    repo = tmp_path / "relu"
    write_variant(repo, "torch-cpu", marker="old", flat=False, compat="relu")
    assert get_local_kernel(repo, "relu").LAYOUT == "compat"
    with pytest.raises(KernelLoadError, match="has no package 'other'.*Packages there: relu"):
        get_local_kernel(repo, "other")


def test_untagged_per_torch_variant_loads_here(tmp_path):
    here = machine_build()
    if here.cxx_abi is None:
        pytest.skip("torch here names no C++ ABI (macOS, Windows)")
    # The name without the ABI tag, for this torch and backend, whatever its ABI.
    name = here.compiled_variant.replace(f"-{here.cxx_abi}", "")
    repo = tmp_path / "relu"
    write_variant(repo, name, marker="untagged")
    write_variant(repo, "torch-cpu", marker="noarch")
    assert get_local_kernel(repo).MARKER == "untagged"
