"""Reading FX nodes: which torch call a node is, its arguments by name, and its traced value.

Dynamo hands a backend a graph of torch-level calls: ``call_function`` nodes whose target is a
torch function (``torch.rsqrt``, ``torch.nn.functional.silu``, ``operator.mul``) and
``call_method`` nodes whose target is a tensor method name (``"pow"``, ``"to"``). One formula
can be written several ways (``x.pow(2)``, ``torch.pow(x, 2)``, ``x ** 2``), so patterns ask
questions through these helpers rather than comparing targets themselves. Graphs made by
``torch.fx.symbolic_trace`` also hold ``call_module`` nodes, and graphs below autograd hold
aten ops; the helpers know those spellings too.

Every value comes from the node's metadata: ``example_value`` (Dynamo) or ``val`` (fake tensor
propagation, aot_autograd): fake tensors with the dtype, device and shape the node had when
traced.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import statically_known_true


def value(node: Any) -> Any:
    """The traced value of ``node`` (a fake tensor, a SymInt, ...), or None when it has none.
    A constant argument (not a node) is its own value."""
    if not isinstance(node, fx.Node):
        return node
    meta = node.meta
    if "val" in meta:
        return meta["val"]
    return meta.get("example_value")


def tensor_value(node: Any) -> torch.Tensor | None:
    """The traced value of ``node`` if it is a tensor, else None."""
    found = value(node)
    return found if isinstance(found, torch.Tensor) else None


def has_values(graph: fx.Graph) -> bool:
    """Whether every computing node of ``graph`` carries its traced value."""
    return all(
        value(node) is not None
        for node in graph.nodes
        if node.op in ("call_function", "call_method", "call_module")
    )


def known_equal(a: Any, b: Any) -> bool:
    """``a == b`` for ints or SymInts, True only when it holds whatever the symbolic sizes are.

    Comparing SymInts with ``==`` and asking for a bool would add a guard to the compiled
    graph (and specialise it); a pattern that cannot tell stays unmatched instead.
    """
    try:
        return bool(statically_known_true(a == b))
    except Exception:  # noqa: BLE001  (an unbacked or odd symbol: not known, so not equal)
        return False


def same_shape(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dim() == b.dim() and all(
        known_equal(p, q) for p, q in zip(a.shape, b.shape, strict=True)
    )


# ---- what a node calls ----------------------------------------------------------------------


def _op(namespace: str, name: str, overload: str = "default") -> Any:
    """``torch.ops.<namespace>.<name>.<overload>``, or None where this torch has no such op."""
    packet = getattr(getattr(torch.ops, namespace), name, None)
    return getattr(packet, overload, None) if packet is not None else None


def aten(name: str, overload: str = "default") -> Any:
    """``torch.ops.aten.<name>.<overload>``, or None where this torch has no such op."""
    return _op("aten", name, overload)


def functions(*targets: Any) -> frozenset:
    """A set of call targets, without the Nones of ops this torch does not have."""
    return frozenset(t for t in targets if t is not None)


def calls(node: Any, targets: Iterable[Any] = (), methods: Iterable[str] = ()) -> bool:
    """Whether ``node`` calls one of ``targets`` (``call_function``) or one of the tensor
    methods named in ``methods`` (``call_method``)."""
    if not isinstance(node, fx.Node):
        return False
    if node.op == "call_function":
        return node.target in targets
    if node.op == "call_method":  # its target is the method's name
        return isinstance(node.target, str) and node.target in methods
    return False


def bind(node: fx.Node, params: Sequence[str], defaults: dict[str, Any] | None = None) -> dict:
    """``node``'s arguments by parameter name (positional ones in ``params`` order, then its
    keyword arguments, then ``defaults`` for what it left out). For a ``call_method`` node the
    tensor the method is called on is the first parameter."""
    bound = dict(defaults or {})
    bound.update(zip(params, node.args, strict=False))  # parameters past the given ones
    bound.update(node.kwargs)
    return bound


def module_of(node: fx.Node, gm: fx.GraphModule) -> torch.nn.Module | None:
    """The submodule a ``call_module`` node calls (None for other nodes or a missing path)."""
    if node.op != "call_module" or not isinstance(node.target, str):  # a path, for these
        return None
    try:
        return gm.get_submodule(node.target)
    except AttributeError:
        return None


def module_path(node: fx.Node) -> str:
    """Where in the model ``node`` came from (``layers.0.mlp``), from Dynamo's module stack;
    empty when unknown."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return node.target if node.op == "call_module" and isinstance(node.target, str) else ""
    path = list(stack.values())[-1]
    path = path[0] if isinstance(path, tuple) else path
    # Dynamo writes L['self'].layers[0].mlp; show it as the module path users know.
    for prefix in ("L['self'].", "L['self']", "L__self__."):
        if path.startswith(prefix):
            path = path[len(prefix) :]
            break
    return path.replace("[", ".").replace("]", "")


