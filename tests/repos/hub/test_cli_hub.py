"""The `kernels` commands that talk to the Hub, against the test server."""

from __future__ import annotations

import json

import pytest

from kernels.cli import main

pytestmark = pytest.mark.hub


def test_versions_lists_tags_branches_and_variants(hub, capsys):
    repo = hub.create_repo()
    repo.release("0.1.0")
    repo.release("0.2.0rc1", variants=("torch-universal", "torch28-cxx11-cu128-x86_64-linux"))
    repo.tag("nightly")
    repo.branch("v1")
    assert main(["versions", repo.repo_id]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == repo.repo_id
    v020 = next(line for line in lines if "v0.2.0rc1" in line)
    v010 = next(line for line in lines if "v0.1.0" in line)
    assert lines.index(v020) < lines.index(v010)  # newest first
    assert "torch-universal*" in v020 and "torch28-cxx11-cu128-x86_64-linux" in v020
    assert repo.git("rev-parse", "v0.1.0")[:12] in v010
    assert "other tags (not versions): nightly" in out
    assert any(line.strip().startswith("v1 ") for line in lines)


def test_versions_json(hub, capsys):
    repo = hub.create_repo()
    repo.release("0.1.0", variants=("torch27-cxx11-cu126-x86_64-linux",))
    assert main(["versions", repo.repo_id, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (v010,) = [r for r in data["refs"] if r["name"] == "v0.1.0"]
    assert v010["kind"] == "version" and v010["version"] == "0.1.0"
    assert v010["variants"] == ["torch27-cxx11-cu126-x86_64-linux"]
    assert v010["variant_here"] is None  # nothing in it runs on this machine


def test_versions_shows_a_broken_preference_file_on_its_row(hub, capsys):
    repo = hub.create_repo()
    repo.write_kernel(version="0.1.0")
    repo.write("kernel-variants.json", '{"prefer": "fastest"}')
    repo.commit()
    repo.tag("v0.1.0")
    repo.write("kernel-variants.json", '{"prefer": "noarch"}')
    repo.commit()
    repo.tag("v0.2.0")
    assert main(["versions", repo.repo_id]) == 0
    lines = capsys.readouterr().out.splitlines()
    v010 = next(i for i, line in enumerate(lines) if "v0.1.0" in line)
    assert "torch-universal" in lines[v010] and "*" not in lines[v010]
    assert "prefer must be one of compiled, noarch, got 'fastest'" in lines[v010 + 1]
    assert any("v0.2.0" in line and "torch-universal*" in line for line in lines)
    assert main(["versions", repo.repo_id, "--json"]) == 0
    refs = {r["name"]: r for r in json.loads(capsys.readouterr().out)["refs"]}
    assert refs["v0.1.0"]["variant_here"] is None and "fastest" in refs["v0.1.0"]["problem"]
    assert refs["v0.2.0"]["problem"] is None


def test_versions_of_a_missing_repository(hub, cli):
    result = cli("versions", "kernels-community/no-such-kernel")
    assert result.returncode == 1
    # The deprecation warning (kernels 0.19) comes first, then the error.
    assert result.stderr.splitlines()[1].startswith(
        "error: Kernel repository kernels-community/no-such-kernel was not found"
    )
    assert "Traceback" not in result.stderr


def test_versions_with_the_hub_unreachable(hub, capsys):
    hub.proxy.stop()
    assert main(["versions", "kernels-community/anything"]) == 1
    assert "cannot be reached" in capsys.readouterr().err


def test_check_a_hub_repository(released, capsys):
    repo = released("0.1.0", "0.2.0")
    assert main(["check", repo.repo_id, "--version", "<0.2"]) == 0
    out = capsys.readouterr().out
    assert "tag v0.1.0" in out and "0 failed" in out
    assert "imports: torch-universal" in out


def test_check_an_untrusted_hub_repository(released, capsys):
    repo = released("0.1.0", org="some-stranger")
    assert main(["check", repo.repo_id, "--version", ">=0.1"]) == 1
    assert "trust_remote_code" in capsys.readouterr().err
    assert main(["check", repo.repo_id, "--version", ">=0.1", "--trust-remote-code"]) == 0


def test_check_a_hub_repository_with_a_broken_layer(hub, capsys):
    repo = hub.create_repo()
    layers = "import torch\n\n\nclass SiluAndMul(torch.nn.Module):\n    scale = 2\n\n    def forward(self, x):\n        return x\n"
    repo.release("0.1.0", layers_source=layers)
    assert main(["check", repo.repo_id, "--revision", "v0.1.0"]) == 1
    assert "class members scale" in capsys.readouterr().out


def test_check_downloads_every_variant_of_a_hub_repository(hub, capsys):
    repo = hub.create_repo()
    repo.release("0.1.0", variants=("torch-universal", "torch27-cxx11-cu126-x86_64-linux"))
    assert main(["check", repo.repo_id, "--version", "==0.1.0"]) == 0
    out = capsys.readouterr().out
    assert "torch27-cxx11-cu126-x86_64-linux (" in out and "torch-universal (" in out
    assert "torch-universal runs here, and is the one this machine loads" in out
    assert "torch27-cxx11-cu126-x86_64-linux does not run here: " in out


def test_upload_reaches_the_server_and_reports_its_refusal(hub, kernel_repo, cli):
    """olah is a read-only mirror: it answers 405 to repository creation. Everything up to
    the HTTP calls is tested in tests/cli/test_cli.py; here the command sends them and must turn
    the server's refusal into a clear error."""
    repo = kernel_repo("to-upload")
    result = cli("upload", str(repo), "--repo-id", "my-org/to-upload", "--tag", "v0.1.0")
    assert result.returncode == 1
    assert "3 file(s)" in result.stdout or "2 file(s)" in result.stdout
    assert result.stderr.startswith("error: Could not upload")
    assert "405" in result.stderr and "Traceback" not in result.stderr


def test_upload_with_the_hub_unreachable(hub, kernel_repo, capsys):
    repo = kernel_repo("to-upload")
    hub.proxy.stop()
    assert main(["upload", str(repo), "--repo-id", "my-org/to-upload"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: Could not upload") and "cannot be reached" in err
    assert "Check the connection" in err and "kernels download" not in err
