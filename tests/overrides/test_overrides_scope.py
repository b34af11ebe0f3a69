"""Turning the overrides on and off: the scope, nesting, the process-wide switch, exact
restoration of PyTorch's dispatch tables (also after an exception), threads, and the errors
users meet."""

import inspect
import logging
import os
import threading

import pytest
import torch
import torch.nn.functional as F

from kernels import KernelMappingError, KernelsError
from kernels.overrides import (
    FAMILIES,
    OVERRIDES,
    OverrideSpec,
    active_aten_overrides,
    aten_override_calls,
    default_overrides,
    disable_aten_overrides,
    enable_aten_overrides,
    registry,
    use_aten_overrides,
)
from kernels.overrides.loading import activation_kernels, norm_kernels
from kernels.overrides.table import resolve_overrides
from tests.support.overrides import (
    DEVICE,
    DISPATCH_KEY,
    dispatch_tables,
    kernel_source,
    paths,
    randn,
)

DEVICE_TYPE = "cuda" if DEVICE == "cuda" else "cpu"


def _silu_then_layer_norm(x, w, b):
    return F.layer_norm(F.silu(x), (x.shape[-1],), w, b)


def _inputs():
    x = randn(3, 5, 37)
    return x, randn(37, shift=1.0), randn(37)


# ---- the scope --------------------------------------------------------------------------------


def test_a_scope_overrides_and_leaving_it_restores_the_dispatch_tables_exactly():
    x, w, b = _inputs()
    before_tables = dispatch_tables()
    before = _silu_then_layer_norm(x, w, b)
    with use_aten_overrides(ops=["silu", "layer_norm"]) as overridden:
        assert overridden == (
            "native_layer_norm",
            "native_layer_norm_backward",
            "silu",
            "silu_backward",
        )
        assert "kernels/overrides/registry.py" in kernel_source("silu")
        during = _silu_then_layer_norm(x, w, b)
    assert paths("silu") == {"ours": 1} and paths("native_layer_norm") == {"ours": 1}
    assert dispatch_tables() == before_tables
    assert "kernels/overrides" not in kernel_source("silu")
    # PyTorch's kernels compute again: bitwise the output of before the scope.
    assert torch.equal(_silu_then_layer_norm(x, w, b), before)
    torch.testing.assert_close(during, before, rtol=1e-5, atol=1e-5)


def test_leaving_a_scope_through_an_exception_restores_the_tables():
    before = dispatch_tables()
    with pytest.raises(RuntimeError, match="inside the scope"):
        with use_aten_overrides(ops=["silu", "gelu", "layer_norm"]):
            assert active_aten_overrides()
            raise RuntimeError("inside the scope")
    assert active_aten_overrides() == {}
    assert dispatch_tables() == before


def test_the_original_kernel_is_the_one_pytorch_had_before():
    # What fall-through calls is torch.library.get_kernel's answer from before our registration.
    pytorch_kernel = kernel_source("gelu")
    with use_aten_overrides(ops=["gelu"]):
        assert kernel_source("gelu") != pytorch_kernel
        x = randn(4, 9, dtype=torch.float64)  # fp64: our kernels do not take it
        assert torch.equal(F.gelu(x), torch.ops.aten.gelu.default(x))
    assert paths("gelu") == {"dtype float64": 2}
    assert kernel_source("gelu") == pytorch_kernel


def test_scopes_nest_and_the_outermost_exit_restores():
    before = dispatch_tables()
    with use_aten_overrides(ops=["layer_norm"]):
        with use_aten_overrides(ops=["layer_norm", "silu"]) as inner:
            assert set(inner) == {
                "native_layer_norm", "native_layer_norm_backward", "silu", "silu_backward"
            }  # fmt: skip
            assert set(active_aten_overrides()) == set(inner)
        # The inner scope adds; leaving it removes only what it alone held.
        assert set(active_aten_overrides()) == {"native_layer_norm", "native_layer_norm_backward"}
        assert "kernels/overrides" in kernel_source("native_layer_norm")
        assert "kernels/overrides" not in kernel_source("silu")
        with use_aten_overrides(ops=["layer_norm"]):  # the same operators again
            pass
        assert "kernels/overrides" in kernel_source("native_layer_norm")
    assert dispatch_tables() == before


