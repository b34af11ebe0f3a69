"""What a build's metadata.json demands is enforced before any of its code runs
(`kernels.repos.requirements`): python-depends, kernels-minver, backend.type, provenance."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import sys

import pytest
import torch.nn as nn
import torch.nn.functional as F

import kernels
from kernels import (
    KernelHashMismatchError,
    KernelizeFallback,
    KernelLoadError,
    KernelMetadataError,
    LocalLayerRepository,
    Mode,
    get_local_kernel,
    kernelize,
    use_kernel_forward_from_hub,
    use_kernel_mapping,
)
from kernels.layer.swap import kernel_layer_of
from kernels.repos import requirements
from kernels.repos.digests import check_digests, variant_digests
from kernels.repos.info import Metadata
from kernels.repos.requirements import ALLOWED_PYTHON_DEPENDS, check_requirements

# Every module a refused load would have imported sets this, so a test can tell that no
# kernel code ran.
RAN = "_kernels_test_requirements_ran"
INIT = f"import builtins\nbuiltins.{RAN} = True\nfrom . import layers\n"

BASE = {
    "name": "activation",
    "id": "_activation_abc",
    "version": 1,
    "license": "Apache-2.0",
    "python-depends": [],
    "backend": {"type": "cuda"},
}


def _repo(kernel_repo, name, variant="torch-universal", **fields):
    path = kernel_repo(name, variant=variant, init_source=INIT)
    meta = {**BASE, **fields}
    (path / "build" / variant / "metadata.json").write_text(json.dumps(meta))
    return path


def _refused(path, error, match, **load_options):
    """Loading `path` raises `error` matching `match`, and none of the kernel's code ran."""
    import builtins

    before = set(sys.modules)
    with pytest.raises(error, match=match) as caught:
        get_local_kernel(path, **load_options)
    assert not hasattr(builtins, RAN), "kernel code ran before the refusal"
    assert set(sys.modules) == before
    return str(caught.value)


@pytest.fixture(autouse=True)
def _forget_ran():
    import builtins

    yield
    if hasattr(builtins, RAN):
        delattr(builtins, RAN)


# --- python-depends ---------------------------------------------------------------------------


def test_no_python_depends_loads(kernel_repo):
    assert hasattr(get_local_kernel(_repo(kernel_repo, "plain")), "layers")


def test_an_installed_allowed_package_loads(kernel_repo, monkeypatch):
    # Pretend einops is installed: the check finds modules without importing them, and a
    # module already in sys.modules counts as installed.
    monkeypatch.setitem(sys.modules, "einops", sys)
    assert hasattr(
        get_local_kernel(_repo(kernel_repo, "einops", **{"python-depends": ["einops"]})), "layers"
    )


