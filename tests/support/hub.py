"""What the Hub tests share besides fixtures: the session's folder, a child interpreter's
environment, and the kernel sources they publish on the test server.

Test modules import these from here, not from conftest.py: pytest imports every conftest.py
under the one module name ``conftest``, so ``from conftest import ...`` reaches whichever
folder's conftest was imported first (tests/transformers5's, when both folders run together).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

#: This test session's folder: the mirrors olah serves, the Hub cache, the configuration.
SESSION_DIR = Path(tempfile.mkdtemp(prefix="kernels-hub-tests-"))
atexit.register(shutil.rmtree, SESSION_DIR, ignore_errors=True)


def subprocess_env(**extra: str) -> dict[str, str]:
    """This session's environment for a child interpreter: our package first on the path,
    then whatever PYTHONPATH already holds (e.g. another huggingface_hub under test)."""
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def kernel_init(version: str, offset: float, variant: str) -> str:
    return textwrap.dedent(
        f"""
        import torch
        import torch.nn.functional as F

        from . import layers

        VERSION = {version!r}
        VARIANT = {variant!r}


        def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
            d = x.shape[-1] // 2
            return F.silu(x[..., :d]) * x[..., d:] + {offset!r}
        """
    ).lstrip()


# A kernel layer; the offset tells a test which kernel version ran.
SILU_AND_MUL_LAYERS = """
import torch
import torch.nn.functional as F


class SiluAndMul(torch.nn.Module):
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        d = input.shape[-1] // 2
        return F.silu(input[..., :d]) * input[..., d:] + {offset}
"""
