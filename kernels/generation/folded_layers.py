"""A Llama-style decoder layer's decode step in four projection kernels: the norms and residual
adds folded into the projections around them.

A kernelized decoder layer decodes a token in eleven launches or so: the input RMSNorm, q/k/v
(one launch, `projections`), rotary, the cache write, attention, ``o_proj``, the residual add,
the post-attention RMSNorm, the MLP's two matrix-vector kernels and the second residual add. The
norms and adds each read and write a few kilobytes: their cost on a GPU is the launch and the
ramp of a kernel, ~1.5 us each, 64 of the 1.1B Llama's ~1.2 ms a token (the decode benchmark's
profile, benchmarks/results/h100/NOTES.md). Here the input norm is computed in the prologue of
the q/k/v kernel, ``o_proj`` adds the residual in its epilogue, the post-attention norm is the
gate/up kernel's prologue and the down projection adds the second residual: the layer's own
arithmetic, rounded where the unfused layer rounds (the norm's output, each projection's
output, each sum), with the rows' sum of squares added in another order.

For the length of a ``generate()`` call, `folded_decoder_layers` puts a ``forward`` in front of
each decoder layer whose code is exactly Llama's (`decoder_layer_calls`: Llama, Mistral, Qwen2,
Qwen3 and their copies in transformers 4.57 and 5.x), whose attention projects only its input
and returns ``o_proj``'s output as it is (`attention_is_foldable`), and whose norms and MLP run
our library's RMSNorm and gated-MLP kernels. The attention module itself still runs (rotary,
the cache update, the attention function, its own arguments), with a ``forward`` in front of its
``o_proj`` for the call. Any call the kernels do not take (the prefill, a backward, a dtype or
size they leave to cuBLAS) is the layer's own ``forward``.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import logging
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..layer.swap import kernel_layer_of
from .attributes import instance_attribute
from .projections import _QKVGroup

logger = logging.getLogger(__name__)

#: The most tokens a folded step takes; more decode module by module. Measured on an H100
#: (benchmarks/results/h100/NOTES.md, 2026-12-08, the 1.1B model): at one row, where the
#: kernels multiply-add, folding took a token from 1.26 to 1.22 ms; at eight, where they use
#: tl.dot on 16 padded rows, each program's pass over x for the norm's sums of squares (before
#: its first weight tile) made q/k/v 2.4x and the MLP 1.2x slower, 1.35 -> 1.59 ms.
FOLD_MAX_ROWS = 1


@dataclass(frozen=True)
class FoldKernels:
    """What folding needs from our library: ``decode`` (the activation library's
    ``decode_mlp``: ``grouped_linear_decode``, ``gated_gemv``, ``gemv``, ``ACTIVATIONS``,
    ``takes_decode_kernels``), ``mlp_activation`` (the activation library's
    ``decode_activation(mlp, x)``: the activation its decode kernels would take ``mlp``'s call
    with, or None), ``gated_mlps`` (the activation library's gated-MLP kernel layers, which
    compute Llama's MLP) and ``rms_norm`` (the norm library's ``RMSNorm`` kernel layer)."""

    decode: Any
    mlp_activation: Callable[[nn.Module, torch.Tensor], str | None]
    gated_mlps: tuple[type, ...]
    rms_norm: type


# --------------------------------------------------------------------------------------------
# Which code folds: read from the source, as `kernels.library.transformers_tags` reads MLPs
# --------------------------------------------------------------------------------------------

# The decoder layer's body, with ``{h}`` its first parameter; the self-attention call (line 3)
# is checked on its own, since each model and transformers line passes it other arguments.
_LAYER_BODY = (
    "residual = {h}",
    "{h} = self.input_layernorm({h})",
    None,  # {h}, _ = self.self_attn(hidden_states={h}, name=name, ..., **kwargs)
    "{h} = residual + {h}",
    "residual = {h}",
    "{h} = self.post_attention_layernorm({h})",
    "{h} = self.mlp({h})",
    "{h} = residual + {h}",
    "return {h}",
)
_PROJECTIONS = ("q_proj", "k_proj", "v_proj")


def _function_def(function: Callable[..., Any]) -> ast.FunctionDef | None:
    """The ``def`` of ``function`` (decorators' wrappers unwrapped), or None without source."""
    function = inspect.unwrap(function)
    try:
        source = textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError):
        return None
    tree = ast.parse(source)
    node = tree.body[0] if tree.body else None
    return node if isinstance(node, ast.FunctionDef) else None


