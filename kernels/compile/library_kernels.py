"""The library's Triton kernels (``library/norm``, ``library/activation``) as registry entries.

Each entry has two ways to be called from a graph. Under a compiler (inductor, aot_eager) the
node calls the package's ``torch.library`` op directly (``rms_norm_op``, ``gated_pair_op``):
under ``torch.compiler.is_compiling()`` the packages' public functions hand the graph the op or
their formula in PyTorch ops, as the packages' compile rule says (docs/compile.md), and a node
of this backend is the op whatever that rule says. When the graph runs eagerly the node calls the public
function, which runs the same kernels with the lightest host path (a plain autograd function,
or the bare launcher without autograd).

Default policy (`Policy`): ``eager_only`` for every entry, from measurements
(benchmarks/results/h100/compile_backend/, docs/compile-backend.md#policy):

- the lone activations (silu, gelu, gelu_tanh): inductor fuses an activation into its
  neighbours; a kernel in its place costs a read and a write of the tensor (a Triton ReLU in
  ResNet-18 under inductor: 0.78x of torch.compile's training step, 0.55x of its inference);
- the norms and the gated activations: alone, our kernels beat torch.compile's code for the
  op (RMSNorm forward+backward 1.05-1.46x, benchmarks/results/*/ops/), but in inductor's graph
  an opaque op costs the fusions around it (the residual add into the norm, forward and
  backward) and a Python custom-op call each: an untagged 4-block Llama (H100, bf16) ran its
  training step at 0.99x of torch.compile with rms_norm and silu_mul replaced at 8x2048 tokens,
  and at 0.69x at 8x512, where the host sets the pace. Under eager, each is one kernel where
  PyTorch runs one or several.

``registry.set_policy(name, "always")`` puts one into inductor's graphs anyway.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from types import ModuleType

from ..library import CUDA_CAPABILITIES, load_library_package
from ..library.registry import compile_patterns
from .entry import DEFAULT_DTYPES, KernelEntry
from .patterns import PATTERNS, Match
from .policy import Policy

# CUDA_CAPABILITIES.min_capability is 80 (8.0): compute capability as (major, minor).
_MIN_CAPABILITY = divmod(CUDA_CAPABILITIES.min_capability, 10)


def _module(package: ModuleType, name: str) -> ModuleType:
    """A submodule of a loaded kernel package (its ``__init__`` re-exports functions under
    the same names as some submodules, so attribute access would give the function)."""
    return sys.modules.get(f"{package.__name__}.{name}") or importlib.import_module(
        f"{package.__name__}.{name}"
    )


def _named(function: Callable, name: str) -> Callable:
    # A readable name in graph code and pictures (``kernels_rms_norm(x, w, 1e-06)``).
    function.__name__ = function.__qualname__ = name
    return function


def _needs_weight(match: Match, values: tuple) -> str | None:
    # rms_norm_op takes a weight; nn.RMSNorm(elementwise_affine=False) and a formula without
    # one have none (a tensor of ones would cost a read for nothing).
    if values[1] is None:
        return "the library's rms_norm kernel needs a weight, and this norm has none"
    return None


def _activation_entries() -> list[KernelEntry]:
    package = load_library_package("activation")
    functions = _module(package, "_functions")
    elementwise = _module(package, "elementwise")
    gated = _module(package, "gated")
    entries = []
    for pattern, act, public in (
        ("silu", functions.SILU, package.silu),
        ("gelu", functions.GELU, package.gelu),
        ("gelu_tanh", functions.GELU_TANH, package.gelu_tanh),
    ):

        def graph_call(x, _op=elementwise.activation_op, _act=act):
            return _op(x, _act)

        entries.append(_entry(pattern, public, "activation", graph_call))
    for pattern, act, public in (
        ("silu_mul", functions.SILU, package.silu_mul),
        ("gelu_mul", functions.GELU, package.gelu_mul),
        ("gelu_tanh_mul", functions.GELU_TANH, package.gelu_tanh_mul),
    ):

        def gated_graph_call(gate, up, _op=gated.gated_pair_op, _act=act):
            return _op(gate, up, _act)

        entries.append(_entry(pattern, public, "activation", gated_graph_call))
    return entries


def _norm_entries() -> list[KernelEntry]:
    package = load_library_package("norm")
    rms = _module(package, "rms_norm")
    ln = _module(package, "layer_norm")

    def rms_norm_graph(x, weight, eps):
        return rms.rms_norm_op(x, weight, eps, rms.LLAMA)[0]

    def layer_norm_graph(x, normalized_shape, weight, bias, eps):
        return ln.layer_norm_op(x, normalized_shape, weight, bias, eps)[0]

    return [
        _entry("rms_norm", package.rms_norm, "norm", rms_norm_graph, check=_needs_weight),
        _entry("layer_norm", package.layer_norm, "norm", layer_norm_graph),
    ]


def _entry(
    pattern: str,
    public: Callable,
    package: str,
    graph_call: Callable,
    *,
    check: Callable | None = None,
) -> KernelEntry:
    """The entry of ``pattern``: ``public`` (the package's function) for eager graphs,
    ``graph_call`` (its op) for traced ones, both named ``kernels_<pattern>`` in graphs."""

    def eager_call(*args):
        return public(*args)

    name = f"kernels_{pattern}"
    return KernelEntry(
        pattern=PATTERNS[pattern],
        kernel=public,
        label=f"library {package}.{public.__name__}",
        source="library",
        policy=Policy.EAGER_ONLY,  # see the module's docstring
        graph_call=_named(graph_call, name),
        eager_call=_named(eager_call, name),
        dtypes=DEFAULT_DTYPES,
        min_cuda_capability=_MIN_CAPABILITY,
        check=check,
    )


def library_entries() -> dict[str, KernelEntry]:
    """The library's entries by pattern name, in `PATTERNS` order (loads the kernel packages)."""
    found = {e.pattern.name: e for e in (*_norm_entries(), *_activation_entries())}
    return {name: found[name] for name in PATTERNS if name in found}


def library_patterns() -> tuple[str, ...]:
    """The patterns the library has kernels for, in `PATTERNS` order (without loading the
    packages): those the library's registry gives its kernels (`LibraryKernel.compile_patterns`);
    tests/compile checks that `library_entries` builds an entry for each."""
    served = set(compile_patterns())
    return tuple(name for name in PATTERNS if name in served)
