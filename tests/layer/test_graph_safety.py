"""graph_safety and explain's ``graphs:`` line: which forwards would break a CUDA graph or a
torch.compile graph, and why, read from their source."""

from __future__ import annotations

import torch
import torch.nn as nn

from kernels import Mode, explain, use_kernel_forward_from_hub, use_kernel_mapping
from kernels.layer.graphs import graph_safety


def _host_read(x):
    return x * x.sum().item()


class _Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * float(x.max().cpu())

    @staticmethod
    def backward(ctx, grad):
        return grad


class Clean(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2


class ReadsItem(nn.Module):
    def forward(self, x):
        return _host_read(x)  # followed into the helper


class AppliesFunction(nn.Module):
    def forward(self, x):
        return _Scale.apply(x)


class BranchesOnData(nn.Module):
    def forward(self, x):
        if (x < 0).any():
            return x.clamp(min=0)
        return x


class MakesHostTensors(nn.Module):
    def forward(self, x):
        return x + torch.tensor([1.0, 2.0], device=x.device).sum()


class CallsOwnMethod(nn.Module):
    def forward(self, x):
        return self._helper(x)

    def _helper(self, x):
        return x.to("cpu")


class NoCompile(nn.Module):
    can_torch_compile = False

    def forward(self, x):
        return x


def test_a_clean_forward_is_safe_in_both():
    safety = graph_safety(Clean, None)
    assert (safety.cuda_graph, safety.torch_compile) == ("ok", "ok")
    assert str(safety).startswith("CUDA graph: ok; torch.compile: ok (read Clean.forward")


def test_host_reads_are_found_in_helpers_functions_and_methods():
    for module, what in [
        (ReadsItem, "item() reads a tensor's value on the host"),
        (AppliesFunction, "cpu() copies a tensor to the host"),
        (CallsOwnMethod, 'to("cpu") copies a tensor to the host'),
        (BranchesOnData, "a condition on any() reads a tensor's value on the host"),
    ]:
        safety = graph_safety(module, None)
        assert (safety.cuda_graph, safety.torch_compile) == ("breaks", "breaks"), module
        assert what in safety.why, safety.why
        assert "test_graph_safety.py:" in safety.why


def test_host_data_breaks_a_cuda_graph_only():
    safety = graph_safety(MakesHostTensors, None)
    assert (safety.cuda_graph, safety.torch_compile) == ("breaks", "ok")
    assert "torch.tensor() copies host data to the device" in safety.why


def test_a_kernel_without_can_torch_compile_breaks_compile_only():
    safety = graph_safety(Clean, NoCompile)
    assert (safety.cuda_graph, safety.torch_compile) == ("ok", "breaks")
    assert "NoCompile does not declare can_torch_compile = True" in safety.why


def test_a_forward_without_python_source_is_unknown():
    builtin = type("Builtin", (nn.Module,), {"forward": torch.relu})
    assert graph_safety(builtin, None).cuda_graph == "unknown"


def test_our_library_kernels_are_safe(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from kernels.library import load_library_package

    for repo, layers in [
        ("norm", ("RMSNorm", "LayerNorm", "FusedAddRMSNorm")),
        ("activation", ("SiLU", "SiluAndMul", "SwiGLUMLP")),
    ]:
        package = load_library_package(repo)
        for name in layers:
            safety = graph_safety(nn.Module, getattr(package.layers, name))
            assert (safety.cuda_graph, safety.torch_compile) == ("ok", "ok"), (name, safety)


@use_kernel_forward_from_hub("Tagged")
class Tagged(ReadsItem):
    pass


def test_explain_prints_a_graphs_line():
    model = nn.Sequential(nn.Linear(2, 2), Tagged())
    with use_kernel_mapping({}, inherit_mapping=False):
        report = explain(model, mode=Mode.INFERENCE, device="cpu")
    (layer,) = report.layers
    assert layer.outcome == "fallback"
    assert layer.graphs.startswith("CUDA graph: breaks; torch.compile: breaks (item()")
    assert "    graphs: CUDA graph: breaks" in str(report)
