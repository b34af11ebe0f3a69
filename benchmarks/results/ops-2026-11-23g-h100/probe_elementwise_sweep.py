"""Element-wise forward launch config sweep: GeluTanh and SiLU at 64M elements, CUDA graph and
plain do_bench (both clear L2 before each call)."""
import sys
sys.path.insert(0, "benchmarks")
import torch
from triton.testing import do_bench
import ops

lib = ops.load_library()
ew = sys.modules[lib["activation"].__name__ + ".elementwise"]
orig = ew._launch_config
stream = torch.cuda.Stream()
copy = ops.copy_bandwidth()
print(f"copy {copy:.0f} GB/s")
with torch.cuda.stream(stream), torch.no_grad():
    for rows, cols in ((16384, 4096), (8192, 8192)):
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        moved = 2 * x.numel() * 2
        for name, fn in (("gelu_tanh", lib["activation"].gelu_tanh), ("silu", lib["activation"].silu),
                         ("torch gelu", lambda t: torch.nn.functional.gelu(t, approximate="tanh"))):
            configs = [None] if name == "torch gelu" else [None, (1024, 4), (2048, 4), (2048, 8), (4096, 4), (4096, 16), (8192, 8), (8192, 16), (16384, 16)]
            for cfg in configs:
                ew._launch_config = orig if cfg is None else (lambda n, cfg=cfg: cfg)
                call = lambda: fn(x)
                g = ops._graph_ms(call, stream, 100)
                e = do_bench(call, warmup=25, rep=100, return_mode="median")
                label = "configured" if cfg is None else f"block {cfg[0]:5d} warps {cfg[1]:2d}"
                print(f"{rows}x{cols} {name:10s} {label:24s} graph {g*1e3:6.1f} us {100*moved/g/1e6/copy:5.1f}%  do_bench {e*1e3:6.1f} us {100*moved/e/1e6/copy:5.1f}%", flush=True)
        ew._launch_config = orig
