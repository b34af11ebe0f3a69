"""The repository side of the public API at Hugging Face kernels 0.19's level: names and
signatures, errors, pickling, Metadata, check_arch, the user agent and the egg-info writer
(docs/hub.md#compatibility). The Hub side is in hub/test_api_019_hub.py."""

from __future__ import annotations

import inspect
import json
import logging
import pickle
from pathlib import Path

import pytest

import kernels
from kernels import (
    BuildVariantNotFoundError,
    FuncRepository,
    KernelMetadataError,
    KernelOfflineError,
    LayerRepository,
    LocalFuncRepository,
    LocalLayerRepository,
    LockedFuncRepository,
    LockedLayerRepository,
    Metadata,
    UntrustedKernelError,
)
from kernels.repos import archs, hubclient
from kernels.repos.info import Backend, BackendInfo
from kernels.repos.lock import write_egg_lockfile

KW = inspect.Parameter.KEYWORD_ONLY
POS = inspect.Parameter.POSITIONAL_OR_KEYWORD

#: The parameters of Hugging Face kernels 0.19.1 (read from its wheel): name -> kind.
THEIRS = {
    "get_kernel": {"repo_id": POS}
    | dict.fromkeys(
        ["revision", "version", "backend", "user_agent", "trust_remote_code", "check_arch"], KW
    ),
    "get_local_kernel": {"repo_path": POS}
    | dict.fromkeys(["backend", "trust_remote_code", "user_agent", "check_arch"], KW),
    "get_locked_kernel": {"repo_id": POS}
    | dict.fromkeys(["lockfile", "trust_remote_code", "user_agent", "check_arch"], KW),
    "has_kernel": {"repo_id": POS}
    | dict.fromkeys(["revision", "version", "backend", "trust_remote_code", "check_arch"], KW),
    "load_kernel": {"repo_id": POS} | dict.fromkeys(["lockfile", "backend", "check_arch"], KW),
    "install_kernel": {"repo_id": POS}
    | dict.fromkeys(
        [
            "revision",
            "version",
            "backend",
            "local_files_only",
            "user_agent",
            "trust_remote_code",
        ],
        KW,
    ),
    "get_kernel_variants": {"repo_id": POS} | dict.fromkeys(["revision", "version", "backend"], KW),
    "get_kernel_dep": {"repo_id": POS},
    "get_loaded_kernels": {},
    "LayerRepository": {"repo_id": POS}
    | dict.fromkeys(
        ["layer_name", "revision", "version", "trust_remote_code", "user_agent", "check_arch"], KW
    ),
    "FuncRepository": {"repo_id": POS}
    | dict.fromkeys(["func_name", "revision", "version", "trust_remote_code", "check_arch"], KW),
    "LocalLayerRepository": {"repo_path": POS} | dict.fromkeys(["layer_name", "check_arch"], KW),
    "LocalFuncRepository": {"repo_path": POS} | dict.fromkeys(["func_name", "check_arch"], KW),
    "LockedLayerRepository": {"repo_id": POS}
    | dict.fromkeys(["lockfile", "layer_name", "trust_remote_code", "check_arch"], KW),
    "LockedFuncRepository": {"repo_id": POS}
    | dict.fromkeys(["lockfile", "func_name", "trust_remote_code", "check_arch"], KW),
    "RepoInfo": {"repo_id": POS, "revision": POS},
    "LoadedKernel": {"metadata": POS, "module": POS, "repo_info": POS},
}


@pytest.mark.parametrize("name", sorted(THEIRS))
def test_every_parameter_of_theirs_is_ours_of_the_same_kind(name):
    ours = inspect.signature(getattr(kernels, name)).parameters
    for param, kind in THEIRS[name].items():
        assert param in ours, f"{name} lacks {param}"
        assert ours[param].kind == kind, f"{name}({param}) is {ours[param].kind}"
    # Our extra parameters all have defaults, so every call of theirs is a call of ours.
    extra = [p for p in ours.values() if p.name not in THEIRS[name]]
    assert all(p.default is not inspect.Parameter.empty for p in extra), name


def test_the_repository_names_of_their_all_are_ours():
    for name in [*THEIRS, "Metadata", "VariantAccepted", "VariantRejected", "Benchmark"]:
        assert name in kernels.__all__ and hasattr(kernels, name), name


