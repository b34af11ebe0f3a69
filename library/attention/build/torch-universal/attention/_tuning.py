"""Launch configurations of the attention kernels, one row per padded head dimension.

Retune here: each entry is ``(BLOCK_M, BLOCK_N, num_warps, num_stages)``, keyed by the head
dimension padded to a power of two (the larger of the query/key and value dimensions). The rows
for 64 and 128 are the fastest of a first sweep of ten configurations each, forward and backward
apart, and the backward's held against a second sweep of each of its two kernels
(``python -m benchmarks.diagnose.attention_versions --dkdv ... --dq ...``; the numbers:
benchmarks/results/h100/NOTES.md). The other rows are the usual Triton flash-attention starting
points, not yet swept. The CPU row keeps blocks small so that the interpreter's tests cross
block boundaries with tiny shapes.
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
#: The decode tile of a call with few programs (batch x kv heads x row tiles, at most
#: DECODE_WIDE_MAX_PROGRAMS) at head dim 128 in 16-bit: twice the keys a step and twice the
#: warps, so that each of the few programs keeps more loads in flight. A sweep of 24 tiles and
#: split counts on an H100 (batch 1, 8 kv heads, 4k cache, bf16; benchmarks/results/h100/
#: NOTES.md) put it first at 16.6 us with 8 splits, against 17.5 for the table's tile at its
#: 16; at batch 8 (64 programs) it was 2% slower than the table's, which keeps that.
DECODE_WIDE = Config(16, 128, 8, 3)
DECODE_WIDE_MAX_PROGRAMS = 8
DECODE_MAX_QUERIES = 16
#: Rows (queries x query heads of one kv head) of one decode program; more make several tiles.
DECODE_MAX_ROWS = 64
#: Key blocks a decode split should at least cover (256 keys with the table's tiles, 512 with
#: DECODE_WIDE): below that, the split's fixed cost (its loads of q, its partial output written
#: and read back) outweighs the parallelism it adds.
DECODE_MIN_BLOCKS_PER_SPLIT = 4
#: The most splits of a decode call (its partial outputs grow with the count).
DECODE_MAX_SPLITS = 64
#: Decode programs an SM should get: one wave of one program an SM. Measured with
#: ``benchmarks.attention``'s split sweep (H100, 8 kv heads, 4k cache; benchmarks/results/h100/
#: NOTES.md): batch 8 is fastest at 2 splits (one program an SM), 4% slower at 4 (two); batch 1
#: within 2% from 8 to 16 splits, where the 256-key floor caps it anyway.
DECODE_PROGRAMS_PER_SM = 1
#: The backward's dk/dv kernel: its programs own BLOCK_N keys and walk BLOCK_M queries at a time.
BACKWARD_DKDV = {
    16: Config(64, 64, 4, 3),
    32: Config(64, 64, 4, 3),
    64: Config(64, 64, 4, 3),
    128: Config(64, 64, 4, 2),
    256: Config(32, 32, 8, 1),
}
#: The backward's dq kernel (and the rowsum kernel's warps): its programs own BLOCK_M queries and
#: walk BLOCK_N keys. A table apart from BACKWARD_DKDV since the two kernels' loops differ.
BACKWARD_DQ = {
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


def decode_config(block_d: int, programs: int, on_cpu: bool, fp32: bool) -> Config:
    """The decode path's tile for a head dimension padded to ``block_d`` and ``programs``
    programs before splitting: DECODE_WIDE where it was measured faster, else the table's."""
    if not on_cpu and not fp32 and block_d == 128 and programs <= DECODE_WIDE_MAX_PROGRAMS:
        return DECODE_WIDE
    return config(DECODE, block_d, on_cpu, fp32)


def decode_plan(
    block_d: int, programs: int, max_seqlen_k: int, sm_count: int, on_cpu: bool, fp32: bool
) -> tuple[Config, int]:
    """The decode path's tile (`decode_config`) and the split count its rule picks for it
    (`decode_splits`)."""
    cfg = decode_config(block_d, programs, on_cpu, fp32)
    return cfg, decode_splits(programs, max_seqlen_k, sm_count, cfg.block_n)


def decode_splits(programs: int, max_seqlen_k: int, sm_count: int, block_n: int = 64) -> int:
    """How many chunks the decode path cuts the keys into, from its programs without splitting
    (batch x kv heads x row tiles), the cache's capacity, the GPU's SM count and the tile's
    keys a step: enough to give every SM DECODE_PROGRAMS_PER_SM program(s) (one wave, no
    tail), but no chunk under DECODE_MIN_BLOCKS_PER_SPLIT blocks of keys.
    A rule, not an autotune: a decode step is captured in CUDA graphs, where nothing may be
    timed, and the choice reads no lengths from the device."""
    by_fill = max(1, DECODE_PROGRAMS_PER_SM * sm_count // max(programs, 1))
    by_work = max(1, -(-max_seqlen_k // (DECODE_MIN_BLOCKS_PER_SPLIT * block_n)))
    return min(by_fill, by_work, DECODE_MAX_SPLITS)
