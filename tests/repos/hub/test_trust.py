"""Trust: code from organisations outside the trusted list is refused unless allowed."""

from __future__ import annotations

import logging

import pytest

import kernels
from kernels import LayerRepository, UntrustedKernelError
from kernels.repos.hubclient import repo_cache_folder
from kernels.repos.trust import DEFAULT_TRUSTED_ORGS, config_path, decide_trust
from tests.support.children import ROOT_FILE_POWERS, run_python
from tests.support.hub import subprocess_env

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
            kernelize(
                layer, device="cpu", mode=Mode.INFERENCE, use_fallback=kernels.KernelizeFallback.ALL
            )
        assert kernel_layer_of(layer) is None
        assert any("trust_remote_code" in r.getMessage() for r in caplog.records)
        for use_fallback in (True, False):  # 0.19: a refused load raises unless CANNOT_LOAD
            with pytest.raises(kernels.KernelLoadError, match="trust_remote_code"):
                kernelize(layer, device="cpu", mode=Mode.INFERENCE, use_fallback=use_fallback)
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


# Look-alike and malformed repository ids: refused before any request reaches the Hub.

KELVIN = "\u212aernels-community"  # KELVIN SIGN: str.lower() makes it 'kernels-community'
LOOK_ALIKE_ORGS = [
    KELVIN,
    "\uff4bernels-community",  # fullwidth k
    "k\u0435rnels-community",  # Cyrillic e
    "kernels-commun\u0131ty",  # dotless i
    "kernels-community\u200b",  # a trailing zero-width space
]


@pytest.mark.any_hub_client
def test_a_look_alike_org_served_by_the_hub_is_refused_before_any_request(hub):
    # The server really serves it: with huggingface_hub 0.x (whose id check accepts any
    # Unicode word character) a look-alike org's code was imported as "trusted by default".
    repo = hub.create_repo(f"{KELVIN}/activation", repo_type="model")
    repo.release("0.1.0")
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HFValidationError

    try:
        refs = HfApi().list_repo_refs(repo.repo_id, repo_type="model")
        assert "v0.1.0" in {t.name for t in refs.tags}
    except HFValidationError:
        pass  # huggingface_hub 1.x and later refuse the name themselves
    hub.proxy.sent.clear()
    for trust in (False, ["kernels-community"], True):
        with pytest.raises(kernels.KernelRepositoryNotFoundError, match="u212aernels-community"):
            kernels.get_kernel(
                repo.repo_id, version=">=0.1", repo_type="model", trust_remote_code=trust
            )
    with pytest.raises(kernels.KernelRepositoryNotFoundError):
        kernels.has_kernel(repo.repo_id, version=">=0.1", repo_type="model")
    assert bytes(hub.proxy.sent) == b""
    assert not repo_cache_folder("kernels-community/activation", "model").exists()


@pytest.mark.any_hub_client
@pytest.mark.parametrize("org", LOOK_ALIKE_ORGS, ids=ascii)
def test_look_alike_ids_are_refused_by_every_entry_point_without_a_request(hub, org):
    from kernels.repos.download import load_hub_kernel

    repo_id = f"{org}/activation"
    calls = {
        "get_kernel": lambda: kernels.get_kernel(repo_id, version=1),
        "load_hub_kernel": lambda: load_hub_kernel(repo_id, version=1),
        "has_kernel": lambda: kernels.has_kernel(repo_id, version=1),
        "get_kernel_variants": lambda: kernels.get_kernel_variants(repo_id, version=1),
        "install_kernel": lambda: kernels.install_kernel(repo_id, revision="main"),
    }
    for name, call in calls.items():
        with pytest.raises(kernels.KernelRepositoryNotFoundError, match="not a Hub repository id"):
            call()
        assert bytes(hub.proxy.sent) == b"", f"{name} sent a request"
    with pytest.raises(kernels.KernelMappingError):
        LayerRepository(repo_id, layer_name="SiluAndMul", version=1)


@pytest.mark.any_hub_client
@pytest.mark.parametrize(
    "args",
    [
        ["versions", f"{KELVIN}/activation"],
        ["check", f"{KELVIN}/activation", "--trust-remote-code"],
        ["benchmark", f"{KELVIN}/activation@v1"],
    ],
    ids=lambda args: args[0],
)
def test_commands_refuse_look_alike_ids_without_a_request(hub, cli, args):
    result = cli(*args)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "\\u212aernels-community" in result.stderr
    assert bytes(hub.proxy.sent) == b""


def test_an_owner_less_id_is_not_trusted_by_the_default_orgs(hub):
    with pytest.raises(UntrustedKernelError, match="names no organisation"):
        kernels.get_kernel("kernels-community", version=1)
    assert bytes(hub.proxy.sent) == b""


def test_ascii_case_of_a_trusted_org_is_trusted(hub):
    # The Hub treats names case-insensitively; the test server does not, so the repository
    # is published under the spelling that is asked for.
    repo = hub.create_repo("Kernels-Community/shouted-activation")
    repo.release("0.1.0")
    assert "trusted by default" in decide_trust(repo.repo_id).reason
    assert kernels.get_kernel(repo.repo_id, version=">=0.1").VERSION == "0.1.0"


# A cache this user cannot write: the error names the folder and the fix.


@pytest.mark.any_hub_client
def test_a_read_only_cache_names_its_path_and_the_fix(released, tmp_path):
    repo = released("0.1.0", repo_type="model")
    cache = tmp_path / "shared-cache"
    cache.mkdir()
    code = (
        "import kernels\n"
        f"print(kernels.get_kernel({repo.repo_id!r}, version='>=0.1', repo_type='model').VERSION)"
    )

    def load(**env):
        return run_python(
            "-c",
            code,
            env={**subprocess_env(), "HF_HUB_CACHE": str(cache), **env},
            timeout=120,
            drop_capabilities=ROOT_FILE_POWERS,
        )

    cache.chmod(0o555)
    try:
        result = load()
        assert result.returncode != 0
        error = result.stderr.strip().splitlines()[-1]
        assert error.startswith("kernels.errors.KernelDownloadError"), error
        assert f"{cache}/models--" in error  # the folder it could not write
        assert f"HF_HUB_CACHE={cache}" in error
        assert "point HF_HUB_CACHE at a writable folder" in error
        # What the message promises: once filled, a read-only cache serves offline loads.
        cache.chmod(0o755)
        filled = run_python(
            "-c", code, env={**subprocess_env(), "HF_HUB_CACHE": str(cache)}, timeout=120
        )
        assert filled.stdout.strip() == "0.1.0", filled.stderr
        for folder in [cache, *cache.rglob("*")]:
            if folder.is_dir() and not folder.is_symlink():
                folder.chmod(0o555)
        offline = load(HF_HUB_OFFLINE="1")
        assert offline.stdout.strip() == "0.1.0", offline.stderr
    finally:
        for folder in [cache, *cache.rglob("*")]:
            if folder.is_dir() and not folder.is_symlink():
                folder.chmod(0o755)