def test_a_dependency_is_found_without_importing_it(kernel_repo, tmp_path, monkeypatch):
    # An installed einops whose import would fail: finding it must not run it.
    (tmp_path / "site" / "einops").mkdir(parents=True)
    (tmp_path / "site" / "einops" / "__init__.py").write_text("raise RuntimeError('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "einops", raising=False)
    get_local_kernel(_repo(kernel_repo, "found", **{"python-depends": ["einops"]}))
    assert "einops" not in sys.modules


def test_a_package_outside_the_allow_list_is_refused(kernel_repo):
    path = _repo(kernel_repo, "evil", **{"python-depends": ["requests"]})
    message = _refused(path, KernelMetadataError, "'python-depends' names 'requests'")
    assert "allowed: einops, helion" in message and "tvm-ffi" in message
    # A universal build may name the machine's backend's packages only; this test machine's
    # backend decides which, so it is given explicitly here.
    meta = Metadata.load_from_variant(path / "build" / "torch-universal")
    with pytest.raises(KernelMetadataError, match="nvidia-cutlass-dsl"):
        check_requirements(meta, path / "build" / "torch-universal", machine_backend="cuda")


def test_backend_specific_packages_follow_the_variant(kernel_repo, monkeypatch):
    monkeypatch.setitem(sys.modules, "cutlass", sys)
    cutlass = {"python-depends": ["nvidia-cutlass-dsl"]}
    cuda = _repo(kernel_repo, "cuda", variant="torch-cuda", **cutlass)
    variant = cuda / "build" / "torch-cuda"
    check_requirements(Metadata.load_from_variant(variant), variant, machine_backend="rocm")
    rocm = _repo(kernel_repo, "rocm", variant="torch-rocm", backend={"type": "rocm"}, **cutlass)
    variant = rocm / "build" / "torch-rocm"
    with pytest.raises(KernelMetadataError, match="a kernel for rocm may not depend on"):
        check_requirements(Metadata.load_from_variant(variant), variant, machine_backend="cuda")
    universal = _repo(kernel_repo, "universal", **cutlass)
    variant = universal / "build" / "torch-universal"
    check_requirements(Metadata.load_from_variant(variant), variant, machine_backend="cuda")
    with pytest.raises(KernelMetadataError, match="a kernel for xpu may not depend on"):
        check_requirements(Metadata.load_from_variant(variant), variant, machine_backend="xpu")


def test_a_missing_allowed_package_is_refused_with_the_install_command(kernel_repo, monkeypatch):
    monkeypatch.delitem(sys.modules, "tvm_ffi", raising=False)
    monkeypatch.setattr(requirements.importlib.util, "find_spec", lambda name: None)
    path = _repo(kernel_repo, "needs", **{"python-depends": ["tvm-ffi"]})
    message = _refused(path, KernelLoadError, "needs the Python package 'apache-tvm-ffi'")
    assert message.endswith("Install it with: pip install apache-tvm-ffi")


def test_the_allow_list_is_hugging_faces():
    assert sorted(ALLOWED_PYTHON_DEPENDS["general"]) == ["einops", "helion", "tvm-ffi"]
    assert list(ALLOWED_PYTHON_DEPENDS["cuda"]) == ["nvidia-cutlass-dsl"]
    assert list(ALLOWED_PYTHON_DEPENDS["xpu"]) == ["onednn"]
    # oneDNN ships no Python module: nothing to look for, so it is not checked.
    assert ALLOWED_PYTHON_DEPENDS["xpu"]["onednn"][0].import_name is None


# --- kernels-minver ---------------------------------------------------------------------------


@pytest.mark.parametrize("minver", ["0.1.0", "0.18.2", kernels.__version__])
def test_an_old_enough_minver_loads(kernel_repo, minver):
    get_local_kernel(_repo(kernel_repo, "old", **{"kernels-minver": minver}))


def test_a_newer_minver_is_refused_with_both_versions_and_the_upgrade(kernel_repo):
    major, minor, patch = (int(part) for part in kernels.__version__.split(".")[:3])
    newer = f"{major}.{minor}.{patch + 1}"  # the next release of ours
    path = _repo(kernel_repo, "new", **{"kernels-minver": newer})
    message = _refused(path, KernelLoadError, f"needs kernels>={re.escape(newer)}")
    assert f"kernels {kernels.__version__} is installed" in message
    assert message.endswith("Upgrade with: pip install --upgrade kernels")
    _refused(_repo(kernel_repo, "major", **{"kernels-minver": "1.0.0"}), KernelLoadError, "1.0.0")


@pytest.mark.parametrize("minver", ["0.18", "0.18.2.post1", "x", "1.0.0a1", " 0.1.0", "01.0.0", ""])
def test_a_malformed_minver_is_a_metadata_error(kernel_repo, minver):
    path = _repo(kernel_repo, "bad", **{"kernels-minver": minver})
    _refused(path, KernelMetadataError, "'kernels-minver' is .*not a version X.Y.Z")


def test_a_development_release_counts_as_its_release(monkeypatch):
    assert requirements._release("0.18.2.dev0") == (0, 18, 2)
    assert requirements._release("1.0") == (1, 0, 0)
    assert requirements._release("not-pep440") > (99, 0, 0)


# --- backend.type -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variant", "declared"),
    [
        ("torch-cuda", "cuda"),
        ("torch-rocm", "rocm"),
        ("torch-xpu", "xpu"),
        ("torch-npu", "cann"),
        ("torch28-cxx11-cu128-x86_64-linux", "cuda"),
        ("torch-universal", "cuda"),
        ("torch-universal", "rocm"),
        ("torch-universal", "universal"),
    ],
)
def test_a_backend_matching_its_variant_is_accepted(tmp_path, variant, declared):
    folder = tmp_path / "build" / variant
    check_requirements(Metadata(backend={"type": declared}), folder, machine_backend="cuda")


@pytest.mark.parametrize(
    ("variant", "declared"),
    [
        ("torch-cuda", "rocm"),
        ("torch-rocm", "cuda"),
        ("torch-xpu", "universal"),
        ("torch28-cxx11-cu128-x86_64-linux", "rocm"),
        ("torch29-cxx11-rocm63-x86_64-linux", "cuda"),
    ],
)
def test_a_backend_unlike_its_variant_is_refused(tmp_path, variant, declared):
    folder = tmp_path / "build" / variant
    with pytest.raises(KernelMetadataError, match=f"declares backend '{declared}'.*{variant}"):
        check_requirements(Metadata(backend={"type": declared}), folder, machine_backend="cuda")


def test_a_mislabelled_build_is_refused_at_load(kernel_repo):
    path = _repo(kernel_repo, "mislabelled", variant="torch-cpu", backend={"type": "cuda"})
    # backend="cpu": the torch-cpu variant is the one chosen on any machine, a GPU one too.
    message = _refused(path, KernelMetadataError, "declares backend 'cuda'", backend="cpu")
    assert "expected backend.type 'cpu'" in message and "rebuild it with kernel-builder" in message