def test_metadata_has_their_readers():
    assert callable(Metadata.from_bytes) and callable(Metadata.read_from_file)


# --- errors ---------------------------------------------------------------------------------


def test_an_untrusted_organisation_is_a_value_error():
    with pytest.raises(ValueError, match="not trusted") as caught:
        kernels.get_kernel("someone-untrusted/x", version=1)
    assert isinstance(caught.value, UntrustedKernelError)
    assert isinstance(caught.value, PermissionError)  # as before 0.19


def test_an_offline_cache_miss_is_a_file_not_found_error():
    assert issubclass(KernelOfflineError, FileNotFoundError)
    assert issubclass(KernelOfflineError, ConnectionError)  # as before 0.19
    error = KernelOfflineError("not cached", reason="HF_HUB_OFFLINE is set")
    assert error.reason == "HF_HUB_OFFLINE is set" and str(error) == "not cached"


# --- pickling ---------------------------------------------------------------------------------


def _roundtrip(value):
    copy = pickle.loads(pickle.dumps(value))
    assert copy == value and type(copy) is type(value)
    return copy


def test_hub_repositories_pickle_with_every_field():
    layer = LayerRepository(
        "kernels-community/activation",
        layer_name="SiluAndMul",
        version=1,
        trust_remote_code=["someone"],
        user_agent={"app": "x"},
        check_arch=False,
    )
    copy = _roundtrip(layer)
    assert (copy.check_arch, copy.user_agent, copy.trust_remote_code) == (
        False,
        {"app": "x"},
        ("someone",),
    )
    func = FuncRepository("kernels-community/rotary", func_name="f", revision="main")
    assert _roundtrip(func).revision == "main"
    assert _roundtrip(FuncRepository("a/b", func_name="f", version=">=0.1", check_arch=False))


def test_local_repositories_pickle_and_still_load(kernel_repo):
    path = kernel_repo("pickled")
    layer = _roundtrip(LocalLayerRepository(path, layer_name="SiluAndMul", check_arch=False))
    assert layer.check_arch is False and layer.load().__name__ == "SiluAndMul"
    old_form = _roundtrip(
        LocalLayerRepository(path, package_name="activation", layer_name="SiluAndMul")
    )
    assert old_form.load() is layer.load()
    assert _roundtrip(LocalFuncRepository(path, func_name="f")).func_name == "f"


def test_locked_repositories_pickle_with_the_lock_they_mean(tmp_path):
    lockfile = tmp_path / "kernels.lock"
    layer = LockedLayerRepository("a/b", layer_name="L", lockfile=lockfile, check_arch=False)
    copy = _roundtrip(layer)
    assert copy.lockfile == lockfile and copy.check_arch is False
    default = LockedLayerRepository("a/b", layer_name="L")  # the lock of this module
    assert _roundtrip(default)._caller == default._caller == __name__
    func = _roundtrip(LockedFuncRepository("a/b", func_name="f"))
    assert func._package._caller == __name__ and func.func_name == "f"


# --- Metadata ---------------------------------------------------------------------------------

FULL = {
    "id": "_my_kernel_8a3be8f",
    "version": 1,
    "name": "my-kernel",
    "license": "Apache-2.0",
    "kernels-minver": "0.17.0",
    "python-depends": ["torch"],
    "backend": {"type": "cuda", "archs": ["9.0", "10.0"]},
}


def test_metadata_from_bytes_reads_lists_and_backend_info():
    meta = Metadata.from_bytes(json.dumps(FULL).encode())
    assert meta == Metadata.from_dict(FULL)
    assert meta.python_depends == ["torch"] and isinstance(meta.python_depends, list)
    assert meta.backend.backend_type == Backend.CUDA == "cuda"
    assert meta.backend.archs == ["9.0", "10.0"]
    assert meta.backend["type"] == "cuda"  # the raw keys, as before 0.19
    assert repr(meta.backend) == "BackendInfo(backend_type=Backend.CUDA, archs=['9.0', '10.0'])"
    assert str(meta.kernels_minver) == "0.17.0"


def test_backend_names_parse_in_any_case():
    assert Backend.from_str("ROCM") is Backend.ROCm and str(Backend.ROCm) == "rocm"
    assert repr(Backend.XPU) == "Backend.XPU"
    with pytest.raises(ValueError, match="unknown backend 'dsp'"):
        Backend.from_str("dsp")


