"""Host cost per call at tiny shapes: all contenders (compile too), cProfile of ours, micro-costs."""
import cProfile, pstats, sys, time
sys.path.insert(0, "benchmarks")
import torch
import ops

lib, liger = ops.load_library(), ops.load_liger()

def host_us(fn, n=1000):
    for _ in range(50): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6

cases = {
    "RMSNorm": lambda: ops.norm_case("RMSNorm", lib, liger, 8, 256),
    "LayerNorm": lambda: ops.norm_case("LayerNorm", lib, liger, 8, 256),
    "SiluAndMul": lambda: ops.silu_mul_case(lib, liger, 8, 256),
    "SwiGLU": lambda: ops.swiglu_case(lib, liger, 8, 256),
    "GeluTanh": lambda: ops.gelu_tanh_case(lib, liger, 8, 256),
    "rotary": lambda: ops.rotary_case(lib, liger, 1, 16),
}
profiles = {}
for name, make in cases.items():
    inputs, params, fns, _, _ = make()
    calls = {impl: ops._calls(inputs, params, fn) for impl, fn in fns.items()}
    for impl, (fwd, fb) in calls.items():
        print(f"{name:10s} {impl:8s} fwd {host_us(fwd):6.1f} us  fwd+bwd {host_us(fb):6.1f} us", flush=True)
    profiles[name] = calls["ours"]
for name in ("RMSNorm", "SiluAndMul", "rotary"):
    fwd, fb = profiles[name]
    for label, c in (("fwd", fwd), ("fwd+bwd", fb)):
        p = cProfile.Profile(); p.enable()
        for _ in range(500): c()
        torch.cuda.synchronize(); p.disable()
        print(f"===== cProfile ours {name} {label}, 500 calls")
        pstats.Stats(p).sort_stats("tottime").print_stats(14)

x = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
class Id(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t): return t.view_as(t)
    @staticmethod
    def backward(ctx, g): return g
xg = x.clone().requires_grad_()
micro = {
    "torch.empty(shape,dtype,device)": lambda: torch.empty((8, 256), dtype=x.dtype, device=x.device),
    "torch.empty_like": lambda: torch.empty_like(x),
    "x.new_empty": lambda: x.new_empty((8, 256)),
    "torch.cuda.current_device()": torch.cuda.current_device,
    "torch._C._cuda_getDevice()": torch._C._cuda_getDevice,
    "x.data_ptr()": x.data_ptr,
    "x.stride(0)": lambda: x.stride(0),
    "x.is_contiguous()": x.is_contiguous,
    "x[:, :128]": lambda: x[:, :128],
    "x.view(-1, 256)": lambda: x.view(-1, 256),
    "x.reshape(-1, 256)": lambda: x.reshape(-1, 256),
    "torch.is_grad_enabled()": torch.is_grad_enabled,
    "torch.compiler.is_compiling()": torch.compiler.is_compiling,
    "Id.apply(xg)": lambda: Id.apply(xg),
    "autograd.grad(Id.apply(xg))": lambda: torch.autograd.grad(Id.apply(xg), [xg], x),
}
for k, f in micro.items():
    print(f"micro {k:34s} {host_us(f, 5000):7.2f} us", flush=True)
