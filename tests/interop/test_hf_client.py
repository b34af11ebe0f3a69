"""Hugging Face's own `kernels` client loads and kernelizes each of our kernel repositories.

Runs in ``.venv-hf`` (``make test-hf``), where `kernels` is their client and this package is not
installed: nothing here imports ours. On the CPU our Triton kernels run through Triton's
interpreter (``TRITON_INTERPRET=1``, set by tests/conftest.py before triton is imported), so
shapes are tiny. Each kernelized layer is compared in fp32 with the plain layer it replaces.
"""

import json
import math
from pathlib import Path

import kernels

assert kernels.__version__ == "0.19.1", (
    f"tests/interop needs Hugging Face's kernels 0.19.1, got {kernels.__version__} from "
    f"{kernels.__file__}: run them with `make test-hf`"
)

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kernels import (  # noqa: E402
    KernelizeFallback,
    LocalLayerRepository,
    Metadata,
    Mode,
    get_kernelized_layers,
    get_local_kernel,
    kernelize,
    use_kernel_forward_from_hub,
    use_kernel_mapping,
)

REPOS = ("activation", "attention", "loss", "norm", "rotary")
NOARCH = ("torch-cuda", "torch-rocm", "torch-xpu")


def _metadata(library: Path, repo: str, variant: str) -> dict:
    return json.loads((library / repo / "build" / variant / "metadata.json").read_text())


@pytest.mark.parametrize("repo", REPOS)
def test_their_client_loads_each_repository(library, repo):
    """On the CPU their client takes torch-universal (the legacy layout: the package in a folder
    of its own), imported under the variant's metadata id."""
    module = get_local_kernel(library / repo)
    meta = _metadata(library, repo, "torch-universal")
    assert module.__name__ == meta["id"]
    assert (
        Path(module.__file__) == library / repo / "build" / "torch-universal" / repo / "__init__.py"
    )


@pytest.mark.parametrize("repo", REPOS)
@pytest.mark.parametrize("variant", NOARCH)
def test_their_client_loads_each_noarch_variant_flat(library, repo, variant):
    """A variant folder given directly is imported as the package itself (the current layout);
    its metadata.json parses, with the variant's own backend."""
    folder = library / repo / "build" / variant
    meta = Metadata.read_from_file(folder / "metadata.json")
    assert (str(meta.name), meta.id, meta.version) == (
        repo,
        _metadata(library, repo, variant)["id"],
        1,
    )
    assert str(meta.backend.backend_type).lower() == variant.removeprefix("torch-")
    assert meta.python_depends == []
    module = get_local_kernel(folder)
    assert Path(module.__file__) == folder / "__init__.py"


@pytest.mark.parametrize("repo", REPOS)
def test_their_client_verifies_our_digests(library, repo, caplog, tmp_path):
    """Every variant records kernel-builder's file digests, which their client checks before it
    imports the variant: with no digest it would load with a warning that the kernel's
    integrity cannot be verified; with a changed file it refuses."""
    import shutil

    with caplog.at_level("DEBUG", logger="kernels"):
        get_local_kernel(library / repo)
    digest_lines = [r for r in caplog.records if "digest" in r.getMessage()]
    assert digest_lines and all(r.levelname == "DEBUG" for r in digest_lines), [
        (r.levelname, r.getMessage()) for r in digest_lines
    ]
    assert "match the digest" in digest_lines[-1].getMessage()

    copy = tmp_path / "build" / "torch-cuda"
    shutil.copytree(library / repo / "build" / "torch-cuda", copy)
    with (copy / "__init__.py").open("a") as f:
        f.write("\n# changed after the build\n")
    with pytest.raises(RuntimeError, match="(?s)do not match the digest.*mismatch for __init__.py"):
        get_local_kernel(copy)


def test_their_client_prefers_the_noarch_variant_of_the_machines_backend(library):
    # Private in their client since 0.19 (kernels._internals), pinned by the version above.
    from kernels._internals.backends import CPU, CUDA, ROCm
    from kernels._internals.variants import _resolve_variant_for_system, get_variants_local
    from packaging.version import Version

    variants = get_variants_local(library / "norm" / "build")
    for backend, expected in (
        (CPU(), "torch-universal"),
        (CUDA(version=Version("12.8")), "torch-cuda"),
        (ROCm(version=Version("6.3")), "torch-rocm"),
    ):
        accepted, _ = _resolve_variant_for_system(
            variants, backend, "x86_64", "linux", Version("2.13"), True, None
        )
        assert accepted[0].variant_str == expected


