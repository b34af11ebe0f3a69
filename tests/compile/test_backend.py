"""The backend: downstream compilers, the report, graph pictures and text, graphs with module
calls, graph breaks and dynamic shapes."""

import shutil

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from kernels.compile import (
    DownstreamError,
    DrawingUnavailableError,
    KernelRegistry,
    KernelsBackend,
    kernels_backend,
)
from tests.support.compile import LlamaBlock, check_against_float64, on_device, randn


def test_inductor_downstream_trains():
    """Inductor (its C++ backend on the CPU) compiles the forward and backward around our ops,
    put into its graph with policy 'always'."""
    block = LlamaBlock()
    registry = KernelRegistry.library(policy="always")
    backend = kernels_backend(registry)  # downstream="inductor" by default
    assert backend.downstream_name == "inductor" and backend.downstream_fuses
    check_against_float64(block, torch.compile(block, backend=backend), randn(2, 4, 32))
    assert (backend.count("rms_norm"), backend.count("silu_mul")) == (2, 1)


def test_default_registry_is_the_library():
    backend = kernels_backend(downstream="eager")
    assert [e.pattern.name for e in backend.registry.entries()][:2] == ["rms_norm", "layer_norm"]
    with pytest.raises(TypeError, match="takes a KernelRegistry; got dict"):
        KernelsBackend({"relu": F.relu})


def test_unknown_downstream(library):
    with pytest.raises(DownstreamError, match="Unknown downstream compiler 'inductr'.*'inductor'"):
        kernels_backend(library, downstream="inductr")
    with pytest.raises(DownstreamError, match="inductor_options are for downstream='inductor'"):
        kernels_backend(library, downstream="eager", inductor_options={"max_autotune": True})
    with pytest.raises(DownstreamError, match="a backend name such as 'inductor' or a callable"):
        kernels_backend(library, downstream=3)
    with pytest.raises(DownstreamError, match=r"Unknown inductor option\(s\) max_autotun: "):
        kernels_backend(library, inductor_options={"max_autotun": True, "max_autotune": True})
    kernels_backend(library, inductor_options={"max_autotune": True, "triton.cudagraphs": False})


def test_cuda_graphs_option_picks_the_graph_replaying_downstream(library):
    """cuda_graphs=True: inductor with its CUDA-graph trees switched on; the uncompiled
    downstreams through Dynamo's cudagraphs backend, still counted as not fusing."""
    cudagraphs = torch._dynamo.lookup_backend("cudagraphs")
    backend = kernels_backend(library, cuda_graphs=True)
    assert backend.downstream_name == "inductor" and backend.downstream_fuses
    assert repr(backend).endswith("downstream='inductor', cuda_graphs=True)")
    for name in ("eager", "aot_eager"):
        backend = kernels_backend(library, downstream=name, cuda_graphs=True)
        # Traced by aot_autograd before capture: aot_eager's program, under either name.
        assert backend.downstream_name == "aot_eager" and not backend.downstream_fuses
        assert backend._downstream is cudagraphs
    assert kernels_backend(library, downstream="eager")._downstream is not cudagraphs
    kernels_backend(library, cuda_graphs=True, inductor_options={"triton.cudagraphs": True})


def test_cuda_graphs_option_errors(library):
    with pytest.raises(
        DownstreamError, match=r"contradicts inductor_options=\{'triton.cudagraphs'"
    ):
        kernels_backend(library, cuda_graphs=True, inductor_options={"triton.cudagraphs": False})
    with pytest.raises(DownstreamError, match="works with downstream 'inductor', 'eager' or 'aot"):
        kernels_backend(library, downstream=lambda gm, inputs: gm.forward, cuda_graphs=True)
    with pytest.raises(DownstreamError, match="works with downstream .* got 'cudagraphs'"):
        kernels_backend(library, downstream="cudagraphs", cuda_graphs=True)
    with pytest.raises(DownstreamError, match="cuda_graphs is True or False; got 'yes'"):
        kernels_backend(library, cuda_graphs="yes")


def test_cuda_graphs_with_eager_downstream_trains():
    """Our kernels in Dynamo's cudagraphs backend: aot_autograd traces them (forward and their
    registered backward); off the GPU the graphs are skipped and the graph runs as traced."""
    block = LlamaBlock()
    backend = kernels_backend(KernelRegistry.library(), downstream="eager", cuda_graphs=True)
    check_against_float64(block, torch.compile(block, backend=backend), randn(2, 4, 32))
    assert (backend.count("rms_norm"), backend.count("silu_mul")) == (2, 1), backend.report()
    assert "graph 0 (downstream aot_eager): " in backend.report()


def test_report_file(library, tmp_path):
    path = tmp_path / "out" / "report.txt"
    backend = kernels_backend(library, downstream="eager", report=path)
    block = on_device(LlamaBlock())
    compiled = torch.compile(block, backend=backend)
    compiled(randn(2, 4, 32))
    text = path.read_text()
    assert text == backend.report()
    lines = text.splitlines()
    assert lines[0] == "kernels.compile: 1 graph(s)"
    assert lines[2].startswith("graph 0 (downstream eager): ")
    assert "    rms_norm with library norm.rms_norm: 2" in lines
    assert "      torch.rms_norm at input_norm: rms_norm" in lines
    assert "    silu_mul with library activation.silu_mul: 1" in lines
    assert "      F.silu(gate) * up at mlp: silu, mul" in lines
    assert lines[-3:] == ["totals (replaced / left):", "  rms_norm: 2 / 0", "  silu_mul: 1 / 0"]
    # A second graph (float64: recompiled, nothing replaced) appends to the same report.
    compiled.double()(randn(2, 4, 32, dtype=torch.float64))
    text = path.read_text()
    assert "kernels.compile: 2 graph(s)" in text
    assert "  rms_norm: 2 / 2" in text
    assert "dtype float64 is not one the kernel takes" in text


