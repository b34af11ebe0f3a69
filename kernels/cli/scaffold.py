"""The files `kernels init` writes: a Triton kernel repository in kernel-builder's layout.

The source (``build.toml``, ``torch-ext/<package>/``) and ``build.py``, a copy of our
``library/build.py``, which `kernels init` then runs to write ``build/`` (each variant with its
``metadata.json``), as ``make library`` does for our own repositories.

Templates use ``{repo_id}``, ``{name}``, ``{package}``, ``{title}`` and ``{hub}`` placeholders
(``str.format``; literal braces are doubled).
"""

from __future__ import annotations

from pathlib import Path

README = """\
---
license: apache-2.0
library_name: kernels
tags:
  - kernels
  - triton
---

# {repo_id}

A Triton kernel repository, scaffolded with `kernels init`. It ships one example kernel, an
element-wise SiLU with a backward pass, and a kernel layer that can replace `torch.nn.SiLU`'s
`forward`. Replace it with your own kernel: keep the layout, the tests and the benchmark.

## Layout

```
build.toml                          name, version, license, backends (kernel-builder's format)
torch-ext/{package}/                the package source: edit it here, then run `python build.py`
    __init__.py                     the functions the package exports
    silu.py                         Triton kernels -> launchers -> autograd.Function -> silu()
    layers.py                       kernel layers for kernelize (stateless, forward only)
build.py                            writes build/ from torch-ext/ (the same package in each variant)
build/                              what the Hub serves, never edited by hand; each variant has a
    torch-cuda/ torch-rocm/ torch-xpu/   metadata.json; these hold the package itself (current
    torch-universal/{package}/           clients); this one the legacy layout (older clients)
tests/                              correctness against PyTorch (TRITON_INTERPRET=1 without a GPU)
benchmarks/                         benchmarks run by `kernels benchmark .` (kernels.benchmark.Benchmark)
```

## Use

```python
from kernels import get_kernel, LayerRepository

{package} = get_kernel("{repo_id}", version=">=0.1,<0.2")
y = {package}.silu(x)

mapping = {{"SiLU": {{"cuda": LayerRepository("{repo_id}", layer_name="SiLU", version=">=0.1,<0.2")}}}}
```

## Develop and publish

```bash
python build.py                               # after every change to torch-ext/
python -m pytest tests                        # on CPU, Triton runs through its interpreter
kernels check .                               # layout, imports, layer rules, signatures
kernels benchmark .                           # times each workload against PyTorch
kernels upload . --repo-id {repo_id} --tag v0.1.0
```

Kernel layers must stay stateless: no `__init__`, no members besides `forward`,
`has_backward` and `can_torch_compile`, and `forward` must take exactly the arguments of the
layer it replaces. Inside the package, import only relatively (`from .silu import silu`):
the package is loaded under a private module name.
"""

BUILD_TOML = """\
[general]
name = "{name}"
version = 1
edition = 5
license = "Apache-2.0"
backends = [
    "cuda",
    "rocm",
    "xpu",
]
{hub}
[torch-noarch]
"""

HUB = """
[general.hub]
repo-id = "{repo_id}"
"""

INIT = '''\
"""{title}: Triton kernels (scaffolded by `kernels init`; replace the SiLU example with yours)."""

from . import layers
from .silu import silu

__all__ = ["layers", "silu"]
'''

OP = '''\
"""Element-wise SiLU, ``y = x * sigmoid(x)``, as an example to replace with your kernel.

Read top to bottom: the Triton kernels, the launcher that picks block sizes, then the autograd
wiring. Arithmetic is fp32 whatever the input dtype.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_fwd_kernel(X, Y, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements  # the last program may run past the end
    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.sigmoid(x)
    tl.store(Y + offsets, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _silu_bwd_kernel(DY, X, DX, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + offsets, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(x)
    tl.store(DX + offsets, (dy * s * (1.0 + x * (1.0 - s))).to(DX.dtype.element_ty), mask=mask)


def _launch_config(n_elements: int) -> tuple[int, int]:
    # Up to 4096 elements per program (small inputs shrink it to the next power of two, at
    # least one warp's worth), with one warp per 512 elements, capped at 8.
    block = min(4096, max(128, triton.next_power_of_2(n_elements)))
    return block, max(1, min(8, block // 512))


def _check_runnable(x: torch.Tensor, kernel) -> None:
    # Without its interpreter Triton compiles only for GPUs, and on CPU tensors says
    # "0 active drivers", which does not say what to do.
    if x.device.type == "cpu" and type(kernel).__name__ != "InterpretedFunction":
        raise RuntimeError(
            f"{kernel.__name__} got CPU tensors, but Triton compiles kernels only for GPUs: move "
            "the inputs to a GPU, or, to run on the CPU (slowly, for tests), set "
            "TRITON_INTERPRET=1 in the environment before triton is first imported"
        )


def silu_forward(x: torch.Tensor) -> torch.Tensor:
    _check_runnable(x, _silu_fwd_kernel)
    x = x.contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    if n:
        block, num_warps = _launch_config(n)
        _silu_fwd_kernel[(triton.cdiv(n, block),)](x, y, n, BLOCK=block, num_warps=num_warps)
    return y


def silu_backward(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    _check_runnable(x, _silu_bwd_kernel)
    x, dy = x.contiguous(), dy.contiguous()
    dx = torch.empty_like(x)
    n = x.numel()
    if n:
        block, num_warps = _launch_config(n)
        _silu_bwd_kernel[(triton.cdiv(n, block),)](dy, x, dx, n, BLOCK=block, num_warps=num_warps)
    return dx


class _SiLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return silu_forward(x)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return silu_backward(dy, x)


def silu(x: torch.Tensor) -> torch.Tensor:
    """SiLU of `x` (any shape; float32, float16 or bfloat16), differentiable."""
    return _SiLUFunction.apply(x)
'''

