"""Op registration and launch helpers shared by this package's ops.

Two versions of this repository can be loaded into one process, each under its own module name
(for example ``kernels._loaded.<hash>.norm``). ``torch.library`` ops live in one global registry,
so the namespace is derived from the package's own name: each loaded copy registers its ops apart
from the others.
"""

import functools
import re

import torch
import triton

NAMESPACE = "kernels_lib_" + re.sub(r"\W", "_", __package__)

# The dtypes the kernels load and store; arithmetic is always fp32 inside the kernels.
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Rows up to this many elements are held in registers whole (one pass over memory); wider rows
# are streamed in chunks of CHUNK elements, two or three passes (the later ones mostly hit L2).
# 16384 fp32 values over 16 warps is 32 registers a thread per live row tensor; past that the
# backward kernel, which keeps x, dy, w and the dw accumulator live, would spill.
MAX_ONE_PASS = 16384
CHUNK = 4096


def op_name(name: str) -> str:
    """The qualified ``torch.library`` name of this package's op ``name``."""
    return f"{NAMESPACE}::{name}"


def check_dtype(what: str, tensor: torch.Tensor) -> None:
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"{what}: dtype {tensor.dtype} is not supported; the kernels take float32, float16 "
            "or bfloat16 (cast the input, or keep this layer out of the kernel mapping)"
        )


def use_autograd_function(*tensors) -> bool:
    """Whether an eager call must record a backward (else the bare launcher is enough)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def as_rows(x: torch.Tensor, n_cols: int) -> torch.Tensor:
    """``x`` as a (rows, n_cols) view whose rows are contiguous, copying only when no such view exists."""
    x2 = x.reshape(-1, n_cols)
    if n_cols > 1 and x2.stride(1) != 1:
        x2 = x2.contiguous()
    return x2


@functools.cache
def _cuda_multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors of ``device``; 2 on the CPU, where the Triton interpreter runs
    programs one after another (two keep the cross-program weight-gradient reduction tested)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _cuda_multiprocessors(index)
    return 2


def row_block(n_cols: int) -> tuple[bool, int, int, int]:
    """(one_pass, block_n, rows_per_block, num_warps) for a row-wise kernel over ``n_cols`` columns.

    A program's block holds about 4096 elements: short rows are packed several to a block (up to
    64), a row of 4096..16384 gets a block of its own, wider rows are streamed in CHUNK pieces.
    With 16 elements a thread (two 16-byte vectors of bf16 per load) that is 8 warps for 4096.
    """
    if n_cols > MAX_ONE_PASS:
        return False, CHUNK, 1, 8
    block_n = triton.next_power_of_2(n_cols)
    rows = max(1, min(64, 4096 // block_n))
    num_warps = max(1, min(16, rows * block_n // 512))
    return True, block_n, rows, num_warps


def persistent_grid(n_rows: int, rows_per_block: int, device: torch.device, per_sm: int):
    """(programs, rows_per_program) for a backward kernel that sums weight gradients per program.

    At most ``per_sm`` programs per multiprocessor, each walking a contiguous run of rows and
    keeping its partial weight gradient in registers; the partials ([programs, n_cols] fp32)
    are summed afterwards. Fewer programs means fewer partial rows to write and reduce.
    """
    blocks = triton.cdiv(n_rows, rows_per_block)
    programs = max(1, min(blocks, multiprocessors(device) * per_sm))
    rows_per_program = triton.cdiv(blocks, programs) * rows_per_block
    return triton.cdiv(n_rows, rows_per_program), rows_per_program
