"""Rotary: (1) is the 1x4096 gap footprint (Liger rotates in place)? Time our kernel writing over
its inputs. (2) Do the eager-call rows pay cudaMalloc/cudaFree? Count device allocations.

The probe behind rotary-inplace-probe.txt (run from the repository root with Liger-Kernel on the
path; rearranged into functions for the linter since the run, the same calls in the same order).
"""

import sys

sys.path.insert(0, "benchmarks")
import ops  # noqa: E402
import torch  # noqa: E402

HEAD_DIM = 128


def cos_sin(batch, seq):
    # as ops.rotary_case builds them (its own live inside its lambdas)
    inv = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2, device="cuda").float() / HEAD_DIM))
    freqs = torch.arange(seq, device="cuda").float()[None, :, None] * inv
    emb = torch.cat((freqs, freqs), -1).expand(batch, seq, HEAD_DIM)
    return emb.cos().to(torch.bfloat16).contiguous(), emb.sin().to(torch.bfloat16).contiguous()


def footprint(lib, liger, rot, stream):
    for b, s in ops.ROTARY_SHAPES:
        (q, k), _, fns, moved, _ = ops.rotary_case(lib, liger, b, s)
        cos, sin = cos_sin(b, s)
        calls = {
            "liger (in place)": lambda f=fns["liger"], q=q, k=k: f(q, k),
            "ours": lambda f=fns["ours"], q=q, k=k: f(q, k),
            "ours kernel, in place": lambda q=q, k=k, c=cos, s_=sin: rot._launch(
                q, k, c, s_, q, k, 1, False
            ),
        }
        for name, call in calls.items():
            with torch.no_grad():
                ms = ops._graph_ms(call, stream, 100)
            print(
                f"rotary {b}x{s} fwd graph, L2 cleared: {name:24s} {ms * 1e3:6.1f} us "
                f"{moved / ms / 1e6:5.0f} GB/s",
                flush=True,
            )


def allocations(lib, liger):
    for b, s in ((4, 2048), (1, 4096)):
        (q, k), params, fns, _, _ = ops.rotary_case(lib, liger, b, s)
        fns.pop("eager")
        calls = {i: ops._calls([q, k], params, f)[1] for i, f in fns.items()}
        for subset in (list(calls), ["ours"], ["liger"]):
            before = torch.cuda.memory_stats().get("num_device_alloc", -1)
            times = ops.interleaved_ms({i: calls[i] for i in subset}, 100)
            after = torch.cuda.memory_stats().get("num_device_alloc", -1)
            timed = ", ".join(f"{i} {v * 1e3:.1f} us" for i, v in times.items())
            print(
                f"rotary {b}x{s} fwd+bwd eager calls {subset}: {timed}; "
                f"cudaMalloc calls {after - before}",
                flush=True,
            )


def main():
    lib, liger = ops.load_library(), ops.load_liger()
    rot = sys.modules[lib["rotary"].__name__ + ".rotary"]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        footprint(lib, liger, rot, stream)
        allocations(lib, liger)


if __name__ == "__main__":
    main()
