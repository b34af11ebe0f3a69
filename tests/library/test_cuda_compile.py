"""Every kernel of our repositories compiles for a CUDA GPU (sm_90), also on a machine without
one: the interpreter that runs the other CPU tests cannot see what only the compiler rejects,
such as a loop that changes a variable's dtype. ``cuda_compile_check.py`` does the work, in a
subprocess without ``TRITON_INTERPRET``."""

import pytest
import torch

from tests.support.children import run_python
from tests.support.paths import REPO_ROOT, subprocess_env


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="on a GPU the other tests compile every kernel for real"
)
def test_every_kernel_compiles_for_a_cuda_gpu():
    pytest.importorskip("triton.backends.nvidia", reason="this Triton has no CUDA backend")
    env = subprocess_env()
    env.pop("TRITON_INTERPRET", None)  # the script compiles; the interpreter would not
    done = run_python(
        "-m", "tests.library.cuda_compile_check", env=env, cwd=REPO_ROOT, timeout=1200
    )
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert "compiled" in done.stdout and "kernels for sm_90" in done.stdout, done.stdout