# ---- the arithmetic the patterns are written in ----------------------------------------------

MUL = functions(operator.mul, torch.mul, aten("mul", "Tensor"))
TRUEDIV = functions(operator.truediv, torch.div, torch.true_divide, aten("div", "Tensor"))
ADD = functions(operator.add, torch.add, aten("add", "Tensor"), aten("add", "Scalar"))
POW = functions(operator.pow, torch.pow, aten("pow", "Tensor_Scalar"))
SQUARE = functions(torch.square, aten("square"))
MEAN = functions(torch.mean, aten("mean", "dim"))
RSQRT = functions(torch.rsqrt, aten("rsqrt"))
SQRT = functions(torch.sqrt, aten("sqrt"))

# Tensor methods (and torch ops) that change only a tensor's dtype.
CAST_METHODS = frozenset({"to", "type", "type_as", "float", "half", "bfloat16", "double"})
CAST_FUNCTIONS = functions(aten("_to_copy"), _op("prims", "convert_element_type"))


def operands(node: Any, targets: frozenset, method: str) -> tuple[Any, Any] | None:
    """``(a, b)`` when ``node`` is the binary op ``a <op> b`` (``operator.mul``, ``torch.mul``,
    ``a.mul(b)``), else None. ``torch.add`` with an ``alpha`` is not a plain sum: None."""
    if not calls(node, targets, (method,)):
        return None
    if len(node.args) != 2 or any(k not in ("out",) for k in node.kwargs):
        return None
    if node.kwargs.get("out") is not None:
        return None
    return node.args[0], node.args[1]


def other_operand(pair: tuple[Any, Any] | None, one: Any) -> Any:
    """The operand of ``pair`` that is not ``one`` (the first if both are), else None."""
    if pair is None:
        return None
    if pair[0] is one:
        return pair[1]
    if pair[1] is one:
        return pair[0]
    return None


def cast_input(node: Any) -> fx.Node | None:
    """The input of ``node`` when ``node`` only converts a tensor's dtype (``x.to(torch.float32)``,
    ``x.float()``, ``x.type_as(y)``), else None.

    What a cast converts to is read from the traced values, not from its arguments: a cast
    must keep its input's shape and device, whatever spelling it uses.
    """
    if not calls(node, CAST_FUNCTIONS, CAST_METHODS) or not node.args:
        return None
    source = node.args[0]
    if not isinstance(source, fx.Node):
        return None
    before, after = tensor_value(source), tensor_value(node)
    if before is None or after is None:
        return None
    if before.device != after.device or not same_shape(before, after):
        return None
    return source


def constant_number(arg: Any) -> float | None:
    """``arg`` as a float when it is a Python number in the graph (not a node), else None."""
    if isinstance(arg, bool) or not isinstance(arg, (int, float)):
        return None
    return float(arg)


def is_last_dim(dim: Any, ndim: int) -> bool:
    """Whether ``dim`` (an int, or a one-element list or tuple of one) names the last of
    ``ndim`` dimensions."""
    if isinstance(dim, (list, tuple)):
        if len(dim) != 1:
            return False
        dim = dim[0]
    if isinstance(dim, bool) or not isinstance(dim, int):
        return False
    return dim == -1 or dim == ndim - 1


def graph_order(graph: fx.Graph) -> dict[fx.Node, int]:
    """Each node's position in ``graph``."""
    return {node: i for i, node in enumerate(graph.nodes)}
