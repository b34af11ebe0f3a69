"""Host cost per call, library at HEAD~ (old) against the working tree (new), beside Liger and
compile: tiny shapes (host-bound), interleaved rounds; then ops.py's eager-call timing at
4096x4096 for the same contenders."""
import os, statistics, sys, time, types
sys.path.insert(0, "benchmarks")
import torch
import kernels
import ops

def load(root):
    return {n: kernels.get_local_kernel(os.path.join(root, n), n) for n in ("activation", "norm", "rotary")}

new, old = ops.load_library(), load(".whl/old/library")
liger = ops.load_liger()

def cases(rows, cols, batch, seq):
    out = {}
    for name, make in (
        ("RMSNorm", lambda lib: ops.norm_case("RMSNorm", lib, liger, rows, cols)),
        ("LayerNorm", lambda lib: ops.norm_case("LayerNorm", lib, liger, rows, cols)),
        ("SiluAndMul", lambda lib: ops.silu_mul_case(lib, liger, rows, cols)),
        ("SwiGLU", lambda lib: ops.swiglu_case(lib, liger, rows, cols)),
        ("GeluTanh", lambda lib: ops.gelu_tanh_case(lib, liger, rows, cols)),
        ("rotary", lambda lib: ops.rotary_case(lib, liger, batch, seq)),
    ):
        inputs, params, fns, bf, bb = make(new)
        fns_old = make(old)[2]
        fns["old"] = fns_old["ours"]
        # the old one bound to the same module/inputs: rebuild from the same case objects
        if name in ("RMSNorm", "LayerNorm"):
            mod = fns["eager"]
            layer = getattr(old["norm"].layers, name)
            fns["old"] = ops.bound(layer, mod)
        elif name in ("SiluAndMul", "GeluTanh"):
            fns["old"] = ops.bound(getattr(old["activation"].layers, name), fns["eager"])
        out[name] = (inputs, params, fns, bf, bb)
    return out

def host_us(fn, n=300):
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6

print("== host us per call, 8x256 (rotary 1x16), median of 7 interleaved rounds")
for name, (inputs, params, fns, _, _) in cases(8, 256, 1, 16).items():
    calls = {impl: ops._calls(inputs, params, fn) for impl, fn in fns.items()}
    res = {impl: ([], []) for impl in calls}
    for r in range(7):
        for impl, (f, fb) in calls.items():
            res[impl][0].append(host_us(f)); res[impl][1].append(host_us(fb, 150))
    line = "  ".join(f"{impl} {statistics.median(a):6.1f}/{statistics.median(b):6.1f}" for impl, (a, b) in res.items())
    print(f"{name:10s} fwd/fwd+bwd: {line}", flush=True)

print("== eager calls (ops.interleaved_ms), 4096x4096 (rotary 1x4096), us")
for name, (inputs, params, fns, bf, bb) in cases(4096, 4096, 1, 4096).items():
    stream = torch.cuda.Stream(); stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        calls = {impl: ops._calls(inputs, params, fn) for impl, fn in fns.items()}
        tf = ops.interleaved_ms({i: c[0] for i, c in calls.items()}, 300)
        tb = ops.interleaved_ms({i: c[1] for i, c in calls.items()}, 300)
    torch.cuda.current_stream().wait_stream(stream)
    line = "  ".join(f"{i} {tf[i]*1e3:6.1f}/{tb[i]*1e3:6.1f}" for i in calls)
    print(f"{name:10s} fwd/fwd+bwd: {line}", flush=True)
