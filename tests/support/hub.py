"""The Hub test session's settings and what the Hub tests share besides fixtures: the
session's folder, the server's ports, and the kernel sources they publish on the test server.

Importing this module sets the session's Hub settings (HF_ENDPOINT, HF_HUB_CACHE, an empty
kernels configuration) in ``os.environ``; huggingface_hub reads them once, when it is first
imported. tests/conftest.py imports it before any test module, so the settings hold for the
whole run whichever folder is collected first, and no test reaches the real Hub.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import tempfile
import textwrap
from pathlib import Path

from tests.support.paths import REPO_ROOT, subprocess_env

__all__ = [
    "ENDPOINT",
    "HF_CACHE",
    "MIRRORS",
    "OLAH_PORT",
    "PROXY_PORT",
    "REPO_ROOT",
    "SESSION_DIR",
    "SILU_AND_MUL_LAYERS",
    "kernel_init",
    "subprocess_env",
]

#: This test session's folder: the mirrors olah serves, the Hub cache, the configuration.
SESSION_DIR = Path(tempfile.mkdtemp(prefix="kernels-hub-tests-"))
atexit.register(shutil.rmtree, SESSION_DIR, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


MIRRORS = SESSION_DIR / "mirrors"
HF_CACHE = SESSION_DIR / "hf-cache"
OLAH_PORT = _free_port()
PROXY_PORT = _free_port()
ENDPOINT = f"http://127.0.0.1:{PROXY_PORT}"

_SESSION_ENV = {
    "HF_ENDPOINT": ENDPOINT,
    "HF_HUB_CACHE": str(HF_CACHE),
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_HUB_ETAG_TIMEOUT": "5",
    "HF_HUB_DOWNLOAD_TIMEOUT": "5",
    # The user's own kernels configuration must not change what the tests see.
    "KERNELS_CONFIG": str(SESSION_DIR / "no-config.yaml"),
    # The receipt key of this session (kernels.repos.receipt_key), not the user's.
    "KERNELS_STATE_DIR": str(SESSION_DIR / "state"),
    # The kernel library built from library/ by this session (kernels.library.builds), not
    # the user's cache.
    "KERNELS_LIBRARY_CACHE": str(SESSION_DIR / "library"),
}
(SESSION_DIR / "no-config.yaml").write_text("# the Hub tests' (empty) kernels configuration\n")
for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "KERNELS_TRUSTED_ORGS"):
    os.environ.pop(_name, None)
os.environ.update(_SESSION_ENV)


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
