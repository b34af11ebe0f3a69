"""The one list of the library's kernels: each repository under ``library/`` and each layer it
serves, with what the rest of the project must know about it.

Adding a kernel to the library is its folder under ``library/`` and one entry here (a
`LibraryKernel`, and a `LibraryRepository` for a new folder). The other lists are derived from
this one where they can be: `kernels.library.library_mapping` (the layers),
`kernels.library.load_library_package` (the repository names),
``kernels.compile.library_kernels.library_patterns`` (the compile backend's patterns) and
``benchmarks.cases.load_library`` (the repositories ``benchmarks.ops`` times).
``tests/library/test_registry.py`` checks the lists that cannot import this module against it
(the compile rule's ``LAYERS`` and ``RULE``, copied into standalone repositories; the case names
of ``benchmarks/cases.py``; the override families; the ``compile_side`` calls in each
repository's source; the folders under ``library/``) and names the list and the name that
disagree. docs/writing-kernels.md#adding-a-kernel-to-the-library says what to touch.
"""

from __future__ import annotations

from dataclasses import dataclass

from .transformers_tags import CAUSAL_LM_LAYER_NAMES


@dataclass(frozen=True)
class LibraryRepository:
    """One kernel repository of the library: a folder under ``library/``.

    Attributes:
        name: the folder under ``library/``, its package name and its Hub repository name.
        benchmarks: the modules under ``benchmarks/`` that time it (``"ops"`` for
            ``benchmarks/ops.py``); each repository has at least one.
    """

    name: str
    benchmarks: tuple[str, ...]


@dataclass(frozen=True)
class LibraryKernel:
    """One kernel of the library: the layer name it serves and where it lives.

    Attributes:
        layer_name: the name model code tags the layer (or function) with.
        repo: the `LibraryRepository` it lives in (the folder under ``library/``).
        attribute: the kernel layer class in ``layers``, or the function for function kernels.
        is_function: a function kernel (`kernels.LocalFuncRepository`) rather than a layer.
        compile_layers: the layers of the compile rule (``_compile_rule.LAYERS``) that its
            functions ask under ``torch.compile`` (op or formula).
        benchmarks: the ``benchmarks.ops`` cases that time it (``benchmarks/cases.py``'s
            ``OPS``).
        compile_patterns: the patterns of the compile backend (`kernels.compile`) that it
            serves (``kernels/compile/library_kernels.py``).
        override_families: the aten override families (`kernels.overrides`) that run its
            launchers in place of PyTorch's kernels.
    """

    layer_name: str
    repo: str
    attribute: str
    is_function: bool = False
    compile_layers: tuple[str, ...] = ()
    benchmarks: tuple[str, ...] = ()
    compile_patterns: tuple[str, ...] = ()
    override_families: tuple[str, ...] = ()


#: Every kernel repository of the library, by folder name.
REPOSITORIES: tuple[LibraryRepository, ...] = (
    LibraryRepository("activation", benchmarks=("ops", "decode_mlp", "overrides")),
    LibraryRepository("norm", benchmarks=("ops", "overrides")),
    LibraryRepository("rotary", benchmarks=("ops",)),
    LibraryRepository("loss", benchmarks=("loss",)),
    # No layer: transformers' attention registries reach it (kernels.library.attention).
    LibraryRepository("attention", benchmarks=("attention",)),
)

_ACTIVATION = ("activation",)
_GATED = ("gated_activation",)
_GATED_MLP = ("gated_mlp", "gated_mlp_decode")

