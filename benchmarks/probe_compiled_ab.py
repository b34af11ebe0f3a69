"""Is "ours (kernelized + compile)" a different program from "torch.compile"? An A/B/A' test.

    python benchmarks/probe_compiled_ab.py 8x512

Under ``torch.compile`` our norm, activation and rotary layers hand inductor their formula in
PyTorch ops (measured better than putting our kernels in the graph as opaque ops; see the
comments at ``is_compiling()`` in the library), so a kernelized model compiled should be the
same program as the plain model compiled. This probe times, on the same weights and in
interleaved rounds (``e2e.time_interleaved``): torch.compile, a second torch.compile of a second
copy of the model (the null: any difference between these two is noise), and ours kernelized
and compiled; in several batches of rounds, so that the spread shows. Then the profiler's device
time of a training step for each.
"""

from __future__ import annotations

import statistics
import sys

import e2e
import torch
from probe_step_split import device_ms

NULL = "torch.compile (second copy)"


def main(shape: str, batches: int = 4, rounds: int = 8) -> None:
    torch.manual_seed(0)
    state = {k: v.detach().clone() for k, v in e2e.build().state_dict().items()}
    makers = e2e.contender_makers(state)
    makers[NULL] = makers["torch.compile"]
    module_state = e2e.ModuleState()
    names = ("torch.compile", NULL, "ours (kernelized + compile)")
    contenders = e2e.build_contenders(makers, names, module_state)
    batch, seq = (int(v) for v in shape.split("x"))
    tokens = torch.randint(0, e2e.CONFIG["vocab_size"], (batch, seq), device="cuda")
    medians = {name: {"train_ms": [], "prefill_ms": []} for name in names}
    for b in range(batches):
        rows = e2e.time_interleaved(contenders, module_state, tokens, rounds, 3 if b == 0 else 1)
        for row in rows:
            for key in ("train_ms", "prefill_ms"):
                medians[row["contender"]][key].append(row[key])
    print(f"shape {shape}: medians of {batches} batches of {rounds} interleaved rounds")
    for name in names:
        model, own_state = contenders[name]
        module_state.restore(own_state)
        total, _ = device_ms(model, tokens)
        cells = "  ".join(
            f"{key[:-3]} {statistics.median(v):7.2f} ms [{min(v):.2f}, {max(v):.2f}]"
            for key, v in medians[name].items()
        )
        print(f"  {name:30s} {cells}  device/step {total:.2f} ms", flush=True)
    module_state.restore()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "8x512")
