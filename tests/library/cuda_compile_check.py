"""Compile every Triton kernel of our kernel repositories for a CUDA GPU, without one.

    python -m tests.library.cuda_compile_check [--arch 90]    (from the repository root)

The CPU tests run the kernels through Triton's interpreter, which executes their Python: it
cannot see what only the compiler rejects (a loop that changes a variable's dtype, a branch
that yields different types, a shape the layout cannot take). This script calls every op of
the repositories, forward and backward, at widths that take each code path, with the launch
helper replaced by one that only records the launch; then it compiles each distinct
(kernel, argument types, constexprs, warps) for a CUDA target with Triton's own compiler
(LLVM and ptxas, which ship with Triton), exactly as a GPU would. It must run without
``TRITON_INTERPRET`` (that makes ``triton.jit`` build interpreter functions, which cannot be
compiled); ``test_cuda_compile.py`` runs it in a subprocess.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime.jit import JITFunction, mangle_type

from tests.support.library import load

#: Shared memory a block may have, in bytes, by compute capability (CUDA's programming guide:
#: 227 KB on sm_90, 163 KB on sm_80).
SHARED_MEMORY = {90: 232448, 80: 166912}

TYPES = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.int32: "i32",
    torch.int64: "i64",
}


def _recording_launch(launches: list):
    def launch(kernel, grid, args, num_warps, device, num_stages=None):
        launches.append((kernel, tuple(args), num_warps, num_stages))  # None: Triton's default

    return launch


def _patch_launch(package, launches: list) -> None:
    """Replace ``launch`` in every module of ``package`` (each imports it from ``_library``)."""
    original = sys.modules[f"{package.__name__}._library"].launch
    recording = _recording_launch(launches)
    for name, module in list(sys.modules.items()):
        if name.startswith(package.__name__) and getattr(module, "launch", None) is original:
            module.launch = recording


def _grad(out, inputs):
    outs = out if isinstance(out, (tuple, list)) else (out,)
    torch.autograd.grad(outs, inputs, [torch.ones_like(o) for o in outs], allow_unused=True)


def _run_norm(norm) -> None:
    # Widths that take each forward and backward path: packed narrow rows, one pass, the chunked
    # forwards (RMSNorm's whole 8 KB chunks; LayerNorm's power-of-two chunks, its normalising
    # pass unrolled, or looped at 9216; bf16 rows of 4096 with many rows), rows past
    # MAX_ONE_PASS (ragged and whole); fp32 and bf16 (fp16 compiles as bf16 does).
    for dtype in (torch.float32, torch.bfloat16):
        for width in (64, 3000, 4096, 5120, 8192, 9216, 20000, 32768):
            rows = 16384 if width == 4096 and dtype == torch.bfloat16 else 3
            x = torch.zeros(rows, width, dtype=dtype, requires_grad=True)
            r = torch.zeros(rows, width, dtype=dtype, requires_grad=True)
            w = torch.zeros(width, dtype=dtype, requires_grad=True)
            b = torch.zeros(width, dtype=dtype, requires_grad=True)
            _grad(norm.rms_norm(x, w, 1e-6), (x, w))
            _grad(norm.gemma_rms_norm(x, w, 1e-6), (x, w))
            _grad(norm.fused_add_rms_norm(x, r, w, 1e-6), (x, r, w))
            _grad(norm.layer_norm(x, (width,), w, b, 1e-5), (x, w, b))
            if width in (3000, 8192):
                _grad(norm.layer_norm(x, (width,), w, None, 1e-5), (x, w))
                _grad(norm.layer_norm(x, (width,), None, None, 1e-5), (x,))


def _run_activation(activation) -> None:
    elementwise = ("silu", "gelu", "gelu_tanh", "new_gelu", "fast_gelu", "quick_gelu")
    gated = ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul")
    two_inputs = ("silu_mul", "gelu_mul", "gelu_tanh_mul")
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.zeros(3, 1000, dtype=dtype, requires_grad=True)
        gate = torch.zeros(3, 1000, dtype=dtype, requires_grad=True)
        for name in elementwise:
            _grad(getattr(activation, name)(x), (x,))
        for name in gated:
            _grad(getattr(activation, name)(x), (x,))
        for name in two_inputs:
            _grad(getattr(activation, name)(gate, x), (gate, x))
    _run_decode_mlp(activation)


def _run_decode_mlp(activation) -> None:
    # The decode-size MLP's kernels with the configurations the rule picks on an H100 (132 SMs)
    # at the benchmark's shapes: one row (multiply-adds) and eight (tl.dot), each with and
    # without split-K; biases and tanh GELU once. Weights are expanded views: only the launch
    # arguments matter here.
    decode = sys.modules[f"{activation.__name__}.decode_mlp"]
    for dtype in (torch.float16, torch.bfloat16):
        for hidden, inter in ((2048, 5632), (4096, 14336)):
            gate_w = torch.empty(1, hidden, dtype=dtype).expand(inter, hidden)
            down_w = torch.empty(1, inter, dtype=dtype).expand(hidden, inter)
            for m in (1, 8):
                x = torch.zeros(m, hidden, dtype=dtype)
                h = torch.zeros(m, inter, dtype=dtype)
                config = decode.gemv_config(m, inter, hidden, True, 132)
                decode.gated_gemv(x, gate_w, None, gate_w, None, 0, config)
                decode.gemv(h, down_w, None, decode.gemv_config(m, hidden, inter, False, 132))
                decode.gated_gemv(x, gate_w, None, gate_w, None, 0, config._replace(split_k=2))
            # q, k and v of a grouped-query attention (hidden -> hidden, 256, 256) in one launch.
            q_w = torch.empty(1, hidden, dtype=dtype).expand(hidden, hidden)
            kv_w = torch.empty(1, hidden, dtype=dtype).expand(256, hidden)
            for m in (1, 8):
                x = torch.zeros(m, hidden, dtype=dtype)
                decode.grouped_linear_decode(x, (q_w, kv_w, kv_w), None)
        # The folded decoder layer's variants (kernels.generation.folded_layers): the norm in
        # q/k/v's and gate/up's prologue, the residual in o_proj's and down's epilogue, at the
        # 1.1B model's sizes (bf16 only: the variants differ by constexprs the dtype does not
        # touch, and each compile costs CI a second).
        if dtype == torch.bfloat16:
            _run_decode_folds(decode, dtype)
        x = torch.zeros(3, 64, dtype=dtype)
        w, b = torch.zeros(96, 64, dtype=dtype), torch.zeros(96, dtype=dtype)
        decode.grouped_linear_decode(x, (w, w[:32], w[:16]), (b, b[:32], b[:16]))
        for split in (1, 2):
            for dot in (False, True):
                config = decode.GemvConfig(16, 32, split, 4, 2, dot)
                decode.gated_gemv(x, w, b, w, b, 2, config)
                decode.gemv(x, w, b, config)


def _run_decode_folds(decode, dtype) -> None:
    hidden, inter, kv = 2048, 8192, 512
    gate_w = torch.empty(1, hidden, dtype=dtype).expand(inter, hidden)
    down_w = torch.empty(1, inter, dtype=dtype).expand(hidden, inter)
    q_w = torch.empty(1, hidden, dtype=dtype).expand(hidden, hidden)
    kv_w = torch.empty(1, hidden, dtype=dtype).expand(kv, hidden)
    norm = torch.zeros(hidden, dtype=dtype)
    for m in (1, 8):
        x, h = torch.zeros(m, hidden, dtype=dtype), torch.zeros(m, inter, dtype=dtype)
        decode.grouped_linear_decode(x, (q_w, kv_w, kv_w), None, norm_weight=norm, eps=1e-5)
        decode.gemv(x, q_w, None, residual=x)  # o_proj
        decode.gated_gemv(x, gate_w, None, gate_w, None, 0, norm_weight=norm, eps=1e-5)
        decode.gemv(h, down_w, None, residual=x)


def _run_rotary(rotary) -> None:
    # Without the interpreter, rotary hands CPU tensors to PyTorch; here they go to the kernel.
    sys.modules[f"{rotary.__name__}.rotary"]._CPU_RUNS_KERNELS = True
    for dtype in (torch.float32, torch.bfloat16):
        for heads, kv_heads, head_dim in ((32, 8, 128), (5, 1, 96)):
            q = torch.zeros(2, heads, 7, head_dim, dtype=dtype, requires_grad=True)
            k = torch.zeros(2, kv_heads, 7, head_dim, dtype=dtype, requires_grad=True)
            cos = torch.zeros(2, 7, head_dim, dtype=dtype)
            sin = torch.zeros(2, 7, head_dim, dtype=dtype)
            _grad(rotary.apply_rotary_pos_emb(q, k, cos, sin), (q, k))
    # The KV-cache write, both position forms (a counter as transformers 5.x keeps, int64
    # positions as 4.57 passes), at a decode step's size.
    sys.modules[f"{rotary.__name__}.kv_cache"]._CPU_RUNS_KERNELS = True
    for dtype in (torch.float32, torch.bfloat16):
        cache = torch.zeros(8, 8, 256, 128, dtype=dtype)
        new = torch.zeros(8, 1, 8, 128, dtype=dtype).transpose(1, 2)
        rotary.write_kv_cache(cache, cache, new, new, counter=torch.zeros((), dtype=torch.long))
        rotary.write_kv_cache(cache, cache, new, new, positions=torch.zeros(1, dtype=torch.long))


def _run_loss(loss) -> None:
    # Without the interpreter, the loss hands CPU tensors to PyTorch; here they go to the
    # kernels, with the GPU's blocks and warps. One pass and two passes over vocabulary tiles,
    # with and without soft-capping and smoothing, gradients in the forward (mean), recomputed
    # (none) and none at all; the same kernels on logits; int32 labels.
    ops = sys.modules[f"{loss.__name__}.fused_linear_cross_entropy"]
    ops._CPU_RUNS_KERNELS = True
    ops.CPU_BLOCK, ops.CPU_BLOCK_WARPS = ops.BLOCK, ops.BLOCK_WARPS
    for dtype in (torch.float32, torch.bfloat16):
        h = torch.zeros(6, 64, dtype=dtype, requires_grad=True)
        w = torch.zeros(5000, 64, dtype=dtype, requires_grad=True)
        b = torch.zeros(5000, dtype=dtype, requires_grad=True)
        x = torch.zeros(6, 5000, dtype=dtype, requires_grad=True)
        y = torch.zeros(6, dtype=torch.long)
        for softcap, smoothing in ((None, 0.0), (30.0, 0.1)):
            options = {"softcap": softcap, "label_smoothing": smoothing}
            for vocab_chunk in (None, 2048):
                fused = functools.partial(loss.fused_linear_cross_entropy, vocab_chunk=vocab_chunk)
                _grad(fused(h, w, y, b, **options), (h, w, b))
                _grad(fused(h, w, y.int(), reduction="none", **options), (h, w))
                with torch.no_grad():
                    fused(h, w, y, **options)
            for reduction in ("mean", "none"):
                _grad(loss.cross_entropy(x, y, reduction=reduction, **options), (x,))


def _attention_cases(full: bool) -> list[tuple]:
    """The dense calls: (tensor descriptors, dtype, (q/k, v) head dims, causal, every mask option,
    backward). ``full``: every combination (about 120 variants, 6 to 10 minutes on two cores);
    else one call a code path (about 40 variants, about a minute): pointers and descriptors,
    the three dot precisions, a padded head dimension, the largest tile (256), unequal dims,
    every option at once, the backward's two dk/dv layouts (by head dim)."""
    if not full:
        bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
        return [
            (False, bf16, (128, 128), True, False, True),
            (True, bf16, (128, 128), True, True, True),
            (True, bf16, (80, 80), False, False, False),
            (False, fp32, (64, 64), True, False, True),
            (True, bf16, (64, 64), True, False, True),
            (False, bf16, (256, 256), True, False, False),
            (True, fp16, (192, 128), False, False, False),
        ]
    cases = []
    for tma in (False, True):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for dims in ((64, 64), (80, 80), (128, 128), (256, 256), (192, 128)):
                if dtype != torch.bfloat16 and dims[0] not in (64, 128):
                    continue
                cases += [(tma, dtype, dims, causal, False, True) for causal in (False, True)]
                if dims[0] == 128:
                    cases.append((tma, dtype, dims, True, True, True))
    return cases


