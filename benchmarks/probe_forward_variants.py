"""Forward variants against the library's kernels and the peers (H200 probes, 2026-11-24;
results and conclusions in benchmarks/results/ops-2026-11-24b-h200/).

    python benchmarks/probe_forward_variants.py [norm] [gelu]

Each case's contenders run back to back in CUDA graphs replayed in interleaved rounds
(``ops.interleaved_graphs_ms``), beside torch.compile, Liger and a copy of the same bytes.

- norm: the norm forwards as the library runs them, and the same kernels with the weight (and
  bias) loaded beside the row instead of after its reductions. With PROBE_CONSTEXPR set, also
  the kernels with ``n_cols`` a constexpr; with PROBE_PERSISTENT, persistent forwards (a few
  programs per SM, each walking a run of rows with the backward's look-ahead); with
  PROBE_CHUNKED_SHIFT, a chunked two-pass LayerNorm. The last two lost everywhere. With
  PROBE_LN_CHUNKED, LayerNorm's chunked forward with pass 2's first chunk loaded before the
  reductions, and with one merged reduction. PROBE_ONLY (ops, comma-separated) picks cases;
  PROBE_NO_ROW leaves out the one-row kernels.
- gelu: the tanh-GELU forward and backward over launch configurations, a kernel of the same
  structure that only copies (the ceiling of the structure), and the sigmoid from
  ``ex2.approx`` and ``rcp.approx`` (fewer instructions than IEEE division).
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import sys
import tempfile

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ops  # noqa: E402
from diagnose import _swapped  # noqa: E402


def source_variant(kernel, replacements: list, tag: str):
    """A copy of ``kernel`` compiled from its source with each ``(old, new)`` of
    ``replacements`` applied (each must match), in the kernel's module's globals."""
    module = sys.modules[kernel.fn.__module__]
    source = inspect.getsource(kernel.fn)
    for old, new in replacements:
        assert old in source, (kernel.fn.__name__, old)
        source = source.replace(old, new, 1)
    header = (
        "import sys\n"
        f"globals().update({{k: v for k, v in vars(sys.modules[{module.__name__!r}]).items() "
        "if not k.startswith('__')})\n\n"
    )
    folder = tempfile.mkdtemp(prefix="probe_")
    name = f"{tag}_{kernel.fn.__name__}"
    path = os.path.join(folder, f"{name}.py")
    with open(path, "w") as f:
        f.write(header + source)
    spec = importlib.util.spec_from_file_location(f"probe_{name}", path)
    variant = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(variant)
    return getattr(variant, kernel.fn.__name__)


def constexpr_variant(kernel):
    """A copy of ``kernel`` with ``n_cols`` a constexpr."""
    return source_variant(kernel, [("    n_cols,\n", "    n_cols: tl.constexpr,\n")], "const")


# The one-pass forwards load the weight (and bias) after the row's reductions; Liger's RMSNorm
# loads it beside the row, so that its latency overlaps the row's.
RMS_W_EARLY = [
    (
        "        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)\n"
        "        tl.store(RSTD + rows, rstd, mask=row_mask)\n"
        "        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)\n",
        "        w = tl.load(W + cols, mask=col_mask, other=0.0)\n"
        "        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)\n"
        "        tl.store(RSTD + rows, rstd, mask=row_mask)\n"
        "        w = w.to(tl.float32)\n",
    )
]
LN_WB_EARLY = [
    (
        "        x = x.to(tl.float32)\n        mean = tl.sum(x, axis=1) / n_cols\n",
        "        if HAS_WEIGHT:\n"
        "            w_row = tl.load(W + cols, mask=col_mask, other=0.0)\n"
        "        if HAS_BIAS:\n"
        "            b_row = tl.load(B + cols, mask=col_mask, other=0.0)\n"
        "        x = x.to(tl.float32)\n        mean = tl.sum(x, axis=1) / n_cols\n",
    ),
    (
        "y = y * tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]",
        "y = y * w_row.to(tl.float32)[None, :]",
    ),
    (
        "y = y + tl.load(B + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]",
        "y = y + b_row.to(tl.float32)[None, :]",
    ),
]


# LayerNorm's chunked forward (2026-11-24c): pass 2's first chunk (x, weight, bias) loaded before
# the row's reductions, so that those loads are in flight while the program reduces; and the
# row's moments merged in one reduction of (mean, M2, count) triples (Chan's pairwise formula)
# instead of the mean's reduction and then the centred one.
LN_CHUNKED_PREFETCH = [
    (
        "        lane_count = WHOLE + in_tail.to(tl.float32)\n",
        "        first_x = tl.load(x_row + cols, eviction_policy='evict_first')\n"
        "        if HAS_WEIGHT:\n"
        "            first_w = tl.load(W + cols, eviction_policy='evict_last')\n"
        "        if HAS_BIAS:\n"
        "            first_b = tl.load(B + cols, eviction_policy='evict_last')\n"
        "        lane_count = WHOLE + in_tail.to(tl.float32)\n",
    ),
    (
        "        for start in range(0, CHUNKED_COLS, BLOCK_N):\n            c = start + cols\n",
        "        y0 = (first_x.to(tl.float32) - mean) * rstd\n"
        "        if HAS_WEIGHT:\n"
        "            y0 = y0 * first_w.to(tl.float32)\n"
        "        if HAS_BIAS:\n"
        "            y0 = y0 + first_b.to(tl.float32)\n"
        "        tl.store(Y + row * CHUNKED_COLS + cols, y0.to(Y.dtype.element_ty))\n"
        "        for start in range(BLOCK_N, CHUNKED_COLS, BLOCK_N):\n            c = start + cols\n",
    ),
]
LN_CHUNKED_MERGED = [
    (
        "        mean = tl.sum(lane_mean * lane_count, axis=0) / CHUNKED_COLS\n"
        "        spread = lane_mean - mean\n"
        "        m2 = tl.sum(lane_m2 + lane_count * spread * spread, axis=0)\n",
        "        mean, m2, _ = tl.reduce((lane_mean, lane_m2, lane_count), 0, _probe_merge)\n",
    )
]


@triton.jit
def _probe_merge(mean_a, m2_a, count_a, mean_b, m2_b, count_b):
    count = count_a + count_b
    share_b = count_b / count
    delta = mean_b - mean_a
    return mean_a + delta * share_b, m2_a + m2_b + delta * delta * count_a * share_b, count


# ---- persistent norm forwards ---------------------------------------------------------------


@triton.jit
def _load_step(X, rows, row_end, cols, col_mask, stride_x):
    # A step's rows of x in their stored dtype; rows past row_end are masked off.
    mask = (rows < row_end)[:, None] & col_mask[None, :]
    return tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)


@triton.jit
def _rms_scale(xhat, w, GEMMA: tl.constexpr, IN_DTYPE: tl.constexpr):
    # y before its final cast, in either semantics (the library's ``_scale``).
    if GEMMA:  # noqa: SIM108 (a constexpr branch)
        y = xhat * (w + 1.0)
    else:
        y = xhat.to(IN_DTYPE).to(tl.float32) * w
    return y


@triton.jit
def rms_fwd_persistent(X, W, Y, RSTD, n_rows, N: tl.constexpr, stride_x, eps, rows_per_program,
                       GEMMA: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    x = _load_step(X, row_start + tl.arange(0, ROWS), row_end, cols, col_mask, stride_x)
    for first in range(row_start, row_end, ROWS):
        rows = first + tl.arange(0, ROWS)
        next_x = _load_step(X, rows + ROWS, row_end, cols, col_mask, stride_x)
        row_mask = rows < row_end
        xf = x.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(xf * xf, axis=1) / N + eps)
        tl.store(RSTD + rows, rstd, mask=row_mask)
        y = _rms_scale(xf * rstd[:, None], w[None, :], GEMMA, X.dtype.element_ty)
        tl.store(
            Y + rows[:, None] * N + cols[None, :],
            y.to(Y.dtype.element_ty),
            mask=row_mask[:, None] & col_mask[None, :],
        )
        x = next_x


@triton.jit
def ln_fwd_persistent(X, W, B, Y, MEAN, RSTD, n_rows, N: tl.constexpr, stride_x, eps,
                      rows_per_program, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=col_mask, other=0.0).to(tl.float32)
    x = _load_step(X, row_start + tl.arange(0, ROWS), row_end, cols, col_mask, stride_x)
    for first in range(row_start, row_end, ROWS):
        rows = first + tl.arange(0, ROWS)
        next_x = _load_step(X, rows + ROWS, row_end, cols, col_mask, stride_x)
        row_mask = rows < row_end
        mask = row_mask[:, None] & col_mask[None, :]
        xf = x.to(tl.float32)
        mean = tl.sum(xf, axis=1) / N
        xc = tl.where(mask, xf - mean[:, None], 0.0)
        rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / N + eps)
        tl.store(MEAN + rows, mean, mask=row_mask)
        tl.store(RSTD + rows, rstd, mask=row_mask)
        y = xc * rstd[:, None] * w[None, :] + b[None, :]
        tl.store(Y + rows[:, None] * N + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
        x = next_x


@triton.jit
def ln_fwd_chunked_shift(X, W, B, Y, MEAN, RSTD, n_cols, stride_x, eps, CHUNK: tl.constexpr):
    # Two passes over the row in chunks, as RMSNorm's chunked forward: sums of (x - shift) and
    # (x - shift)^2 in one pass (the shift is the first chunk's mean, so that the variance
    # E[(x - shift)^2] - (mean - shift)^2 loses at most a digit: (mean - shift)^2 <= var * chunks),
    # then the normalising pass, whose reads mostly hit L2.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, CHUNK)
    mask = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0, eviction_policy="evict_last")
    x = x.to(tl.float32)
    shift = tl.sum(x, axis=0) / tl.minimum(n_cols, CHUNK)
    d = tl.where(mask, x - shift, 0.0)
    acc1 = d
    acc2 = d * d
    for start in range(CHUNK, n_cols, CHUNK):
        c = start + cols
        m = c < n_cols
        xi = tl.load(X + row * stride_x + c, mask=m, other=0.0, eviction_policy="evict_last")
        d = tl.where(m, xi.to(tl.float32) - shift, 0.0)
        acc1 += d
        acc2 += d * d
    s1 = tl.sum(acc1, axis=0) / n_cols
    var = tl.maximum(tl.sum(acc2, axis=0) / n_cols - s1 * s1, 0.0)
    mean = shift + s1
    rstd = tl.rsqrt(var + eps)
    tl.store(MEAN + row, mean)
    tl.store(RSTD + row, rstd)
    for start in range(0, n_cols, CHUNK):
        c = start + cols
        m = c < n_cols
        xi = tl.load(X + row * stride_x + c, mask=m, other=0.0, eviction_policy="evict_first")
        w = tl.load(W + c, mask=m, other=0.0, eviction_policy="evict_last").to(tl.float32)
        b = tl.load(B + c, mask=m, other=0.0, eviction_policy="evict_last").to(tl.float32)
        y = (xi.to(tl.float32) - mean) * rstd * w + b
        tl.store(Y + row * n_cols + c, y.to(Y.dtype.element_ty), mask=m)


def chunked_shift_call(module, x, chunk, warps):
    n_rows, n = x.shape
    y = torch.empty_like(x)
    mean = torch.empty(n_rows, device=x.device, dtype=torch.float32)
    rstd = torch.empty_like(mean)

    def call():
        ln_fwd_chunked_shift[(n_rows,)](
            x, module.weight, module.bias, y, mean, rstd, n, n, module.eps, chunk,
            num_warps=warps,
        )  # fmt: skip
        return y

    return call


def _persistent_configs(cols: int) -> list:
    """(programs per SM, warps, rows a step) with 8 to 64 elements a thread a step; none unless
    PROBE_PERSISTENT is set (they lost everywhere on the H200, 2026-11-24)."""
    if not os.environ.get("PROBE_PERSISTENT"):
        return []
    block = triton.next_power_of_2(cols)
    configs = []
    for rows in (1, 2):
        for warps in (4, 8, 16):
            for per_sm in (1, 2, 4):
                per_thread = rows * block // (32 * warps)
                if 8 <= per_thread <= 64 and rows * block <= 8192:
                    configs.append((per_sm, warps, rows))
    return configs


def persistent_call(op, module, x, config, norm_library):
    per_sm, warps, rows = config
    n_rows, n = x.shape
    block = triton.next_power_of_2(n)
    programs, rows_per_program = norm_library.persistent_grid(n_rows, rows, x.device, per_sm)
    rstd = torch.empty(n_rows, device=x.device, dtype=torch.float32)
    if op == "LayerNorm":
        y = torch.empty_like(x)
        mean = torch.empty_like(rstd)

        def call():
            ln_fwd_persistent[(programs,)](
                x, module.weight, module.bias, y, mean, rstd, n_rows, n, n, module.eps,
                rows_per_program, rows, block, num_warps=warps,
            )  # fmt: skip
            return y

        return call
    gemma = op == "GemmaRMSNorm"
    eps = module.eps if gemma else module.variance_epsilon
    y = torch.empty(x.shape, device=x.device, dtype=x.dtype)

    def call():
        rms_fwd_persistent[(programs,)](
            x, module.weight, y, rstd, n_rows, n, n, eps, rows_per_program, gemma, rows, block,
            num_warps=warps,
        )  # fmt: skip
        return y

    return call


# ---- one row a program, with scalar row addressing ------------------------------------------
# The library's one-pass forwards index [ROWS, BLOCK_N] tiles (int64 row offsets broadcast over
# the columns, a 2-D mask); with one row a program, as Liger's RMSNorm, the row's base is a
# scalar and each element costs a 32-bit column offset.


@triton.jit
def rms_fwd_row(X, W, Y, RSTD, n_cols, stride_x, eps, GEMMA: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(RSTD + row, rstd)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    y = _rms_scale(x * rstd, w, GEMMA, X.dtype.element_ty)
    tl.store(Y + row * n_cols + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def ln_fwd_row(X, W, B, Y, MEAN, RSTD, n_cols, stride_x, eps, HAS_BIAS: tl.constexpr,
               BLOCK_N: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    xc = tl.where(mask, x - mean, 0.0)
    rstd = tl.rsqrt(tl.sum(xc * xc, axis=0) / n_cols + eps)
    tl.store(MEAN + row, mean)
    tl.store(RSTD + row, rstd)
    y = xc * rstd * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y = y + tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * n_cols + cols, y.to(Y.dtype.element_ty), mask=mask)


def row_call(op, module, x, warps):
    n_rows, n = x.shape
    block = triton.next_power_of_2(n)
    rstd = torch.empty(n_rows, device=x.device, dtype=torch.float32)
    y = torch.empty_like(x)
    if op.startswith("LayerNorm"):
        mean = torch.empty_like(rstd)
        bias = module.bias if module.bias is not None else module.weight

        def call():
            ln_fwd_row[(n_rows,)](
                x, module.weight, bias, y, mean, rstd, n, n, module.eps,
                module.bias is not None, block, num_warps=warps,
            )  # fmt: skip
            return y

        return call
    gemma = op == "GemmaRMSNorm"
    eps = module.eps if gemma else module.variance_epsilon

    def call():
        rms_fwd_row[(n_rows,)](
            x, module.weight, y, rstd, n, n, eps, gemma, block, num_warps=warps
        )  # fmt: skip
        return y

    return call


NORM_CASES = [
    ("RMSNorm", (4096, 4096)),
    ("RMSNorm", (16384, 4096)),
    ("GemmaRMSNorm", (16384, 4096)),
    ("RMSNorm-widths", (16384, 5120)),
    ("LayerNorm", (4096, 4096)),
    ("LayerNorm", (16384, 4096)),
    ("LayerNorm", (8192, 8192)),
    ("LayerNorm", (32768, 8192)),
    ("LayerNorm-widths", (16384, 5120)),
    ("LayerNorm-nobias", (8192, 8192)),
]


def graph(name, calls):
    """``ops.back_to_back_graph(calls, 15)``, replayed once and synchronised at once, so that a
    faulting graph is named before anything else runs."""
    print(f"capturing {name}", flush=True)
    made = ops.back_to_back_graph(calls, 15)
    made[0].replay()
    torch.cuda.synchronize()
    return made


def _print_times(label, times, moved):
    best = min(times["compile"], times.get("liger", float("inf")))
    for name, ms in sorted(times.items(), key=lambda t: t[1]):
        print(f"{label} {name:34s} {ms * 1e3:7.1f} us {moved / ms / 1e6:6.0f} GB/s "
              f"{best / ms:6.3f}x best peer", flush=True)  # fmt: skip


def norm_variants(lib, liger):
    package = lib["norm"].__name__
    rms = sys.modules[package + ".rms_norm"]
    ln = sys.modules[package + ".layer_norm"]
    norm_library = sys.modules[package + "._library"]
    variants = {
        "rms": {},
        "ln": {},
    }
    if os.environ.get("PROBE_EARLY"):  # lost everywhere but the fused add (0.8%)
        variants["rms"]["w loaded early"] = source_variant(
            rms._rms_norm_fwd_kernel, RMS_W_EARLY, "early"
        )
        variants["ln"]["w, b loaded early"] = source_variant(
            ln._layer_norm_fwd_kernel, LN_WB_EARLY, "early"
        )
    if os.environ.get("PROBE_LN_CHUNKED"):
        ln._probe_merge = _probe_merge  # the variant's source finds it in the module's globals
        variants["ln"]["chunk 0 of pass 2 early"] = source_variant(
            ln._layer_norm_fwd_kernel, LN_CHUNKED_PREFETCH, "prefetch"
        )
        variants["ln"]["one merged reduction"] = source_variant(
            ln._layer_norm_fwd_kernel, LN_CHUNKED_MERGED, "merged"
        )
    if os.environ.get("PROBE_CONSTEXPR"):
        variants["rms"]["n_cols constexpr"] = constexpr_variant(rms._rms_norm_fwd_kernel)
        variants["ln"]["n_cols constexpr"] = constexpr_variant(ln._layer_norm_fwd_kernel)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.no_grad():
        only = [o for o in os.environ.get("PROBE_ONLY", "").split(",") if o]
        for op, (rows, cols) in NORM_CASES:
            if only and op not in only:
                continue
            torch._dynamo.reset()
            inputs, _, fns, moved, _ = ops.norm_case(op, lib, liger, rows, cols)
            graphs = {}
            for impl in ("compile", "liger", "ours"):
                if impl in fns:
                    graphs[impl] = graph(impl, [functools.partial(fns[impl], *inputs)])
            copies = ops.same_bytes_calls(moved, 1)
            graphs["copy of the same bytes"] = graph("copy of the same bytes", copies)
            is_ln = op.startswith("LayerNorm")
            target, attribute = (
                (ln, "_layer_norm_fwd_kernel") if is_ln else (rms, "_rms_norm_fwd_kernel")
            )
            module = fns["eager"]
            expected = module(*inputs)
            for label, kernel in variants["ln" if is_ln else "rms"].items():
                with _swapped(target, **{attribute: kernel}):
                    torch.testing.assert_close(fns["ours"](*inputs), expected, rtol=2e-2, atol=2e-2)
                    name = f"ours, {label}"
                    graphs[name] = graph(name, [functools.partial(fns["ours"], *inputs)])
            keep = []  # the probe calls' outputs must outlive their graphs
            if op != "FusedAddRMSNorm" and cols > 2048 and not os.environ.get("PROBE_NO_ROW"):
                for warps in (4, 8, 16):
                    call = row_call(op, module, inputs[0], warps)
                    keep.append(call)
                    torch.testing.assert_close(call(), expected, rtol=2e-2, atol=2e-2)
                    name = f"one row, scalar base, {warps}w"
                    graphs[name] = graph(name, [call])
            for config in _persistent_configs(cols):
                call = persistent_call(op, module, inputs[0], config, norm_library)
                keep.append(call)
                torch.testing.assert_close(call(), expected, rtol=2e-2, atol=2e-2)
                per_sm, warps, n = config
                graphs[f"persistent {per_sm}/SM {warps}w {n} rows"] = graph(
                    f"persistent {per_sm}/SM {warps}w {n} rows", [call]
                )
            if is_ln and os.environ.get("PROBE_CHUNKED_SHIFT"):
                for chunk, warps in ((2048, 8), (2048, 16), (4096, 8), (4096, 16)):
                    if chunk >= cols:
                        continue
                    call = chunked_shift_call(module, inputs[0], chunk, warps)
                    keep.append(call)
                    torch.testing.assert_close(call(), expected, rtol=2e-2, atol=2e-2)
                    name = f"chunked shift {chunk} {warps}w"
                    graphs[name] = graph(name, [call])
            _print_times(f"{op} fwd {rows}x{cols}", ops.interleaved_graphs_ms(graphs), moved)
            del graphs, inputs, fns, keep
            torch.cuda.empty_cache()


# ---- tanh-GELU -----------------------------------------------------------------------------


@triton.jit
def copy_kernel(X, Y, n_elements, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    tl.store(Y + offsets, tl.load(X + offsets, mask=mask, other=0.0), mask=mask)


@triton.jit
def _fast_sigmoid(v):
    # 1 / (1 + 2^(-v log2 e)) with the approximate exp2 and reciprocal (each one MUFU op).
    e = tl.inline_asm_elementwise(
        "ex2.approx.ftz.f32 $0, $1;", "=r,r", [v * -1.4426950408889634], dtype=tl.float32,
        is_pure=True, pack=1,
    )  # fmt: skip
    return tl.inline_asm_elementwise(
        "rcp.approx.ftz.f32 $0, $1;", "=r,r", [e + 1.0], dtype=tl.float32, is_pure=True, pack=1
    )


@triton.jit
def gelu_tanh_fast_kernel(X, Y, n_elements, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    y = x * _fast_sigmoid((x + 0.044715 * x * x * x) * 1.5957691216057308)
    tl.store(Y + offsets, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def gelu_tanh_streaming_kernel(X, Y, n_elements, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    x = tl.load(X + offsets, mask=mask, other=0.0, eviction_policy="evict_first")
    x = x.to(tl.float32)
    y = x * tl.sigmoid((x + 0.044715 * x * x * x) * 1.5957691216057308)
    tl.store(Y + offsets, y.to(Y.dtype.element_ty), mask=mask, cache_modifier=".cs")


GELU_FWD_CONFIGS = [(512, 2), (1024, 2), (1024, 4), (2048, 4), (4096, 4), (2048, 8), (4096, 8),
                    (4096, 16)]  # fmt: skip
GELU_BWD_CONFIGS = [(1024, 4), (2048, 4), (4096, 4), (2048, 8), (4096, 8), (4096, 16), (8192, 16)]
GELU_SHAPES = [(4096, 4096), (16384, 4096), (8192, 8192), (32768, 8192)]


def gelu_variants(lib, liger):
    activation = lib["activation"].__name__
    elementwise = sys.modules[activation + ".elementwise"]
    gelu_tanh = sys.modules[activation + "._functions"].GELU_TANH
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.no_grad():
        for rows, cols in GELU_SHAPES:
            torch._dynamo.reset()
            inputs, _, fns, moved, moved_bwd = ops.gelu_tanh_case(lib, liger, rows, cols)
            ours = functools.partial(fns["ours"], *inputs)
            expected = ours()
            graphs = {
                impl: graph(impl, [functools.partial(fns[impl], *inputs)])
                for impl in ("compile", "ours")
            }
            copies = ops.same_bytes_calls(moved, 1)  # its buffers must outlive the graph
            graphs["copy of the same bytes"] = graph("copy of the same bytes", copies)
            for block, warps in GELU_FWD_CONFIGS:
                config = {"_launch_config": lambda n, c=(block, warps): c}
                with _swapped(elementwise, **config):
                    graphs[f"block {block} {warps}w"] = graph(f"block {block} {warps}w", [ours])
                    if (block, warps) != (2048, 4):
                        continue
                    for name, kernel in (
                        ("copy structure", copy_kernel),
                        ("approx sigmoid", gelu_tanh_fast_kernel),
                    ):
                        with _swapped(elementwise, _activation_fwd_kernel=kernel):
                            if name != "copy structure":
                                torch.testing.assert_close(ours(), expected, rtol=1e-2, atol=1e-2)
                            graphs[f"{name}, block {block} {warps}w"] = graph(
                                f"{name}, block {block} {warps}w", [ours]
                            )
            _print_times(f"GeluTanh fwd {rows}x{cols}", ops.interleaved_graphs_ms(graphs), moved)
            # The backward launcher alone (reads x and dy, writes dx).
            x = inputs[0]
            dy = torch.randn_like(x)
            backward = functools.partial(elementwise.activation_backward, dy, x, gelu_tanh)
            copies_bwd = ops.same_bytes_calls(moved_bwd, 1)
            graphs = {"copy of the same bytes": graph("copy", copies_bwd)}
            graphs["ours"] = graph("ours", [backward])
            for block, warps in GELU_BWD_CONFIGS:
                config = {"_launch_config": lambda n, c=(block, warps): c}
                with _swapped(elementwise, **config):
                    graphs[f"block {block} {warps}w"] = graph(f"block {block} {warps}w", [backward])
            times = ops.interleaved_graphs_ms(graphs)
            times["compile"] = times["ours"]  # no peer here: ratios are against ours
            _print_times(f"GeluTanh bwd {rows}x{cols}", times, moved_bwd)
            del graphs, inputs, fns, copies, copies_bwd
            torch.cuda.empty_cache()


def main():
    parts = sys.argv[1:] or ["norm", "gelu"]
    lib = ops.load_library()
    liger = ops.load_liger()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    for part in parts:
        {"gelu": gelu_variants, "norm": norm_variants}[part](lib, liger)


if __name__ == "__main__":
    main()
