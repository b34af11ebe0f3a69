"""Downloading kernels: only the chosen variant, into the session's HF cache, imported once per commit."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

import kernels
from kernels import BuildVariantNotFoundError
from kernels.repos.download import package_name_for
from kernels.repos.variants import machine_build

pytestmark = pytest.mark.hub

COMPILED = machine_build().compiled_variant  # e.g. torch213-cxx11-cpu-x86_64-linux
BACKEND = f"torch-{machine_build().backend}"
OTHER_COMPILED = "torch27-cxx11-cu126-x86_64-linux"


def snapshot_variants(module) -> list[str]:
    """The variant folders the module's snapshot holds (what was downloaded)."""
    from pathlib import Path

    build = Path(module.__file__).parents[2]
    assert build.name == "build"
    return sorted(p.name for p in build.iterdir())


def test_downloads_into_the_session_cache(released, hub):
    repo = released("0.1.0")
    module = kernels.get_kernel(repo.repo_id, version=">=0.1")
    assert str(hub.cache) in module.__file__
    assert "snapshots" in module.__file__


def test_only_the_chosen_variant_is_downloaded(hub):
    repo = hub.create_repo()
    repo.release("0.1.0", variants=(OTHER_COMPILED, "torch-universal", COMPILED))
    module = kernels.get_kernel(repo.repo_id, version="==0.1.0")
    assert module.VARIANT == COMPILED  # the exact compiled match wins over universal
    assert snapshot_variants(module) == [COMPILED]


def test_backend_variant_beats_universal(hub):
    repo = hub.create_repo()
    repo.release("0.1.0", variants=("torch-universal", BACKEND))
    assert kernels.get_kernel(repo.repo_id, version="==0.1.0").VARIANT == BACKEND


def test_repository_can_prefer_noarch_over_compiled(hub):
    repo = hub.create_repo()
    repo.write_kernel(version="0.1.0", variants=(COMPILED, "torch-universal"))
    repo.write("kernel-variants.json", '{"prefer": "noarch"}')
    repo.commit()
    repo.tag("v0.1.0")
    module = kernels.get_kernel(repo.repo_id, version="==0.1.0")
    assert module.VARIANT == "torch-universal"
    assert snapshot_variants(module) == ["torch-universal"]


def test_bad_preference_file_is_an_error(hub):
    repo = hub.create_repo()
    repo.write_kernel(version="0.1.0")
    repo.write("kernel-variants.json", '{"prefer": "fastest"}')
    repo.commit()
    repo.tag("v0.1.0")
    with pytest.raises(BuildVariantNotFoundError, match="prefer must be one of compiled, noarch"):
        kernels.get_kernel(repo.repo_id, version="==0.1.0")


def test_missing_variant_lists_what_the_repo_offers_and_what_this_machine_needs(hub):
    repo = hub.create_repo()
    repo.release(
        "0.1.0",
        variants=(OTHER_COMPILED, "torch-cuda" if BACKEND != "torch-cuda" else "torch-rocm"),
    )
    with pytest.raises(BuildVariantNotFoundError) as info:
        kernels.get_kernel(repo.repo_id, version="==0.1.0")
    message = str(info.value)
    assert OTHER_COMPILED in message
    assert COMPILED in message and "torch-universal" in message
    assert repo.repo_id in message and "tag v0.1.0" in message
    assert isinstance(info.value, FileNotFoundError)
    assert not kernels.has_kernel(repo.repo_id, version="==0.1.0")


def test_has_kernel(released):
    repo = released("0.1.0")
    assert kernels.has_kernel(repo.repo_id, version=">=0.1")
    with pytest.raises(kernels.KernelRepositoryNotFoundError):
        kernels.has_kernel("kernels-community/never-existed", version=">=0.1")


def test_has_kernel_downloads_nothing(released, hub):
    repo = released("0.1.0")
    assert kernels.has_kernel(repo.repo_id, version=">=0.1")
    from kernels.repos.hubclient import repo_cache_folder

    assert not (repo_cache_folder(repo.repo_id) / "snapshots").exists()


def test_same_commit_is_imported_once(released):
    repo = released("0.1.0")
    first = kernels.get_kernel(repo.repo_id, version=">=0.1")
    again = kernels.get_kernel(repo.repo_id, revision="v0.1.0")
    assert first is again


def test_two_versions_of_one_kernel_in_one_process(released):
    repo = released("0.1.0", "0.2.0")
    old = kernels.get_kernel(repo.repo_id, version="<0.2")
    new = kernels.get_kernel(repo.repo_id, version=">=0.2")
    assert (old.VERSION, new.VERSION) == ("0.1.0", "0.2.0")
    assert old.__name__ != new.__name__
    assert sys.modules[old.__name__] is old and sys.modules[new.__name__] is new
    # Each keeps its own submodules.
    assert old.layers.SiluAndMul is not new.layers.SiluAndMul
    x = torch.randn(2, 8)
    assert torch.allclose(new.silu_and_mul(x) - old.silu_and_mul(x), torch.ones(2, 4))
    # Neither took the bare package name.
    package = repo.repo_id.split("/")[1].replace("-", "_")
    assert package not in sys.modules


def test_install_kernel_downloads_without_importing(released):
    repo = released("0.1.0")
    variant_dir = kernels.install_kernel(repo.repo_id, revision="v0.1.0")
    assert isinstance(variant_dir, Path)  # 0.19: the variant folder alone, as theirs returns
    assert variant_dir.name == "torch-universal" and variant_dir.parent.name == "build"
    assert (variant_dir / package_name_for(repo.repo_id) / "__init__.py").is_file()
    assert not any(
        str(variant_dir) in str(getattr(m, "__file__", "")) for m in list(sys.modules.values())
    )
    # And from the cache only, afterwards.
    again = kernels.install_kernel(repo.repo_id, revision="v0.1.0", local_files_only=True)
    assert again == variant_dir


