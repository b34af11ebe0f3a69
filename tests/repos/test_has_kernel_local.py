"""`has_kernel` answers a repository that LOCAL_KERNELS maps to a folder from that folder,
with no Hub request, as Hugging Face's client does."""

from __future__ import annotations

import json

import pytest

from kernels import KernelLoadError, UntrustedKernelError, get_kernel, has_kernel
from kernels.repos.local_overrides import ENV


@pytest.fixture
def no_hub(monkeypatch):
    """No Hub to reach, and a repository of an organisation nobody trusts: a call that took
    the Hub's way would fail (unreachable) where the folder answers."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.delenv(ENV, raising=False)


def _repo(root, variant):
    folder = root / "build" / variant
    folder.mkdir(parents=True)
    meta = {"name": "relu", "id": "_relu_x", "version": 1, "license": "MIT"}
    meta |= {"python-depends": [], "backend": {"type": variant.split("-")[1]}}
    (folder / "metadata.json").write_text(json.dumps(meta))
    (folder / "__init__.py").write_text("MARKER = 'local'\n")
    return root


def test_a_local_folder_with_a_variant_for_this_machine(tmp_path, monkeypatch, no_hub):
    monkeypatch.setenv(ENV, f"someone/relu={_repo(tmp_path / 'relu', 'torch-cpu')}")
    assert has_kernel("someone/relu", version=1) is True
    with pytest.raises(UntrustedKernelError):  # an unlisted one still goes the Hub's way
        get_kernel("someone/other", version=1)


def test_a_local_folder_without_one(tmp_path, monkeypatch, no_hub):
    # A Metal build only: no variant for this (Linux) machine, so False rather than an error.
    monkeypatch.setenv(ENV, f"someone/relu={_repo(tmp_path / 'relu', 'torch-metal')}")
    assert has_kernel("someone/relu", version=1) is False


def test_a_missing_folder_is_an_error_not_an_answer(tmp_path, monkeypatch, no_hub):
    monkeypatch.setenv(ENV, f"someone/relu={tmp_path / 'missing'}")
    with pytest.raises(KernelLoadError, match=f"{ENV}.*the folder does not exist"):
        has_kernel("someone/relu", version=1)
