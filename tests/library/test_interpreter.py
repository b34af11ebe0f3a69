"""The test suite's interpreter set-up (tests.support.interpreter): a kernel whose helper runs
in a loop computes what it computes without the set-up, patches ``triton.language`` once for the
launch and once for the helper instead of at every call, and leaves ``triton.language`` as it
found it."""

from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl

from tests.support import interpreter

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter only (the CPU runs)"
)

STEPS = 5


@triton.jit
def scaled(x, k):
    return x * k + tl.exp(x * 0.0)


@triton.jit
def kernel(X, Y, n, STEPS: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(X + offsets, mask=mask)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for k in range(STEPS):
        acc += scaled(x, k)
    tl.store(Y + offsets, acc, mask=mask)


def _run(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    kernel[(3,)](x, y, x.numel(), STEPS=STEPS, BLOCK=4)
    return y


def test_installed_here():
    assert interpreter.skip_repeated_patching()
    from triton.runtime import interpreter as triton_interpreter

    assert triton_interpreter._patch_lang.skips_repeats


def test_results_and_language_state_are_the_interpreters_own(monkeypatch):
    x = torch.linspace(-1, 1, 11, dtype=torch.float32)
    # sum over k of (x * k + 1), in float64
    expected = (x.double() * sum(range(STEPS)) + STEPS).float()
    before = {name: getattr(tl, name) for name in ("load", "store", "exp", "arange")}

    calls = []

    def counted(fn):
        calls.append(fn.__name__)
        return original(fn)

    original = interpreter.original_patch_lang
    monkeypatch.setattr(interpreter, "original_patch_lang", counted)
    got = _run(x)
    # the launch, then each helper's first call (tl.zeros is a jit function too); not the
    # other 14 of `scaled` (3 programs x 5 steps) nor 2 of `zeros`
    assert calls == ["kernel", "zeros", "scaled"]
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert {name: getattr(tl, name) for name in before} == before

    # the interpreter's own path (every call patching) gives the same bits
    monkeypatch.setattr(interpreter._state, "patched", None)
    monkeypatch.setattr(interpreter, "_patched_this_launch", lambda: None)
    calls.clear()
    assert torch.equal(_run(x), got)
    assert calls == ["kernel"] + (["zeros"] + ["scaled"] * STEPS) * 3
    assert {name: getattr(tl, name) for name in before} == before


@triton.jit
def add_ints(X, Y, Z, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(Z + offsets, tl.load(X + offsets) + tl.load(Y + offsets))


def _add_ints(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    z = torch.empty_like(x)
    add_ints[(1,)](x, y, z, BLOCK=x.numel())
    return z


def test_overflow_checks_are_off_where_they_check_nothing(monkeypatch):
    """The set-up turns the sanitizer off (debug being off); with the interpreter's own options
    an int32 add that overflows wraps around unchecked, the same bits as without the sanitizer;
    only with debug on (which the interpreter's options never have) would it assert."""
    import dataclasses

    from triton.runtime.errors import InterpreterError
    from triton.runtime.interpreter import interpreter_builder

    assert interpreter.skip_discarded_overflow_checks()
    assert not interpreter_builder.options.sanitize_overflow
    assert not interpreter_builder.options.debug
    top = torch.iinfo(torch.int32).max
    x = torch.tensor([top, 5, -3, top], dtype=torch.int32)
    y = torch.tensor([1, 7, 2, top], dtype=torch.int32)
    wrapped = (x.long() + y.long() + 2**31) % 2**32 - 2**31
    assert torch.equal(_add_ints(x, y).long(), wrapped)

    stock = dataclasses.replace(interpreter_builder.options, sanitize_overflow=True)
    monkeypatch.setattr(interpreter_builder, "options", stock)
    assert torch.equal(_add_ints(x, y).long(), wrapped)

    monkeypatch.setattr(interpreter_builder, "options", dataclasses.replace(stock, debug=True))
    assert not interpreter.skip_discarded_overflow_checks()  # debug on: left as it is
    assert interpreter_builder.options.sanitize_overflow
    with pytest.raises(InterpreterError, match="int32 overflow detected for operation add"):
        _add_ints(x, y)
