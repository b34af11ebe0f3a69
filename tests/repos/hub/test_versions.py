"""Resolving `version` and `revision` against tags and branches on the test server."""

from __future__ import annotations

import logging

import pytest

import kernels
from kernels import (
    FuncRepository,
    KernelRepositoryNotFoundError,
    KernelRevisionError,
    KernelVersionSpecError,
    LayerRepository,
)
from kernels.repos.versions import parse_version_tag, resolve_revision

pytestmark = pytest.mark.hub


def test_highest_tag_satisfying_the_specifier_is_loaded(released):
    repo = released("0.0.3", "0.0.4", "0.0.9", "0.1.0")
    module = kernels.get_kernel(repo.repo_id, version=">=0.0.4,<0.1.0")
    assert module.VERSION == "0.0.9"


def test_tags_that_are_not_versions_are_ignored(hub):
    repo = hub.create_repo()
    repo.release("0.1.0")
    # Higher-looking tags that are not v<major>.<minor>.<patch>: none may win.
    repo.write_kernel(version="not-a-version").commit("experiment")
    for tag in ("v9", "v9.9", "latest", "release-9.9.9", "9.9.9", "v9.9.9+local"):
        repo.tag(tag)
    resolved = resolve_revision(repo.repo_id, version=">=0.1")
    assert resolved.revision == "v0.1.0"


def test_annotated_tags_resolve_to_their_commit(hub):
    repo = hub.create_repo()
    repo.write_kernel(version="0.2.0")
    sha = repo.commit()
    repo.tag("v0.2.0", annotated=True)
    assert resolve_revision(repo.repo_id, version="==0.2.0").commit == sha
    assert kernels.get_kernel(repo.repo_id, version="==0.2.0").VERSION == "0.2.0"


def test_prereleases_only_when_the_specifier_asks(released):
    repo = released("0.1.0", "0.2.0rc1")
    assert kernels.get_kernel(repo.repo_id, version=">=0.1").VERSION == "0.1.0"
    assert kernels.get_kernel(repo.repo_id, version=">=0.2.0rc1").VERSION == "0.2.0rc1"


def test_prerelease_only_match_is_an_error_with_a_hint(released):
    repo = released("0.1.0", "0.2.0rc1")
    with pytest.raises(KernelRevisionError, match=r"Pre-releases satisfy it") as info:
        kernels.get_kernel(repo.repo_id, version=">0.1.0")
    assert "0.1.0, 0.2.0rc1" in str(info.value)


def test_no_version_satisfies_lists_the_versions_that_exist(released):
    repo = released("0.0.1", "0.0.2", "0.1.0")
    with pytest.raises(KernelRevisionError) as info:
        kernels.get_kernel(repo.repo_id, version=">=1.0,<2")
    message = str(info.value)
    assert repo.repo_id in message and "satisfies '>=1.0,<2'" in message
    assert "0.0.1, 0.0.2, 0.1.0" in message
    assert "Branches: main" in message


@pytest.mark.parametrize("spec", ["latest", "0.1", ">>0.1", "", "~=1"])
def test_malformed_specifier_is_a_clear_error_before_any_download(spec, hub):
    with pytest.raises(KernelVersionSpecError, match="specifier|empty string|~="):
        LayerRepository("kernels-community/anything", layer_name="X", version=spec)
    with pytest.raises(KernelVersionSpecError):
        kernels.get_kernel("kernels-community/does-not-exist", version=spec)


def test_bare_version_gets_a_hint():
    with pytest.raises(KernelVersionSpecError, match=r"'==0\.1'"):
        LayerRepository("kernels-community/anything", layer_name="X", version="0.1")


def test_int_version_selects_the_branch_vN(hub):
    repo = hub.create_repo()
    repo.write_kernel(version="1.x", offset=1.0)
    repo.commit()
    repo.branch("v1")
    repo.write_kernel(version="2.x", offset=2.0)
    repo.commit()
    repo.branch("v2")
    assert kernels.get_kernel(repo.repo_id, version=1).VERSION == "1.x"
    assert kernels.get_kernel(repo.repo_id, version=2).VERSION == "2.x"
    with pytest.raises(KernelRevisionError, match=r"no branch v3.*Branches: main, v1, v2"):
        kernels.get_kernel(repo.repo_id, version=3)


