"""Helpers for the kernel library tests: loading, tolerances, and reference modules.

The repositories are loaded the way the package loads them, through
``kernels.library.load_library_package`` (``kernels.get_local_kernel`` of the library's folder).
"""

import itertools
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_GPU = DEVICE == "cuda"
#: The torch.compile backend of the tests that check our layers compiled with the model around
#: them: inductor on a GPU; on the CPU, AOTAutograd with eager kernels (Dynamo's graphs, the
#: fakes and the autograd registrations are the same; the partitioner is AOTAutograd's default,
#: not inductor's min-cut), because inductor's C++ builds there cost minutes of CPU on a fresh
#: clone and run none of the GPU's code.
#: tests/library/test_compile_rule.py keeps inductor on the CPU (max-autotune, reduce-overhead).
COMPILE_BACKEND = "inductor" if ON_GPU else "aot_eager"

#: This checkout's library/ folder: the sources (`kernels.library.library_source`). What the
#: package loads is the library built from it, `kernels.library.library_path()`.
LIBRARY = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "library"))

DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# Tolerances against a float64 reference, per dtype: relative L2 error of the whole tensor,
# and an element-wise bound scaled by the reference's largest magnitude. fp32 kernels land
# near 1e-7; fp16 and bf16 within a few roundings of their unit roundoff (2^-11, 2^-8).
REL_L2 = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.2e-2}
ELEMENT = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def load(repo: str):
    """The library's package ``repo``, as kernelize and the package's own users load it."""
    from kernels.library import load_library_package

    return load_library_package(repo)


def assert_close(
    out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str = "", floor: float = 0.0
) -> None:
    """``out`` (computed with ``dtype`` inputs) against a float64 reference ``ref``.

    ``floor``: a magnitude under which errors are judged absolutely rather than relatively.
    An activation like 0.5 x (1 + erf(x / sqrt 2)) is computed from terms of size |x| whatever
    its value, so its fp32 error is a few ulp of |x| even where the output is 1e-7: the tests
    pass the input's largest magnitude there.
    """
    assert out is not None, f"{what}: no gradient"
    assert tuple(out.shape) == tuple(ref.shape), (
        f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    )
    out = out.detach().double().cpu()
    ref = ref.detach().double().cpu()
    assert torch.isfinite(out).all(), f"{what}: non-finite values"
    if ref.numel() == 0:
        return
    # Magnitudes under the dtype's smallest normal number are not resolved by the dtype at all.
    tiny = max(torch.finfo(dtype).tiny, floor)
    scale = max(ref.abs().max().item(), tiny)
    rel = ((out - ref).norm() / max(ref.norm().item(), tiny)).item()
    assert rel <= REL_L2[dtype], f"{what}: relative L2 error {rel:.3g} > {REL_L2[dtype]:.3g}"
    err = (out - ref).abs().max().item()
    bound = ELEMENT[dtype] * scale
    assert err <= bound, f"{what}: max abs error {err:.3g} > {bound:.3g} (max |ref| {scale:.3g})"


def randn(*shape, dtype=torch.float32, scale=1.0, shift=0.0, device=DEVICE):
    return (torch.randn(*shape, device=device) * scale + shift).to(dtype)


def grads(outputs, inputs, seed_grads):
    """d(outputs)/d(inputs) against ``seed_grads``; None for inputs that got no gradient."""
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    seed_grads = seed_grads if isinstance(seed_grads, (tuple, list)) else (seed_grads,)
    return torch.autograd.grad(outputs, inputs, seed_grads, allow_unused=True)


def library_ops(graph_module) -> set[str]:
    """The names of this library's ops (``kernels_lib_*`` namespaces) called in a graph
    module, without their namespace."""
    names = set()
    for node in graph_module.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if schema is not None and schema.name.startswith("kernels_lib_"):
            names.add(schema.name.split("::", 1)[1])
    return names


# ---- covering designs for Triton's interpreter ------------------------------------------------


def _param_id(value: Any) -> str | None:
    if isinstance(value, dict):  # options a case's name already says
        return None
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, tuple):
        return "x".join(str(v) for v in value) or "scalar"
    return str(value)


