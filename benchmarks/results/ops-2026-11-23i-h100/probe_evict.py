"""Norm forward, eviction hints (working tree) against the library without them (.whl/old),
beside compile and one element-wise kernel moving the same bytes: CUDA graphs, L2 cleared,
alternating rounds on one VM."""
import os, sys, statistics, torch
sys.path.insert(0, "benchmarks")
import ops, kernels

def load(root):
    return {n: kernels.get_local_kernel(os.path.join(root, n), n) for n in ("norm",)}

new, old = ops.load_library(), load(".whl/old/library")
print(torch.cuda.get_device_name(), torch.__version__)
stream = torch.cuda.Stream()
with torch.cuda.stream(stream):
    for op in ("RMSNorm", "LayerNorm"):
        for rows, cols in ops.NORM_SHAPES + [(16384, 5120)]:
            torch._dynamo.reset()
            (x,), params, fns, moved, _ = ops.norm_case(op, new, None, rows, cols)
            mod = fns["eager"]
            layer = getattr(old["norm"].layers, op)
            calls = {"new": fns["ours"], "old": ops.bound(layer, mod), "compile": fns["compile"]}
            src = torch.zeros(moved // 4, device="cuda", dtype=torch.bfloat16); dst = torch.empty_like(src)
            def run(fn):
                def f():
                    with torch.no_grad():
                        fn(x)
                return f
            cs = {k: run(v) for k, v in calls.items()}
            cs["copy"] = lambda: torch.neg(src, out=dst)
            times = {k: [] for k in cs}
            for r in range(3):
                for k, c in cs.items():
                    times[k].append(ops._graph_ms(c, stream, 60) * 1e3)
            med = {k: statistics.median(v) for k, v in times.items()}
            print(f"{op} {rows}x{cols}: " + "  ".join(f"{k} {v:6.1f} us" for k, v in med.items())
                  + f"  new/old {med['old'] / med['new']:.3f}  new vs compile {med['compile'] / med['new']:.3f}  new vs copy {med['copy'] / med['new']:.3f}", flush=True)
