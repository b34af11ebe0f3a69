"""Call forms, settings and layout rules of Hugging Face's `kernels` client 0.17 that work here.

Local folders are built in tmp: `get_local_kernel` with a backend and with a repository's
``build/`` or one variant folder, the flat package preferred over its compatibility copy,
and the ``LOCAL_KERNELS`` redirect of Hub loads.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest

import kernels.repos.variants as variants
from kernels import (
    BuildVariantNotFoundError,
    KernelLoadError,
    KernelMappingError,
    KernelMetadataError,
    LayerRepository,
    UntrustedKernelError,
    get_kernel,
    get_kernel_dep,
    get_local_kernel,
)
from kernels.repos.local_overrides import ENV, local_overrides
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


# LOCAL_KERNELS: Hub loads of the repositories it lists import local folders instead.


@pytest.fixture
def no_hub(monkeypatch):
    """No LOCAL_KERNELS from outside, and no Hub to reach where the endpoint is read now.

    The repositories these tests name are in an untrusted organisation ("someone"), so a load
    that went the Hub's way would also be refused, before any request, by the trust check.
    """
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.delenv(ENV, raising=False)


def relu_repo(root, marker):
    write_variant(root, "torch-cpu", marker=marker)
    layers = root / "build" / "torch-cpu" / "layers.py"
    layers.write_text(
        "import torch\n\n\nclass ReLU(torch.nn.Module):\n"
        "    def forward(self, x):\n        return torch.relu(x)\n"
    )
    init = root / "build" / "torch-cpu" / "__init__.py"
    init.write_text(init.read_text() + "from . import layers\n")
    return root


@pytest.mark.parametrize("form", ["repo", "build", "variant"])
def test_local_kernels_replaces_a_hub_load(tmp_path, monkeypatch, caplog, no_hub, form):
    repo = relu_repo(tmp_path / "relu", marker="local")
    folder = {"repo": repo, "build": repo / "build", "variant": repo / "build" / "torch-cpu"}
    other = relu_repo(tmp_path / "other", marker="other")
    # An organisation nobody trusts: local code is the user's own, so it loads all the same.
    monkeypatch.setenv(ENV, f"someone/relu={folder[form]}:someone/other={other}")
    with caplog.at_level(logging.INFO, logger="kernels"):
        module = get_kernel("someone/relu", version=1)
    assert module.MARKER == "local"
    assert module is get_local_kernel(repo)
    notes = [r.getMessage() for r in caplog.records if "instead of the Hub" in r.getMessage()]
    assert len(notes) == 1 and "someone/relu" in notes[0] and str(folder[form]) in notes[0]
    assert get_kernel("someone/other", version=1).MARKER == "other"


def test_local_kernels_serves_layer_repositories(tmp_path, monkeypatch, no_hub):
    repo = relu_repo(tmp_path / "relu", marker="local")
    monkeypatch.setenv(ENV, f"someone/relu={repo}")
    layer_repo = LayerRepository("someone/relu", layer_name="ReLU", version=1)
    assert layer_repo.load() is get_local_kernel(repo).layers.ReLU
    assert layer_repo.commit == "local"
    assert "LOCAL_KERNELS" in str(layer_repo)


def test_a_repository_local_kernels_does_not_list_goes_to_the_hub(tmp_path, monkeypatch, no_hub):
    monkeypatch.setenv(ENV, f"someone/relu={relu_repo(tmp_path / 'relu', marker='local')}")
    # The Hub path: trust is checked (before any request), which a listed repository skips.
    with pytest.raises(UntrustedKernelError, match="someone/other"):
        get_kernel("someone/other", version=1)


@pytest.mark.parametrize(
    "value, problem",
    [
        ("someone/relu", "has no '='"),
        ("relu=/src/relu", "is not a Hub repository id"),
        ("some one/relu=/src/relu", "is not a Hub repository id"),
        ("someone/relu=", "names no folder"),
        ("someone/relu=/a:someone/relu=/b", "already mapped to /a"),
    ],
)
def test_a_malformed_local_kernels_names_the_variable_and_entry(
    monkeypatch, no_hub, value, problem
):
    monkeypatch.setenv(ENV, value)
    with pytest.raises(KernelMappingError) as info:
        get_kernel("someone/relu", version=1)
    message = str(info.value)
    assert message.startswith(f"{ENV} entry ") and problem in message
    assert "e.g. kernels-community/relu=/src/relu" in message


def test_empty_local_kernels_entries_are_skipped():
    assert local_overrides("") == {}
    assert local_overrides("a/b=/x::") == {"a/b": Path("/x")}
    # Only the first '=' separates: a folder name may hold one.
    assert local_overrides("a/b=/x=y") == {"a/b": Path("/x=y")}


def test_a_local_kernels_folder_that_does_not_exist_says_so(tmp_path, monkeypatch, no_hub):
    monkeypatch.setenv(ENV, f"someone/relu={tmp_path / 'missing'}")
    with pytest.raises(KernelLoadError, match="the folder does not exist.*remove someone/relu"):
        get_kernel("someone/relu", version=1)


# `kernels check`: each variant is imported in a process of its own.

TORCH_LIBRARY_INIT = """
import torch

