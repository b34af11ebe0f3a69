"""Workloads for `kernels benchmark library/activation`: our Triton kernels against PyTorch.

Each workload times the kernel (``benchmark_<workload>``) and the PyTorch expression it replaces
(``verify_<workload>``, also the reference its output is checked against), in float16 (bf16's
rounding is coarser than the 0.01 tolerance of the check). On a GPU the shapes are a
Llama-8B-sized MLP's (4096 tokens, intermediate size 14336); on a CPU the kernels run through
Triton's interpreter (TRITON_INTERPRET=1), which is slow, so the shapes are small there and the
timings say nothing about a GPU.
"""

import torch
import torch.nn.functional as F

from kernels.benchmark import Benchmark


def _shape(device: str, gpu: tuple[int, int], cpu: tuple[int, int]) -> tuple[int, int]:
    return gpu if device == "cuda" else cpu


class SiLUWorkloads(Benchmark):
    """The element-wise activation of an MLP's gate (transformers' ``SiLUActivation``)."""

    seed = 0

    def setup(self):
        rows, cols = _shape(self.device, (4096, 14336), (16, 256))
        self.x = torch.randn(rows, cols, device=self.device, dtype=torch.float16)

    def benchmark_silu(self):
        self.out = self.kernel.silu(self.x)

    def verify_silu(self):
        return F.silu(self.x)

    def benchmark_gelu_tanh(self):
        self.out = self.kernel.gelu_tanh(self.x)

    def verify_gelu_tanh(self):
        return F.gelu(self.x, approximate="tanh")


class GatedWorkloads(Benchmark):
    """``act(x[..., :d]) * x[..., d:]`` (vLLM's layout), one kernel instead of three ops."""

    seed = 0

    def setup(self):
        rows, cols = _shape(self.device, (4096, 2 * 14336), (16, 512))
        self.x = torch.randn(rows, cols, device=self.device, dtype=torch.float16)

    def benchmark_silu_and_mul(self):
        self.out = self.kernel.silu_and_mul(self.x)

    def verify_silu_and_mul(self):
        gate, up = self.x.chunk(2, dim=-1)
        return F.silu(gate) * up

    def benchmark_gelu_and_mul(self):
        self.out = self.kernel.gelu_and_mul(self.x)

    def verify_gelu_and_mul(self):
        gate, up = self.x.chunk(2, dim=-1)
        return F.gelu(gate) * up


if __name__ == "__main__":
    from pathlib import Path

    from kernels.cli import main

    raise SystemExit(main(["benchmark", str(Path(__file__).resolve().parents[1])]))