def test_variant_folder_as_package(hub):
    """The newer layout: build/<variant>/__init__.py is the package itself."""
    from tests.support.hub import SILU_AND_MUL_LAYERS, kernel_init

    repo = hub.create_repo()
    repo.write("build/torch-universal/__init__.py", kernel_init("0.3.0", 3.0, "torch-universal"))
    repo.write("build/torch-universal/layers.py", SILU_AND_MUL_LAYERS.format(offset=3.0))
    repo.commit()
    repo.tag("v0.3.0")
    module = kernels.get_kernel(repo.repo_id, version="==0.3.0")
    assert module.VERSION == "0.3.0"
    assert module.layers.SiluAndMul.__name__ == "SiluAndMul"


def test_package_name_differs_from_repo_name(hub):
    repo = hub.create_repo()
    repo.release("0.1.0", package="some_other_name")
    assert kernels.get_kernel(repo.repo_id, version="==0.1.0").VERSION == "0.1.0"


def _user_agents(hub) -> set[str]:
    """The user agents of the requests for kernel repositories (huggingface_hub 2.x also
    makes requests of its own, e.g. /api/agent-harnesses, with httpx's agent)."""
    sent = bytes(hub.proxy.sent).decode("latin-1")
    agents = set()
    for head in sent.split("\r\n\r\n"):
        line = head.lstrip().split("\r\n", 1)[0]
        if "/kernels/" in line:
            agents |= set(re.findall(r"(?im)^user-agent: (.*?)$", head))
    return agents


def test_user_agent_reaches_the_server(released, hub, monkeypatch):
    """Every request of the load (refs, listing, download) carries the caller's user agent
    and ours, as Hugging Face's client builds it."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", False)
    repo = released("0.1.0")
    hub.proxy.clear()
    module = kernels.get_kernel(repo.repo_id, version=">=0.1", user_agent={"app": "kernels-tests"})
    assert module.VERSION == "0.1.0"
    agents = _user_agents(hub)
    assert len(hub.proxy.requests) >= 2 and agents
    for agent in agents:
        assert "app/kernels-tests" in agent and f"kernels/{kernels.__version__}" in agent
        assert "file_type/kernel" in agent and f"backend/{machine_build().backend}" in agent
    # A LayerRepository sends its own, and a later load without one sends none of it.
    repo2 = released("0.1.0")
    hub.proxy.clear()
    kernels.LayerRepository(
        repo2.repo_id, layer_name="SiluAndMul", version=">=0.1", user_agent="my-app/1.0"
    ).load()
    assert all("my-app/1.0" in agent for agent in _user_agents(hub))
    hub.proxy.clear()
    kernels.get_kernel(released("0.1.0").repo_id, version=">=0.1")
    assert not any("my-app" in agent or "app/kernels-tests" in agent for agent in _user_agents(hub))


def test_disabled_telemetry_sends_no_user_agent_of_ours(released, hub, monkeypatch):
    """HF_HUB_DISABLE_TELEMETRY (set for the whole test session): as in Hugging Face's client,
    neither the caller's user agent nor our system details are sent."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    repo = released("0.1.0")
    hub.proxy.clear()
    kernels.get_kernel(repo.repo_id, version=">=0.1", user_agent={"app": "kernels-tests"})
    agents = _user_agents(hub)
    assert agents and not any("app/kernels-tests" in a or "file_type" in a for a in agents)


def test_hf_home_and_hf_token_are_honoured(released, hub, python, tmp_path):
    """Without HF_HUB_CACHE the cache is HF_HOME/hub, and HF_TOKEN goes with every request."""
    repo = released("0.1.0")
    home = tmp_path / "hf-home"
    result = python(
        f"""
        import kernels
        print(kernels.get_kernel({repo.repo_id!r}, version=">=0.1").__file__)
        """,
        env={"HF_HOME": str(home), "HF_HUB_CACHE": None, "HF_TOKEN": "hf_kernels_test_token"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith(str(home / "hub" / "kernels--"))
    sent = bytes(hub.proxy.sent)
    requests = re.findall(rb"(?m)^(?:GET|HEAD|POST) \S+ HTTP/1\.1\r$", sent)
    tokens = re.findall(rb"(?im)^authorization: bearer hf_kernels_test_token\r$", sent)
    assert len(requests) >= 3 and len(tokens) == len(requests), sent.decode(errors="replace")


def test_the_cache_stays_readable_by_huggingface_hub(released, hub):
    """Our file lists live inside the repository's cache folder; `hf cache scan` must not mind."""
    from huggingface_hub import scan_cache_dir

    repo = released("0.1.0")
    kernels.get_kernel(repo.repo_id, version=">=0.1")
    info = scan_cache_dir(hub.cache)
    assert not [w for w in info.warnings if repo.repo_id.split("/")[1] in str(w)]
    (cached,) = [r for r in info.repos if r.repo_id == repo.repo_id]
    assert {ref for revision in cached.revisions for ref in revision.refs} == {"v0.1.0"}


def test_loaded_hub_kernels_record_their_repository_and_commit(released):
    from kernels import RepoInfo, get_loaded_kernels

    repo = released("0.1.0", "0.2.0")
    module = kernels.get_kernel(repo.repo_id, version="<0.2")
    (entry,) = [e for e in get_loaded_kernels() if e.module is module]
    commit = repo.git("rev-parse", "v0.1.0")
    assert entry.repo_info == RepoInfo(repo.repo_id, commit, "kernel")
