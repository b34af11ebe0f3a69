"""Workloads for `kernels benchmark library/norm`: our Triton kernels against PyTorch.

Each workload times the kernel (``benchmark_<workload>``) and the PyTorch code it replaces
(``verify_<workload>``: transformers' eager formula, also the reference the output is checked
against), in float16 (bf16's rounding is coarser than the 0.01 tolerance of the check). On a GPU
the shapes are a Llama-8B-sized layer's (4096 tokens, hidden size 4096); on a CPU the kernels run
through Triton's interpreter (TRITON_INTERPRET=1), which is slow, so the shapes are small there
and the timings say nothing about a GPU.
"""

import torch
import torch.nn.functional as F

from kernels.benchmark import Benchmark

EPS = 1e-6


def llama_rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """transformers' ``LlamaRMSNorm.forward``."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    return weight * h.to(x.dtype)


class NormWorkloads(Benchmark):
    seed = 0

    def setup(self):
        rows, hidden = (4096, 4096) if self.device == "cuda" else (16, 256)
        options = {"device": self.device, "dtype": torch.float16}
        self.x = torch.randn(rows, hidden, **options)
        self.residual = torch.randn(rows, hidden, **options)
        self.weight = 1 + 0.1 * torch.randn(hidden, **options)
        self.bias = 0.1 * torch.randn(hidden, **options)

    def benchmark_rms_norm(self):
        self.out = self.kernel.rms_norm(self.x, self.weight, EPS)

    def verify_rms_norm(self):
        return llama_rms_norm(self.x, self.weight)

    def benchmark_fused_add_rms_norm(self):
        # The normalised sum; the sum itself (the new residual) is checked by the tests.
        self.out = self.kernel.fused_add_rms_norm(self.x, self.residual, self.weight, EPS)[0]

    def verify_fused_add_rms_norm(self):
        return llama_rms_norm(self.x + self.residual, self.weight)

    def benchmark_layer_norm(self):
        shape = self.x.shape[-1:]
        self.out = self.kernel.layer_norm(self.x, shape, self.weight, self.bias, EPS)

    def verify_layer_norm(self):
        return F.layer_norm(self.x, self.x.shape[-1:], self.weight, self.bias, EPS)


if __name__ == "__main__":
    from pathlib import Path

    from kernels.cli import main

    raise SystemExit(main(["benchmark", str(Path(__file__).resolve().parents[1])]))
