"""Tagging what transformers 4.57 leaves untagged: gated MLPs and `apply_rotary_pos_emb`.

transformers 4.57 tags its norms and activation modules, so `kernelize` reaches those by
itself. Its gated MLP classes carry no layer name, and its attention layers call the module
global ``apply_rotary_pos_emb``, which `kernelize` cannot see. The two functions here make both
reachable, and only where the code is exactly the formula our kernels compute: each reads the
source of what it tags and leaves anything else alone (logged at INFO).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import logging
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from ..layer.decorators import use_kernel_func_from_hub, use_kernelized_func
from ..layer.func import ATTACHED_ATTRIBUTE, attached_functions
from ..layer.tagging import (
    CONDITION_ATTRIBUTE,
    TAG_ATTRIBUTE,
    replace_kernel_forward_from_hub,
    tag_of,
)

if TYPE_CHECKING:
    from torch import nn

logger = logging.getLogger(__name__)

#: The layer name of our kernel for Llama-style gated MLPs.
GATED_MLP_LAYER_NAME = "SwiGLUMLP"
#: The function kernel name transformers 5.x gives ``apply_rotary_pos_emb``; our rotary
#: kernel is registered under it.
ROTARY_FUNCTION_NAME = "rotary_pos_emb"

_GATED_MLP_ATTRIBUTES = ("gate_proj", "up_proj", "down_proj", "act_fn")
_GATED_MLP_EXPRESSION = "self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))"

# transformers' rotate-half RoPE, as Llama, Mistral, Qwen2, Qwen3, Gemma and their copies define
# it (docstrings and comments aside): what our rotary kernel computes.
_ROTARY_FUNCTION = "apply_rotary_pos_emb"
_ROTARY_SOURCE = """
def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed
"""
_ROTATE_HALF_SOURCE = """
def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)
"""


# What the tag functions changed, as calls that put it back (newest last).
_undo: list[Callable[[], None]] = []
# The function `tag_on_kernelize` added as a tagger, while it is added.
_kernelize_tagger: list[Callable[[], None]] = []


def untag() -> None:
    """Undo every change `tag_gated_mlps` and `tag_rotary_embeddings` made in this process,
    and stop `tag_on_kernelize`'s tagging.

    The tagged MLP classes lose their layer name, and each modelling module gets its own
    ``apply_rotary_pos_emb`` function back (and the attention classes their attachments).
    Models kernelized before keep their swapped MLP forwards, but their attention calls the
    original rotary function again. For programs that tag models they build and then hand the
    process back (a demo, a test), so that models built later start as transformers made them.
    """
    while _kernelize_tagger:
        _kernelize_tagger.pop()()
    while _undo:
        _undo.pop()()


@contextlib.contextmanager
def untag_on_exit() -> Iterator[None]:
    """Undo, when the block exits, the tags made inside it (and only those).

    Example:
        ```python
        from kernels import Mode, explain
        from kernels.library.transformers_tags import tag_transformers_layers, untag_on_exit

        with untag_on_exit():
            tag_transformers_layers(model)
            print(explain(model, mode=Mode.INFERENCE))
        ```
    """
    start = len(_undo)
    try:
        yield
    finally:
        while len(_undo) > start:
            _undo.pop()()


def tag_transformers_layers(model: nn.Module) -> list[str]:
    """`tag_gated_mlps` and `tag_rotary_embeddings` on `model`: the class names tagged.

    On transformers 5.x, which tags ``apply_rotary_pos_emb`` itself, only the gated MLPs are
    left to tag.
    """
    tagged = tag_gated_mlps(model) + tag_rotary_embeddings(model)
    if tagged:
        logger.info("tagged what transformers leaves untagged: %s", ", ".join(tagged))
    return tagged


def tag_on_kernelize() -> None:
    """Have `kernelize` run `tag_transformers_layers` on every model before planning it.

    Models that transformers builds and kernelizes itself (``from_pretrained(...,
    use_kernels=True)``, ``model.use_kernels = True``, ``model.train()``) then get their gated
    MLPs (and, on 4.57, their rotary embeddings) tagged before their layers are looked at. Calling
    it again changes nothing; `untag` stops it. `register_library_kernels` calls it.
    """
    from ..layer.taggers import add_tagger

    if not _kernelize_tagger:
        _kernelize_tagger.append(add_tagger(tag_transformers_layers))


def _remove_class_attributes(cls: type, names: tuple[str, ...]) -> None:
    for name in names:
        if name in vars(cls):
            delattr(cls, name)


def _restore_class_attribute(cls: type, name: str, value: object) -> None:
    if value is None:
        _remove_class_attributes(cls, (name,))
    else:
        setattr(cls, name, value)


def _function_ast(func: Callable) -> ast.FunctionDef | None:
    """The parsed definition of `func`, docstring dropped; None where the source is unknown."""
    try:
        source = textwrap.dedent(inspect.getsource(func))
        function = ast.parse(source).body[0]
    except (AttributeError, OSError, TypeError, SyntaxError, IndexError):
        return None
    if not isinstance(function, ast.FunctionDef):
        return None
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        function.body = body[1:]
    return function


def _same_definition(func: Callable, source: str) -> bool:
    """Whether `func` is defined exactly as `source` (names, arguments, defaults, body)."""
    function = _function_ast(func)
    expected = ast.parse(source).body[0]
    return function is not None and ast.dump(function) == ast.dump(expected)


# ---- gated MLPs ------------------------------------------------------------------------------


def _computes_gated_mlp(cls: type) -> bool:
    """Whether ``cls.forward`` is ``forward(self, x)`` returning exactly
    ``self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))`` (directly or through
    one local variable), undecorated: what the ``SwiGLUMLP`` kernel computes.

    transformers 4.57 has classes with the same four attributes and ``forward(self, x)`` that
    compute something else (``BitNetMLP`` normalises before ``down_proj``, ``FalconH1MLP``
    scales, ``T5GemmaMLP`` applies dropout), so the attributes alone do not decide.
    """
    function = _function_ast(getattr(cls, "forward", None))
    if function is None or function.decorator_list:
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
    match function.body:
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
        _undo.append(
            functools.partial(_remove_class_attributes, cls, (TAG_ATTRIBUTE, CONDITION_ATTRIBUTE))
        )
        tagged.append(cls.__name__)
    return tagged


# ---- rotary embeddings -----------------------------------------------------------------------


def _rotary_module(namespace: dict) -> nn.Module | None:
    """The function module standing for ``apply_rotary_pos_emb`` in the module globals
    `namespace`, made on first use.

    The global is replaced by a module instance (tagged ``"rotary_pos_emb"``) that calls the
    original function, which is what transformers 5.x's ``@use_kernel_func_from_hub`` does at
    definition time; calls through the global then go through whatever forward `kernelize`
    gives that instance. None when the global is not transformers' rotate-half formula (or its
    ``rotate_half`` is not the usual one).
    """
    from torch import nn

    current = namespace.get(_ROTARY_FUNCTION)
    if isinstance(current, nn.Module):
        return current if tag_of(type(current)) == ROTARY_FUNCTION_NAME else None
    if not (
        inspect.isfunction(current)
        and _same_definition(current, _ROTARY_SOURCE)
        and inspect.isfunction(namespace.get("rotate_half"))
        and _same_definition(namespace["rotate_half"], _ROTATE_HALF_SOURCE)
        and namespace.get("torch") is sys.modules.get("torch")
        and _calls_fit_new_signature(sys.modules.get(namespace.get("__name__", "")))
    ):
        return None
    module = use_kernel_func_from_hub(ROTARY_FUNCTION_NAME)(_with_new_signature(current))
    namespace[_ROTARY_FUNCTION] = module
    _undo.append(functools.partial(namespace.__setitem__, _ROTARY_FUNCTION, current))
    logger.debug(
        "%s.%s now calls through a kernelizable module", namespace.get("__name__"), _ROTARY_FUNCTION
    )
    return module


def _calls_fit_new_signature(module: object) -> bool:
    """Whether every use of ``apply_rotary_pos_emb`` in `module`'s source is a call that passes
    at most ``q, k, cos, sin`` positionally and no keyword but ``unsqueeze_dim``: such calls
    mean the same with transformers 4.57's signature and with 5.x's, which dropped the unused
    ``position_ids`` before ``unsqueeze_dim``."""
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError, SyntaxError):
        return False
    checked: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_rotary_name(node.func):
            if (
                len(node.args) > 4
                or any(isinstance(a, ast.Starred) for a in node.args)
                or any(kw.arg != "unsqueeze_dim" for kw in node.keywords)
            ):
                return False
            checked.add(id(node.func))
    # Any other read of the name (passed along, stored) could reach a call we cannot see.
    return all(
        id(node) in checked
        for node in ast.walk(tree)
        if _is_rotary_name(node) and isinstance(node.ctx, ast.Load)
    )


def _is_rotary_name(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == _ROTARY_FUNCTION


def _with_new_signature(original: Callable) -> Callable:
    """`original` (transformers 4.57's ``apply_rotary_pos_emb``) with transformers 5.x's
    signature, the one our rotary kernel has, so that `kernelize` accepts the kernel for it."""

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        return original(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)

    # No ``__wrapped__``: inspect.signature would follow it back to the 4.57 signature.
    apply_rotary_pos_emb.original = original
    apply_rotary_pos_emb.__module__ = original.__module__
    apply_rotary_pos_emb.__doc__ = original.__doc__
    return apply_rotary_pos_emb


def tag_rotary_embeddings(model: nn.Module) -> list[str]:
    """Make transformers 4.57's ``apply_rotary_pos_emb`` kernelizable in ``model``'s attention.

    transformers 4.57's attention layers call ``apply_rotary_pos_emb``, a plain function of
    their modelling module (``modeling_llama`` and co.), which `kernelize` cannot see.
    transformers 5.x makes it a kernelizable function named ``"rotary_pos_emb"`` and attaches it
    to the attention class; this does the same for 4.57: for every class in ``model`` whose
    ``forward`` calls the module global ``apply_rotary_pos_emb``, when that global is exactly
    transformers' rotate-half formula (its source is read, and its ``rotate_half``'s), the global
    is replaced by a function module tagged ``"rotary_pos_emb"`` that calls the original, and
    the module is attached to the class with `use_kernelized_func`. A class whose function
    differs (partial rotary, interleaved, multimodal sections) is left alone and logged.
    The function module has transformers 5.x's signature ``(q, k, cos, sin, unsqueeze_dim=1)``
    (4.57's had an unused ``position_ids`` before ``unsqueeze_dim``), so it is only made where
    every call in the modelling module passes at most ``q, k, cos, sin`` positionally.

    The replacement behaves as the original until `kernelize` runs with a mapping that serves
    ``"rotary_pos_emb"`` (`library_mapping()` does). It is one object per modelling module,
    as in transformers 5.x: kernelizing one model swaps it for every model of that module in
    the process, so kernelize the models you run together for the same device. Our rotary
    kernel runs the PyTorch formula for tensors it does not take, CPU tensors included
    (without ``TRITON_INTERPRET=1``).

    Returns:
        The names of the classes this call attached the function to, in the order first met.

    Example:
        ```python
        from kernels import Mode, kernelize, library_mapping, use_kernel_mapping
        from kernels.library import tag_gated_mlps, tag_rotary_embeddings

        tag_rotary_embeddings(model)  # e.g. ["LlamaAttention"]
        tag_gated_mlps(model)  # e.g. ["LlamaMLP"]
        with use_kernel_mapping(library_mapping()):
            kernelize(model, mode=Mode.TRAINING)
        ```
    """
    tagged: list[str] = []
    seen: set[type] = set()
    for name, module in model.named_modules():
        cls = type(module)
        if cls in seen:
            continue
        seen.add(cls)
        # transformers wraps some forwards (deprecated keyword arguments): read the inner one,
        # and look the global up where that function looks it up.
        forward = inspect.unwrap(getattr(cls, "forward", None))
        if not inspect.isfunction(forward) or _ROTARY_FUNCTION not in forward.__code__.co_names:
            continue
        rotary = _rotary_module(forward.__globals__)
        if rotary is None:
            logger.info(
                "%s (%s.%s) calls %s, which is not transformers' rotate-half formula; not "
                "tagged as %r",
                name or "<model>",
                cls.__module__,
                cls.__qualname__,
                _ROTARY_FUNCTION,
                ROTARY_FUNCTION_NAME,
            )
            continue
        if any(fn is rotary for _, fn in attached_functions(module)):
            continue
        previous = vars(cls).get(ATTACHED_ATTRIBUTE)
        use_kernelized_func(rotary)(cls)
        _undo.append(functools.partial(_restore_class_attribute, cls, ATTACHED_ATTRIBUTE, previous))
        tagged.append(cls.__name__)
    return tagged
