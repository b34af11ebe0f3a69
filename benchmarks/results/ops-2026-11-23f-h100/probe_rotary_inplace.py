"""Rotary: (1) is the 1x4096 gap footprint (Liger rotates in place)? time our kernel writing over
its inputs; (2) do the eager-call rows pay cudaMalloc/cudaFree? count device allocations."""
import sys
sys.path.insert(0, "benchmarks")
import torch
import ops

lib, liger = ops.load_library(), ops.load_liger()
rot = sys.modules[lib["rotary"].__name__ + ".rotary"]
stream = torch.cuda.Stream()
with torch.cuda.stream(stream):
    for b, s in ops.ROTARY_SHAPES:
        (q, k), _, fns, moved, _ = ops.rotary_case(lib, liger, b, s)
        cos = torch.ones(1); sin = torch.ones(1)
        # the case's cos/sin live in the lambdas; rebuild them as ops.rotary_case does
        inv = 1.0 / (10000 ** (torch.arange(0, 128, 2, device="cuda").float() / 128))
        fr = torch.arange(s, device="cuda").float()[None, :, None] * inv
        emb = torch.cat((fr, fr), -1).expand(b, s, 128)
        cos, sin = emb.cos().to(torch.bfloat16).contiguous(), emb.sin().to(torch.bfloat16).contiguous()
        calls = {
            "liger (in place)": lambda: fns["liger"](q, k),
            "ours": lambda: fns["ours"](q, k),
            "ours kernel, in place": lambda: rot._launch(q, k, cos, sin, q, k, 1, False),
        }
        for name, c in calls.items():
            with torch.no_grad():
                ms = ops._graph_ms(c, stream, 100)
            print(f"rotary {b}x{s} fwd graph, L2 cleared: {name:24s} {ms*1e3:6.1f} us {moved/ms/1e6:5.0f} GB/s", flush=True)
    # (2) eager fwd+bwd in interleaved rounds, as ops.py times them, with device allocations counted
    for b, s in ((4, 2048), (1, 4096)):
        (q, k), params, fns, _, _ = ops.rotary_case(lib, liger, b, s)
        fns.pop("eager")
        calls = {i: ops._calls([q, k], params, f)[1] for i, f in fns.items()}
        for subset in (list(calls), ["ours"], ["liger"]):
            before = torch.cuda.memory_stats().get("num_device_alloc", -1)
            t = ops.interleaved_ms({i: calls[i] for i in subset}, 100)
            after = torch.cuda.memory_stats().get("num_device_alloc", -1)
            print(f"rotary {b}x{s} fwd+bwd eager calls {subset}: " + ", ".join(f"{i} {v*1e3:.1f} us" for i, v in t.items()) + f"; cudaMalloc calls {after - before}", flush=True)