def _run_attention(attention, full: bool = False) -> None:
    # The attention launcher takes the GPU's tiles, dot precision and split counts for these CPU
    # tensors (``_takes_gpu_path``), on an H100's 132 SMs, and its launches are recorded with
    # their stages. The dense calls of `_attention_cases`; packed batches, dropout, a paged
    # cache, a left-padded one, a padding mask; the decode path in one launch (several
    # splits), its direct form (one split) and its two launches; and the backward where asked.
    ops = sys.modules[f"{attention.__name__}._ops"]
    ops._takes_gpu_path = lambda device: True
    ops.multiprocessors = lambda device: 132
    ops._has_tma = lambda device: True
    # ops.launch is the recording one (_patch_launch), which _run calls with warps and stages.
    f = attention.flash_attn_func
    everything = {"window_size": (64, 0), "softcap": 30.0, "s_aux": torch.zeros(8)}
    for tma, dtype, (dim, dim_v), causal, options, backward in _attention_cases(full):
        ops._FORWARD_TMA = ops._BACKWARD_TMA = tma
        shapes = ((2, 80, 8, dim), (2, 80, 2, dim), (2, 80, 2, dim_v))
        q, k, v = (torch.zeros(shape, dtype=dtype, requires_grad=backward) for shape in shapes)
        out = f(q, k, v, causal=causal, **(everything if options else {}))
        if backward:
            _grad(out, (q, k, v))
    # The rest as an H100 would run them (the forward's descriptors by head dim).
    ops._FORWARD_TMA = ops._BACKWARD_TMA = None
    # One query, or one key: the backward walks a length Triton compiles as the constant 1.
    for seqlen_q, seqlen_k in ((1, 80), (80, 1)):
        shapes = ((2, seqlen_q, 8, 128), (2, seqlen_k, 2, 128), (2, seqlen_k, 2, 128))
        q, k, v = (torch.zeros(shape, dtype=torch.bfloat16, requires_grad=True)
                   for shape in shapes)  # fmt: skip
        _grad(f(q, k, v, causal=True), (q, k, v))
    packed = [torch.zeros(96, heads, 128, dtype=torch.bfloat16, requires_grad=True)
              for heads in (8, 2, 2)]  # fmt: skip
    cu = torch.tensor([0, 40, 96], dtype=torch.int32)
    _grad(attention.flash_attn_varlen_func(*packed, cu, cu, 56, 56, dropout_p=0.1), packed)
    if full:
        _grad(attention.flash_attn_varlen_func(*packed, cu, cu, 56, 56, causal=True), packed)
        q, k, v = (t.unflatten(0, (1, 96)) for t in packed)
        _grad(f(q, k, v, dropout_p=0.1, causal=True), packed)
    ops.dropout_keep_mask(torch.zeros(1, dtype=torch.int64), 80, 8, 96, 0.1)
    # A head dimension under 16 (tests' tiny models, fp32): Triton 3.6 compiles no tl.dot that
    # reduces over fewer than 16 (Triton 3.9 does), so the blocks are padded to 16.
    tiny = [torch.zeros(13, heads, 8, requires_grad=True) for heads in (4, 2, 2)]
    cu = torch.tensor([0, 8, 13], dtype=torch.int32)
    _grad(attention.flash_attn_varlen_func(*tiny, cu, cu, 8, 8, causal=True, window_size=(3, 3)),
          tiny)  # fmt: skip
    with torch.no_grad():
        attention.flash_attn_with_kvcache(tiny[0][None, :1], tiny[1][None], tiny[2][None],
                                          cache_seqlens=cu[1:2])  # fmt: skip
    with torch.no_grad():
        for dtype in (torch.bfloat16, torch.float16) if full else (torch.bfloat16,):
            q = torch.zeros(4, 1, 32, 128, dtype=dtype)
            cache = torch.zeros(4, 4096, 8, 128, dtype=dtype)
            used = torch.full((4,), 4000, dtype=torch.int32)
            for splits in (0, 1):
                attention.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=used,
                                                  num_splits=splits)  # fmt: skip
            # Batch 1: few programs, the wide decode tile (_tuning.DECODE_WIDE).
            attention.flash_attn_with_kvcache(q[:1], cache[:1], cache[:1], cache_seqlens=used[:1])
            every_option = everything | {"s_aux": torch.zeros(32)}
            attention.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=used, causal=True,
                                              **every_option)  # fmt: skip
            ops._DECODE_FUSED = False
            attention.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=used)
            ops._DECODE_FUSED = True
            # A left-padded cache: the decode step and a prefill of 40 queries (the forward).
            leftpad = torch.full((4,), 100, dtype=torch.int32)
            for queries in (q, torch.zeros(4, 40, 32, 128, dtype=dtype)):
                attention.flash_attn_with_kvcache(queries, cache, cache, cache_seqlens=used,
                                                  cache_leftpad=leftpad, causal=True)  # fmt: skip
                # A padding mask over the keys (transformers' 2-D mask), alone and, as our
                # transformers attention's decode step passes it, with the first kept keys.
                keep = torch.ones(4, 4096, dtype=torch.bool)
                attention.flash_attn_with_kvcache(queries, cache, cache, cache_seqlens=used,
                                                  key_padding_mask=keep, causal=True)  # fmt: skip
            attention.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=used, causal=True,
                                              cache_leftpad=leftpad, key_padding_mask=keep)  # fmt: skip
            # A paged cache of 256-token pages: the decode step and a prefill of 40 queries.
            pages = torch.zeros(64, 256, 8, 128, dtype=dtype)
            table = torch.arange(64, dtype=torch.int32).reshape(4, 16)
            attention.flash_attn_with_kvcache(q, pages, pages, cache_seqlens=used,
                                              block_table=table)  # fmt: skip
            prefill = torch.zeros(4, 40, 32, 128, dtype=dtype)
            attention.flash_attn_with_kvcache(prefill, pages, pages, cache_seqlens=used,
                                              block_table=table, causal=True)  # fmt: skip


