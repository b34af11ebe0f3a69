"""The norms' launch configurations: how many elements a program's block holds, how many warps
run it, and how many programs the backward's weight-gradient reduction uses, as swept on the
GPUs named below. Both norms (RMSNorm and LayerNorm) share them; each norm's own forward sweep
is in its module (``_fwd_block``).
"""

import functools

import torch

from ._library import cdiv, multiprocessors, next_power_of_2

# Rows up to this many elements are held in registers whole (one pass over memory); wider rows
# are streamed in chunks of CHUNK elements by WIDE_ROW_WARPS warps, two passes (the second
# mostly hits L2). 16384 fp32 values over 16 warps is 32 registers a thread per live
# row tensor; past that the backward kernel, which keeps x, dy, w and the dw accumulator live,
# would spill. Chunks and warps from a sweep at 1024x65536 (bf16, CUDA graphs), where they beat
# chunks of 4096 with 8 warps in both norms. The backward of such rows is below (WIDE_BWD_*);
# only its row reduction streams CHUNKs.
MAX_ONE_PASS = 16384
CHUNK = 16384
WIDE_ROW_WARPS = 32

# The backward kernels walk their rows in steps, loading the next step's rows before reducing
# their own (so that loads stay in flight while a program reduces); a step's rows are held in
# registers twice over. Configuration from a sweep of the backward launchers (kernel and
# partial sums, bf16, CUDA graphs; benchmarks/diagnose/norm_backward.py, the outcome in
# benchmarks/results/h200/NOTES.md):
# - rows up to MAX_ONE_PASS: BWD_BLOCK_ELEMENTS a step (two rows of 4096, four of 2048, one of
#   8192), one program per SM, 8 warps up to rows of 2048 and 16 beyond: close to the memory
#   bandwidth, and faster than the best step without the look-ahead (16384 elements);
# - rows up to NARROW_ROW wide: NARROW_BWD_ELEMENTS a step (four rows of 1024), two programs
#   per SM, 4 warps, which beat 8192 elements a step in both norms.
BWD_BLOCK_ELEMENTS = 8192
BWD_PROGRAMS_PER_SM = 1

# The forward of rows up to FWD_NARROW_ELEMENTS wide, in both norms: such rows share blocks of
# that many elements, 4 warps, which beat blocks of 4096 elements with 8 warps in both norms
# (an interleaved A/B with benchmarks/diagnose/norm_forward.py). Each norm's wider rows follow its own sweep (``_fwd_block`` in its module).
FWD_NARROW_ELEMENTS = 2048
NARROW_ROW = 1024
NARROW_BWD_ELEMENTS = 4096
NARROW_BWD_WARPS = 4
NARROW_BWD_PROGRAMS_PER_SM = 2

# The backward of rows past MAX_ONE_PASS: a first kernel reduces each row to the dot products
# the input gradient needs (reading x and dy once, in CHUNKs), then the backward kernel runs on
# a 2-D grid, each program a run of rows times a block of WIDE_BWD_COLUMNS columns, so every
# program streams x and dy once and keeps its weight-gradient share in registers. Streaming
# whole rows twice per program, with the partial weight gradient read and written per chunk,
# took well over twice as long. Column blocks of 2048 to 8192, 8 or 16 warps and one or two
# programs per SM were all about as fast: the values below are one of them.
WIDE_BWD_COLUMNS = 4096
WIDE_BWD_ROWS = 4
WIDE_BWD_WARPS = 8
WIDE_BWD_PROGRAMS_PER_SM = 1


def previous_power_of_2(n: int) -> int:
    """The largest power of two at most ``n`` (0 for 0)."""
    return 1 << (n.bit_length() - 1) if n > 0 else 0


@functools.cache
def row_block(n_cols: int, elements: int = 4096) -> tuple[bool, int, int, int]:
    """(one_pass, block_n, rows_per_block, num_warps) for a row-wise kernel over ``n_cols`` columns.

    A program's block holds about ``elements`` elements: short rows are packed several to a block
    (up to 64), a row as long or longer (up to MAX_ONE_PASS) gets a block of its own, wider rows
    are streamed in CHUNK pieces. With 16 elements a thread (two 16-byte vectors of bf16 per
    load) that is 8 warps for 4096 elements, 16 for 8192 and more. Warps are counted from the
    elements a block holds, not from its power-of-two padding: a row of 5120 in a block of 8192
    runs 8 warps, not 16, which was faster for both norms.
    """
    if n_cols > MAX_ONE_PASS:
        return False, CHUNK, 1, WIDE_ROW_WARPS
    block_n = next_power_of_2(n_cols)
    rows = max(1, min(64, elements // block_n))
    num_warps = max(1, min(16, previous_power_of_2(rows * n_cols // 512)))
    return True, block_n, rows, num_warps


def narrow_bwd_block(n_cols: int) -> tuple[bool, int, int, int, int] | None:
    """The backward's (one_pass, block_n, rows, num_warps, programs_per_sm) for rows up to
    NARROW_ROW wide; None for wider rows."""
    if n_cols > NARROW_ROW:
        return None
    one_pass, block_n, rows, _ = row_block(n_cols, NARROW_BWD_ELEMENTS)
    return one_pass, block_n, rows, NARROW_BWD_WARPS, NARROW_BWD_PROGRAMS_PER_SM


@functools.cache
def bwd_block(n_cols: int) -> tuple[bool, int, int, int, int]:
    """(one_pass, block_n, rows, num_warps, programs_per_sm) for a norm's backward, as swept."""
    special = narrow_bwd_block(n_cols) or wide_bwd_block(n_cols)
    if special is not None:
        return special
    _, block_n, rows, _ = row_block(n_cols, BWD_BLOCK_ELEMENTS)  # one pass: not wide
    return True, block_n, rows, 8 if block_n <= 2048 else 16, BWD_PROGRAMS_PER_SM


def wide_bwd_block(n_cols: int) -> tuple[bool, int, int, int, int] | None:
    """The backward's (one_pass=False, column block, rows, num_warps, programs_per_sm) for rows
    past MAX_ONE_PASS; None for the others."""
    if n_cols <= MAX_ONE_PASS:
        return None
    return False, WIDE_BWD_COLUMNS, WIDE_BWD_ROWS, WIDE_BWD_WARPS, WIDE_BWD_PROGRAMS_PER_SM


def persistent_grid(
    n_rows: int, rows_per_block: int, device: torch.device, per_sm: int, col_blocks: int = 1
):
    """(programs, rows_per_program) for a backward kernel that sums weight gradients per program.

    At most ``per_sm`` programs per multiprocessor (counting the ``col_blocks`` programs that
    share a run of rows, one per block of columns), each walking a contiguous run of rows and
    keeping its partial weight gradient in registers; the partials ([programs, n_cols] fp32)
    are summed afterwards. Fewer programs means fewer partial rows to write and reduce.
    """
    max_programs = max(1, multiprocessors(device) * per_sm // col_blocks)
    return _persistent_grid(n_rows, rows_per_block, max_programs)


@functools.lru_cache(maxsize=1024)
def _persistent_grid(n_rows: int, rows_per_block: int, max_programs: int):
    blocks = cdiv(n_rows, rows_per_block)
    programs = max(1, min(blocks, max_programs))
    rows_per_program = cdiv(blocks, programs) * rows_per_block
    return cdiv(n_rows, rows_per_program), rows_per_program