@pytest.mark.parametrize("repo", REPOS)
def test_their_build_toml_parser_takes_ours(library, repo, capfd):
    # Private in their client (the parser kernel-builder shares), pinned by the version above.
    from kernels._rust import Backend, Build

    build = Build.open(library / repo)
    assert set(build.general.backends) == {Backend.CUDA, Backend.ROCm, Backend.XPU}
    assert "legacy" not in capfd.readouterr().err


# ---- kernelize, one layer of each repository ------------------------------------------------


@use_kernel_forward_from_hub("SiluAndMul")
class SiluAndMul(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]


@use_kernel_forward_from_hub("RMSNorm")
class RMSNorm(torch.nn.Module):
    """transformers' LlamaRMSNorm."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        x = hidden_states.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(hidden_states.dtype)


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


@use_kernel_forward_from_hub("rotary_pos_emb")
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """transformers 5.x's function, tagged as transformers tags it."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


@use_kernel_forward_from_hub("ForCausalLMLoss")
def for_causal_lm_loss(
    logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None,
    **kwargs,
):  # fmt: skip
    """transformers' ForCausalLMLoss, on logits (or on ``hidden_states @ lm_head_weight.T``)."""
    if logits is None:
        logits = F.linear(kwargs["hidden_states"], kwargs["lm_head_weight"])
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = F.cross_entropy(
        logits.float().reshape(-1, vocab_size), shift_labels.reshape(-1),
        ignore_index=ignore_index, reduction=reduction,
    )  # fmt: skip
    return loss / num_items_in_batch if reduction == "sum" else loss


class Tiny(torch.nn.Module):
    """One layer of each repository: an MLP's activation, a norm, the rotary embedding of an
    attention's q and k, and the causal-LM loss."""

    def __init__(self, hidden=16, vocab=40):
        super().__init__()
        self.up = torch.nn.Linear(hidden, 2 * hidden, bias=False)
        self.act = SiluAndMul()
        self.norm = RMSNorm(hidden)
        self.qk = torch.nn.Linear(hidden, 2 * hidden, bias=False)
        # The tagged functions are module instances: one each, as kernelize swaps an
        # instance's forward.
        self.rotary = type(apply_rotary_pos_emb)()
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False)
        self.loss = type(for_causal_lm_loss)()
        self.vocab = vocab

    def forward(self, x, cos, sin, labels):
        h = self.norm(x + self.act(self.up(x)))
        b, s, _ = h.shape
        # q and k of two heads of 8: (batch, heads, seq, head_dim) each
        q, k = self.qk(h).view(b, s, 2, 2, -1).permute(2, 0, 3, 1, 4).contiguous().unbind(0)
        q, k = self.rotary(q, k, cos, sin)
        h = h + (q + k).transpose(1, 2).reshape(b, s, -1)
        logits = self.lm_head(h)
        loss = self.loss(logits, labels, self.vocab)
        fused = self.loss(None, labels, self.vocab, hidden_states=h, lm_head_weight=self.lm_head.weight)  # fmt: skip
        return h, logits, loss, fused


MAPPING = {
    "SiluAndMul": ("activation", "SiluAndMul"),
    "RMSNorm": ("norm", "RMSNorm"),
    "rotary_pos_emb": ("rotary", "RotaryPosEmb"),
    "ForCausalLMLoss": ("loss", "ForCausalLMLoss"),
}


def _inputs(hidden=16, seq=5, vocab=40):
    torch.manual_seed(0)
    x = torch.randn(2, seq, hidden)
    head_dim = 8
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    emb = torch.arange(seq, dtype=torch.float32)[:, None] * inv
    emb = torch.cat((emb, emb), -1)[None].expand(2, seq, head_dim)
    labels = torch.randint(0, vocab, (2, seq))
    labels[0, 1] = -100
    return x, emb.cos(), emb.sin(), labels


def _local_mapping(library: Path):
    return {
        name: {"cpu": LocalLayerRepository(library / repo, layer_name=layer)}
        for name, (repo, layer) in MAPPING.items()
    }