@pytest.mark.parametrize("bad", [-1, 1.5, True, ["0.1"]])
def test_bad_version_types_are_rejected(bad):
    with pytest.raises(KernelVersionSpecError):
        LayerRepository("kernels-community/anything", layer_name="X", version=bad)


def test_revision_and_version_together_are_an_error(hub):
    with pytest.raises(kernels.KernelMappingError, match="give one"):
        LayerRepository("kernels-community/x", layer_name="X", revision="main", version=">=1")
    with pytest.raises(KernelVersionSpecError, match="give one"):
        kernels.get_kernel("kernels-community/x", revision="main", version=">=1")


def test_neither_is_a_value_error_that_says_how_to_pin(released, hub):
    """0.19: a version or a revision must be given (before 0.19: main, with a warning)."""
    repo = released("0.1.0")
    hub.proxy.clear()
    for call in (
        lambda: kernels.get_kernel(repo.repo_id),
        lambda: kernels.has_kernel(repo.repo_id),
        lambda: kernels.get_kernel_variants(repo.repo_id),
        lambda: kernels.install_kernel(repo.repo_id),
    ):
        with pytest.raises(
            ValueError, match="A kernel version or revision must be specified"
        ) as caught:
            call()
        assert isinstance(caught.value, KernelVersionSpecError)
        assert "version=1" in str(caught.value) and "revision='main'" in str(caught.value)
    for make in (LayerRepository, FuncRepository):
        name = {"layer_name": "SiluAndMul"} if make is LayerRepository else {"func_name": "f"}
        opening = "Either a revision or a version must be specified"  # their sentence
        with pytest.raises(ValueError, match=f"{opening} \\({make.__name__}"):
            make(repo.repo_id, **name)
    assert hub.proxy.requests == []  # refused before any Hub request


def test_revision_main_follows_the_main_branch(released):
    repo = released("0.1.0")
    repo.write_kernel(version="main-head").commit()
    assert kernels.get_kernel(repo.repo_id, revision="main").VERSION == "main-head"


def test_pinned_loads_do_not_warn(released, caplog):
    repo = released("0.1.0")
    with caplog.at_level(logging.WARNING, logger="kernels"):
        kernels.get_kernel(repo.repo_id, version=">=0.1")
    assert not [r for r in caplog.records if "unpinned" in r.getMessage()]


def test_revision_can_be_a_branch_a_tag_or_a_commit(hub):
    repo = hub.create_repo()
    first = repo.release("0.1.0")
    repo.write_kernel(version="dev").commit()
    repo.branch("dev")
    assert kernels.get_kernel(repo.repo_id, revision="v0.1.0").VERSION == "0.1.0"
    assert kernels.get_kernel(repo.repo_id, revision="dev").VERSION == "dev"
    assert kernels.get_kernel(repo.repo_id, revision=first).VERSION == "0.1.0"


def test_unknown_revision_lists_branches_and_tags(released):
    repo = released("0.1.0")
    with pytest.raises(KernelRevisionError, match=r"no branch or tag named 'nope'.*0\.1\.0"):
        kernels.get_kernel(repo.repo_id, revision="nope")
    with pytest.raises(KernelRevisionError, match="no revision"):
        kernels.get_kernel(repo.repo_id, revision="0" * 40)


def test_missing_repository(hub):
    with pytest.raises(KernelRepositoryNotFoundError, match="not found") as info:
        kernels.get_kernel("kernels-community/no-such-kernel", version=">=0.1")
    assert hub.endpoint in str(info.value)
    assert "HF_TOKEN" in str(info.value)
    with pytest.raises(KernelRepositoryNotFoundError):
        kernels.get_kernel("kernels-community/no-such-kernel", revision="main")


def test_malformed_repo_id():
    with pytest.raises(KernelRepositoryNotFoundError, match="org/name"):
        kernels.get_kernel("not a repo id", version=">=1")


@pytest.mark.parametrize(
    ("tag", "expected"),
    [
        ("v1.2.3", "1.2.3"),
        ("v0.2.0rc1", "0.2.0rc1"),
        ("v1.0.0.post1", "1.0.0.post1"),
        ("v1.2", None),
        ("v1", None),
        ("1.2.3", None),
        ("v1.2.3+cu121", None),
        ("latest", None),
    ],
)
def test_version_tags(tag, expected):
    version = parse_version_tag(tag)
    assert (str(version) if version else None) == expected
