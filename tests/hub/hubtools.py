"""Kernel sources that the Hub tests publish on the test server."""

from __future__ import annotations

import textwrap


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
