"""Op registration and launch helpers shared by this package's ops.

Two versions of this repository can be loaded into one process, each under its own module name
(for example ``kernels._loaded.<hash>.rotary``). ``torch.library`` ops live in one global
registry, so the namespace is derived from the package's own name: each loaded copy registers
its ops apart from the others.
"""

import hashlib
import os
import re

import torch


def _source_digest() -> str:
    # A digest of this package's sources, so that a changed version loaded under the same module
    # name (same folder) gets new op names, and no compiled-graph cache built for the old ops'
    # schemas is reused for them.
    digest = hashlib.sha256()
    folder = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            with open(os.path.join(folder, name), "rb") as f:
                digest.update(name.encode() + b"\0" + f.read())
    return digest.hexdigest()[:10]


NAMESPACE = "kernels_lib_" + re.sub(r"\W", "_", __package__) + "_" + _source_digest()

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


# ---- launching ------------------------------------------------------------------------------
#
# Triton's launcher (``kernel[grid](...)``) binds arguments and builds a cache key in Python on
# every call: on the GPU machines we measured (2026-11-23, Triton 3.6, H100 VM) that is ~34 us a
# launch, more than the kernel takes at 4096 x 4096. ``launch`` keeps the compiled kernel that a
# first ordinary launch returned, under a key made of exactly what Triton specialises on (tensor
# dtypes and 16-byte alignment; integers equal to 1, divisible by 16, or past int32; the value of
# every constexpr; num_warps; the device), and launches it directly afterwards (~13 us).
# On the CPU (the interpreter) every launch is an ordinary one.

_compiled: dict = {}
_constexpr_masks: dict = {}


def _constexpr_mask(kernel) -> tuple[bool, ...]:
    mask = _constexpr_masks.get(kernel)
    if mask is None:
        mask = tuple(bool(p.is_constexpr) for p in kernel.params)
        _constexpr_masks[kernel] = mask
    return mask


def _spec(value, is_constexpr: bool):
    if is_constexpr:
        return value
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.data_ptr() % 16 == 0)
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, int):
        return (value == 1, value % 16 == 0, -(2**31) <= value < 2**31)
    return type(value)


def launch(kernel, grid: tuple, args: tuple, num_warps: int, device: torch.device) -> None:
    """``kernel[grid](*args, num_warps=num_warps)`` on ``device``, with all arguments (constexprs
    included) positional in the kernel's parameter order."""
    if device.type != "cuda":
        kernel[grid](*args, num_warps=num_warps)
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index != torch.cuda.current_device():
        # A model split over GPUs calls layers with tensors on a device that is not the current
        # one; Triton launches on the current device.
        with torch.cuda.device(index):
            launch(kernel, grid, args, num_warps, device)
        return
    key = (kernel, index, num_warps, *map(_spec, args, _constexpr_mask(kernel)))
    compiled = _compiled.get(key)
    if compiled is None:
        compiled = kernel[grid](*args, num_warps=num_warps)
        if callable(getattr(compiled, "__getitem__", None)):
            _compiled[key] = compiled
        return
    compiled[grid + (1,) * (3 - len(grid))](*args)