# What a compiled kernel's TORCH_LIBRARY does: torch accepts one per namespace and process.
_lib = torch.library.Library("hf_forms_check_ns", "DEF")
_lib.define("twice(Tensor x) -> Tensor")
from . import layers
"""


def test_check_imports_each_variant_in_its_own_process(tmp_path, capsys):
    from kernels.cli import main

    repo = tmp_path / "ops"
    for variant in ("torch-cpu", "torch-universal"):
        folder = write_variant(repo, variant, marker=variant)
        (folder / "__init__.py").write_text(TORCH_LIBRARY_INIT)
        (folder / "layers.py").write_text(
            "import torch\n\n\nclass Twice(torch.nn.Module):\n"
            "    def forward(self, x):\n        return 2 * x\n"
        )
    (repo / "README.md").write_text("# ops\n")
    assert main(["check", str(repo)]) == 0
    out = capsys.readouterr().out
    for variant in ("torch-cpu", "torch-universal"):
        assert f"ok    imports: {variant}: package ops imports" in out, out
        assert f"ok    layers: {variant}: Twice follows the kernel layer rules" in out
    assert "0 failed" in out


@pytest.mark.new_interpreters  # the product's own children, here and nowhere else
def test_check_reports_a_variant_whose_process_dies(tmp_path, capsys):
    from kernels.cli import main

    repo = tmp_path / "dies"
    folder = write_variant(repo, "torch-cpu", marker="dies")
    (folder / "__init__.py").write_text("import os\nos._exit(3)\n")
    assert main(["check", str(repo)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  imports: torch-cpu: the process importing it ended with status 3" in out


# kernel-depends and get_kernel_dep: a kernel's dependencies load before it, LOCAL_KERNELS
# standing in for the Hub.

USES_DEP = """
from kernels import get_kernel_dep