def test_report_before_anything_compiled(library):
    assert kernels_backend(library).report() == "kernels.compile: no graph compiled yet\n"


def test_graph_text_needs_nothing(library, tmp_path):
    backend = kernels_backend(
        library, downstream="eager", draw=tmp_path / "graphs", draw_format="txt"
    )
    torch.compile(on_device(LlamaBlock()), backend=backend)(randn(2, 4, 32))
    before = (tmp_path / "graphs" / "graph0-before.txt").read_text()
    after = (tmp_path / "graphs" / "graph0-after.txt").read_text()
    # Code lines, not the source comments print_readable puts beside them.
    before, after = ([line for line in text.splitlines() if " = " in line and "#" not in line]
                     for text in (before, after))  # fmt: skip
    assert any("torch.rms_norm(" in line for line in before)
    assert not any("kernels_rms_norm(" in line for line in before)
    assert any("kernels_rms_norm(" in line for line in after)
    assert not any("torch.rms_norm(" in line for line in after)
    assert any("kernels_silu_mul(" in line for line in after)


def test_pictures_without_pydot_name_the_extra(library, monkeypatch, tmp_path):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "pydot" else real_find_spec(name, *a),
    )
    with pytest.raises(DrawingUnavailableError) as error:
        kernels_backend(library, draw=tmp_path)
    message = str(error.value)
    assert "needs the pydot package" in message
    assert "pip install 'kernels[draw]'" in message
    assert "apt-get install graphviz" in message
    assert "draw_format='txt'" in message
    assert isinstance(error.value, ImportError)


def test_pictures_without_graphviz_name_it(library, monkeypatch, tmp_path):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: object() if name == "pydot" else real_find_spec(name, *a),
    )
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(
        DrawingUnavailableError, match="Graphviz's `dot` program, which is not on PATH"
    ):
        kernels_backend(library, draw=tmp_path, draw_format="png")
    # The Graphviz source needs pydot alone.
    kernels_backend(library, draw=tmp_path, draw_format="dot")


def test_unknown_draw_format(library, tmp_path):
    with pytest.raises(ValueError, match="Unknown draw_format 'jpeg'"):
        kernels_backend(library, draw=tmp_path, draw_format="jpeg")


def test_pictures(library, tmp_path):
    pytest.importorskip("pydot")
    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot is not installed")
    backend = kernels_backend(library, downstream="eager", draw=tmp_path)
    torch.compile(on_device(LlamaBlock()), backend=backend)(randn(2, 4, 32))
    for stage in ("before", "after"):
        assert (tmp_path / f"graph0-{stage}.svg").read_text().lstrip().startswith("<?xml")


def test_module_calls_of_a_symbolic_trace(library):
    """Graphs made by ``torch.fx.symbolic_trace`` call modules (``call_module``) and carry no
    traced values: the backend propagates fake tensors through them and reads the weights of
    ``nn.RMSNorm`` and ``nn.LayerNorm`` through ``get_attr`` nodes."""
    model = nn.Sequential(
        nn.Linear(16, 16), nn.RMSNorm(16, eps=1e-5), nn.SiLU(), nn.LayerNorm(16), nn.GELU("tanh")
    ).to(randn(1).device)
    with torch.no_grad():
        model[1].weight.uniform_(0.5, 1.5)
        model[3].weight.uniform_(0.5, 1.5)
    gm = fx.symbolic_trace(model)
    assert {n.op for n in gm.graph.nodes} == {"placeholder", "call_module", "output"}
    x = randn(3, 16)
    backend = kernels_backend(library, downstream="eager")
    compiled = backend(gm, [x])
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)
    forms = sorted(r.form for r in backend.reports[0].replaced)
    assert forms == ["nn.GELU module", "nn.LayerNorm module", "nn.RMSNorm module", "nn.SiLU module"]


def test_graph_breaks_give_one_report_per_graph(library):
    def fn(x):
        x = F.silu(x)
        torch._dynamo.graph_break()
        return F.gelu(x)

    backend = kernels_backend(library, downstream="eager")
    x = randn(4, 8)
    torch.testing.assert_close(torch.compile(fn, backend=backend)(x), fn(x))
    assert [(r.graph_index, r.count()) for r in backend.reports] == [(0, 1), (1, 1)]
    assert backend.count() == 2


def test_dynamic_shapes(library):
    block = LlamaBlock()
    backend = kernels_backend(library, downstream="aot_eager")
    compiled = torch.compile(block, backend=backend, dynamic=True)
    for seq in (3, 5, 7):
        check_against_float64(block, compiled, randn(2, seq, 32))
    # Under dynamic=True Dynamo passes the norms' eps in as a graph input (read with .item()):
    # the kernels take it as it is, in every graph compiled.
    assert [(r.count(), r.kept_count()) for r in backend.reports] == [(3, 0)] * len(backend.reports)


def test_an_empty_registry_changes_nothing():
    backend = kernels_backend(KernelRegistry(), downstream="eager")
    x = randn(2, 4, 32)
    block = on_device(LlamaBlock())
    torch.testing.assert_close(torch.compile(block, backend=backend)(x), block(x))
    assert backend.count() == backend.kept_count() == 0
    assert "no pattern found" in backend.report()
