"""Trust: code from organisations outside the trusted list is refused unless allowed."""

from __future__ import annotations

import logging

import pytest

import kernels
from kernels import LayerRepository, UntrustedKernelError
from kernels.repos.hubclient import repo_cache_folder
from kernels.repos.trust import DEFAULT_TRUSTED_ORGS, config_path, decide_trust

pytestmark = pytest.mark.hub


@pytest.fixture
def untrusted(released):
    return released("0.1.0", org="some-stranger")


def test_untrusted_org_is_refused_before_anything_is_downloaded(untrusted, caplog):
    with (
        caplog.at_level(logging.INFO, logger="kernels"),
        pytest.raises(UntrustedKernelError) as info,
    ):
        kernels.get_kernel(untrusted.repo_id, version=">=0.1")
    message = str(info.value)
    for how in (
        "trust_remote_code=True",
        "trust_remote_code=['some-stranger']",
        "KERNELS_TRUSTED_ORGS=some-stranger",
        str(config_path()),
    ):
        assert how in message
    assert isinstance(info.value, kernels.KernelLoadError) and isinstance(
        info.value, PermissionError
    )
    assert not repo_cache_folder(untrusted.repo_id).exists()
    assert any("Refusing" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "allow",
    [True, ["some-stranger"], ["Some-Stranger"], ["other", "some-stranger/{name}"]],
)
def test_trust_remote_code_allows_it(untrusted, allow, caplog):
    if isinstance(allow, list):
        allow = [a.format(name=untrusted.repo_id.split("/")[1]) for a in allow]
    with caplog.at_level(logging.INFO, logger="kernels"):
        module = kernels.get_kernel(untrusted.repo_id, version=">=0.1", trust_remote_code=allow)
    assert module.VERSION == "0.1.0"
    assert any("Trusting kernel code from" in r.getMessage() for r in caplog.records)


def test_listing_another_org_does_not_allow_it(untrusted):
    with pytest.raises(UntrustedKernelError):
        kernels.get_kernel(
            untrusted.repo_id, version=">=0.1", trust_remote_code=["kernels-stranger"]
        )


def test_environment_variable_extends_the_trusted_orgs(untrusted, monkeypatch):
    monkeypatch.setenv("KERNELS_TRUSTED_ORGS", "someone-else, some-stranger")
    assert kernels.get_kernel(untrusted.repo_id, version=">=0.1").VERSION == "0.1.0"
    assert "KERNELS_TRUSTED_ORGS" in decide_trust(untrusted.repo_id).reason


def test_config_file_extends_the_trusted_orgs(untrusted, monkeypatch, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("trusted_orgs:\n  - some-stranger\n")
    monkeypatch.setenv("KERNELS_CONFIG", str(config))
    assert kernels.get_kernel(untrusted.repo_id, version=">=0.1").VERSION == "0.1.0"
    assert str(config) in decide_trust(untrusted.repo_id).reason


def test_config_file_can_trust_single_repositories(untrusted, monkeypatch, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(f"trusted_repos: [{untrusted.repo_id}]\n")
    monkeypatch.setenv("KERNELS_CONFIG", str(config))
    assert decide_trust(untrusted.repo_id).trusted
    assert not decide_trust("some-stranger/another-kernel").trusted


def test_xdg_config_location(monkeypatch, tmp_path):
    monkeypatch.delenv("KERNELS_CONFIG")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "config.yaml").write_text("trusted_orgs: [xdg-org]\n")
    assert config_path() == tmp_path / "kernels" / "config.yaml"
    assert decide_trust("xdg-org/k").trusted


def test_malformed_config_is_an_error(monkeypatch, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("trusted_orgs: some-stranger\n")
    monkeypatch.setenv("KERNELS_CONFIG", str(config))
    with pytest.raises(kernels.KernelMappingError, match="must be a list"):
        decide_trust("some-stranger/x")


def test_default_trusted_orgs():
    assert {"kernels-triton", "kernels-community"} <= set(DEFAULT_TRUSTED_ORGS)
    assert decide_trust("kernels-community/activation").trusted
    assert decide_trust("kernels-triton/rms-norm").trusted
    assert not decide_trust("kernels-community-fake/activation").trusted
    assert not decide_trust("gpt2").trusted  # no organisation at all


def test_layer_repository_refused_falls_back_in_kernelize(untrusted, caplog):
    import torch.nn as nn

    from kernels import Mode, kernelize, use_kernel_forward_from_hub, use_kernel_mapping
    from kernels.layer.swap import kernel_layer_of

    @use_kernel_forward_from_hub("SiluAndMul")
    class Layer(nn.Module):
        def forward(self, input):
            return input

    repo = LayerRepository(untrusted.repo_id, layer_name="SiluAndMul", version=">=0.1")
    layer = Layer()
    with use_kernel_mapping({"SiluAndMul": {"cpu": repo}}, inherit_mapping=False):
        with caplog.at_level(logging.WARNING, logger="kernels"):
            kernelize(layer, device="cpu", mode=Mode.INFERENCE)
        assert kernel_layer_of(layer) is None
        assert any("trust_remote_code" in r.getMessage() for r in caplog.records)
        with pytest.raises(kernels.KernelLoadError, match="trust_remote_code"):
            kernelize(layer, device="cpu", mode=Mode.INFERENCE, use_fallback=False)
    trusted = LayerRepository(
        untrusted.repo_id, layer_name="SiluAndMul", version=">=0.1", trust_remote_code=True
    )
    with use_kernel_mapping({"SiluAndMul": {"cpu": trusted}}, inherit_mapping=False):
        kernelize(layer, device="cpu", mode=Mode.INFERENCE)
    assert kernel_layer_of(layer) is not None
    assert "trust_remote_code=True" in str(trusted)


@pytest.mark.parametrize("bad", ["some-org", 1, [1], ["a/b/c"], [""]])
def test_malformed_trust_argument(bad):
    with pytest.raises(kernels.KernelMappingError):
        LayerRepository("x/y", layer_name="L", trust_remote_code=bad)