def _body(node: ast.FunctionDef) -> list[ast.stmt]:
    body = list(node.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    return body


@dataclass(frozen=True)
class LayerCalls:
    """How a foldable decoder layer calls its attention: ``hidden`` (its first parameter) as
    ``hidden_states=``, each name of ``passed`` as ``name=name`` (its own parameters), and its
    ``**`` parameter ``rest`` (None if it passes none)."""

    hidden: str
    passed: tuple[str, ...]
    rest: str | None
    signature: inspect.Signature


@functools.lru_cache(maxsize=64)
def decoder_layer_calls(forward: Callable[..., Any]) -> LayerCalls | None:
    """`LayerCalls` when ``forward`` (a decoder layer class's) is Llama's, statement for
    statement (the residual, the input norm, the attention call passing only the layer's own
    arguments by name, the add, the post-attention norm, the MLP, the add, the return), else
    None."""
    node = _function_def(forward)
    if node is None or len(node.args.args) < 2:
        return None
    hidden = node.args.args[1].arg
    rest = node.args.kwarg.arg if node.args.kwarg is not None else None
    params = {a.arg for a in (*node.args.args[1:], *node.args.kwonlyargs)}
    body = _body(node)
    if len(body) != len(_LAYER_BODY):
        return None
    passed: tuple[str, ...] = ()
    for statement, template in zip(body, _LAYER_BODY, strict=True):
        if template is None:
            found = _attention_call(statement, hidden, params, rest)
            if found is None:
                return None
            passed = found
            continue
        want = ast.parse(template.format(h=hidden)).body[0]
        if ast.dump(statement) != ast.dump(want):
            return None
    return LayerCalls(hidden, passed, rest, inspect.signature(forward))


def _attention_call(
    statement: ast.stmt, hidden: str, params: set[str], rest: str | None
) -> tuple[str, ...] | None:
    """The names passed as ``name=name`` in ``{hidden}, _ = self.self_attn(hidden_states=
    {hidden}, ..., **{rest})``, or None if the statement is anything else."""
    if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1):
        return None
    target, call = statement.targets[0], statement.value
    if not (
        isinstance(target, ast.Tuple)
        and len(target.elts) == 2
        and all(isinstance(e, ast.Name) for e in target.elts)
        and target.elts[0].id == hidden  # type: ignore[attr-defined]
        and target.elts[1].id != hidden  # type: ignore[attr-defined]
    ):
        return None
    if not (isinstance(call, ast.Call) and not call.args and _is_self_attribute(call.func)):
        return None
    if call.func.attr != "self_attn":  # type: ignore[attr-defined]
        return None
    passed, hidden_given = [], False
    for keyword in call.keywords:
        value = keyword.value
        if keyword.arg is None:  # **rest
            if not (isinstance(value, ast.Name) and value.id == rest):
                return None
        elif keyword.arg == "hidden_states":
            hidden_given = isinstance(value, ast.Name) and value.id == hidden
        elif isinstance(value, ast.Name) and value.id == keyword.arg and keyword.arg in params:
            passed.append(keyword.arg)
        else:
            return None
    return tuple(passed) if hidden_given else None


def _is_self_attribute(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and (node.value.id == "self")
    )


@functools.lru_cache(maxsize=64)
def attention_is_foldable(forward: Callable[..., Any]) -> bool:
    """Whether an attention class's ``forward`` reads its input only as ``q_proj``'s,
    ``k_proj``'s and ``v_proj``'s argument (once each) and for its ``.shape``, and returns
    ``o_proj``'s output as the first item of what it returns: then its input may be the
    un-normalised hidden states when the projections normalise it, and its output may already
    hold the residual that ``o_proj`` added."""
    node = _function_def(forward)
    if node is None or len(node.args.args) < 2:
        return False
    hidden = node.args.args[1].arg
    allowed: set[int] = set()
    projected = dict.fromkeys(_PROJECTIONS, 0)
    o_calls = 0
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and _is_self_attribute(sub.func):
            name = sub.func.attr  # type: ignore[attr-defined]
            if name in projected:
                if len(sub.args) != 1 or sub.keywords:
                    return False
                arg = sub.args[0]
                if not (isinstance(arg, ast.Name) and arg.id == hidden):
                    return False
                projected[name] += 1
                allowed.add(id(arg))
            elif name == "o_proj":
                o_calls += 1
        elif (
            isinstance(sub, ast.Attribute)
            and sub.attr == "shape"
            and isinstance(sub.value, ast.Name)
            and sub.value.id == hidden
        ):
            allowed.add(id(sub.value))
    uses = [s for s in ast.walk(node) if isinstance(s, ast.Name) and s.id == hidden]
    if any(id(u) not in allowed for u in uses) or set(projected.values()) != {1} or o_calls != 1:
        return False
    return _returns_o_proj(_body(node))


