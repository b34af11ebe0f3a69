"""`kernels check --layer-of` given something other than a layer class, and
`--rebuild-binaries` given what it cannot compile again."""

from __future__ import annotations

import pytest

from kernels.cli import main


def test_layer_of_refuses_what_is_not_a_module_class(kernel_repo, capsys):
    # A function has no forward to compare with: the check used to crash in its child process
    # with an AttributeError instead of saying what to pass.
    repo = kernel_repo("sig")
    spec = "SiluAndMul=torch.nn.functional:silu"
    assert main(["check", str(repo), "--layer-of", spec]) == 1
    err = capsys.readouterr().err
    assert "torch.nn.functional:silu is not a torch.nn.Module subclass" in err
    assert "AttributeError" not in err


def test_rebuild_binaries_needs_a_library_source_folder(kernel_repo, capsys):
    """A built repository carries no launch records to compile its binaries again from: the check
    says what it needs instead of passing."""
    repo = kernel_repo("sig")
    assert main(["check", str(repo), "--rebuild-binaries"]) == 1
    out = capsys.readouterr().out
    assert "--rebuild-binaries needs a library source folder of a checkout" in out


def test_rebuild_binaries_of_another_triton_are_counted_not_compiled(capsys, monkeypatch):
    """The library's shipped binaries were compiled by another Triton than the CPU tests': the
    check counts them and warns that nothing was compared (a kernel compiled again is
    tests/library/test_binary_launches.py's)."""
    import triton

    from kernels.library.paths import library_source

    folder = library_source() / "norm"
    manifest = folder / "binaries" / "manifest.json"
    if not manifest.is_file() or f'"triton": "{triton.__version__}"' in manifest.read_text():
        pytest.skip("needs shipped binaries of another Triton than this one")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    main(["check", str(folder), "--rebuild-binaries"])
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "binaries: rebuilt:" in line)
    assert line.startswith("warn") and "nothing compared" in line
    assert f"no kernels shipped for Triton {triton.__version__}" in line
