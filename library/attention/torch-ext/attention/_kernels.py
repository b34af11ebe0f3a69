"""The Triton kernels of flash attention: a forward, and a backward in three kernels.

Every kernel addresses a query, key or value row as ``base[batch] + row * stride_row +
head * stride_head + dim`` (the last dimension contiguous), so one kernel serves all layouts:

- dense ``(batch, seqlen, heads, dim)`` tensors: row ``i`` of batch ``b``;
- packed (varlen) ``(total, heads, dim)`` tensors, passed as ``(1, total, heads, dim)``: the rows
  of sequence ``b`` start at ``cu_seqlens[b]`` (``VARLEN_Q``, ``K_LEN == K_CU``);
- a KV cache ``(batch, capacity, heads, dim)`` of which sequence ``b`` uses its first
  ``seqused_k[b]`` rows (``K_LEN == K_USED``), optionally paged (``PAGED``: cache rows live in
  blocks of ``PAGE_SIZE`` rows listed by a block table).

Masks follow flash-attn 2: with ``shift = len_k - len_q`` (the causal diagonal is aligned to the
bottom right), query ``i`` sees key ``j`` when ``i + shift - left <= j <= i + shift + right``;
each side is unbounded unless its WINDOW_* flag is set (causal is ``right = 0``). Logits are
``q . k * scale``, soft-capped as ``cap * tanh(logit / cap)`` when SOFTCAP; an attention sink
(``s_aux``, one logit per head) joins every row's softmax denominator and nothing else. Scores
are kept in base-2 units (``exp2``), the log-sum-exp is written in natural units.

A row that sees no key (and has no sink) gets output 0 and log-sum-exp ``+inf``, as in
flash-attn 2: its probabilities ``exp(s - lse)`` are then 0 in the backward.

The backward recomputes probabilities from the saved log-sum-exp (flash-attn 2): ``_delta``
computes ``rowsum(dout * out)``, ``_bwd_dkdv`` walks the queries that see one block of keys (all
the query heads of the key's group, one after another) and ``_bwd_dq`` walks the keys one block
of queries sees. No atomics: every gradient element is summed by one program in a fixed order,
so the backward is bitwise repeatable whatever ``deterministic`` says.
"""

import triton
import triton.language as tl

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)

# How a sequence's key length is known (the K_LEN constexpr).
K_FIXED = 0  # seqlen_k for every batch
K_CU = 1  # cu_seqlens_k[b + 1] - cu_seqlens_k[b], rows from cu_seqlens_k[b]
K_USED = 2  # seqused_k[b] (a KV cache's filled length), rows from 0


@triton.jit
def _tanh(x):
    # No libdevice (the interpreter has none): tanh from exp2. For |x| large exp2 overflows to
    # inf or underflows to 0, and the result is exactly +-1.
    return 1.0 - 2.0 / (tl.exp2(x * (2.0 * LOG2E)) + 1.0)


@triton.jit
def _dot(a, b, DOT_PRECISION: tl.constexpr):
    # "upcast": Triton's interpreter (3.9) multiplies bfloat16 matrices wrongly (results off by
    # 1e10), so on the CPU bf16 operands are widened first; they hold the same values.
    if DOT_PRECISION == "upcast":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=DOT_PRECISION)


@triton.jit
def _seq_q(CU_Q, b, seqlen_q, VARLEN_Q: tl.constexpr):
    # (batch index into the tensor, first row, length) of batch b's queries.
    if VARLEN_Q:
        start = tl.load(CU_Q + b).to(tl.int64)
        length = (tl.load(CU_Q + b + 1) - start).to(tl.int32)
        return b * 0, start, length
    else:
        return b, 0, seqlen_q


@triton.jit
def _seq_k(CU_K, SEQUSED_K, b, seqlen_k, K_LEN: tl.constexpr):
    # (batch index into the tensor, first row, length) of batch b's keys and values.
    if K_LEN == 1:
        start = tl.load(CU_K + b).to(tl.int64)
        length = (tl.load(CU_K + b + 1) - start).to(tl.int32)
        return b * 0, start, length
    elif K_LEN == 2:
        return b, 0, tl.load(SEQUSED_K + b).to(tl.int32)
    else:
        return b, 0, seqlen_k


@triton.jit
def _logits(qk, logit_scale, cap_log2, SOFTCAP: tl.constexpr):
    # Base-2 logits from raw q.k. Without SOFTCAP, logit_scale is scale * log2(e); with it,
    # logit_scale is scale / cap and cap_log2 is cap * log2(e).
    if SOFTCAP:
        return cap_log2 * _tanh(qk * logit_scale)
    else:
        return qk * logit_scale


@triton.jit
def _mask(rows, cols, len_q, len_k, window_left, window_right, WINDOW_LEFT: tl.constexpr,
          WINDOW_RIGHT: tl.constexpr):  # fmt: skip
    # Which (query, key) pairs are visible: rows and cols are the query and key indices as
    # broadcastable 2-D tensors (queries down and keys across, or transposed for _dkdv_steps).
    shift = len_k - len_q
    mask = (rows < len_q) & (cols < len_k)
    if WINDOW_RIGHT:
        mask = mask & (cols <= rows + shift + window_right)
    if WINDOW_LEFT:
        mask = mask & (cols >= rows + shift - window_left)
    return mask