def test_an_operator_is_registered_once_however_many_scopes_hold_it():
    with use_aten_overrides(ops=["silu"]), use_aten_overrides(ops=["silu"]):
        dump = torch._C._dispatch_dump("aten::silu")
        ours = [line for line in dump.splitlines() if "kernels/overrides/registry.py" in line]
        assert len(ours) == 1


def test_the_switch_stays_on_until_disabled():
    before = dispatch_tables()
    assert enable_aten_overrides(ops="silu") == ("silu", "silu_backward")
    F.silu(randn(5))
    assert paths("silu") == {"ours": 1}
    assert active_aten_overrides() == {"silu": (DEVICE_TYPE,), "silu_backward": (DEVICE_TYPE,)}
    disable_aten_overrides()
    disable_aten_overrides()  # off already: nothing to do
    assert dispatch_tables() == before


def test_enabling_again_replaces_the_switchs_set():
    enable_aten_overrides(ops=["silu", "gelu"])
    enable_aten_overrides(ops=["gelu"])
    assert set(active_aten_overrides()) == {"gelu", "gelu_backward"}
    disable_aten_overrides()
    assert active_aten_overrides() == {}


def test_the_switch_and_scopes_hold_their_own_overrides():
    before = dispatch_tables()
    enable_aten_overrides(ops=["silu"])
    with use_aten_overrides(ops=["silu", "gelu"]):
        disable_aten_overrides()  # the switch lets go; the scope still holds silu
        assert set(active_aten_overrides()) == {"silu", "silu_backward", "gelu", "gelu_backward"}
    assert dispatch_tables() == before
    with use_aten_overrides(ops=["gelu"]):
        enable_aten_overrides(ops=["gelu"])
    assert set(active_aten_overrides()) == {"gelu", "gelu_backward"}  # the switch's, still on
    disable_aten_overrides()
    assert dispatch_tables() == before


# ---- which operators ------------------------------------------------------------------------


def test_default_overrides_are_the_ones_faster_than_aten():
    assert default_overrides() == tuple(s for s in OVERRIDES if s.faster_than_aten)
    assert resolve_overrides(None) == default_overrides()
    for spec in OVERRIDES:
        assert spec.evidence and spec.reached_by
    # The benchmarks saved so far put LayerNorm ahead (docs/overrides.md has the numbers).
    assert {s.op for s in default_overrides()} == {
        "native_layer_norm",
        "native_layer_norm_backward",
    }
    with use_aten_overrides() as overridden:
        assert overridden == ("native_layer_norm", "native_layer_norm_backward")


def test_families_and_operator_names():
    assert FAMILIES == ("layer_norm", "rms_norm", "silu", "gelu")
    assert [s.op for s in resolve_overrides("rms_norm")] == [
        "_fused_rms_norm", "_fused_rms_norm_backward"
    ]  # fmt: skip
    # A family's name takes its backward along; "aten::" names the operator alone.
    assert [s.op for s in resolve_overrides(["silu"])] == ["silu", "silu_backward"]
    assert [s.op for s in resolve_overrides(["aten::silu"])] == ["silu"]
    assert [s.op for s in resolve_overrides(["gelu_backward", "native_layer_norm"])] == [
        "native_layer_norm", "gelu_backward"
    ]  # fmt: skip
    assert resolve_overrides([]) == ()


def test_an_unknown_name_is_an_error_naming_the_known_ones():
    with pytest.raises(KernelMappingError) as error:
        with use_aten_overrides(ops=["layer_norm", "softmax"]):
            pass
    message = str(error.value)
    assert "'softmax'" in message
    for name in (*FAMILIES, "native_layer_norm_backward", "_fused_rms_norm"):
        assert name in message
    assert active_aten_overrides() == {}  # nothing was registered
    with pytest.raises(KernelMappingError, match="strings"):
        enable_aten_overrides(ops=[F.silu])


def test_device_types():
    with pytest.raises(KernelMappingError, match="'cuda' and 'cpu'"):
        enable_aten_overrides(ops="silu", device_types="mps")
    # CUDA alone: on a CPU-only machine nothing is registered (PyTorch has no CUDA kernel there).
    with use_aten_overrides(ops="silu", device_types="cuda") as overridden:
        assert overridden == (("silu", "silu_backward") if DEVICE == "cuda" else ())