LAYERS = '''\
"""Kernel layers: each replaces the ``forward`` of a tagged module and keeps its signature.

A kernel layer has no state and no ``__init__``: ``kernelize`` binds ``forward`` to the
original module instance, so ``self`` is that module.
"""

import torch

from .silu import silu


class SiLU(torch.nn.Module):
    """Replaces ``torch.nn.SiLU`` (and transformers' ``SiLUActivation``): ``forward(self, input)``."""

    has_backward = True
    # Calling a Triton kernel through autograd.Function is not declared torch.compile-safe;
    # register the op with torch.library (custom_op with register_fake and register_autograd,
    # see docs/writing-kernels.md) before setting this to True.
    can_torch_compile = False

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return silu(input)
'''

CONFTEST = '''\
"""Without a CUDA GPU, Triton kernels run through Triton's interpreter on CPU tensors.

The variable must be set before anything imports triton.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
'''

TEST = '''\
"""{title} against PyTorch: forward, backward, and as a kernel layer through kernelize."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kernels import (
    LocalLayerRepository,
    Mode,
    get_local_kernel,
    kernelize,
    use_kernel_forward_from_hub,
    use_kernel_mapping,
)

REPO = Path(__file__).resolve().parents[1]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The interpreter runs all three dtypes too (bfloat16 emulated), so the CPU checks them all.
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOLERANCE = {{torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}}


@pytest.fixture(scope="module")
def kernel():
    return get_local_kernel(REPO, "{package}")


@pytest.mark.parametrize("shape", [(7,), (3, 129), (2, 4, 1000)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_matches_pytorch(kernel, shape, dtype):
    x = torch.randn(shape, device=DEVICE, dtype=dtype)
    torch.testing.assert_close(
        kernel.silu(x), F.silu(x.float()).to(dtype), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype]
    )


def test_backward_matches_pytorch(kernel):
    x = torch.randn(4, 300, device=DEVICE, requires_grad=True)
    dy = torch.randn_like(x)
    kernel.silu(x).backward(dy)
    ours, x.grad = x.grad, None
    F.silu(x).backward(dy)
    torch.testing.assert_close(ours, x.grad, atol=1e-5, rtol=1e-5)


def test_build_is_current():
    """build/ is what build.py makes of torch-ext/: run `python build.py` after a change."""
    spec = importlib.util.spec_from_file_location("kernel_build", REPO / "build.py")
    build = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = build
    spec.loader.exec_module(build)
    assert build.differences(build.read_repository(REPO)) == [], "run `python build.py`"


def test_kernelize_swaps_the_layer_forward():
    @use_kernel_forward_from_hub("SiLU")
    class TaggedSiLU(torch.nn.SiLU):
        pass

    model = torch.nn.Sequential(torch.nn.Linear(16, 16), TaggedSiLU()).to(DEVICE)
    x = torch.randn(3, 16, device=DEVICE)
    expected = model(x)
    repo = LocalLayerRepository(REPO, package_name="{package}", layer_name="SiLU")
    with use_kernel_mapping({{"SiLU": {{DEVICE: repo}}}}, inherit_mapping=False):
        kernelize(model, mode=Mode.TRAINING)
    assert model[1].forward.__func__ is not TaggedSiLU.forward  # it runs the kernel layer's
    torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)
'''

BENCHMARK = '''\
"""Benchmarks of {title}: `kernels benchmark .` runs them (or `python {{this file}}`).

Each benchmark_<workload> method is timed; verify_<workload> returns what it must produce
(PyTorch's result), checked against self.out and timed too, for the speedup column. Add the
shapes that matter for your kernel. On a machine without a GPU the kernel runs through
Triton's interpreter (set TRITON_INTERPRET=1): slow, so keep the CPU shapes small.
"""

import torch
import torch.nn.functional as F

from kernels.benchmark import Benchmark


class SiLUWorkloads(Benchmark):
    seed = 0

    def setup_rows(self):
        rows = 4096 if self.device == "cuda" else 16
        self.x = torch.randn(rows, 4096, device=self.device, dtype=torch.bfloat16)

    def benchmark_rows(self):
        self.out = self.kernel.silu(self.x)

    def verify_rows(self):
        return F.silu(self.x)


if __name__ == "__main__":
    from pathlib import Path

    from kernels.cli import main

    raise SystemExit(main(["benchmark", str(Path(__file__).resolve().parents[1])]))
'''

GITIGNORE = """\
__pycache__/
*.pyc
.pytest_cache/
benchmarks/results/
"""


def files(*, repo_id: str, name: str, package: str, builder: Path) -> dict[str, str]:
    """Relative path -> contents of every source file of a new kernel repository; ``builder`` is
    the build script copied in as ``build.py`` (our ``library/build.py``)."""
    hub = "" if repo_id.startswith("<") else HUB.format(repo_id=repo_id)
    values = {"repo_id": repo_id, "name": name, "package": package, "title": name, "hub": hub}
    source = f"torch-ext/{package}"
    return {
        "README.md": README.format(**values),
        ".gitignore": GITIGNORE,
        "build.toml": BUILD_TOML.format(**values),
        "build.py": builder.read_text(encoding="utf-8"),
        f"{source}/__init__.py": INIT.format(**values),
        f"{source}/silu.py": OP,
        f"{source}/layers.py": LAYERS,
        "tests/conftest.py": CONFTEST,
        f"tests/test_{package}.py": TEST.format(**values),
        f"benchmarks/benchmark_{package}.py": BENCHMARK.format(**values),
    }