RELU = get_kernel_dep("someone/relu")
"""


def dependent_repo(root, depends, init=USES_DEP):
    folder = write_variant(root, "torch-cpu", marker="dependent")
    metadata = json.loads((folder / "metadata.json").read_text())
    (folder / "metadata.json").write_text(json.dumps({**metadata, "kernel-depends": depends}))
    (folder / "__init__.py").write_text(init)
    return root


def test_a_kernel_gets_its_dependency_while_it_imports(tmp_path, monkeypatch, no_hub):
    dep = relu_repo(tmp_path / "relu", marker="dep")
    monkeypatch.setenv(ENV, f"someone/relu={dep}")
    parent = dependent_repo(tmp_path / "parent", [{"repo-id": "someone/relu", "version": 1}])
    assert get_local_kernel(parent).RELU is get_local_kernel(dep)
    # The same through a Hub load of the dependent kernel.
    other = dependent_repo(tmp_path / "other", [{"repo-id": "someone/relu", "revision": "main"}])
    monkeypatch.setenv(ENV, f"someone/relu={dep}:someone/other={other}")
    assert get_kernel("someone/other", version=1).RELU is get_local_kernel(dep)


def test_get_kernel_dep_outside_an_import_or_for_an_unlisted_kernel(tmp_path, monkeypatch, no_hub):
    with pytest.raises(KernelLoadError, match="works only while a kernel is imported"):
        get_kernel_dep("someone/relu")
    monkeypatch.setenv(ENV, f"someone/relu={relu_repo(tmp_path / 'relu', marker='dep')}")
    init = 'from kernels import get_kernel_dep\nget_kernel_dep("someone/other")\n'
    parent = dependent_repo(tmp_path / "p", [{"repo-id": "someone/relu", "version": 1}], init)
    with pytest.raises(
        KernelLoadError, match=r"not among this kernel's dependencies.*someone/relu"
    ):
        get_local_kernel(parent)


def test_dependencies_are_trust_checked(tmp_path, no_hub):
    parent = dependent_repo(tmp_path / "p", [{"repo-id": "someone/relu", "version": 1}])
    with pytest.raises(UntrustedKernelError, match="someone"):
        get_local_kernel(parent)


def test_a_cycle_of_dependencies_is_refused(tmp_path, monkeypatch, no_hub):
    a = dependent_repo(tmp_path / "a", [{"repo-id": "someone/b", "version": 1}], init="")
    b = dependent_repo(tmp_path / "b", [{"repo-id": "someone/a", "version": 1}], init="")
    monkeypatch.setenv(ENV, f"someone/a={a}:someone/b={b}")
    with pytest.raises(
        KernelLoadError, match="Cyclic kernel-depends: someone/a -> someone/b -> someone/a"
    ):
        get_kernel("someone/a", version=1)


@pytest.mark.parametrize(
    "depends, problem",
    [
        ({"someone/relu": 1}, "must be a list"),
        (["someone/relu"], "an entry is an object"),
        ([{"repo-id": "someone/relu"}], "exactly one of version and revision"),
        ([{"repo-id": "someone/relu", "version": 1, "revision": "main"}], "exactly one of"),
        ([{"repo-id": "someone/relu", "version": 1, "extra": 1}], "unknown field(s) 'extra'"),
        ([{"repo-id": "relu", "version": 1}], "is not a Hub repository id"),
        ([{"repo-id": "someone/relu", "version": True}], "version must be an integer >= 0"),
        ([{"repo-id": "someone/relu", "version": -1}], "version must be an integer >= 0"),
        ([{"repo-id": "someone/relu", "revision": ""}], "revision must be a branch"),
        ([{"repo-id": "someone/relu", "version": 1}] * 2, "someone/relu is listed twice"),
        ([{"repo-id": f"someone/k{i}", "version": 1} for i in range(65)], "at most 64"),
    ],
)
def test_a_malformed_kernel_depends_imports_nothing(tmp_path, no_hub, depends, problem):
    parent = dependent_repo(tmp_path / "p", depends, init="raise SystemExit('imported')\n")
    with pytest.raises(KernelMetadataError) as info:
        get_local_kernel(parent)
    assert "kernel-depends is malformed" in str(info.value) and problem in str(info.value)


def test_check_loads_kernel_depends_before_importing(tmp_path, monkeypatch, capsys, no_hub):
    from kernels.cli import main

    monkeypatch.setenv(ENV, f"someone/relu={relu_repo(tmp_path / 'relu', marker='dep')}")
    parent = dependent_repo(tmp_path / "p", [{"repo-id": "someone/relu", "version": 1}])
    assert main(["check", str(parent)]) == 0, capsys.readouterr().out
    assert "ok    imports: torch-cpu: package p imports" in capsys.readouterr().out
