"""Our own Triton kernels, shipped as kernel repositories, and the mapping that uses them.

Example:
    ```python
    from kernels import Mode, kernelize, library_mapping, use_kernel_mapping

    with use_kernel_mapping(library_mapping()):
        kernelize(model, mode=Mode.TRAINING | Mode.TORCH_COMPILE)
    ```
"""

from __future__ import annotations

import ast
import inspect
import logging
import os
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import KernelMappingError
from ..layer.tagging import replace_kernel_forward_from_hub, tag_of
from ..mapping.device import validate_device_type
from ..repos.local import LocalFuncRepository, LocalLayerRepository

if TYPE_CHECKING:
    from torch import nn

logger = logging.getLogger(__name__)

#: The Hub organisation our kernel repositories are published under.
HUB_ORGANISATION = "kernels-triton"

#: Device types our Triton kernels are tested on and registered for by default.
TESTED_DEVICE_TYPES = ("cuda",)


@dataclass(frozen=True)
class LibraryKernel:
    """One kernel of the library: the layer name it serves and where it lives."""

    layer_name: str
    repo: str  # the repository folder under library/ (and the Hub repo name)
    attribute: str  # the kernel layer class in `layers`, or the function for function kernels
    is_function: bool = False


KERNELS: tuple[LibraryKernel, ...] = (
    *(
        LibraryKernel(name, "activation", name)
        for name in ("SiLU", "GeLU", "GeluTanh", "NewGELU", "FastGELU", "QuickGELU")
    ),
    *(
        LibraryKernel(name, "activation", name)
        for name in ("SiluAndMul", "GeluAndMul", "GeluTanhAndMul", "SwiGLUMLP")
    ),
    *(
        LibraryKernel(name, "norm", name)
        for name in ("RMSNorm", "GemmaRMSNorm", "FusedAddRMSNorm", "LayerNorm")
    ),
    LibraryKernel("rotary_pos_emb", "rotary", "apply_rotary_pos_emb", is_function=True),
)


def library_path() -> Path:
    """The folder holding our kernel repositories.

    An installed package carries them as package data (``kernels/_library``); a checkout
    (or an editable install) has them in the top-level ``library/`` folder.
    """
    package_dir = Path(__file__).resolve().parent.parent
    for candidate in (package_dir / "_library", package_dir.parent / "library"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"The kernel library is missing: neither {package_dir / '_library'} nor "
        f"{package_dir.parent / 'library'} exists. Reinstall the kernels package."
    )


def library_mapping(
    devices: Iterable[str] | None = None,
    *,
    layers: Iterable[str] | None = None,
) -> dict:
    """The kernel mapping from layer names to our Triton kernel repositories.

    Every kernel supports backward and torch.compile, so each is registered for all modes.

    Args:
        devices: device types to register the kernels for. By default ``cuda`` (where they
            are tested), plus ``cpu`` when ``TRITON_INTERPRET=1`` is set, so that they run
            through Triton's interpreter (slow: for checking numerics, not for speed).
        layers: restrict the mapping to these layer names (default: all of them).

    Example:
        ```python
        from kernels import register_kernel_mapping, library_mapping

        register_kernel_mapping(library_mapping())
        ```
    """
    if devices is None:
        devices = list(TESTED_DEVICE_TYPES)
        if os.environ.get("TRITON_INTERPRET") == "1":
            devices.append("cpu")
    devices = [validate_device_type(d) for d in devices]
    wanted = None if layers is None else set(layers)
    known = {k.layer_name for k in KERNELS}
    if wanted is not None and not wanted <= known:
        raise KernelMappingError(
            f"The kernel library has no kernels for {', '.join(sorted(wanted - known))}; it has: "
            f"{', '.join(sorted(known))}."
        )
    root = library_path()
    mapping = {}
    for kernel in KERNELS:
        if wanted is not None and kernel.layer_name not in wanted:
            continue
        if kernel.is_function:
            repository = LocalFuncRepository(
                root / kernel.repo, package_name=kernel.repo, func_name=kernel.attribute
            )
        else:
            repository = LocalLayerRepository(
                root / kernel.repo, package_name=kernel.repo, layer_name=kernel.attribute
            )
        mapping[kernel.layer_name] = {device: repository for device in devices}
    return mapping


# ---- tagging transformers' gated MLPs -------------------------------------------------------