def test_agnostic_and_unknown_backends():
    agnostic = BackendInfo({"type": "agnostic"})
    assert agnostic.backend_type is None and agnostic.archs is None
    assert repr(agnostic) == "BackendInfo(backend_type=None, archs=None)"
    future = Metadata.from_dict({"backend": {"type": "some-future-backend", "archs": ["x"]}})
    assert future.backend.archs is None and "Unknown" in repr(future.backend)
    with pytest.raises(ValueError, match="unknown backend"):
        _ = future.backend.backend_type


@pytest.mark.parametrize(
    "data, message",
    [
        (b"{not json", "not valid JSON"),
        (b"\xff{}", "not UTF-8"),
        (b'{"id": "a", "id": "b"}', "'id' twice"),
        (b'{"backend": {"type": "cuda", "archs": "9.0"}}', "'archs' must be a list"),
        (b'{"backend": {"type": "cuda", "archs": [9.0]}}', "'archs' must be a list"),
        (b"[" * 100 + b"]" * 100, "levels deep"),
        (b" " * (2 << 20), "refused unread"),
    ],
)
def test_hostile_metadata_bytes_are_refused(data, message):
    with pytest.raises(KernelMetadataError, match=message) as caught:
        Metadata.from_bytes(data)
    assert isinstance(caught.value, ValueError)  # what Hugging Face's from_bytes raises


# --- check_arch -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arch, capability, runs",
    [
        ("9.0", (9, 0), True),
        ("8.0", (8, 6), True),  # same major, newer minor
        ("8.0", (9, 0), False),  # a newer major needs PTX
        ("8.0+PTX", (9, 0), True),
        ("9.0+PTX", (8, 9), False),
        ("9.0a", (9, 0), True),
        ("9.0a", (9, 1), False),  # architecture-specific: exactly that one
        ("10.0f", (10, 3), True),
        ("10.0f", (12, 0), False),  # family-specific: same major only
        ("sm_90", (9, 0), None),  # a notation this version does not know
    ],
)
def test_cuda_arch_rules(arch, capability, runs):
    assert archs.cuda_arch_runs_on(arch, capability) is runs


def test_unknown_notations_are_not_held_against_a_build():
    assert archs.cuda_archs_run_on(["sm_90", "compute_90"], (7, 0))
    assert not archs.cuda_archs_run_on(["sm_90", "9.0"], (7, 0))


def _with_archs(kernel_repo, name, archs_list):
    path = kernel_repo(name)
    meta = {"name": name, "backend": {"type": "cuda", "archs": archs_list}}
    (path / "build" / "torch-universal" / "metadata.json").write_text(json.dumps(meta))
    return path


@pytest.fixture
def sm80(monkeypatch):
    """Pretend the current device is a CUDA GPU of capability 8.0 (this machine has none)."""
    monkeypatch.setattr(archs, "device_arch", lambda backend: (8, 0) if backend else None)


def test_check_arch_refuses_a_build_for_other_gpus(kernel_repo, sm80):
    path = _with_archs(kernel_repo, "hopper-only", ["9.0a"])
    with pytest.raises(BuildVariantNotFoundError, match="check_arch=False") as caught:
        kernels.get_local_kernel(path)
    assert "CUDA capability 8.0" in str(caught.value) and "9.0a" in str(caught.value)
    with pytest.raises(BuildVariantNotFoundError):
        LocalLayerRepository(path, layer_name="SiluAndMul").load()
    layer = LocalLayerRepository(path, layer_name="SiluAndMul", check_arch=False).load()
    assert layer.__name__ == "SiluAndMul"


def test_check_arch_accepts_a_build_for_this_gpu(kernel_repo, sm80):
    path = _with_archs(kernel_repo, "ampere", ["8.0", "9.0"])
    assert kernels.get_local_kernel(path).layers.SiluAndMul.__name__ == "SiluAndMul"


def test_without_a_gpu_of_the_builds_backend_nothing_is_checked(kernel_repo):
    # This machine has no CUDA device: archs cannot be compared, so the build loads.
    path = _with_archs(kernel_repo, "no-gpu-here", ["9.0"])
    assert kernels.get_local_kernel(path).layers.SiluAndMul.__name__ == "SiluAndMul"


# --- local kernels without a package name -----------------------------------------------------


