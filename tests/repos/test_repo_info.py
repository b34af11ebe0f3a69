"""RepoInfo (where a kernel came from) and Metadata (a build's metadata.json)."""

import json
from dataclasses import FrozenInstanceError

import pytest

from kernels import KernelLoadError, Metadata, RepoInfo


def test_repo_info_is_a_small_value():
    origin = RepoInfo(repo_id="kernels-community/activation", revision="a" * 40)
    assert origin == RepoInfo("kernels-community/activation", "a" * 40)
    assert {origin: 1}[RepoInfo("kernels-community/activation", "a" * 40)] == 1
    assert str(origin) == f"kernels-community/activation (revision {'a' * 40})"
    with pytest.raises(FrozenInstanceError):
        origin.revision = "main"


def test_metadata_reads_kernel_builders_metadata_json(tmp_path):
    variant = tmp_path / "build" / "torch-cuda"
    variant.mkdir(parents=True)
    (variant / "metadata.json").write_text(
        json.dumps(
            {
                "id": "_activation_cuda_34605e1",
                "name": "activation",
                "version": 2,
                "license": "apache-2.0",
                "python-depends": ["einops"],
                "backend": {"type": "cuda", "archs": ["9.0"]},
                "digest": {"kind": "sha256"},
            }
        )
    )
    meta = Metadata.load_from_variant(variant)
    assert (meta.id, meta.name, meta.version, meta.license) == (
        "_activation_cuda_34605e1",
        "activation",
        2,
        "apache-2.0",
    )
    assert meta.python_depends == ["einops"]  # a list, as in Hugging Face's client
    assert meta.backend["type"] == "cuda"
    assert meta.upstream is None and meta.kernels_minver is None
    assert dict(meta.extra) == {"digest": {"kind": "sha256"}}  # kept, unread


def test_a_build_without_metadata_has_empty_metadata(tmp_path):
    meta = Metadata.load_from_variant(tmp_path)
    assert meta == Metadata() and meta.python_depends == [] and meta.version is None
    with pytest.raises(FileNotFoundError):
        Metadata.read_from_file(tmp_path / "metadata.json")


@pytest.mark.parametrize(
    "content, message",
    [
        ("{", "is not valid JSON"),
        ("[]", "must hold a JSON object"),
        ('{"version": "2"}', "'version' must be an integer or null"),
        ('{"version": true}', "'version' must be an integer or null"),
        ('{"python-depends": "einops"}', "'python-depends' must be a list of requirement"),
    ],
)
def test_malformed_metadata_names_the_file_and_key(tmp_path, content, message):
    path = tmp_path / "metadata.json"
    path.write_text(content)
    with pytest.raises(KernelLoadError, match=message) as caught:
        Metadata.read_from_file(path)
    assert str(path) in str(caught.value)