#: Every layer (and function) the library has a kernel for, in `library_mapping` order.
KERNELS: tuple[LibraryKernel, ...] = (
    LibraryKernel("SiLU", "activation", "SiLU", compile_layers=_ACTIVATION,
                  compile_patterns=("silu",), override_families=("silu",)),
    LibraryKernel("GeLU", "activation", "GeLU", compile_layers=_ACTIVATION,
                  compile_patterns=("gelu",), override_families=("gelu",)),
    LibraryKernel("GeluTanh", "activation", "GeluTanh", compile_layers=_ACTIVATION,
                  benchmarks=("GeluTanh",), compile_patterns=("gelu_tanh",),
                  override_families=("gelu",)),
    LibraryKernel("NewGELU", "activation", "NewGELU", compile_layers=_ACTIVATION),
    LibraryKernel("FastGELU", "activation", "FastGELU", compile_layers=_ACTIVATION),
    LibraryKernel("QuickGELU", "activation", "QuickGELU", compile_layers=_ACTIVATION),
    # "SwiGLU" times the same kernel on gate and up apart (silu_mul), as Liger's is called.
    LibraryKernel("SiluAndMul", "activation", "SiluAndMul", compile_layers=_GATED,
                  benchmarks=("SiluAndMul", "SwiGLU"), compile_patterns=("silu_mul",)),
    LibraryKernel("GeluAndMul", "activation", "GeluAndMul", compile_layers=_GATED,
                  compile_patterns=("gelu_mul",)),
    LibraryKernel("GeluTanhAndMul", "activation", "GeluTanhAndMul", compile_layers=_GATED,
                  compile_patterns=("gelu_tanh_mul",)),
    LibraryKernel("SwiGLUMLP", "activation", "SwiGLUMLP", compile_layers=_GATED_MLP),
    LibraryKernel("GeGLUMLP", "activation", "GeGLUMLP", compile_layers=_GATED_MLP),
    LibraryKernel("RMSNorm", "norm", "RMSNorm", compile_layers=("rms_norm",),
                  benchmarks=("RMSNorm", "RMSNorm-fp32", "RMSNorm-widths"),
                  compile_patterns=("rms_norm",), override_families=("rms_norm",)),
    LibraryKernel("GemmaRMSNorm", "norm", "GemmaRMSNorm", compile_layers=("gemma_rms_norm",),
                  benchmarks=("GemmaRMSNorm",)),
    LibraryKernel("FusedAddRMSNorm", "norm", "FusedAddRMSNorm",
                  compile_layers=("fused_add_rms_norm",), benchmarks=("FusedAddRMSNorm",)),
    LibraryKernel("LayerNorm", "norm", "LayerNorm", compile_layers=("layer_norm",),
                  benchmarks=("LayerNorm", "LayerNorm-fp32", "LayerNorm-widths",
                              "LayerNorm-nobias"),
                  compile_patterns=("layer_norm",), override_families=("layer_norm",)),
    # transformers 5.x's name for Qwen3.5-style ``(1 + weight)`` norms: GemmaRMSNorm's formula.
    LibraryKernel("RMSNormZeroCentered", "norm", "GemmaRMSNorm",
                  compile_layers=("gemma_rms_norm",)),
    LibraryKernel("rotary_pos_emb", "rotary", "apply_rotary_pos_emb", is_function=True,
                  compile_layers=("rotary",), benchmarks=("rotary",)),
    # transformers 5.x's name for its causal-LM loss function (the loss of logits, or fused
    # with the lm_head when called with its hidden states and weight) ...
    LibraryKernel("ForCausalLMLoss", "loss", "ForCausalLMLoss",
                  compile_layers=("fused_linear_cross_entropy", "cross_entropy")),
    # ... and the whole *ForCausalLM forwards that tag_causal_lm_losses tags (transformers 4.57
    # and 5.24; MoE: Mixtral's, and 5.24's DeepSeek-V3 one, which returns the router logits
    # without an aux loss).
    *(
        LibraryKernel(name, "loss", name, compile_layers=("fused_linear_cross_entropy",))
        for name in CAUSAL_LM_LAYER_NAMES
    ),
)  # fmt: skip


def repository_names() -> tuple[str, ...]:
    """The folder names of `REPOSITORIES`, in order."""
    return tuple(r.name for r in REPOSITORIES)


def benchmark_cases(repo: str | None = None) -> tuple[str, ...]:
    """The ``benchmarks.ops`` cases of `KERNELS` (those of ``repo``'s kernels only, if given)."""
    return tuple(c for k in KERNELS if repo in (None, k.repo) for c in k.benchmarks)


def compile_layers(repo: str | None = None) -> tuple[str, ...]:
    """The compile rule's layers `KERNELS` ask (those of ``repo``'s kernels only, if given),
    each once, in order."""
    layers = (layer for k in KERNELS if repo in (None, k.repo) for layer in k.compile_layers)
    return tuple(dict.fromkeys(layers))


def compile_patterns() -> tuple[str, ...]:
    """The compile backend's patterns that `KERNELS` serve, each once."""
    return tuple(dict.fromkeys(p for k in KERNELS for p in k.compile_patterns))


def override_families() -> tuple[str, ...]:
    """The aten override families that run `KERNELS`' launchers, each once."""
    return tuple(dict.fromkeys(f for k in KERNELS for f in k.override_families))


def repository_of(name: str, field: str) -> str:
    """The repository of the kernels whose ``field`` (``"compile_patterns"``,
    ``"override_families"``, ``"compile_layers"``, ``"benchmarks"``) holds ``name``.

    Raises:
        LookupError: no kernel has it, or kernels of two repositories do.
    """
    repos = {k.repo for k in KERNELS if name in getattr(k, field)}
    if len(repos) != 1:
        found = ", ".join(sorted(repos)) or "none"
        raise LookupError(f"{field} {name!r}: expected the kernels of one repository, got {found}.")
    return repos.pop()