@pytest.mark.parametrize("mode", [Mode.INFERENCE, Mode.TRAINING], ids=["inference", "training"])
def test_their_kernelize_runs_a_layer_of_each_repository(library, mode):
    torch.manual_seed(0)
    plain = Tiny()
    fast = Tiny()
    fast.load_state_dict(plain.state_dict())
    with use_kernel_mapping(_local_mapping(library)):
        # 0.19's flags: no fallback of any kind, so each layer must take our kernel.
        kernelize(fast, mode=mode, device="cpu", use_fallback=KernelizeFallback.NONE)
    for module, (repo, layer) in zip(
        (fast.act, fast.norm, fast.rotary, fast.loss), MAPPING.values(), strict=True
    ):
        bound = module.forward.__func__
        assert bound.__qualname__ == f"{layer}.forward", bound.__qualname__
        assert bound.__module__ == f"{_metadata(library, repo, 'torch-universal')['id']}.layers"

    x, cos, sin, labels = _inputs()
    x_fast = x.clone().requires_grad_(mode == Mode.TRAINING)
    x_plain = x.clone().requires_grad_(mode == Mode.TRAINING)
    got = fast(x_fast, cos, sin, labels)
    want = plain(x_plain, cos, sin, labels)
    for name, g, w in zip(("hidden", "logits", "loss", "fused loss"), got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=2e-5, atol=2e-5, msg=lambda m, n=name: f"{n}: {m}")
    assert math.isfinite(got[2].item())
    if mode == Mode.TRAINING:
        (got[0].square().mean() + got[2] + got[3]).backward()
        (want[0].square().mean() + want[2] + want[3]).backward()
        torch.testing.assert_close(x_fast.grad, x_plain.grad, rtol=1e-4, atol=1e-5)
        for (name, p), q in zip(fast.named_parameters(), plain.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")  # fmt: skip


def test_their_get_kernelized_layers_reports_our_repositories(library):
    """0.19's inspection of a kernelized model names, for each swapped layer, the repository
    (ours) its kernel came from."""
    model = Tiny()
    mapping = _local_mapping(library)
    with use_kernel_mapping(mapping):
        kernelize(model, mode=Mode.INFERENCE, device="cpu", use_fallback=KernelizeFallback.NONE)
    layers = get_kernelized_layers(model).layers
    for name, tag in (("act", "SiluAndMul"), ("norm", "RMSNorm")):
        assert layers[name].module is getattr(model, name)
        assert layers[name].repo is mapping[tag]["cpu"]


def test_their_client_loads_a_repository_that_ships_triton_binaries(library, tmp_path, caplog):
    """A CUDA variant may carry ``_binaries/`` (compiled Triton kernels and a manifest, which
    our packages seed into Triton's cache): their client checks those files against
    metadata.json's digests like any other, refuses a changed one, and otherwise ignores them.
    The binaries are bytes of our making: what matters here is the layout."""
    import hashlib
    import importlib.util
    import shutil
    import sys

    spec = importlib.util.spec_from_file_location("_interop_binaries_build", library / "build.py")
    build = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = build
    try:
        spec.loader.exec_module(build)
        shared = build.binaries_module()
        repo_dir = tmp_path / "norm"
        shutil.copytree(library / "norm", repo_dir, ignore=shutil.ignore_patterns("build"))
        repo = build.read_repository(repo_dir)
        key, cubin = "A" * 52, b"\x7fELF" + bytes(4000)
        group = shared.Group(
            triton="3.6.0",
            key=key,
            target="cuda:90",
            kernel="_rms_norm_fwd",
            files=tuple(
                shared.BinaryFile(name, hashlib.sha256(data).hexdigest(), len(data))
                for name, data in (("_rms_norm_fwd.json", b"{}"), ("_rms_norm_fwd.cubin", cubin))
            ),
        )
        digest = build.source_digest(build.package_files(repo))
        binaries = repo_dir / "binaries"
        shutil.rmtree(binaries, ignore_errors=True)  # the library's own, replaced by this one
        json_file, cubin_file = group.files
        (binaries / "files").mkdir(parents=True)
        (binaries / shared.stored(json_file)).write_bytes(b"{}")
        (binaries / shared.stored(cubin_file)).write_bytes(cubin)
        manifest = shared.Manifest("norm", digest, (group,))
        (binaries / "manifest.json").write_text(manifest.to_json())
        out = build.write_build(repo, tmp_path / "out", symbols=False)
    finally:
        del sys.modules[spec.name]
    for variant in ("torch-universal", "torch-cuda"):
        package = out / variant / "norm" if variant == "torch-universal" else out / variant
        assert (package / "_binaries" / shared.stored(cubin_file)).read_bytes() == cubin

    with caplog.at_level("DEBUG", logger="kernels"):
        module = get_local_kernel(tmp_path / "out")
    assert Path(module.__file__).parent.joinpath("_binaries", "manifest.json").is_file()
    assert "match the digest" in [r for r in caplog.records if "digest" in r.getMessage()][-1].getMessage()  # fmt: skip
    assert hasattr(module, "layers")

    target = out / "torch-cuda" / "_binaries" / shared.stored(cubin_file)
    target.write_bytes(b"\x00" + cubin[1:])
    with pytest.raises(
        RuntimeError, match=f"(?s)do not match the digest.*{cubin_file.sha256}.cubin"
    ):
        get_local_kernel(out / "torch-cuda")
