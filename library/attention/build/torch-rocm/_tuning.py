"""Launch configurations of the attention kernels, one row per padded head dimension.

Retune here: each entry is ``(BLOCK_M, BLOCK_N, num_warps, num_stages)``, keyed by the head
dimension padded to a power of two (the larger of the query/key and value dimensions). The rows
for 64 and 128 are the fastest of a first sweep of ten configurations each, forward and backward
apart (its numbers: benchmarks/results/h100/NOTES.md). The other rows are the usual Triton
flash-attention starting points, not yet swept. The CPU row keeps blocks small so
that the interpreter's tests cross block boundaries with tiny shapes.
"""

from typing import NamedTuple


class Config(NamedTuple):
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


#: The forward (and the decode path): queries per program, keys per step.
FORWARD = {
    16: Config(64, 64, 4, 3),
    32: Config(64, 64, 4, 3),
    64: Config(64, 64, 4, 3),
    128: Config(64, 64, 4, 3),
    256: Config(64, 32, 8, 2),
}
#: The decode path (at most DECODE_MAX_QUERIES queries a sequence): fewer, smaller query rows.
DECODE = {
    16: Config(16, 64, 4, 3),
    32: Config(16, 64, 4, 3),
    64: Config(16, 64, 4, 3),
    128: Config(16, 64, 4, 3),
    256: Config(16, 32, 4, 2),
}
DECODE_MAX_QUERIES = 16
#: Both backward kernels: dk/dv programs own BLOCK_N keys and walk BLOCK_M queries at a time;
#: dq programs own BLOCK_M queries and walk BLOCK_N keys.
BACKWARD = {
    16: Config(64, 64, 4, 3),
    32: Config(64, 64, 4, 3),
    64: Config(64, 64, 4, 3),
    128: Config(64, 64, 4, 2),
    256: Config(32, 32, 8, 1),
}
#: The rowsum(dout * out) kernel: rows per program.
DELTA_ROWS = 64

#: Every kernel on the CPU (Triton's interpreter).
CPU = Config(16, 16, 1, 1)

#: Head dimensions the kernels take (padded to the next key of the tables above).
MAX_HEAD_DIM = 256


def config(table: dict, block_d: int, on_cpu: bool) -> Config:
    """The configuration of ``table`` for a head dimension padded to ``block_d``."""
    return CPU if on_cpu else table[max(16, block_d)]