#: The layer name of our kernel for Llama-style gated MLPs.
GATED_MLP_LAYER_NAME = "SwiGLUMLP"

_GATED_MLP_ATTRIBUTES = ("gate_proj", "up_proj", "down_proj", "act_fn")
_GATED_MLP_EXPRESSION = "self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))"


def _computes_gated_mlp(cls: type) -> bool:
    """Whether ``cls.forward`` is ``forward(self, x)`` returning exactly
    ``self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))`` (directly or through
    one local variable), undecorated: what the ``SwiGLUMLP`` kernel computes.

    transformers 4.57 has classes with the same four attributes and ``forward(self, x)`` that
    compute something else (``BitNetMLP`` normalises before ``down_proj``, ``FalconH1MLP``
    scales, ``T5GemmaMLP`` applies dropout), so the attributes alone do not decide.
    """
    try:
        source = textwrap.dedent(inspect.getsource(cls.forward))
        function = ast.parse(source).body[0]
    except (AttributeError, OSError, TypeError, SyntaxError, IndexError):
        return False
    if not isinstance(function, ast.FunctionDef) or function.decorator_list:
        return False
    args = function.args
    if (
        [a.arg for a in args.posonlyargs + args.args] != ["self", "x"]
        or args.vararg
        or args.kwonlyargs
        or args.kwarg
        or args.defaults
    ):
        return False
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # a docstring
    match body:
        case [ast.Return(value=expression)]:
            pass
        case [
            ast.Assign(targets=[ast.Name(id=name)], value=expression),
            ast.Return(value=ast.Name(id=returned)),
        ] if name == returned:
            pass
        case _:
            return False
    return expression is not None and ast.unparse(expression) == _GATED_MLP_EXPRESSION


def tag_gated_mlps(model: nn.Module) -> list[str]:
    """Tag the untagged Llama-style gated MLP classes in ``model`` as ``"SwiGLUMLP"``.

    transformers 4.57 tags its norms and activation modules but not ``LlamaMLP``,
    ``MistralMLP``, ``Qwen2MLP``, ``Qwen3MLP`` and their copies in other models, so
    ``kernelize`` cannot reach them. This tags, through `replace_kernel_forward_from_hub`, the
    class of every submodule that has ``gate_proj``, ``up_proj``, ``down_proj`` and ``act_fn``,
    whose class carries no layer name yet, and whose ``forward(self, x)`` computes exactly
    ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` (its source is read; a class whose
    ``forward`` differs, e.g. with dropout or a norm inside, is left alone and logged).

    Tagging marks the class, so all its instances (in every model, and its subclasses) are
    tagged; it changes nothing until `kernelize` runs with a mapping that serves
    ``"SwiGLUMLP"`` (`library_mapping()` does). The kernel fuses ``act_fn(gate) * up`` when
    ``act_fn`` is SiLU and otherwise runs the module's own formula. Pass ``verify=`` to
    `kernelize` to have each swapped MLP checked against its own forward on real inputs.

    Returns:
        The names of the classes tagged by this call, in the order first met.

    Example:
        ```python
        from kernels import Mode, kernelize, library_mapping, use_kernel_mapping
        from kernels.library import tag_gated_mlps

        tag_gated_mlps(model)  # e.g. ["LlamaMLP"]
        with use_kernel_mapping(library_mapping()):
            kernelize(model, mode=Mode.TRAINING, verify=example_input_ids)
        ```
    """
    tagged: list[str] = []
    seen: set[type] = set()
    for name, module in model.named_modules():
        cls = type(module)
        if cls in seen or not all(hasattr(module, a) for a in _GATED_MLP_ATTRIBUTES):
            continue
        seen.add(cls)
        if tag_of(cls) is not None:
            continue
        if not _computes_gated_mlp(cls):
            logger.info(
                "%s (%s.%s) has gate_proj, up_proj, down_proj and act_fn but its forward is not "
                "down_proj(act_fn(gate_proj(x)) * up_proj(x)); not tagged as %r",
                name or "<model>",
                cls.__module__,
                cls.__qualname__,
                GATED_MLP_LAYER_NAME,
            )
            continue
        replace_kernel_forward_from_hub(cls, GATED_MLP_LAYER_NAME)
        tagged.append(cls.__name__)
    return tagged