def test_a_folder_outside_build_has_no_variant_to_match(tmp_path):
    check_requirements(
        Metadata(backend={"type": "rocm"}), tmp_path / "mypkg", machine_backend="cuda"
    )


# --- provenance -------------------------------------------------------------------------------

COMMIT = "ab" * 20


@pytest.mark.parametrize(
    ("provenance", "dirty"),
    [
        ({"kernel-builder": {"version": "0.1"}}, False),
        (
            {"kernel-builder": {"version": "0.1"}, "kernel": {"commit": COMMIT, "dirty": False}},
            False,
        ),
        ({"kernel-builder": {"version": "0.1"}, "kernel": {"commit": COMMIT, "dirty": True}}, True),
        ({"kernel-builder": {"version": "0.1", "git": {"commit": COMMIT, "dirty": True}}}, True),
        ({"kernel": {"dirty": "yes"}}, False),
        ("dirty", False),
    ],
)
def test_a_dirty_build_loads_with_one_warning(kernel_repo, caplog, provenance, dirty):
    path = _repo(kernel_repo, "prov", provenance=provenance)
    with caplog.at_level(logging.WARNING, logger="kernels"):
        get_local_kernel(path)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if dirty:
        assert len(warnings) == 1
        assert "kernel 'activation'" in warnings[0] and "uncommitted changes" in warnings[0]
    else:
        assert warnings == []


# --- through kernelize --------------------------------------------------------------------------


@use_kernel_forward_from_hub("SiluAndMul")
class SiluAndMul(nn.Module):
    def forward(self, input):
        d = input.shape[-1] // 2
        return F.silu(input[..., :d]) * input[..., d:]


def test_kernelize_falls_back_from_a_refused_kernel(kernel_repo, caplog):
    path = _repo(kernel_repo, "refused", **{"kernels-minver": "99.0.0"})
    mapping = {"SiluAndMul": {"cpu": LocalLayerRepository(path, layer_name="SiluAndMul")}}
    with use_kernel_mapping(mapping, inherit_mapping=False):
        layer = SiluAndMul()
        with caplog.at_level(logging.WARNING, logger="kernels"):
            kernelize(layer, mode=Mode.INFERENCE, device="cpu", use_fallback=KernelizeFallback.ALL)
        assert kernel_layer_of(layer) is None
        assert any("kernels>=99.0.0" in r.getMessage() for r in caplog.records)
        with pytest.raises(KernelLoadError, match="kernels>=99.0.0"):
            kernelize(SiluAndMul(), mode=Mode.INFERENCE, device="cpu", use_fallback=False)


# --- file digests -----------------------------------------------------------------------------


def _digests(variant_dir, algorithm="sha256"):
    """The digest field of a variant's files, computed as kernel-builder does."""
    files = {}
    for path in sorted(variant_dir.rglob("*")):
        rel = path.relative_to(variant_dir).as_posix()
        if path.is_file() and not rel.startswith("metadata.json") and path.suffix != ".pyc":
            digest = hashlib.new(algorithm, path.read_bytes()).digest()
            files[rel] = base64.b64encode(digest).decode()
    return {"algorithm": algorithm, "files": files}


def _digested(kernel_repo, name, algorithm="sha256", **fields):
    path = _repo(kernel_repo, name)
    variant = path / "build" / "torch-universal"
    meta = {**BASE, "digest": _digests(variant, algorithm), **fields}
    (variant / "metadata.json").write_text(json.dumps(meta))
    return path, variant


def test_digests_are_hugging_faces(tmp_path):
    # The value their client's Digest.hash_variant gives a file holding "x=1\n".
    data = "mHUu4o1UhL3CgU+3CttqCy+zH2qbjueugf0vyc8wCzs="
    variant = tmp_path / "build" / "torch-universal"
    variant.mkdir(parents=True)
    (variant / "__init__.py").write_text("x=1\n")
    assert _digests(variant)["files"] == {"__init__.py": data}
    meta = Metadata(extra={"digest": {"algorithm": "sha256", "files": {"__init__.py": data}}})
    check_digests(meta, variant)
    (variant / "__init__.py").write_text("x=2\n")
    with pytest.raises(KernelHashMismatchError, match="__init__.py has sha256"):
        check_digests(meta, variant)