def covering(
    cases: Iterable[Any],
    *,
    dtypes: Sequence[torch.dtype] = DTYPES,
    options: Sequence[Any] | Mapping[str, Any] = (),
    every_dtype: Iterable[tuple] = (),
    every_option: Iterable[tuple] = (),
    last_dtype_too: Iterable[tuple] = (),
    full: bool = ON_GPU,
) -> list[Any]:
    """pytest parameters: ``cases`` (tuples of arguments, or ``pytest.param`` of them) crossed
    with ``dtypes`` and then ``options`` (a last argument such as a weight dtype, or a mapping of
    test ids to such; none if empty) by a covering design rather than the full product.

    Through Triton's interpreter a case costs up to seconds, and most of the full product
    repeats what one dtype proves: indexing, masks, strides, chunk loops and row splits are the
    same code at every dtype. So on the CPU every case runs at ``dtypes[0]`` (float32, whose
    float64 reference is the strictest) with ``options[0]``; the ``every_option`` cases run
    there with every option; and the ``every_dtype`` cases (small ones chosen per file, among
    them a non-contiguous layout, an odd size and a chunked path: what 16-bit loads, stores and
    conversions could get wrong) run every dtype with every option; the ``last_dtype_too`` cases
    (a wide, chunked one, too slow for every dtype) also run at ``dtypes[-1]`` (bfloat16, the
    coarsest) with ``options[0]``. GPU-marked cases, and every case when ``full`` (on the GPU,
    where it is cheap), run the full product.
    """
    # Lists, not sets: a case may hold a dict of options.
    every_dtype, every_option = list(every_dtype), list(every_option)
    last_dtype_too = list(last_dtype_too)
    named = dict(options) if isinstance(options, Mapping) else {_param_id(o): o for o in options}
    params = []
    for case in cases:
        values, marks = (tuple(case.values), case.marks) if hasattr(case, "values") else (case, ())
        crossed = full or any(m.name == "gpu" for m in marks) or values in every_dtype
        for dtype in dtypes:
            for i, (name, option) in enumerate(named.items() or [(None, None)]):
                if not (
                    crossed
                    or (dtype == dtypes[0] and (i == 0 or values in every_option))
                    or (dtype == dtypes[-1] and i == 0 and values in last_dtype_too)
                ):
                    continue
                args = (*values, dtype, *((option,) if named else ()))
                ident = "-".join(filter(None, [*map(_param_id, (*values, dtype)), name]))
                params.append(pytest.param(*args, marks=marks, id=ident))
    return params


def alternating(
    dtypes: Sequence[torch.dtype],
    *axes: Sequence[Any] | Mapping[str, Any],
    full: bool = ON_GPU,
) -> list[Any]:
    """pytest parameters ``(dtype, *values)``: every combination of the ``axes`` (sequences of
    values, or mappings of test ids to values) once, in the dtype that the parity of its
    indices picks, so that each dtype meets every value of every axis and every pair of
    values, of different axes, meets each dtype where the axes allow; the full product when
    ``full`` (on the GPU)."""
    named = [dict(a) if isinstance(a, Mapping) else {_param_id(v): v for v in a} for a in axes]
    params = []
    for combination in itertools.product(*(enumerate(a.items()) for a in named)):
        parity = sum(i for i, _ in combination) % len(dtypes)
        for d, dtype in enumerate(dtypes):
            if full or d == parity:
                ident = "-".join([_param_id(dtype), *(name for _, (name, _) in combination)])
                values = (value for _, (_, value) in combination)
                params.append(pytest.param(dtype, *values, id=ident))
    return params


# ---- reference modules for layers that transformers does not define -------------------------


class SiluAndMul(nn.Module):
    """vLLM's SiluAndMul: ``[..., 2d] -> [..., d]``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]


class GeluAndMul(nn.Module):
    """vLLM's GeluAndMul with approximate="none"."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.gelu(x[..., :d]) * x[..., d:]


class GeluTanhAndMul(nn.Module):
    """vLLM's GeluAndMul with approximate="tanh"."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.gelu(x[..., :d], approximate="tanh") * x[..., d:]


class FusedAddRMSNorm(nn.Module):
    """The reference module of the "FusedAddRMSNorm" layer (documented in library/norm/README.md):
    a residual add followed by LlamaRMSNorm, returning the normalised sum and the sum."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states, residual):
        hidden_states = hidden_states + residual
        residual = hidden_states
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype), residual


def transformers_activation(name: str, forward):
    """transformers' activation module class ``name``; where the installed transformers lacks it
    (the GPU machine has a later major version), a stand-in with the same ``forward(self, input)``."""
    from transformers import activations

    cls = getattr(activations, name, None)
    if cls is not None:
        return cls

    def fallback_forward(self, input: torch.Tensor) -> torch.Tensor:
        return forward(input)

    return type(name, (nn.Module,), {"forward": fallback_forward})
