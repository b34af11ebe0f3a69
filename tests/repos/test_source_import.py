"""Kernel packages are imported from source only, and a failed import leaves nothing behind.

Local folders (get_local_kernel, LocalLayerRepository) go through the same import as Hub
kernels; tests/repos/hub/test_cache_tampering.py covers the Hub cache and its locks.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import py_compile
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels import (
    KernelizeFallback,
    KernelLoadError,
    LocalLayerRepository,
    Mode,
    get_loaded_kernels,
    get_local_kernel,
    kernelize,
    use_kernel_forward_from_hub,
    use_kernel_mapping,
)
from kernels.layer.swap import kernel_layer_of
from kernels.repos.loader import unique_module_name


@pytest.fixture(autouse=True)
def bytecode_on(monkeypatch):
    """Python as users run it: free to read and write bytecode (the test environment sets
    PYTHONDONTWRITEBYTECODE, which would make "no __pycache__ written" pass for free)."""
    monkeypatch.setattr(sys, "dont_write_bytecode", False)


def package_dir(repo: Path, package: str = "activation") -> Path:
    return repo / "build" / "torch-universal" / package


def modules_of(package: Path, package_name: str = "activation") -> list[str]:
    name = unique_module_name(package_name, package.resolve())
    return [m for m in sys.modules if m == name or m.startswith(name + ".")]


def plant_pyc(source_file: Path, planted_source: str) -> Path:
    """Write, where Python looks for `source_file`'s bytecode, an unchecked-hash .pyc
    compiled from other source: Python would run it without looking at the .py."""
    target = Path(importlib.util.cache_from_source(str(source_file)))
    scratch = source_file.parent.parent / f"planted-{source_file.stem}.py"
    scratch.write_text(planted_source)
    py_compile.compile(
        str(scratch),
        cfile=str(target),
        doraise=True,
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )
    scratch.unlink()
    return target


def marker_writer(marker: Path) -> str:
    return f"open({str(marker)!r}, 'w').write('planted code ran')\n"


def test_a_local_package_writes_no_bytecode(kernel_repo):
    repo = kernel_repo("fresh", init_source="from . import layers\nfrom . import helpers\n")
    (package_dir(repo) / "helpers.py").write_text("VALUE = 1\n")
    (package_dir(repo) / "lazy.py").write_text("VALUE = 2\n")
    module = get_local_kernel(repo)
    assert module.helpers.VALUE == 1
    assert importlib.import_module(f"{module.__name__}.lazy").VALUE == 2
    assert importlib.reload(module.helpers).VALUE == 1
    assert not list(repo.rglob("__pycache__"))


@pytest.mark.parametrize("planted_in", ["__init__", "layers", "lazy"])
def test_a_planted_pyc_never_runs(kernel_repo, tmp_path, planted_in):
    repo = kernel_repo("planted", init_source="from . import layers\nREAL = True\n")
    package = package_dir(repo)
    (package / "lazy.py").write_text("REAL = True\n")
    marker = tmp_path / "planted-ran"
    pyc = plant_pyc(package / f"{planted_in}.py", marker_writer(marker) + "REAL = False\n")
    module = get_local_kernel(repo)
    lazy = importlib.import_module(f"{module.__name__}.lazy")
    assert module.REAL is True and lazy.REAL is True
    assert hasattr(module.layers, "SiluAndMul")
    assert not marker.exists()
    assert pyc.is_file()  # left as it was: neither read nor rewritten


def test_bytecode_without_source_is_refused(kernel_repo, tmp_path):
    repo = kernel_repo("sourceless", init_source="from . import layers\nfrom . import compiled\n")
    scratch = tmp_path / "compiled.py"
    scratch.write_text("VALUE = 1\n")
    pyc = package_dir(repo) / "compiled.pyc"
    py_compile.compile(str(scratch), cfile=str(pyc), doraise=True)
    with pytest.raises(KernelLoadError, match="compiled.pyc is bytecode without its source"):
        get_local_kernel(repo)
    assert modules_of(package_dir(repo)) == []

    # A package that imports fine still cannot reach a bare .pyc later.
    good = kernel_repo("good")
    shutil.copy(pyc, package_dir(good) / "compiled.pyc")
    module = get_local_kernel(good)
    with pytest.raises(ImportError, match="compiled.pyc is bytecode without its source"):
        importlib.import_module(f"{module.__name__}.compiled")


def test_extension_modules_load(kernel_repo):
    """Compiled kernels ship .so files; the lock hashes them like any other file."""
    import _json

    repo = kernel_repo("extension", init_source="from . import layers\nfrom . import _json\n")
    shutil.copy(_json.__file__, package_dir(repo) / Path(_json.__file__).name)
    module = get_local_kernel(repo)
    assert module._json.__file__.startswith(str(package_dir(repo).resolve()))
    assert module._json.scanstring('"x"', 1) == ("x", 3)


def test_a_folder_without_init_under_a_package_imports_from_source(kernel_repo, tmp_path):
    repo = kernel_repo("namespace", init_source="from . import layers\nfrom .ops import impl\n")
    ops = package_dir(repo) / "ops"
    ops.mkdir()
    (ops / "impl.py").write_text("REAL = True\n")
    marker = tmp_path / "planted-ran"
    plant_pyc(ops / "impl.py", marker_writer(marker) + "REAL = False\n")
    assert get_local_kernel(repo).impl.REAL is True
    assert not marker.exists()


class Stop(BaseException):
    """A kernel's own BaseException, as some libraries define to unwind."""


