"""Loading kernel packages from kernel repository folders in Hub layout."""

import sys
from dataclasses import replace

import pytest
from packaging.version import Version

from kernels import (
    BuildVariantNotFoundError,
    KernelLoadError,
    LocalLayerRepository,
    get_local_kernel,
)
from kernels.repos.variants import MachineBuild, choose_variant, machine_build

LINUX_CUDA = MachineBuild(
    torch=Version("2.8"),
    cxx_abi="cxx11",
    backend="cuda",
    backend_version=Version("12.8"),
    cpu="x86_64",
    os="linux",
)


def test_documented_layout(kernel_repo):
    module = get_local_kernel(kernel_repo("activation"), "activation")
    assert module.layers.SiluAndMul.has_backward is True


def test_package_name_may_be_omitted_when_there_is_one(kernel_repo):
    module = get_local_kernel(kernel_repo("activation"))
    assert hasattr(module.layers, "SiluAndMul")


def test_newer_layout_variant_folder_is_the_package(kernel_repo):
    path = kernel_repo("flat", package=None)
    assert hasattr(get_local_kernel(path).layers, "SiluAndMul")
    # A package name given for the newer layout names the import; it is not a folder there.
    assert get_local_kernel(path, "activation") is get_local_kernel(path)


def test_same_folder_gives_the_same_module(kernel_repo):
    path = kernel_repo("activation")
    assert get_local_kernel(path, "activation") is get_local_kernel(str(path), "activation")
    # load() hands over the layer itself, as transformers 5.x expects (it reads __module__).
    layer = LocalLayerRepository(path, layer_name="SiluAndMul").load()
    assert layer is get_local_kernel(path).layers.SiluAndMul
    assert sys.modules[layer.__module__] is get_local_kernel(path).layers


def test_two_repositories_with_one_package_name_do_not_clash(kernel_repo):
    a = get_local_kernel(kernel_repo("a", offset=1), "activation")
    b = get_local_kernel(kernel_repo("b", offset=2), "activation")
    assert a is not b and a.__name__ != b.__name__
    assert a.layers.SiluAndMul is not b.layers.SiluAndMul
    assert sys.modules[a.__name__] is a and sys.modules[b.__name__] is b
    assert "activation" not in sys.modules


def test_relative_imports_inside_the_package_work(kernel_repo, tmp_path):
    path = kernel_repo(
        "rel",
        init_source="from . import layers\nfrom ._ops import VALUE\n",
    )
    (path / "build" / "torch-universal" / "activation" / "_ops.py").write_text("VALUE = 42\n")
    assert get_local_kernel(path).VALUE == 42


def test_import_errors_leave_nothing_behind(kernel_repo):
    path = kernel_repo(
        "broken", init_source="from . import layers\nraise RuntimeError('bad build')\n"
    )
    before = set(sys.modules)
    with pytest.raises(
        KernelLoadError, match="Importing kernel package 'activation' .* RuntimeError: bad build"
    ):
        get_local_kernel(path)
    assert set(sys.modules) == before


def test_compiled_variant_for_this_machine_is_preferred(kernel_repo):
    here = machine_build().compiled_variant
    path = kernel_repo("multi", offset=1)  # torch-universal
    kernel_repo("multi", variant=here, offset=2)
    module = get_local_kernel(path)
    assert module.__file__.endswith(f"build/{here}/activation/__init__.py")
    assert "+ 2\n" in (path / "build" / here / "activation" / "layers.py").read_text()


def test_no_variant_for_this_machine_lists_what_exists(kernel_repo):
    path = kernel_repo("foreign", variant="torch27-cxx11-cu126-aarch64-linux")
    kernel_repo("foreign", variant="torch27-metal-aarch64-darwin")
    with pytest.raises(BuildVariantNotFoundError) as info:
        get_local_kernel(path)
    message = str(info.value)
    assert "torch27-cxx11-cu126-aarch64-linux: rejected (" in message
    assert "torch27-metal-aarch64-darwin: rejected (" in message
    assert f"runs e.g. {machine_build().compiled_variant}, torch-cpu or torch-universal" in message
    assert isinstance(info.value, FileNotFoundError)


def test_variant_preference_order():
    offered = [
        "torch-universal",
        "torch-cuda",
        "torch28-cxx11-cu128-x86_64-linux",
        "torch28-cxx11-cu126-x86_64-linux",
    ]
    assert (
        choose_variant(offered, where="r", machine=LINUX_CUDA) == "torch28-cxx11-cu128-x86_64-linux"
    )
    assert choose_variant(offered[:2], where="r", machine=LINUX_CUDA) == "torch-cuda"
    assert (
        choose_variant(["torch-universal", "torch-rocm"], where="r", machine=LINUX_CUDA)
        == "torch-universal"
    )
    assert (
        choose_variant(["torch-universal", "docs", "README.md"], where="r", machine=LINUX_CUDA)
        == "torch-universal"
    )