def test_variant_digests_are_what_the_check_compares(tmp_path):
    # Their client's Digest.hash_variant values for "hello world"; the metadata, its
    # signature and bytecode are left out, paths are relative with "/".
    variant = tmp_path / "v"
    (variant / "sub").mkdir(parents=True)
    (variant / "sub" / "_ext.so").write_bytes(b"hello world")
    for name in ("metadata.json", "metadata.json.sigstore", "cache.pyc"):
        (variant / name).write_bytes(b"{}")
    assert variant_digests(variant) == {
        "sub/_ext.so": "uU0nuZNNPgilLlLX2n2r+sSE7+N6U4DukIj3rOLvzek="
    }
    assert variant_digests(variant, "sha512")["sub/_ext.so"].startswith("MJ7MSJwS1utMxA9Q")
    meta = Metadata(extra={"digest": {"algorithm": "sha256", "files": variant_digests(variant)}})
    check_digests(meta, variant)
    with pytest.raises(ValueError, match="unknown digest algorithm 'md5'"):
        variant_digests(variant, "md5")


@pytest.mark.parametrize("algorithm", ["sha256", "sha512"])
def test_files_matching_their_digests_load(kernel_repo, algorithm):
    path, variant = _digested(kernel_repo, "good", algorithm)
    # Left out of the digests, as in Hugging Face's client: the metadata and its signature,
    # and bytecode.
    (variant / "metadata.json.sigstore").write_text("{}")
    (variant / "activation" / "__pycache__").mkdir()
    (variant / "activation" / "__pycache__" / "layers.cpython-311.pyc").write_bytes(b"pyc")
    (variant / "stray.pyc").write_bytes(b"pyc")
    assert hasattr(get_local_kernel(path), "layers")
    # A local folder changes while it is developed: it keeps no receipt.
    assert not list(path.rglob(".kernels-files"))


def test_a_changed_file_is_refused_naming_it(kernel_repo):
    path, variant = _digested(kernel_repo, "changed")
    (variant / "activation" / "layers.py").write_text("import os\n")
    message = _refused(path, KernelHashMismatchError, "activation/layers.py has sha256 ")
    assert "metadata.json records" in message and "Nothing was imported" in message
    assert "Rebuild the kernel (kernel-builder writes the digests)" in message


def test_an_extra_file_is_refused_naming_it(kernel_repo):
    path, variant = _digested(kernel_repo, "extra")
    (variant / "activation" / "planted.py").write_text("import os\n")
    _refused(path, KernelHashMismatchError, "activation/planted.py is not listed in the digests")


def test_a_missing_file_is_refused_naming_it(kernel_repo):
    path, variant = _digested(kernel_repo, "missing")
    meta = json.loads((variant / "metadata.json").read_text())
    meta["digest"]["files"]["activation/_ops.py"] = meta["digest"]["files"]["activation/layers.py"]
    (variant / "metadata.json").write_text(json.dumps(meta))
    _refused(path, KernelHashMismatchError, "file activation/_ops.py is listed .* but missing")


@pytest.mark.parametrize(
    ("digest", "match"),
    [
        ("sha256", "must be an object, not a string"),
        ({"algorithm": "SHA256", "files": {}}, "'algorithm' is 'SHA256'"),
        ({"algorithm": "md5", "files": {}}, "must be one of sha256, sha512"),
        ({"algorithm": "sha256", "files": []}, "'files' must be an object"),
        ({"algorithm": "sha256", "files": {"../x.py": "A" * 43 + "="}}, "'../x.py' is not a path"),
        ({"algorithm": "sha256", "files": {"/etc/passwd": "A" * 43 + "="}}, "is not a path"),
        ({"algorithm": "sha256", "files": {"a//b": "A" * 43 + "="}}, "is not a path"),
        ({"algorithm": "sha256", "files": {"x.py": "not base64!"}}, "not the base64 of a sha256"),
        ({"algorithm": "sha512", "files": {"x.py": "A" * 43 + "="}}, "not the base64 of a sha512"),
        ({"algorithm": "sha256", "files": {"x.py": 3}}, "not the base64"),
    ],
)
def test_malformed_digests_are_a_metadata_error(kernel_repo, digest, match):
    path, _ = _digested(kernel_repo, "malformed", digest=digest)
    _refused(path, KernelMetadataError, match)


@pytest.mark.parametrize(("machine", "loads"), [("cuda", True), ("cpu", False), ("npu", False)])
def test_a_universal_build_may_name_the_machines_backend_packages(
    kernel_repo, monkeypatch, machine, loads
):
    from dataclasses import replace

    import kernels.repos.variants as variants

    here = replace(variants.machine_build(), backend=machine, backend_version=None)
    monkeypatch.setattr(variants, "machine_build", lambda: here)
    monkeypatch.setitem(sys.modules, "cutlass", sys)
    path = _repo(kernel_repo, f"on-{machine}", **{"python-depends": ["nvidia-cutlass-dsl"]})
    if loads:
        get_local_kernel(path)
    else:
        _refused(
            path, KernelMetadataError, "'nvidia-cutlass-dsl', which a kernel for c[a-z]+ may not"
        )