def test_cpu_needs_the_triton_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(KernelMappingError, match="TRITON_INTERPRET=1"):
        enable_aten_overrides(ops="silu", device_types=["cpu"])
    with use_aten_overrides(ops="silu") as overridden:  # default: CUDA only, then
        assert all(active_aten_overrides()[op] == ("cuda",) for op in overridden)


@pytest.mark.skipif(DEVICE != "cpu", reason="the CPU build's dispatch tables")
def test_an_operator_pytorch_has_no_kernel_for_is_left_alone(caplog):
    # PyTorch decomposes _fused_rms_norm above autograd on the CPU and has no CPU kernel for its
    # backward: registering one would change how autograd routes it.
    with caplog.at_level(logging.INFO, logger="kernels.overrides"):
        with use_aten_overrides(ops=["rms_norm", "silu"]) as overridden:
            assert overridden == ("silu", "silu_backward")
    assert "aten::_fused_rms_norm has no CPU kernel" in caplog.text


def _spec(op, load=norm_kernels, impl=None):
    def passthrough(kernels, original, keyset, *args, **kwargs):
        return original.call_boxed(keyset, *args, **kwargs)

    return OverrideSpec(op, "test", "a test", False, "a test", load, impl or passthrough)


def test_an_operator_missing_from_this_torch_is_skipped_and_logged(caplog):
    with caplog.at_level(logging.INFO, logger="kernels.overrides"):
        held = registry.acquire([_spec("no_such_operator_in_torch")], [DISPATCH_KEY])
    assert held == ()
    assert "aten::no_such_operator_in_torch does not exist in torch" in caplog.text


def test_registration_is_all_or_nothing():
    before = dispatch_tables()

    def broken_load():
        raise ImportError("triton is broken")

    specs = [_spec("silu", load=activation_kernels), _spec("gelu", load=broken_load)]
    with pytest.raises(ImportError, match="triton is broken"):
        registry.acquire(specs, [DISPATCH_KEY])
    assert registry.registered() == {}
    assert dispatch_tables() == before


def test_without_get_kernel_nothing_is_registered(monkeypatch):
    # torch before 2.9 has no torch.library.get_kernel: no exact way to call PyTorch's kernel.
    monkeypatch.delattr(torch.library, "get_kernel")
    with pytest.raises(KernelsError, match="torch 2.9 or newer"):
        enable_aten_overrides(ops="silu")
    assert registry.registered() == {}


def test_public_api_has_docstrings_and_signatures():
    for fn in (use_aten_overrides, enable_aten_overrides, disable_aten_overrides,
               active_aten_overrides, aten_override_calls):  # fmt: skip
        assert fn.__doc__
    parameters = inspect.signature(use_aten_overrides).parameters
    assert list(parameters) == ["ops", "device_types"]
    assert list(inspect.signature(enable_aten_overrides).parameters) == ["ops", "device_types"]


# ---- threads ----------------------------------------------------------------------------------


def test_the_dispatcher_is_process_wide_a_scope_in_one_thread_serves_all():
    opened, done = threading.Event(), threading.Event()

    def other_thread():
        with use_aten_overrides(ops=["silu"]):
            opened.set()
            done.wait(30)

    thread = threading.Thread(target=other_thread)
    thread.start()
    try:
        assert opened.wait(30)
        F.silu(randn(7))  # this thread's call runs our kernel: the override is not per thread
        assert paths("silu") == {"ours": 1}
    finally:
        done.set()
        thread.join()
    assert active_aten_overrides() == {}


def test_scopes_in_many_threads_leave_the_tables_restored():
    before = dispatch_tables()
    errors = []

    def worker(ops):
        try:
            for _ in range(5):
                with use_aten_overrides(ops=ops):
                    pass
        except Exception as exc:  # noqa: BLE001  (reported below)
            errors.append(exc)

    threads = [
        threading.Thread(target=worker, args=(ops,)) for ops in (["silu"], ["gelu", "silu"]) * 3
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert dispatch_tables() == before


def test_counts_and_reset():
    with use_aten_overrides(ops="silu"):
        F.silu(randn(3))
        F.silu(randn(3, dtype=torch.float64))
    assert aten_override_calls() == {("silu", "ours"): 1, ("silu", "dtype float64"): 1}


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="CPU registration")
def test_default_device_types_under_the_interpreter():
    with use_aten_overrides(ops="silu"):
        assert active_aten_overrides()["silu"] == (
            ("cuda", "cpu") if torch.cuda.is_available() else ("cpu",)
        )
