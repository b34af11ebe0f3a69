"""`kernels check --layer-of` given something other than a layer class."""

from __future__ import annotations

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