@triton.jit
def _key_range(start_m, len_q, len_k, window_left, window_right, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr):  # fmt: skip
    # [lo, hi): the key blocks that the queries start_m .. start_m + BLOCK_M - 1 may see.
    shift = len_k - len_q
    lo = 0
    hi = len_k
    if WINDOW_RIGHT:
        hi = tl.minimum(hi, start_m + BLOCK_M + shift + window_right)
    if WINDOW_LEFT:
        lo = tl.maximum(start_m + shift - window_left, 0)
        lo = (lo // BLOCK_N) * BLOCK_N
    return lo, hi


@triton.jit
def _unmasked(lo, hi, first, end, BLOCK: tl.constexpr):
    # [u_lo, u_hi) within [lo, hi), both on lo's grid of BLOCK: the blocks that start at or after
    # `first` and end by `end`, which no mask touches. lo is a multiple of BLOCK.
    u_lo = tl.maximum(lo, ((tl.maximum(first, 0) + BLOCK - 1) // BLOCK) * BLOCK)
    u_lo = tl.minimum(u_lo, hi)
    u_hi = tl.maximum(u_lo, tl.minimum(hi, (tl.maximum(end, 0) // BLOCK) * BLOCK))
    return u_lo, u_hi


@triton.jit
def _head_rows(DESC, b, row, h, ROWS: tl.constexpr):
    # ROWS rows of head h from ``row`` on, through a tensor descriptor over a 4-D (batch, rows,
    # heads, dim) tensor, as a [ROWS, padded dim] tile: zeros past the tensor's edges.
    return tl.reshape(DESC.load([b, tl.cast(row, tl.int32), h, 0]), [ROWS, DESC.block_shape[3]])


@triton.jit
def _dropout_offsets(rows, h, cols, n_heads, rng_cols):
    # Philox offsets of (query row, head, key), rows and cols as broadcastable 2-D tensors.
    return (rows.to(tl.int64) * n_heads + h) * rng_cols + cols


@triton.jit
def _dropout_keep(seed, rows, h, cols, n_heads, rng_cols, dropout_p):
    # Which probabilities of rows x keys survive dropout: Philox numbers keyed by (seed, query
    # row, head, key), so that the backward (and _dropout_mask_kernel) regenerate the same mask
    # from the seed alone. rows index q's (batch x seqlen) or packed rows, cols a sequence's own
    # keys, as broadcastable 2-D tensors (as for _mask); rng_cols (>= every sequence's key
    # count) keeps the offsets distinct.
    return tl.rand(seed, _dropout_offsets(rows, h, cols, n_heads, rng_cols)) >= dropout_p


@triton.jit
def _dropout_mask_kernel(KEEP, SEED, n_rows, n_heads, rng_cols, dropout_p,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    # The keep-mask (n_rows, n_heads, rng_cols) of _dropout_keep, for tests: the same code the
    # attention kernels run.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    h = tl.program_id(1)
    seed = tl.load(SEED)
    for start_n in range(0, rng_cols, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        keep = _dropout_keep(seed, rows[:, None], h, offs_n[None, :], n_heads, rng_cols,
                             dropout_p)  # fmt: skip
        offsets = _dropout_offsets(rows[:, None], h, offs_n[None, :], n_heads, rng_cols)
        tl.store(KEEP + offsets, keep.to(tl.int8),
                 mask=(rows < n_rows)[:, None] & (offs_n < rng_cols)[None, :])  # fmt: skip


@triton.jit
def _fwd_steps(
    q, m_i, l_i, acc, K, V, BLOCK_TABLE, start, end, b, bk, k_start, hk, offs_m, offs_dq, offs_dv,
    dq_mask, dv_mask, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
    len_q, len_k, logit_scale, cap_log2, window_left, window_right, k_first, KEY_MASK_ROW,
    seed, rows_g, h, n_heads, rng_cols, dropout_p, dropout_scale,
    BLOCK_N: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
    WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
    DOT_PRECISION: tl.constexpr, MASKED: tl.constexpr, DROPOUT: tl.constexpr,
    LEFTPAD: tl.constexpr, KEY_PADDING: tl.constexpr, K_DESC, V_DESC, TMA: tl.constexpr,
):  # fmt: skip
    # The online softmax over key blocks [start, end). Unless MASKED, every key of these blocks
    # exists and every query sees it: no mask is computed or applied. With TMA, k and v come
    # through tensor descriptors (never PAGED): their blocks are read by the copy engine, zeros
    # past the tensor's edges (the head dimension's padding included), so only keys past len_k
    # inside the tensor (another packed sequence, or a cache's unfilled rows) need a mask.
    # LEFTPAD: a left-padded cache's keys start at k_first; KEY_PADDING: this sequence's keys
    # are those whose byte of KEY_MASK_ROW is nonzero. Other rows are neither attended to nor
    # read (they may hold anything); only MASKED blocks have any.
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_mask = offs_n < len_k
        if LEFTPAD:
            n_mask = n_mask & (offs_n >= k_first)
        if KEY_PADDING:
            n_mask = n_mask & (tl.load(KEY_MASK_ROW + offs_n, mask=n_mask, other=0) != 0)
        if TMA:
            kt = tl.trans(_head_rows(K_DESC, bk, k_start + start_n, hk, BLOCK_N))
        else:
            if PAGED:
                page = tl.load(BLOCK_TABLE + b.to(tl.int64) * stride_bt + offs_n // PAGE_SIZE,
                               mask=n_mask, other=0).to(tl.int64)  # fmt: skip
                k_rows = page * stride_kb + (offs_n % PAGE_SIZE) * stride_ks
                v_rows = page * stride_vb + (offs_n % PAGE_SIZE) * stride_vs
            else:
                k_rows = bk.to(tl.int64) * stride_kb + (k_start + offs_n) * stride_ks
                v_rows = bk.to(tl.int64) * stride_vb + (k_start + offs_n) * stride_vs
            if MASKED:
                kt = tl.load(K + k_rows[None, :] + hk * stride_kh + offs_dq[:, None],
                             mask=n_mask[None, :] & dq_mask[:, None], other=0.0)  # fmt: skip
            else:
                kt = tl.load(K + k_rows[None, :] + hk * stride_kh + offs_dq[:, None],
                             mask=dq_mask[:, None], other=0.0)  # fmt: skip
        s = _logits(_dot(q, kt, DOT_PRECISION), logit_scale, cap_log2, SOFTCAP)
        if MASKED:
            mask = _mask(offs_m[:, None], offs_n[None, :], len_q, len_k, window_left, window_right,
                         WINDOW_LEFT, WINDOW_RIGHT)  # fmt: skip
            if LEFTPAD or KEY_PADDING:
                mask = mask & n_mask[None, :]
            s = tl.where(mask, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row that has seen nothing yet keeps m = -inf; subtract 0 there instead (p is 0).
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if DROPOUT:
            # The denominator sums every probability; only the output sees the dropped ones.
            keep = _dropout_keep(seed, rows_g[:, None], h, offs_n[None, :], n_heads, rng_cols,
                                 dropout_p)  # fmt: skip
            p = tl.where(keep, p * dropout_scale, 0.0)
        if TMA:
            v = _head_rows(V_DESC, bk, k_start + start_n, hk, BLOCK_N)
            if MASKED:
                # p is 0 past len_k, but 0 x a non-finite value read there would not be.
                v = tl.where(n_mask[:, None], v, 0.0)
        elif MASKED:
            v = tl.load(V + v_rows[:, None] + hk * stride_vh + offs_dv[None, :],
                        mask=n_mask[:, None] & dv_mask[None, :], other=0.0)  # fmt: skip
        else:
            v = tl.load(V + v_rows[:, None] + hk * stride_vh + offs_dv[None, :],
                        mask=dv_mask[None, :], other=0.0)  # fmt: skip
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, DOT_PRECISION)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _fwd_kernel(
    Q, K, V, OUT, LSE, SINK, CU_Q, CU_K, SEQUSED_K, BLOCK_TABLE, SEED, CACHE_LEFTPAD, KEY_MASK,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh,
    stride_lb, stride_lh, stride_bt, stride_km,
    seqlen_q, seqlen_k, n_heads, group,
    logit_scale, cap_log2, window_left, window_right, rng_cols, dropout_p, dropout_scale,
    HEAD_DIM_QK: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    VARLEN_Q: tl.constexpr, K_LEN: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
    WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
    HAS_SINK: tl.constexpr, DOT_PRECISION: tl.constexpr, DROPOUT: tl.constexpr,
    LEFTPAD: tl.constexpr, KEY_PADDING: tl.constexpr, Q_DESC, K_DESC, V_DESC, TMA: tl.constexpr,
):  # fmt: skip
    # TMA: q, k and v read through tensor descriptors over their 4-D shapes (`_fwd_steps`).
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // n_heads
    h = pid_bh % n_heads
    hk = h // group
    bq, q_start, len_q = _seq_q(CU_Q, b, seqlen_q, VARLEN_Q)
    start_m = pid_m * BLOCK_M
    if start_m >= len_q:
        return
    bk, k_start, len_k = _seq_k(CU_K, SEQUSED_K, b, seqlen_k, K_LEN)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_dq = tl.arange(0, BLOCK_DQK)
    offs_dv = tl.arange(0, BLOCK_DV)
    dq_mask = offs_dq < HEAD_DIM_QK
    dv_mask = offs_dv < HEAD_DIM_V
    m_mask = offs_m < len_q
    if TMA:
        # Rows past len_q inside the tensor (the next packed sequence) are computed, not stored.
        q = _head_rows(Q_DESC, bq, q_start + start_m, h, BLOCK_M)
    else:
        q_rows = bq.to(tl.int64) * stride_qb + (q_start + offs_m) * stride_qs + h * stride_qh
        q = tl.load(Q + q_rows[:, None] + offs_dq[None, :],
                    mask=m_mask[:, None] & dq_mask[None, :], other=0.0)  # fmt: skip

    if HAS_SINK:
        # The sink is a logit of its own: start the running max there with a sum of exp(0) = 1.
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + tl.load(SINK + h).to(tl.float32) * LOG2E
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    else:
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    lo, hi = _key_range(start_m, len_q, len_k, window_left, window_right, BLOCK_M, BLOCK_N,
                        WINDOW_LEFT, WINDOW_RIGHT)  # fmt: skip
    # Key blocks that no mask touches: every key exists (block end <= len_k) and, for every
    # query of this block, lies inside its window.
    shift = len_k - len_q
    first = 0
    end = len_k
    if WINDOW_LEFT:
        first = start_m + BLOCK_M - 1 + shift - window_left
    if WINDOW_RIGHT:
        end = tl.minimum(len_k, start_m + shift + window_right + 1)
    k_first = 0
    if LEFTPAD:
        # A left-padded cache (flash-attn's cache_leftpad): no block wholly before its first key
        # is read, and blocks reaching below it are masked.
        k_first = tl.load(CACHE_LEFTPAD + b).to(tl.int32)
        lo = tl.maximum(lo, (k_first // BLOCK_N) * BLOCK_N)
        first = tl.maximum(first, k_first)
    key_mask_row = KEY_MASK + b.to(tl.int64) * stride_km
    if KEY_PADDING:  # any key may be padding: every block is masked
        first = len_k
    u_lo, u_hi = _unmasked(lo, hi, first, end, BLOCK_N)
    seed = 0
    if DROPOUT:
        seed = tl.load(SEED)
    rows_g = bq * seqlen_q + q_start + offs_m
    m_i, l_i, acc = _fwd_steps(
        q, m_i, l_i, acc, K, V, BLOCK_TABLE, lo, u_lo, b, bk, k_start, hk, offs_m, offs_dq, offs_dv,
        dq_mask, dv_mask, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        stride_bt, len_q, len_k, logit_scale, cap_log2, window_left, window_right, k_first,
        key_mask_row, seed, rows_g, h, n_heads, rng_cols, dropout_p, dropout_scale, BLOCK_N, PAGED,
        PAGE_SIZE, WINDOW_LEFT, WINDOW_RIGHT, SOFTCAP, DOT_PRECISION, True, DROPOUT, LEFTPAD,
        KEY_PADDING, K_DESC, V_DESC, TMA,
    )  # fmt: skip
    m_i, l_i, acc = _fwd_steps(
        q, m_i, l_i, acc, K, V, BLOCK_TABLE, u_lo, u_hi, b, bk, k_start, hk, offs_m, offs_dq, offs_dv,
        dq_mask, dv_mask, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        stride_bt, len_q, len_k, logit_scale, cap_log2, window_left, window_right, k_first,
        key_mask_row, seed, rows_g, h, n_heads, rng_cols, dropout_p, dropout_scale, BLOCK_N, PAGED,
        PAGE_SIZE, WINDOW_LEFT, WINDOW_RIGHT, SOFTCAP, DOT_PRECISION, False, DROPOUT, LEFTPAD,
        KEY_PADDING, K_DESC, V_DESC, TMA,
    )  # fmt: skip
    m_i, l_i, acc = _fwd_steps(
        q, m_i, l_i, acc, K, V, BLOCK_TABLE, u_hi, hi, b, bk, k_start, hk, offs_m, offs_dq, offs_dv,
        dq_mask, dv_mask, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        stride_bt, len_q, len_k, logit_scale, cap_log2, window_left, window_right, k_first,
        key_mask_row, seed, rows_g, h, n_heads, rng_cols, dropout_p, dropout_scale, BLOCK_N, PAGED,
        PAGE_SIZE, WINDOW_LEFT, WINDOW_RIGHT, SOFTCAP, DOT_PRECISION, True, DROPOUT, LEFTPAD,
        KEY_PADDING, K_DESC, V_DESC, TMA,
    )  # fmt: skip

    has_mass = l_i > 0.0
    out = acc / tl.where(has_mass, l_i, 1.0)[:, None]
    lse = tl.where(has_mass, m_i * LN2 + tl.log(tl.where(has_mass, l_i, 1.0)), float("inf"))
    o_rows = bq.to(tl.int64) * stride_ob + (q_start + offs_m) * stride_os + h * stride_oh
    tl.store(OUT + o_rows[:, None] + offs_dv[None, :], out.to(OUT.dtype.element_ty),
             mask=m_mask[:, None] & dv_mask[None, :])  # fmt: skip
    tl.store(LSE + bq.to(tl.int64) * stride_lb + h * stride_lh + q_start + offs_m, lse,
             mask=m_mask)  # fmt: skip


@triton.jit
def _delta_kernel(
    OUT, DO, DELTA, CU_Q,
    stride_ob, stride_os, stride_oh,
    stride_dob, stride_dos, stride_doh,
    stride_lb, stride_lh,
    seqlen_q, n_heads,
    HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr,
    VARLEN_Q: tl.constexpr,
):  # fmt: skip
    # delta = rowsum(dout * out) in fp32, laid out as the log-sum-exp.
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // n_heads
    h = pid_bh % n_heads
    bq, q_start, len_q = _seq_q(CU_Q, b, seqlen_q, VARLEN_Q)
    start_m = pid_m * BLOCK_M
    if start_m >= len_q:
        return
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_DV)
    mask = (offs_m < len_q)[:, None] & (offs_d < HEAD_DIM_V)[None, :]
    rows = q_start + offs_m
    o = tl.load(OUT + bq.to(tl.int64) * stride_ob + rows[:, None] * stride_os + h * stride_oh
                + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)  # fmt: skip
    do = tl.load(DO + bq.to(tl.int64) * stride_dob + rows[:, None] * stride_dos + h * stride_doh
                 + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)  # fmt: skip
    tl.store(DELTA + bq.to(tl.int64) * stride_lb + h * stride_lh + rows, tl.sum(o * do, 1),
             mask=offs_m < len_q)  # fmt: skip


@triton.jit
def _dkdv_steps(
    dk, dv, k, v, Q, DO, LSE, DELTA, start, end, h, bq, q_start, offs_n, offs_dq, offs_dv,
    dq_mask, dv_mask, stride_qb, stride_qs, stride_qh, stride_dob, stride_dos, stride_doh,
    stride_lb, stride_lh, len_q, len_k, logit_scale, cap_log2, window_left, window_right,
    seed, row0, n_heads, rng_cols, dropout_p, dropout_scale,
    BLOCK_M: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr, DOT_PRECISION: tl.constexpr, MASKED: tl.constexpr,
    DROPOUT: tl.constexpr, Q_DESC, DO_DESC, TMA: tl.constexpr, KEYS_DOWN: tl.constexpr,
):  # fmt: skip
    # dk and dv of one key block over query blocks [start, end) of head h; unless MASKED, no
    # mask is computed (none applies there). With TMA, q and dout come through tensor
    # descriptors, as k and v do in _fwd_steps: no tile of pointers held in registers beside
    # the dk and dv accumulators.
    # KEYS_DOWN keeps every tile keys x queries, so that the probabilities and their gradient
    # enter the dv and dk products as they are; else queries x keys, transposed for those
    # products (through shared memory). Which is faster depends on the head dimension (the
    # launcher's rule, measured on an H100).
    for start_m in range(start, end, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        m_mask = offs_m < len_q
        rows = q_start + offs_m
        if TMA:
            q = _head_rows(Q_DESC, bq, q_start + start_m, h, BLOCK_M)
            do = _head_rows(DO_DESC, bq, q_start + start_m, h, BLOCK_M)
            if MASKED:
                # Rows past len_q inside the tensor (another packed sequence) have p = 0, but
                # 0 x a non-finite value read there would not be 0.
                q = tl.where(m_mask[:, None], q, 0.0)
                do = tl.where(m_mask[:, None], do, 0.0)
        else:
            q = tl.load(Q + bq.to(tl.int64) * stride_qb + rows[:, None] * stride_qs
                        + h * stride_qh + offs_dq[None, :],
                        mask=m_mask[:, None] & dq_mask[None, :], other=0.0)  # fmt: skip
            do = tl.load(DO + bq.to(tl.int64) * stride_dob + rows[:, None] * stride_dos
                         + h * stride_doh + offs_dv[None, :],
                         mask=m_mask[:, None] & dv_mask[None, :], other=0.0)  # fmt: skip
        l_offs = bq.to(tl.int64) * stride_lb + h * stride_lh + rows
        lse = tl.load(LSE + l_offs, mask=m_mask, other=float("inf")) * LOG2E
        delta = tl.load(DELTA + l_offs, mask=m_mask, other=0.0)
        # The query and key index of every element, and the per-query rows, as the tiles lie.
        if KEYS_DOWN:
            queries = offs_m[None, :]
            keys = offs_n[:, None]
            lse = lse[None, :]
            delta = delta[None, :]
            qk = _dot(k, tl.trans(q), DOT_PRECISION)
            dp = _dot(v, tl.trans(do), DOT_PRECISION)
        else:
            queries = offs_m[:, None]
            keys = offs_n[None, :]
            lse = lse[:, None]
            delta = delta[:, None]
            qk = _dot(q, tl.trans(k), DOT_PRECISION)
            dp = _dot(do, tl.trans(v), DOT_PRECISION)
        p = tl.exp2(_logits(qk, logit_scale, cap_log2, SOFTCAP) - lse)
        if MASKED:
            mask = _mask(queries, keys, len_q, len_k, window_left, window_right, WINDOW_LEFT,
                         WINDOW_RIGHT)  # fmt: skip
            p = tl.where(mask, p, 0.0)
        p_out = p
        if DROPOUT:
            # out = (p * keep * scale) v: dv sees the dropped probabilities, and the gradient
            # of p the kept ones' dp; delta = rowsum(dout * out) is unchanged (flash-attn 2).
            keep = _dropout_keep(seed, row0 + queries, h, keys, n_heads, rng_cols, dropout_p)
            p_out = tl.where(keep, p * dropout_scale, 0.0)
            dp = tl.where(keep, dp * dropout_scale, 0.0)
        ds = p * (dp - delta)
        if SOFTCAP:
            t = _tanh(qk * logit_scale)
            ds = ds * (1.0 - t * t)
        if KEYS_DOWN:
            dv += _dot(p_out.to(do.dtype), do, DOT_PRECISION)
            dk += _dot(ds.to(q.dtype), q, DOT_PRECISION)
        else:
            dv += _dot(tl.trans(p_out.to(do.dtype)), do, DOT_PRECISION)
            dk += _dot(tl.trans(ds.to(q.dtype)), q, DOT_PRECISION)
    return dk, dv


@triton.jit
def _dq_steps(
    dq, q, do, lse, delta, K, V, start, end, bk, k_start, hk, offs_m, offs_dq, offs_dv, dq_mask,
    dv_mask, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, len_q, len_k,
    logit_scale, cap_log2, window_left, window_right, seed, rows_g, h, n_heads, rng_cols,
    dropout_p, dropout_scale, BLOCK_N: tl.constexpr,
    WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
    DOT_PRECISION: tl.constexpr, MASKED: tl.constexpr, DROPOUT: tl.constexpr,
    K_DESC, V_DESC, TMA: tl.constexpr,
):  # fmt: skip
    # dq of one query block over key blocks [start, end); unless MASKED, no mask is computed.
    # With TMA, k and v come through tensor descriptors (as in _dkdv_steps).
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_mask = offs_n < len_k
        if TMA:
            kt = tl.trans(_head_rows(K_DESC, bk, k_start + start_n, hk, BLOCK_N))
            vt = tl.trans(_head_rows(V_DESC, bk, k_start + start_n, hk, BLOCK_N))
            if MASKED:
                # Keys past len_k inside the tensor: p is 0 there, as in _dkdv_steps.
                kt = tl.where(n_mask[None, :], kt, 0.0)
                vt = tl.where(n_mask[None, :], vt, 0.0)
        else:
            k_rows = bk.to(tl.int64) * stride_kb + (k_start + offs_n) * stride_ks + hk * stride_kh
            v_rows = bk.to(tl.int64) * stride_vb + (k_start + offs_n) * stride_vs + hk * stride_vh
            kt = tl.load(K + k_rows[None, :] + offs_dq[:, None],
                         mask=n_mask[None, :] & dq_mask[:, None], other=0.0)  # fmt: skip
            vt = tl.load(V + v_rows[None, :] + offs_dv[:, None],
                         mask=n_mask[None, :] & dv_mask[:, None], other=0.0)  # fmt: skip
        qk = _dot(q, kt, DOT_PRECISION)
        s = _logits(qk, logit_scale, cap_log2, SOFTCAP)
        p = tl.exp2(s - lse[:, None])
        if MASKED:
            mask = _mask(offs_m[:, None], offs_n[None, :], len_q, len_k, window_left, window_right,
                         WINDOW_LEFT, WINDOW_RIGHT)  # fmt: skip
            p = tl.where(mask, p, 0.0)
        dp = _dot(do, vt, DOT_PRECISION)
        if DROPOUT:
            keep = _dropout_keep(seed, rows_g[:, None], h, offs_n[None, :], n_heads, rng_cols,
                                 dropout_p)  # fmt: skip
            dp = tl.where(keep, dp * dropout_scale, 0.0)
        ds = p * (dp - delta[:, None])
        if SOFTCAP:
            t = _tanh(qk * logit_scale)
            ds = ds * (1.0 - t * t)
        dq += _dot(ds.to(kt.dtype), tl.trans(kt), DOT_PRECISION)
    return dq


@triton.jit
def _bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, CU_Q, CU_K, SEED,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_dob, stride_dos, stride_doh,
    stride_dkb, stride_dks, stride_dkh,
    stride_dvb, stride_dvs, stride_dvh,
    stride_lb, stride_lh,
    seqlen_q, seqlen_k, n_kv_heads, group,
    scale, logit_scale, cap_log2, window_left, window_right, rng_cols, dropout_p, dropout_scale,
    HEAD_DIM_QK: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    VARLEN_Q: tl.constexpr, K_LEN: tl.constexpr,
    WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DROPOUT: tl.constexpr, Q_DESC, DO_DESC, TMA: tl.constexpr,
    KEYS_DOWN: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // n_kv_heads
    hk = pid_bh % n_kv_heads
    bk, k_start, len_k = _seq_k(CU_K, CU_K, b, seqlen_k, K_LEN)
    start_n = pid_n * BLOCK_N
    if start_n >= len_k:
        return
    bq, q_start, len_q = _seq_q(CU_Q, b, seqlen_q, VARLEN_Q)
    shift = len_k - len_q

    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_dq = tl.arange(0, BLOCK_DQK)
    offs_dv = tl.arange(0, BLOCK_DV)
    dq_mask = offs_dq < HEAD_DIM_QK
    dv_mask = offs_dv < HEAD_DIM_V
    n_mask = offs_n < len_k
    k_rows = bk.to(tl.int64) * stride_kb + (k_start + offs_n) * stride_ks + hk * stride_kh
    v_rows = bk.to(tl.int64) * stride_vb + (k_start + offs_n) * stride_vs + hk * stride_vh
    k = tl.load(K + k_rows[:, None] + offs_dq[None, :], mask=n_mask[:, None] & dq_mask[None, :],
                other=0.0)  # fmt: skip
    v = tl.load(V + v_rows[:, None] + offs_dv[None, :], mask=n_mask[:, None] & dv_mask[None, :],
                other=0.0)  # fmt: skip
    dk = tl.zeros([BLOCK_N, BLOCK_DQK], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)

    # The queries that may see this block of keys.
    lo = 0
    hi = len_q
    if WINDOW_RIGHT:
        lo = tl.maximum(start_n - shift - window_right, 0)
        lo = (lo // BLOCK_M) * BLOCK_M
    if WINDOW_LEFT:
        hi = tl.minimum(hi, start_n + BLOCK_N - shift + window_left)
    # Query blocks that no mask touches: for each of their rows, every key of this block lies
    # inside its window (rows past len_q have lse = +inf, so their probabilities are 0 anyway).
    first = 0
    end = len_q
    if WINDOW_RIGHT:
        first = start_n + BLOCK_N - 1 - shift - window_right
    if WINDOW_LEFT:
        end = tl.minimum(len_q, start_n + 1 - shift + window_left)
    u_lo, u_hi = _unmasked(lo, hi, first, end, BLOCK_M)
    seed = 0
    if DROPOUT:
        seed = tl.load(SEED)
    row0 = bq * seqlen_q + q_start
    for g in range(0, group):
        h = hk * group + g
        dk, dv = _dkdv_steps(
            dk, dv, k, v, Q, DO, LSE, DELTA, lo, u_lo, h, bq, q_start, offs_n, offs_dq, offs_dv,
            dq_mask, dv_mask, stride_qb, stride_qs, stride_qh, stride_dob, stride_dos,
            stride_doh, stride_lb, stride_lh, len_q, len_k, logit_scale, cap_log2, window_left,
            window_right, seed, row0, n_kv_heads * group, rng_cols, dropout_p, dropout_scale,
            BLOCK_M, WINDOW_LEFT, WINDOW_RIGHT, SOFTCAP, DOT_PRECISION, True, DROPOUT, Q_DESC,
            DO_DESC, TMA, KEYS_DOWN,
        )  # fmt: skip
        dk, dv = _dkdv_steps(
            dk, dv, k, v, Q, DO, LSE, DELTA, u_lo, u_hi, h, bq, q_start, offs_n, offs_dq,
            offs_dv, dq_mask, dv_mask, stride_qb, stride_qs, stride_qh, stride_dob, stride_dos,
            stride_doh, stride_lb, stride_lh, len_q, len_k, logit_scale, cap_log2, window_left,
            window_right, seed, row0, n_kv_heads * group, rng_cols, dropout_p, dropout_scale,
            BLOCK_M, WINDOW_LEFT, WINDOW_RIGHT, SOFTCAP, DOT_PRECISION, False, DROPOUT, Q_DESC,
            DO_DESC, TMA, KEYS_DOWN,
        )  # fmt: skip
        dk, dv = _dkdv_steps(
            dk, dv, k, v, Q, DO, LSE, DELTA, u_hi, hi, h, bq, q_start, offs_n, offs_dq, offs_dv,
            dq_mask, dv_mask, stride_qb, stride_qs, stride_qh, stride_dob, stride_dos,
            stride_doh, stride_lb, stride_lh, len_q, len_k, logit_scale, cap_log2, window_left,
            window_right, seed, row0, n_kv_heads * group, rng_cols, dropout_p, dropout_scale,
            BLOCK_M, WINDOW_LEFT, WINDOW_RIGHT, SOFTCAP, DOT_PRECISION, True, DROPOUT, Q_DESC,
            DO_DESC, TMA, KEYS_DOWN,
        )  # fmt: skip

    dk_rows = bk.to(tl.int64) * stride_dkb + (k_start + offs_n) * stride_dks
    dv_rows = bk.to(tl.int64) * stride_dvb + (k_start + offs_n) * stride_dvs
    tl.store(DK + dk_rows[:, None] + hk * stride_dkh + offs_dq[None, :],
             (dk * scale).to(DK.dtype.element_ty), mask=n_mask[:, None] & dq_mask[None, :])  # fmt: skip
    tl.store(DV + dv_rows[:, None] + hk * stride_dvh + offs_dv[None, :],
             dv.to(DV.dtype.element_ty), mask=n_mask[:, None] & dv_mask[None, :])  # fmt: skip


@triton.jit
def _bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, CU_Q, CU_K, SEED,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_dob, stride_dos, stride_doh,
    stride_dqb, stride_dqs, stride_dqh,
    stride_lb, stride_lh,
    seqlen_q, seqlen_k, n_heads, group,
    scale, logit_scale, cap_log2, window_left, window_right, rng_cols, dropout_p, dropout_scale,
    HEAD_DIM_QK: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    VARLEN_Q: tl.constexpr, K_LEN: tl.constexpr,
    WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DROPOUT: tl.constexpr, K_DESC, V_DESC, TMA: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // n_heads
    h = pid_bh % n_heads
    hk = h // group
    bq, q_start, len_q = _seq_q(CU_Q, b, seqlen_q, VARLEN_Q)
    start_m = pid_m * BLOCK_M
    if start_m >= len_q:
        return
    bk, k_start, len_k = _seq_k(CU_K, CU_K, b, seqlen_k, K_LEN)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_dq = tl.arange(0, BLOCK_DQK)
    offs_dv = tl.arange(0, BLOCK_DV)
    dq_mask = offs_dq < HEAD_DIM_QK
    dv_mask = offs_dv < HEAD_DIM_V
    m_mask = offs_m < len_q
    rows = q_start + offs_m
    q = tl.load(Q + bq.to(tl.int64) * stride_qb + rows[:, None] * stride_qs + h * stride_qh
                + offs_dq[None, :], mask=m_mask[:, None] & dq_mask[None, :], other=0.0)  # fmt: skip
    do = tl.load(DO + bq.to(tl.int64) * stride_dob + rows[:, None] * stride_dos + h * stride_doh
                 + offs_dv[None, :], mask=m_mask[:, None] & dv_mask[None, :], other=0.0)  # fmt: skip
    l_offs = bq.to(tl.int64) * stride_lb + h * stride_lh + rows
    lse = tl.load(LSE + l_offs, mask=m_mask, other=float("inf")) * LOG2E
    delta = tl.load(DELTA + l_offs, mask=m_mask, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_DQK], dtype=tl.float32)

    lo, hi = _key_range(start_m, len_q, len_k, window_left, window_right, BLOCK_M, BLOCK_N,
                        WINDOW_LEFT, WINDOW_RIGHT)  # fmt: skip
    # Key blocks that no mask touches, as in the forward.
    shift = len_k - len_q
    first = 0
    end = len_k
    if WINDOW_LEFT:
        first = start_m + BLOCK_M - 1 + shift - window_left
    if WINDOW_RIGHT:
        end = tl.minimum(len_k, start_m + shift + window_right + 1)
    u_lo, u_hi = _unmasked(lo, hi, first, end, BLOCK_N)
    seed = 0
    if DROPOUT:
        seed = tl.load(SEED)
    rows_g = bq * seqlen_q + rows
    dq = _dq_steps(
        dq, q, do, lse, delta, K, V, lo, u_lo, bk, k_start, hk, offs_m, offs_dq, offs_dv, dq_mask,
        dv_mask, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, len_q, len_k,
        logit_scale, cap_log2, window_left, window_right, seed, rows_g, h, n_heads, rng_cols,
        dropout_p, dropout_scale, BLOCK_N, WINDOW_LEFT, WINDOW_RIGHT, SOFTCAP, DOT_PRECISION,
        True, DROPOUT, K_DESC, V_DESC, TMA,
    )  # fmt: skip
    dq = _dq_steps(
        dq, q, do, lse, delta, K, V, u_lo, u_hi, bk, k_start, hk, offs_m, offs_dq, offs_dv,
        dq_mask, dv_mask, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        len_q, len_k, logit_scale, cap_log2, window_left, window_right, seed, rows_g, h, n_heads,
        rng_cols, dropout_p, dropout_scale, BLOCK_N, WINDOW_LEFT, WINDOW_RIGHT, SOFTCAP,
        DOT_PRECISION, False, DROPOUT, K_DESC, V_DESC, TMA,
    )  # fmt: skip
    dq = _dq_steps(
        dq, q, do, lse, delta, K, V, u_hi, hi, bk, k_start, hk, offs_m, offs_dq, offs_dv, dq_mask,
        dv_mask, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, len_q, len_k,
        logit_scale, cap_log2, window_left, window_right, seed, rows_g, h, n_heads, rng_cols,
        dropout_p, dropout_scale, BLOCK_N, WINDOW_LEFT, WINDOW_RIGHT, SOFTCAP, DOT_PRECISION,
        True, DROPOUT, K_DESC, V_DESC, TMA,
    )  # fmt: skip

    tl.store(DQ + bq.to(tl.int64) * stride_dqb + rows[:, None] * stride_dqs + h * stride_dqh
             + offs_dq[None, :], (dq * scale).to(DQ.dtype.element_ty),
             mask=m_mask[:, None] & dq_mask[None, :])  # fmt: skip


# How a decode split program finishes (the COMBINE constexpr of _decode_split_kernel).
DECODE_PARTIAL = 0  # write its partial only; _decode_reduce_kernel combines (two launches)
DECODE_LAST = 1  # write its partial; the last program of its rows to finish combines them
DECODE_DIRECT = 2  # the only split: write OUT and LSE itself


@triton.jit
def _decode_merge_start(SINK, heads, r_mask, BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr,
                        HAS_SINK: tl.constexpr):  # fmt: skip
    # The running (max, sum, output) of a merge by log-sum-exps, natural units. The sink is a
    # logit of its own: the max starts there with a sum of exp(0) = 1 and no output.
    if HAS_SINK:
        m_i = tl.load(SINK + heads, mask=r_mask, other=0.0).to(tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    else:
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    return m_i, l_i, acc


@triton.jit
def _decode_merge(m_i, l_i, acc, lse_s, out_s):
    # One split (normalised output out_s, log-sum-exp lse_s, -inf where it saw no key) merged.
    m_new = tl.maximum(m_i, lse_s)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    weight = tl.exp(lse_s - m_safe)
    acc = acc * alpha[:, None] + weight[:, None] * out_s
    l_i = l_i * alpha + weight
    return m_new, l_i, acc


@triton.jit
def _decode_merge_store(m_i, l_i, acc, OUT, LSE, b, offs_i, heads, r_mask, offs_dv, dv_mask,
                        stride_ob, stride_os, stride_oh, stride_lb, stride_lh):  # fmt: skip
    # A row with no mass (no key, no sink) gets output 0 and log-sum-exp +inf.
    has_mass = l_i > 0.0
    out = acc / tl.where(has_mass, l_i, 1.0)[:, None]
    lse = tl.where(has_mass, m_i + tl.log(tl.where(has_mass, l_i, 1.0)), float("inf"))
    o_rows = b.to(tl.int64) * stride_ob + offs_i * stride_os + heads * stride_oh
    tl.store(OUT + o_rows[:, None] + offs_dv[None, :], out.to(OUT.dtype.element_ty),
             mask=r_mask[:, None] & dv_mask[None, :])  # fmt: skip
    tl.store(LSE + b.to(tl.int64) * stride_lb + heads * stride_lh + offs_i, lse, mask=r_mask)


@triton.jit
def _decode_combine(
    OUT_P, LSE_P, SINK, OUT, LSE, pid_bh, b, offs_r, offs_i, heads, r_mask, offs_dv, dv_mask,
    stride_ob, stride_os, stride_oh, stride_lb, stride_lh, n_rows, num_splits,
    HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr,
    HAS_SINK: tl.constexpr,
):  # fmt: skip
    # Every split's partial of these rows (and the sink) merged in split order, whichever
    # program runs it, so the result is deterministic. The loads skip L1 (.cg): in the fused
    # path other SMs wrote the partials during this launch, and a line of them in this SM's L1
    # could be stale.
    m_i, l_i, acc = _decode_merge_start(SINK, heads, r_mask, BLOCK_M, BLOCK_DV, HAS_SINK)
    for split in range(0, num_splits):
        part = (pid_bh * num_splits + split).to(tl.int64) * n_rows + offs_r
        lse_s = tl.load(LSE_P + part, mask=r_mask, other=float("-inf"), cache_modifier=".cg")
        out_s = tl.load(OUT_P + part[:, None] * HEAD_DIM_V + offs_dv[None, :],
                        mask=r_mask[:, None] & dv_mask[None, :], other=0.0,
                        cache_modifier=".cg")  # fmt: skip
        m_i, l_i, acc = _decode_merge(m_i, l_i, acc, lse_s, out_s)
    _decode_merge_store(m_i, l_i, acc, OUT, LSE, b, offs_i, heads, r_mask, offs_dv, dv_mask,
                        stride_ob, stride_os, stride_oh, stride_lb, stride_lh)  # fmt: skip


@triton.jit
def _decode_split_kernel(
    Q, K, V, OUT_P, LSE_P, SEQUSED_K, BLOCK_TABLE, SINK, OUT, LSE, COUNTERS, CACHE_LEFTPAD,
    KEY_MASK,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_bt, stride_km,
    stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
    seqlen_q, n_kv_heads, group, num_splits,
    logit_scale, cap_log2, window_left, window_right,
    HEAD_DIM_QK: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
    WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, SOFTCAP: tl.constexpr,
    HAS_SINK: tl.constexpr, DOT_PRECISION: tl.constexpr, COMBINE: tl.constexpr,
    LEFTPAD: tl.constexpr, KEY_PADDING: tl.constexpr,
):  # fmt: skip
    # Flash-decoding: one program per (split of the keys, tile of rows, batch x kv head).
    # Its rows are every query of every query head of one kv head (row r: query r // group,
    # head hk * group + r % group), so that a block of keys and values is read once for the
    # whole group. It writes its split's normalised output and log-sum-exp (-inf where it saw
    # no key) to OUT_P / LSE_P; what combines the splits is the COMBINE mode's (DECODE_*).
    split = tl.program_id(0)
    tile = tl.program_id(1)
    pid_bh = tl.program_id(2)
    b = pid_bh // n_kv_heads
    hk = pid_bh % n_kv_heads
    len_k = tl.load(SEQUSED_K + b).to(tl.int32)
    n_rows = seqlen_q * group
    offs_r = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    r_mask = offs_r < n_rows
    # Rows past n_rows get a query index >= seqlen_q, which _mask hides.
    offs_i = offs_r // group
    heads = hk * group + offs_r % group
    offs_dq = tl.arange(0, BLOCK_DQK)
    offs_dv = tl.arange(0, BLOCK_DV)
    dq_mask = offs_dq < HEAD_DIM_QK
    dv_mask = offs_dv < HEAD_DIM_V
    q_rows = b.to(tl.int64) * stride_qb + offs_i * stride_qs + heads * stride_qh
    q = tl.load(Q + q_rows[:, None] + offs_dq[None, :], mask=r_mask[:, None] & dq_mask[None, :],
                other=0.0)  # fmt: skip

    # The keys any row may see are [lo, len_k) (the queries are the cache's newest rows, so a
    # right window ends at len_k); the splits share them in chunks of whole key blocks.
    lo = 0
    if WINDOW_LEFT:
        lo = (tl.maximum(len_k - seqlen_q - window_left, 0) // BLOCK_N) * BLOCK_N
    k_first = 0
    if LEFTPAD:  # a left-padded cache: its keys start at k_first
        k_first = tl.load(CACHE_LEFTPAD + b).to(tl.int32)
        lo = tl.maximum(lo, (k_first // BLOCK_N) * BLOCK_N)
    blocks = tl.cdiv(len_k - lo, BLOCK_N)
    chunk = tl.cdiv(blocks, num_splits) * BLOCK_N
    start = lo + split * chunk
    end = tl.minimum(start + chunk, len_k)

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    # Pointer loads (TMA off: K and V stand in for the descriptors, unread).
    m_i, l_i, acc = _fwd_steps(
        q, m_i, l_i, acc, K, V, BLOCK_TABLE, start, end, b, b, 0, hk, offs_i, offs_dq, offs_dv,
        dq_mask, dv_mask, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        stride_bt, seqlen_q, len_k, logit_scale, cap_log2, window_left, window_right, k_first,
        KEY_MASK + b.to(tl.int64) * stride_km, 0, offs_i, 0, 1, 1, 0.0, 1.0, BLOCK_N, PAGED,
        PAGE_SIZE, WINDOW_LEFT, WINDOW_RIGHT, SOFTCAP, DOT_PRECISION, True, False, LEFTPAD,
        KEY_PADDING, K, V, False,
    )  # fmt: skip
    has_mass = l_i > 0.0
    out = acc / tl.where(has_mass, l_i, 1.0)[:, None]
    lse = tl.where(has_mass, m_i * LN2 + tl.log(tl.where(has_mass, l_i, 1.0)), float("-inf"))
    if COMBINE == 2:  # DECODE_DIRECT
        # The one split is merged with the sink here, by the same arithmetic as the combine of
        # a partial read back (so the result equals the two-kernel path's bit for bit).
        m_c, l_c, acc_c = _decode_merge_start(SINK, heads, r_mask, BLOCK_M, BLOCK_DV, HAS_SINK)
        m_c, l_c, acc_c = _decode_merge(m_c, l_c, acc_c, lse, out)
        _decode_merge_store(
            m_c, l_c, acc_c, OUT, LSE, b, offs_i, heads, r_mask, offs_dv, dv_mask, stride_ob,
            stride_os, stride_oh, stride_lb, stride_lh,
        )  # fmt: skip
    else:
        part = (pid_bh * num_splits + split).to(tl.int64) * n_rows + offs_r
        tl.store(OUT_P + part[:, None] * HEAD_DIM_V + offs_dv[None, :], out,
                 mask=r_mask[:, None] & dv_mask[None, :])  # fmt: skip
        tl.store(LSE_P + part, lse, mask=r_mask)
        if COMBINE == 1:  # DECODE_LAST
            # The split-K semaphore: a counter per (tile, batch x kv head) that each split's
            # program bumps once its partial is stored; the one that sees num_splits - 1 is the
            # last, and every other split's partial is visible to it. The barrier orders every
            # thread's stores before the atomic, which one thread runs (its result reaches the
            # others through shared memory, behind another barrier): its release publishes the
            # stores at GPU scope, and in the last program its acquire orders the reads of the
            # combine after every other program's release. That program puts the counter back
            # to 0 for the next launch (a CUDA graph's replays included, where nothing on the
            # host could zero it).
            tl.debug_barrier()
            counter = COUNTERS + pid_bh * tl.num_programs(1) + tile
            arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            if arrived == num_splits - 1:
                _decode_combine(
                    OUT_P, LSE_P, SINK, OUT, LSE, pid_bh, b, offs_r, offs_i, heads, r_mask,
                    offs_dv, dv_mask, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
                    n_rows, num_splits, HEAD_DIM_V, BLOCK_DV, BLOCK_M, HAS_SINK,
                )  # fmt: skip
                tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")


@triton.jit
def _decode_reduce_kernel(
    OUT_P, LSE_P, SINK, OUT, LSE,
    stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
    seqlen_q, n_kv_heads, group, num_splits,
    HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr,
    HAS_SINK: tl.constexpr,
):  # fmt: skip
    # Flash-decoding's second launch (DECODE_PARTIAL): each row's splits (and its sink)
    # combined by their log-sum-exps, as the fused path's last program does.
    tile = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // n_kv_heads
    hk = pid_bh % n_kv_heads
    n_rows = seqlen_q * group
    offs_r = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    r_mask = offs_r < n_rows
    offs_i = offs_r // group
    heads = hk * group + offs_r % group
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_mask = offs_dv < HEAD_DIM_V
    _decode_combine(
        OUT_P, LSE_P, SINK, OUT, LSE, pid_bh, b, offs_r, offs_i, heads, r_mask, offs_dv, dv_mask,
        stride_ob, stride_os, stride_oh, stride_lb, stride_lh, n_rows, num_splits, HEAD_DIM_V,
        BLOCK_DV, BLOCK_M, HAS_SINK,
    )  # fmt: skip
