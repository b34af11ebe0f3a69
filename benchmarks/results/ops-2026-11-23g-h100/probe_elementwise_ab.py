"""Element-wise backward: 8 warps (before) against the new configuration, GeluTanh and SiLU."""
import sys
sys.path.insert(0, "benchmarks")
import torch
import ops

lib = ops.load_library()
ew = sys.modules[lib["activation"].__name__ + ".elementwise"]
new = ew._launch_config
old = lambda n: (min(4096, max(128, 1 << (n - 1).bit_length())), 8)
stream = torch.cuda.Stream()
copy = ops.copy_bandwidth()
print(f"copy {copy:.0f} GB/s; new config at 64M elements: {new(64 << 20)}")
with torch.cuda.stream(stream), torch.no_grad():
    for rows, cols in ((4096, 4096), (16384, 4096), (8192, 8192), (32768, 8192)):
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn_like(x)
        for act, code in (("gelu_tanh", 2), ("silu", 0)):
            for label, cfg in (("8 warps (before)", old), ("new", new), ("8 warps again", old), ("new again", new)):
                ew._launch_config = cfg
                f = ops._graph_ms(lambda: ew.activation_forward(x, code), stream, 100)
                b = ops._graph_ms(lambda: ew.activation_backward(dy, x, code), stream, 100)
                n = x.numel() * 2
                print(f"{rows}x{cols} {act:9s} {label:18s} fwd {f*1e3:6.1f} us {100*2*n/f/1e6/copy:5.1f}%  bwd {b*1e3:6.1f} us {100*3*n/b/1e6/copy:5.1f}%", flush=True)
        ew._launch_config = new