def _returns_o_proj(body: list[ast.stmt]) -> bool:
    """Whether the body ends ``x = self.o_proj(x)`` then ``return x, ...``."""
    if len(body) < 2:
        return False
    assign, ret = body[-2], body[-1]
    if not (isinstance(ret, ast.Return) and isinstance(ret.value, ast.Tuple) and ret.value.elts):
        return False
    first = ret.value.elts[0]
    if not (isinstance(assign, ast.Assign) and len(assign.targets) == 1):
        return False
    target, value = assign.targets[0], assign.value
    return (
        isinstance(first, ast.Name)
        and isinstance(target, ast.Name)
        and target.id == first.id
        and isinstance(value, ast.Call)
        and _is_self_attribute(value.func)
        and value.func.attr == "o_proj"  # type: ignore[attr-defined]
        and len(value.args) == 1
        and not value.keywords
    )


# --------------------------------------------------------------------------------------------
# The folded layer
# --------------------------------------------------------------------------------------------


def _no_hooks(module: nn.Module) -> bool:
    return not (module._forward_hooks or module._forward_pre_hooks)


def _plain(module: nn.Module) -> bool:
    """No hooks and no ``forward`` of the instance's own: folding skips its call."""
    return _no_hooks(module) and "forward" not in vars(module)


def _plain_tensor(t: Any) -> bool:
    """A plain tensor or parameter: not a DTensor (tensor parallelism), a quantized or any other
    subclass, whose data the kernels cannot read as they read a tensor's."""
    return type(t) in (torch.Tensor, nn.Parameter)


def _linear_of(module: Any, dtype: torch.dtype, device: torch.device) -> bool:
    """An ``nn.Linear`` (a forward on the instance is ours: `folded_decoder_layers` checked)
    with plain weights of this dtype and device."""
    return (
        type(module) is nn.Linear
        and _plain_tensor(module.weight)
        and module.weight.dtype == dtype
        and module.weight.device == device
        and (module.bias is None or (_plain_tensor(module.bias) and module.bias.dtype == dtype))
    )


