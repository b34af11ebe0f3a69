"""Shared test set-up.

Without a CUDA GPU, Triton kernels run through Triton's interpreter on CPU tensors; the
variable must be set before anything imports triton.
"""

from __future__ import annotations

import os

# One thread per test process. The suite's tensors are tiny, so a second thread buys nothing,
# and when the cores are shared (pytest-xdist's workers, other processes) torch's and OpenBLAS's
# (Triton's interpreter) worker threads spin at every op's barrier waiting for a descheduled
# peer: a tiny Llama's generate() then ran 2-4x slower. Set before torch is imported, which
# reads it once; subprocesses the tests start inherit it. A value the caller set is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Inductor's C++ for CPU tensors without SIMD: the tests check what our ops do inside inductor's
# graphs, not inductor's vectorisation, and g++ compiles the scalar code in less time (a cold
# test_overrides_compile case: 31 -> 23 CPU-seconds). Read as torch._inductor.config is imported.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "0")

import pytest  # noqa: E402
import torch  # noqa: E402

# Imported for what importing it does: the Hub test session's settings go into os.environ
# before any test module imports huggingface_hub (which reads them once), whichever folder
# pytest collects first; no test reaches the real Hub.
import tests.support.hub  # noqa: F401

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    from tests.support.interpreter import skip_discarded_overflow_checks, skip_repeated_patching

    skip_repeated_patching()
    skip_discarded_overflow_checks()


@pytest.fixture(autouse=True)
def forked_variant_checks(request, monkeypatch):
    """`kernels check` imports each variant in a Python child of its own; in the tests these
    children are forked with torch imported (tests/support/children.py) rather than started,
    which is most of their CPU time. Tests marked ``new_interpreters`` keep the product's own
    children (new interpreters)."""
    if request.node.get_closest_marker("new_interpreters"):
        return
    from kernels.cli import check
    from tests.support import children

    def forked(args: list[str], env: dict[str, str], timeout: float):
        return children.run_python(*args, env=env, timeout=timeout)

    monkeypatch.setattr(check, "run_python", forked)


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(
        reason="needs a CUDA GPU; .ci/gpu runs these on the GPU machine (docs/writing-kernels.md, Testing)"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


# Kernel layers used by the core tests. Each kernel adds a distinct offset, so a test can
# tell from a layer's output which kernel ran.
SILU_AND_MUL_LAYER = """
import torch
import torch.nn.functional as F


class SiluAndMul(torch.nn.Module):
    has_backward = {has_backward}
    can_torch_compile = {can_torch_compile}

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        d = input.shape[-1] // 2
        return F.silu(input[..., :d]) * input[..., d:] + {offset}
"""


def write_kernel_repo(
    root,
    *,
    package: str | None = "activation",
    layers_source: str | None = None,
    variant: str = "torch-universal",
    offset: float = 1000.0,
    has_backward: bool = True,
    can_torch_compile: bool = True,
    init_source: str = "from . import layers\n",
):
    """Write a kernel repository in Hub layout under `root` and return `root`.

    With `package=None` the variant folder is the package itself (the newer layout).
    """
    package_dir = root / "build" / variant
    if package is not None:
        package_dir = package_dir / package
    package_dir.mkdir(parents=True, exist_ok=True)
    (package_dir / "__init__.py").write_text(init_source)
    if layers_source is None:
        layers_source = SILU_AND_MUL_LAYER.format(
            offset=offset, has_backward=has_backward, can_torch_compile=can_torch_compile
        )
    (package_dir / "layers.py").write_text(layers_source)
    return root


@pytest.fixture
def kernel_repo(tmp_path):
    """A factory: kernel_repo(name, **write_kernel_repo options) -> repository folder."""

    def make(name: str = "repo", **options):
        return write_kernel_repo(tmp_path / name, **options)

    return make


@pytest.fixture(scope="session")
def published_library(tmp_path_factory):
    """A factory: ``published_library(repo)`` -> the folder of ``library/<repo>`` as `kernels
    upload` publishes it (a copy of the source with ``build/`` made afresh, ``symbols.json``
    included), staged once a session in a temporary folder. git holds no build; what the
    package itself loads is `kernels.library.library_path()` (no ``symbols.json``)."""
    from kernels.cli._source_build import stage
    from kernels.cli.upload import _ignored
    from tests.support.paths import LIBRARY

    root = tmp_path_factory.mktemp("published-library")
    staged: dict[str, object] = {}

    def make(repo: str):
        if repo not in staged:
            staged[repo] = stage(LIBRARY / repo, root, _ignored)
        return staged[repo]

    return make