def test_get_local_kernel_finds_the_package_itself(kernel_repo):
    path = kernel_repo("found", package="relu_pkg")
    module = kernels.get_local_kernel(path, backend="cpu")
    assert module.__name__.endswith("relu_pkg") or "relu_pkg" in module.__file__
    assert kernels.get_local_kernel(path, package_name="relu_pkg") is module  # the 0.17 form
    assert kernels.get_local_kernel(path, "relu_pkg") is module
    layer = LocalLayerRepository(repo_path=path, layer_name="SiluAndMul").load()
    assert layer is module.layers.SiluAndMul


# --- user agent -------------------------------------------------------------------------------


@pytest.fixture
def telemetry(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", False)


@pytest.mark.parametrize("extra", [None, "", {}, "my-app/1.0", {"app": "test", "ver": "2.0"}])
def test_user_agent_has_their_fields_and_no_empty_segment(telemetry, extra):
    import platform

    import torch

    with hubclient.user_agent_for(extra):
        agent = hubclient.hub_api().user_agent
    parts = agent.split("; ")
    assert all(part.strip() and "/" in part for part in parts)
    assert f"kernels/{kernels.__version__}" in parts and "file_type/kernel" in parts
    assert f"python/{'.'.join(platform.python_version_tuple()[:2])}" in parts
    assert f"torch/{torch.__version__}" in parts
    assert any(p.startswith("platform/") and p.count("-") == 1 for p in parts)
    if extra == "my-app/1.0":
        assert parts[0] == "my-app/1.0"
    if isinstance(extra, dict) and extra:
        assert parts[:2] == ["app/test", "ver/2.0"]


def test_user_agent_cannot_inject_headers(telemetry):
    with hubclient.user_agent_for({"a\r\nX-Evil": "1;b"}):
        agent = hubclient.hub_api().user_agent
    assert "\r" not in agent and "\n" not in agent and agent.startswith("a  X-Evil/1 b;")


def test_user_agent_is_none_without_telemetry(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    with hubclient.user_agent_for("should-not-appear"):
        assert hubclient.hub_api().user_agent is None


def test_a_user_agent_that_is_no_string_or_dict_is_refused():
    with pytest.raises(ValueError, match="user_agent must be a string"):
        kernels.get_kernel("kernels-community/activation", version=1, user_agent=42)


# --- the egg_info writer ----------------------------------------------------------------------


class _EggInfoCommand:
    """What setuptools' egg_info command gives a writer: write_or_delete_file."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str | None]] = []

    def write_or_delete_file(self, what: str, filename: str, data: str | None) -> None:
        self.calls.append((what, filename, data))


def test_our_pyproject_registers_the_writer_under_their_name():
    import tomllib

    root = Path(__file__).parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())
    writers = project["project"]["entry-points"]["egg_info.writers"]
    assert writers == {"kernels.lock": "kernels.repos.lock:write_egg_lockfile"}


@pytest.mark.parametrize(
    "pyproject, lock, written",
    [
        (None, "lock", None),  # no pyproject.toml: not called at all
        ("[project]\nname = 'x'\n", "lock", None),  # declares no kernels
        ("[tool.kernels.dependencies]\n'a/b' = 1\n", '{"a": 1}', '{"a": 1}'),
        ("[tool.kernels.dependencies]\n'a/b' = 1\n", None, "delete"),
        ("not = [toml", "lock", None),  # broken: never breaks the build
    ],
)
def test_write_egg_lockfile_as_theirs(tmp_path, monkeypatch, caplog, pyproject, lock, written):
    if pyproject is not None:
        (tmp_path / "pyproject.toml").write_text(pyproject)
    if lock is not None:
        (tmp_path / "kernels.lock").write_text(lock)
    monkeypatch.chdir(tmp_path)
    cmd = _EggInfoCommand()
    with caplog.at_level(logging.WARNING, logger="kernels"):
        write_egg_lockfile(cmd, "kernels.lock", "x.egg-info/kernels.lock")
    if written is None:
        assert cmd.calls == []
    elif written == "delete":
        assert cmd.calls == [("kernels.lock", "x.egg-info/kernels.lock", None)]
        assert "kernels lock" in caplog.text and "does not exist" in caplog.text
    else:
        assert cmd.calls == [("kernels.lock", "x.egg-info/kernels.lock", written)]