class _FoldedLayer:
    """One decoder layer's folded decode step, and the ``forward``s put in front of its layer
    and its ``o_proj``."""

    def __init__(self, layer: nn.Module, calls: LayerCalls, group: _QKVGroup, kernels: FoldKernels):
        self.layer: Any = layer  # a transformers decoder layer (foldable_layers checked it)
        self.calls = calls
        self.group = group
        self.kernels = kernels
        self.original = type(layer).forward.__get__(layer)
        self.residual: torch.Tensor | None = None  # armed: o_proj adds it
        self.folded_residual = False
        self.steps = 0  # decode steps folded (for tests and the log)

    # The layer -------------------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        try:
            bound = self.calls.signature.bind(self.layer, *args, **kwargs)
        except TypeError:
            return self.original(*args, **kwargs)
        h = bound.arguments.get(self.calls.hidden)
        rest = bound.arguments.get(self.calls.rest, {}) if self.calls.rest else {}
        if not isinstance(h, torch.Tensor):
            return self.original(*args, **kwargs)
        act = self._fold_activation(h)
        if act is None:
            return self.original(*args, **kwargs)
        if any(name in rest for name in self.calls.passed):
            # (a deprecated argument name among the rest: the layer's own decorator renames it)
            return self.original(*args, **kwargs)
        named = {}
        for name in self.calls.passed:
            if name in bound.arguments:
                named[name] = bound.arguments[name]
            else:
                default = self.calls.signature.parameters[name].default
                named[name] = None if default is inspect.Parameter.empty else default
        attention = self.layer.self_attn
        norm = self.layer.input_layernorm
        self.residual, self.folded_residual = h, False
        try:
            with self.group.normalising(norm.weight, norm.variance_epsilon, h):
                out, _ = attention(hidden_states=h, **named, **rest)
        finally:
            self.residual = None
        if self.folded_residual:
            h1 = out  # h's shape, dtype and device: the activation found for h holds
        else:  # o_proj's own call: the sum may be of another dtype
            h1 = h + out
            act = self.kernels.mlp_activation(self.layer.mlp, h1)
        self.steps += 1
        return self._mlp(h1, act)

    def _fold_activation(self, h: torch.Tensor) -> str | None:
        """The MLP's activation when this call is a decode step the folded kernels take, with
        every module they stand for as this class expects it; else None."""
        if type(h) is not torch.Tensor or torch.compiler.is_compiling():
            return None
        if torch.is_grad_enabled() and h.requires_grad:
            return None
        layer = self.layer
        if h.numel() > FOLD_MAX_ROWS * h.shape[-1]:
            return None
        if not (self.kernels.decode.takes_decode_kernels(h) and self.group._takes(h)):
            return None
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        if not all(self._is_our_rms_norm(n, h) for n in norms):
            return None
        attention = layer.self_attn
        if not (_no_hooks(attention.o_proj) and _plain(layer.mlp)):
            return None
        if not _linear_of(attention.o_proj, h.dtype, h.device):
            return None
        if kernel_layer_of(layer.mlp) not in set(self.kernels.gated_mlps):
            return None
        return self.kernels.mlp_activation(layer.mlp, h)

    def _is_our_rms_norm(self, norm: nn.Module, h: torch.Tensor) -> bool:
        weight = getattr(norm, "weight", None)
        return (
            kernel_layer_of(norm) is self.kernels.rms_norm
            and not (norm._forward_hooks or norm._forward_pre_hooks)
            and isinstance(weight, torch.Tensor)
            and _plain_tensor(weight)
            and weight.shape == (h.shape[-1],)
            and weight.dtype == h.dtype
            and weight.device == h.device
            and isinstance(getattr(norm, "variance_epsilon", None), float)
        )

    def _mlp(self, h1: torch.Tensor, act: str | None) -> torch.Tensor:
        """``h1 + mlp(post_attention_layernorm(h1))``: the norm in the gate/up kernel's
        prologue, the add in the down projection's epilogue (``act``: the MLP's activation,
        None when its kernels do not take ``h1``)."""
        layer, decode = self.layer, self.kernels.decode
        mlp, norm = layer.mlp, layer.post_attention_layernorm
        if act is None:
            return h1 + mlp(norm(h1))
        gate, up, down = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        m = decode.gated_gemv(
            h1, gate.weight, gate.bias, up.weight, up.bias, decode.ACTIVATIONS[act],
            norm_weight=norm.weight, eps=norm.variance_epsilon,
        )  # fmt: skip
        return decode.gemv(m, down.weight, down.bias, residual=h1)

    # Its o_proj ------------------------------------------------------------------------------

    def o_proj_forward(self, x: torch.Tensor) -> torch.Tensor:
        o_proj = self.layer.self_attn.o_proj
        residual = self.residual
        if (
            residual is not None
            and type(x) is torch.Tensor
            and x.shape[:-1] == residual.shape[:-1]
            and x.dtype == residual.dtype
            and self.kernels.decode.takes_decode_kernels(x)
        ):
            self.residual, self.folded_residual = None, True
            return self.kernels.decode.gemv(x, o_proj.weight, o_proj.bias, residual=residual)
        return F.linear(x, o_proj.weight, o_proj.bias)


def foldable_layers(model: nn.Module) -> list[tuple[Any, LayerCalls]]:
    """The decoder layers of ``model`` whose code folds (`decoder_layer_calls`,
    `attention_is_foldable`) and whose modules are there to fold."""
    found = []
    for module in model.modules():
        if "forward" in vars(module) or not hasattr(module, "self_attn"):
            continue
        calls = decoder_layer_calls(type(module).forward)
        if calls is None:
            continue
        attention: Any = module.self_attn
        if not all(
            isinstance(getattr(module, name, None), nn.Module)
            for name in ("input_layernorm", "post_attention_layernorm", "mlp")
        ):
            continue
        o_proj = getattr(attention, "o_proj", None)
        if not isinstance(o_proj, nn.Module) or "forward" in vars(o_proj):
            continue
        if attention_is_foldable(type(attention).forward):
            found.append((module, calls))
    return found


@contextlib.contextmanager
def folded_decoder_layers(
    model: nn.Module, groups: dict[nn.Module, _QKVGroup], kernels: FoldKernels
) -> Iterator[list[_FoldedLayer]]:
    """For the block, run the decode steps of every foldable decoder layer of ``model``
    (`foldable_layers`) whose attention's q, k and v are grouped (``groups``, from
    `kernels.generation.projections.grouped_projections`) as four projection kernels with the
    norms and residual adds folded in; yields the folded layers."""
    folded = [
        _FoldedLayer(layer, calls, groups[layer.self_attn], kernels)
        for layer, calls in foldable_layers(model)
        if layer.self_attn in groups
    ]
    with contextlib.ExitStack() as stack:
        for f in folded:
            stack.enter_context(instance_attribute(f.layer, "forward", f.forward))
            o_proj = f.layer.self_attn.o_proj
            stack.enter_context(instance_attribute(o_proj, "forward", f.o_proj_forward))
        yield folded
