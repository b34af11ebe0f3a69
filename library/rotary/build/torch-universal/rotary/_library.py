"""Op registration and launch helpers shared by this package's ops.

Two versions of this repository can be loaded into one process, each under its own module name
(for example ``kernels._loaded.<hash>.rotary``). ``torch.library`` ops live in one global
registry, so the namespace is derived from the package's own name: each loaded copy registers
its ops apart from the others.
"""

import re

import torch

NAMESPACE = "kernels_lib_" + re.sub(r"\W", "_", __package__)

# The dtypes the kernels load and store; arithmetic is always fp32 inside the kernels.
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def op_name(name: str) -> str:
    """The qualified ``torch.library`` name of this package's op ``name``."""
    return f"{NAMESPACE}::{name}"


def check_dtype(what: str, tensor: torch.Tensor) -> None:
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"{what}: dtype {tensor.dtype} is not supported; the kernels take float32, float16 "
            "or bfloat16 (cast the input, or keep this layer out of the kernel mapping)"
        )


def use_autograd_function(*tensors: torch.Tensor) -> bool:
    """Whether an eager call must record a backward (else the bare launcher is enough)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