def test_variant_names():
    assert LINUX_CUDA.compiled_variant == "torch28-cxx11-cu128-x86_64-linux"
    mac = MachineBuild(
        torch=Version("2.7"),
        cxx_abi=None,
        backend="metal",
        backend_version=None,
        cpu="aarch64",
        os="darwin",
        macos=Version("26.0"),
    )
    assert mac.compiled_variant == "torch27-metal-aarch64-darwin"
    offered = ["torch-universal", "torch-metal", "torch27-metal-aarch64-darwin", "torch-cuda"]
    assert choose_variant(offered, where="r", machine=mac) == "torch27-metal-aarch64-darwin"
    assert choose_variant(offered[:2], where="r", machine=mac) == "torch-metal"
    # Compiled Metal builds need macOS 26 (0.19): an older macOS takes the pure-Python one.
    old_mac = replace(mac, macos=Version("15.7"))
    assert choose_variant(offered, where="r", machine=old_mac) == "torch-metal"


@pytest.mark.parametrize(
    "setup, package, message",
    [
        (lambda root: root.mkdir(), None, "is not a kernel repository: .*build does not exist"),
        (
            lambda root: (root / "build" / "torch-universal").mkdir(parents=True),
            None,
            "holds no package in build/torch-universal/",
        ),
        (lambda root: None, None, "Kernel repository folder .* does not exist"),
        (
            lambda root: (root / "build" / "torch-universal").mkdir(parents=True),
            "no-such",
            "must be a Python identifier",
        ),
        (
            lambda root: (root / "build" / "torch-universal").mkdir(parents=True),
            "other",
            "has no package 'other' in build/torch-universal/",
        ),
    ],
)
def test_folder_errors(tmp_path, setup, package, message):
    root = tmp_path / "repo"
    setup(root)
    with pytest.raises(KernelLoadError, match=message):
        get_local_kernel(root, package)


def test_several_packages_need_a_name(kernel_repo):
    path = kernel_repo("two", package="first")
    kernel_repo("two", package="second")
    with pytest.raises(
        KernelLoadError,
        match=r"several packages in build/torch-universal/ \(first, second\); pass package_name",
    ):
        get_local_kernel(path)
    assert hasattr(get_local_kernel(path, "second"), "layers")


def test_local_repository_values():
    a = LocalLayerRepository("~/k", package_name="activation", layer_name="SiluAndMul")
    assert a == LocalLayerRepository("~/k", package_name="activation", layer_name="SiluAndMul")
    assert hash(a) == hash(
        LocalLayerRepository("~/k", package_name="activation", layer_name="SiluAndMul")
    )
    assert "~" not in str(a.repo_path)
    assert str(a).endswith("package activation, layer SiluAndMul")


def test_loaded_kernels_are_listed_with_their_metadata(kernel_repo, monkeypatch):
    import json

    # The kernel names einops, which must be installed to load it (kernels.repos.requirements);
    # a module in sys.modules counts as installed.
    monkeypatch.setitem(sys.modules, "einops", sys)

    from kernels import LoadedKernel, Metadata, get_loaded_kernels

    path = kernel_repo("with-metadata")
    (path / "build" / "torch-universal" / "metadata.json").write_text(
        json.dumps(
            {
                "id": "_activation_abc123",
                "name": "activation",
                "version": 2,
                "license": "Apache-2.0",
                "python-depends": ["einops"],
                "backend": {"type": "universal"},
            }
        )
    )
    bare = kernel_repo("without-metadata")
    before = len(get_loaded_kernels())
    module = get_local_kernel(path)
    get_local_kernel(path)  # once per folder
    get_local_kernel(bare)
    loaded = get_loaded_kernels()[before:]
    assert [entry.module for entry in loaded] == [module, get_local_kernel(bare)]
    first = loaded[0]
    assert isinstance(first, LoadedKernel) and first.repo_info is None
    assert first.metadata == Metadata(
        id="_activation_abc123",
        name="activation",
        version=2,
        license="Apache-2.0",
        python_depends=["einops"],
        backend={"type": "universal"},
    )
    assert first.path == (path / "build" / "torch-universal" / "activation").resolve()
    assert loaded[1].metadata == Metadata()
    get_loaded_kernels().clear()  # a snapshot
    assert len(get_loaded_kernels()) == before + 2