@use_kernel_forward_from_hub("SiluAndMul")
class SiluAndMul(nn.Module):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        d = input.shape[-1] // 2
        return F.silu(input[..., :d]) * input[..., d:]


@pytest.mark.parametrize(
    "raised",
    [
        "raise SystemExit(3)",
        "import sys; sys.exit('kernel gave up')",
        f"raise __import__('sys').modules[{__name__!r}].Stop('unwinding')",
        "raise GeneratorExit",
    ],
)
def test_a_kernel_that_exits_at_import_falls_back(kernel_repo, raised):
    repo = kernel_repo("exits", init_source=f"from . import layers\n{raised}\n")
    package = package_dir(repo)
    mapping = {"SiluAndMul": {"cpu": LocalLayerRepository(repo, layer_name="SiluAndMul")}}
    with use_kernel_mapping(mapping, inherit_mapping=False):
        layer = SiluAndMul()
        kernelize(layer, mode=Mode.INFERENCE, device="cpu", use_fallback=KernelizeFallback.ALL)
        assert kernel_layer_of(layer) is None
        assert modules_of(package) == []  # the package and its layers submodule
        with pytest.raises(KernelLoadError, match="Importing kernel package 'activation'"):
            kernelize(SiluAndMul(), mode=Mode.INFERENCE, device="cpu", use_fallback=False)
        assert modules_of(package) == []
    assert package.resolve() not in [k.path for k in get_loaded_kernels()]


def test_keyboard_interrupt_is_the_users_and_leaves_nothing_behind(kernel_repo):
    repo = kernel_repo("interrupted", init_source="from . import layers\nraise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        get_local_kernel(repo)
    assert modules_of(package_dir(repo)) == []


@pytest.mark.parametrize(
    "content",
    ["{", "[]", '{"version": "2"}', '{"python-depends": "einops"}', '{"backend": 3}'],
)
def test_malformed_metadata_refuses_the_load_before_any_code_runs(kernel_repo, tmp_path, content):
    marker = tmp_path / "kernel-ran"
    repo = kernel_repo("bad-metadata", init_source=marker_writer(marker) + "from . import layers\n")
    metadata = repo / "build" / "torch-universal" / "metadata.json"
    metadata.write_text(content)
    for _ in range(2):  # and the second load refuses too
        with pytest.raises(KernelLoadError, match="metadata.json is malformed") as caught:
            get_local_kernel(repo)
        assert str(metadata) in str(caught.value)
        assert not marker.exists()
        assert modules_of(package_dir(repo)) == []
    assert package_dir(repo).resolve() not in [k.path for k in get_loaded_kernels()]

    metadata.write_text(json.dumps({"name": "activation", "version": 1}))
    module = get_local_kernel(repo)
    assert marker.exists()
    (loaded,) = [k for k in get_loaded_kernels() if k.module is module]
    assert loaded.metadata.name == "activation" and loaded.metadata.version == 1


def test_source_with_an_encoding_declaration_and_future_flags(kernel_repo):
    """Compiled as Python compiles source: PEP 263 encodings, and none of our own
    ``from __future__`` flags leak into the kernel."""
    source = textwrap.dedent(
        """\
        # -*- coding: latin-1 -*-
        from . import layers
        WORD = "caf\xe9"

        def f(x: int) -> int:
            return x

        HINT = f.__annotations__["x"]
        """
    )
    repo = kernel_repo("encoded")
    (package_dir(repo) / "__init__.py").write_bytes(source.encode("latin-1"))
    module = get_local_kernel(repo)
    assert module.WORD == "café"
    assert (
        module.HINT is int
    )  # not the string "int" that `from __future__ import annotations` gives
