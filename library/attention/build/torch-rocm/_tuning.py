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
#: The split-KV decode path (at most DECODE_MAX_QUERIES queries a sequence): BLOCK_N keys a
#: step (its rows, the group's queries, are sized by the launcher up to DECODE_MAX_ROWS).
DECODE = {
    16: Config(16, 64, 4, 3),
    32: Config(16, 64, 4, 3),
    64: Config(16, 64, 4, 3),
    128: Config(16, 64, 4, 3),
    256: Config(16, 32, 4, 2),
}
DECODE_MAX_QUERIES = 16
#: Rows (queries x query heads of one kv head) of one decode program; more make several tiles.
DECODE_MAX_ROWS = 64
#: Keys a decode split should at least cover: below that, the split's fixed cost (its loads of
#: q, its partial output written and read back) outweighs the parallelism it adds.
DECODE_MIN_KEYS_PER_SPLIT = 256
#: The most splits of a decode call (its partial outputs grow with the count).
DECODE_MAX_SPLITS = 64
#: Decode programs an SM should get: one wave of one program an SM. Measured with
#: ``benchmarks.attention``'s split sweep (H100, 8 kv heads, 4k cache; benchmarks/results/h100/
#: NOTES.md): batch 8 is fastest at 2 splits (one program an SM), 4% slower at 4 (two); batch 1
#: within 2% from 8 to 16 splits, where the 256-key floor caps it anyway.
DECODE_PROGRAMS_PER_SM = 1
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


def config(table: dict, block_d: int, on_cpu: bool, fp32: bool = False) -> Config:
    """The configuration of ``table`` for a head dimension padded to ``block_d``; with ``fp32``
    (float32 inputs, whose products are exact fp32, not tensor-core tf32) tiles of half the
    rows and columns and at most two stages.

    The tables are tuned for 16-bit inputs. fp32 tiles of the same shape take twice the
    registers and shared memory: on an H100 the backward of head dim 96 (padded to 128) spent
    more than 75 s in ptxas (spilling), where the halved tiles compile in seconds."""
    if on_cpu:
        return CPU
    cfg = table[max(16, block_d)]
    if not fp32:
        return cfg
    return cfg._replace(
        block_m=max(16, cfg.block_m // 2),
        block_n=max(16, cfg.block_n // 2),
        num_stages=min(cfg.num_stages, 2),
    )


def decode_splits(programs: int, max_seqlen_k: int, sm_count: int) -> int:
    """How many chunks the decode path cuts the keys into, from its programs without splitting
    (batch x kv heads x row tiles), the cache's capacity and the GPU's SM count: enough to give
    every SM DECODE_PROGRAMS_PER_SM program(s) (one wave, no tail), but no chunk under
    DECODE_MIN_KEYS_PER_SPLIT keys.
    A rule, not an autotune: a decode step is captured in CUDA graphs, where nothing may be
    timed, and the choice reads no lengths from the device."""
    by_fill = max(1, DECODE_PROGRAMS_PER_SM * sm_count // max(programs, 1))
    by_work = max(1, -(-max_seqlen_k // DECODE_MIN_KEYS_PER_SPLIT))
    return min(by_fill, by_work, DECODE_MAX_SPLITS)