def _signature(kernel, args) -> tuple[dict, dict]:
    """Triton's (signature, constexprs) for ``kernel`` called with ``args`` (all positional)."""
    signature, constexprs = {}, {}
    for param, value in zip(kernel.params, args, strict=True):
        name = param.name
        if param.is_constexpr:
            signature[name] = "constexpr"
            constexprs[name] = value
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + TYPES[value.dtype]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int) and mangle_type(value, True) == "constexpr":
            # As a launch does: Triton compiles an integer argument equal to 1 as that constant
            # (ptxas has crashed on variants only this specialization makes).
            signature[name] = "constexpr"
            constexprs[name] = value
        elif isinstance(value, int):
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
        elif isinstance(value, float):
            signature[name] = "fp32"
        elif type(value).__name__ == "TensorDescriptor":
            signature[name] = mangle_type(value)  # e.g. tensordesc<bf16[1, 64, 1, 128]>
        else:
            raise TypeError(f"{kernel.fn.__name__}: argument {name} = {value!r}")
    return signature, constexprs


#: Each repository's calls, which make every launch to compile.
RUNS = {
    "norm": _run_norm,
    "activation": _run_activation,
    "rotary": _run_rotary,
    "loss": _run_loss,
    "attention": _run_attention,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability, e.g. 90")
    parser.add_argument("--repos", nargs="+", choices=RUNS, help="these repositories only")
    parser.add_argument(
        "--full", action="store_true",
        help="attention: every combination of options (minutes), not one call a code path",
    )  # fmt: skip
    parser.add_argument("--verbose", action="store_true", help="each variant's compile time")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET"):
        sys.exit("run without TRITON_INTERPRET: interpreter functions cannot be compiled")
    launches: list = []
    kernels = set()  # every kernel the packages define (by our naming: ``_..._kernel``)
    runs = RUNS | {"attention": functools.partial(_run_attention, full=args.full)}
    for name, run in runs.items():
        if args.repos and name not in args.repos:
            continue
        package = load(name)
        _patch_launch(package, launches)
        run(package)
        for module_name, module in list(sys.modules.items()):
            if module_name.startswith(package.__name__):
                kernels |= {value.fn for key, value in vars(module).items()
                            if key.endswith("_kernel") and isinstance(value, JITFunction)}  # fmt: skip
    missed = sorted(f.__name__ for f in kernels - {launch[0].fn for launch in launches})
    if missed:
        print(f"FAILED: no call above launches {', '.join(missed)}; add one that does")
        return 1
    variants = {}
    for kernel, call_args, num_warps, num_stages in launches:
        signature, constexprs = _signature(kernel, call_args)
        options = {"num_warps": num_warps}
        if num_stages is not None:
            options["num_stages"] = num_stages
        key = (kernel.fn, tuple(signature.items()), tuple(constexprs.items()), *options.values())
        variants.setdefault(key, (kernel, signature, constexprs, options))
    target = GPUTarget("cuda", args.arch, 32)
    shared_limit = SHARED_MEMORY.get(args.arch)
    start = time.perf_counter()
    for kernel, signature, constexprs, options in variants.values():
        source = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
        began = time.perf_counter()
        try:
            compiled = triton.compile(source, target=target, options=options)
        except Exception as error:
            print(f"FAILED {kernel.fn.__name__} {constexprs} {options}\n{error}")
            return 1
        # A GPU refuses to load a kernel wanting more shared memory than a block may have
        # (Triton's OutOfResources at the first launch); the compiler itself does not check.
        if shared_limit is not None and compiled.metadata.shared > shared_limit:
            print(f"FAILED {kernel.fn.__name__} {constexprs} {options}: "
                  f"{compiled.metadata.shared} bytes of shared memory, sm_{args.arch} has "
                  f"{shared_limit} a block")  # fmt: skip
            return 1
        if args.verbose:
            flags = {k: v for k, v in constexprs.items() if not isinstance(v, bool) or v}
            print(f"{time.perf_counter() - began:6.1f} s  {kernel.fn.__name__} {flags} {options}")
    print(f"compiled {len(variants)} variants of {len(kernels)} kernels for sm_{args.arch} "
          f"({len(launches)} launches recorded) in {time.perf_counter() - start:.0f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
