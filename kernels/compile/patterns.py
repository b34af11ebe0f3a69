"""The patterns the backend finds in a graph, what each one's kernel is called with, and how
each is found.

A pattern names a computation (``"rms_norm"``), the signature of the kernel that replaces it
(a ``torch.library`` schema: ``(Tensor x, Tensor? weight, float eps) -> Tensor``), the same
computation in PyTorch (``reference``: what a user kernel's fake tensors and default backward
are derived from) and the ways it is written in a Dynamo graph. Finding a pattern at a node
gives a `Match`: the nodes it covers and the arguments of the kernel call that replaces them,
constants (eps) read from the graph.

A match may carry a ``problem``: the computation is there, but in a form no kernel with the
pattern's signature can take (``F.rms_norm`` over two trailing dimensions, ``silu(gate) * up``
that broadcasts). The rewrite leaves such matches alone and reports why.

Every kernel returns one new tensor with the shape and dtype of its first argument.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.multiprocessing.reductions import StorageWeakRef

from . import fx_nodes as fxn
from .errors import UnknownPatternError

# --------------------------------------------------------------------------------------------
# Matches
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttrRef:
    """A parameter of the model that a replacement reads through a ``get_attr`` node: the weight
    of an ``nn.RMSNorm`` or ``nn.LayerNorm`` called as a module (``call_module`` graphs)."""

    path: str


@dataclass
class Match:
    """One place in a graph where a pattern's computation is.

    Attributes:
        pattern: the pattern's name.
        form: how the computation is written there, for the report (``"torch.rms_norm"``,
            ``"transformers formula"``, ``"F.relu (in place)"``).
        nodes: the nodes the match covers, in graph order; the last one (``output``) is the
            value the kernel's result stands in for.
        args: the kernel's arguments: nodes, `AttrRef`s and constants, in signature order.
        inplace_input: for an in-place op (``F.relu(x, inplace=True)``), the tensor it writes
            into: reads of it after the op read the kernel's result instead.
        problem: why no kernel of this pattern can replace the match, or None.
        keep: nodes of ``nodes`` that stay in the graph after a replacement, because other
            nodes use them too (the ``x.float()`` of an RMSNorm formula, say).
    """

    pattern: str
    form: str
    nodes: tuple[fx.Node, ...]
    args: tuple
    inplace_input: fx.Node | None = None
    problem: str | None = None
    keep: frozenset = field(default_factory=frozenset)

    @property
    def output(self) -> fx.Node:
        return self.nodes[-1]

    def tensor_args(self) -> list[fx.Node]:
        """The argument nodes whose traced value is a tensor."""
        return [a for a in self.args if isinstance(a, fx.Node) and fxn.tensor_value(a) is not None]


Matcher = Callable[[fx.Node, fx.GraphModule], "Match | None"]


@dataclass(frozen=True)
class Pattern:
    """A computation the backend replaces with a kernel.

    Attributes:
        name: what `KernelRegistry.register` is given (``"relu"``, ``"rms_norm"``).
        summary: one line for listings.
        signature: the kernel's arguments and result, as a ``torch.library`` schema; the
            kernel is called with them positionally.
        reference: the computation in PyTorch with the kernel's signature: what a user
            kernel's output metadata and, without a registered backward, its gradients come from.
        elementwise: a single element-wise op; a fusing compiler (inductor) does better with
            it than a kernel can (see `Policy`).
        forms: how the pattern is written in the graphs it is found in, for the docs.
        matcher: finds the pattern at a node (see `Pattern.match`).
    """

    name: str
    summary: str
    signature: str
    reference: Callable[..., torch.Tensor]
    elementwise: bool
    forms: tuple[str, ...]
    matcher: Matcher = field(repr=False)

    def match(self, node: fx.Node, gm: fx.GraphModule) -> Match | None:
        """The match whose output is ``node``'s computation, found from ``node``, or None."""
        return self.matcher(node, gm)


# --------------------------------------------------------------------------------------------
# Single element-wise ops
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    """How one target of an activation takes its arguments: the parameter names (the first is
    the input), their defaults, and whether it writes into its input (True, or the name of the
    flag parameter that says so)."""

    params: tuple[str, ...]
    defaults: dict = field(default_factory=dict)
    inplace: bool | str = False


def _calls_table(entries: dict) -> dict:
    return {target: call for target, call in entries.items() if target is not None}


_RELU_FUNCTIONS = _calls_table(
    {
        F.relu: _Call(("input", "inplace"), {"inplace": False}, "inplace"),
        torch.relu: _Call(("input",)),
        torch.relu_: _Call(("input",), inplace=True),
        F.relu_: _Call(("input",), inplace=True),
        fxn.aten("relu"): _Call(("input",)),
        fxn.aten("relu_"): _Call(("input",), inplace=True),
    }
)
_RELU_METHODS = {"relu": _Call(("input",)), "relu_": _Call(("input",), inplace=True)}

_SILU_FUNCTIONS = _calls_table(
    {
        F.silu: _Call(("input", "inplace"), {"inplace": False}, "inplace"),
        fxn.aten("silu"): _Call(("input",)),
        fxn.aten("silu_"): _Call(("input",), inplace=True),
    }
)

_GELU_FUNCTIONS = _calls_table(
    {
        # F.gelu is torch._C._nn.gelu; both spellings for a torch where they differ.
        F.gelu: _Call(("input", "approximate"), {"approximate": "none"}),
        torch._C._nn.gelu: _Call(("input", "approximate"), {"approximate": "none"}),
        fxn.aten("gelu"): _Call(("input",), {"approximate": "none"}),
    }
)


@dataclass(frozen=True)
class _Activation:
    """The spellings of one activation in a graph."""

    functions: dict
    methods: dict
    module: type
    approximate: str | None = None  # for the GELUs: which approximation this pattern is


_ACTIVATIONS = {
    "relu": _Activation(_RELU_FUNCTIONS, _RELU_METHODS, nn.ReLU),
    "silu": _Activation(_SILU_FUNCTIONS, {}, nn.SiLU),
    "gelu": _Activation(_GELU_FUNCTIONS, {}, nn.GELU, approximate="none"),
    "gelu_tanh": _Activation(_GELU_FUNCTIONS, {}, nn.GELU, approximate="tanh"),
}


@dataclass(frozen=True)
class _ActivationCall:
    input: Any
    inplace: bool
    form: str


_M = TypeVar("_M", bound=nn.Module)


def _module_called_alone(node: fx.Node, gm: fx.GraphModule, cls: type[_M]) -> _M | None:
    """The module a ``call_module`` node calls, when it is exactly a ``cls`` (a subclass may
    compute something else) called on one positional input and nothing more; else None."""
    module = fxn.module_of(node, gm)
    if (
        not isinstance(module, cls)  # as the next test, but what the checker can follow
        or type(module) is not cls
        or len(node.args) != 1
        or node.kwargs
    ):
        return None
    return module


def _parameter_ref(node: fx.Node, module: nn.Module, name: str) -> AttrRef | None:
    """A reference to the called module's parameter ``name``, None where it has none."""
    return AttrRef(f"{node.target}.{name}") if getattr(module, name) is not None else None


def _activation_call(node: Any, gm: fx.GraphModule, name: str) -> _ActivationCall | None:
    """How ``node`` calls activation ``name``: its input and whether in place, or None when
    ``node`` is not that activation."""
    if not isinstance(node, fx.Node):
        return None
    spec = _ACTIVATIONS[name]
    if node.op == "call_module":
        module = _module_called_alone(node, gm, spec.module)
        if module is None:
            return None
        if spec.approximate is not None and module.approximate != spec.approximate:
            return None
        inplace = bool(getattr(module, "inplace", False))
        return _ActivationCall(node.args[0], inplace, f"nn.{spec.module.__name__} module")
    if node.op == "call_function":
        call = spec.functions.get(node.target)
        form = _target_name(node.target)
    elif node.op == "call_method":
        call = spec.methods.get(node.target)
        form = f"Tensor.{node.target}"
    else:
        return None
    if call is None:
        return None
    bound = fxn.bind(node, call.params, call.defaults)
    if spec.approximate is not None and bound.get("approximate") != spec.approximate:
        return None
    flag = call.inplace if isinstance(call.inplace, bool) else bound.get(call.inplace)
    if not isinstance(flag, bool):  # a flag that is not a constant: leave it alone
        return None
    return _ActivationCall(bound.get("input"), flag, form)


def _target_name(target: Any) -> str:
    """A short readable name of a call target (``F.relu``, ``torch.relu``, ``aten.gelu``)."""
    if isinstance(target, torch._ops.OpOverload):
        return f"aten.{target._schema.name.split('::')[-1]}"
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", str(target))
    if module.startswith("torch.nn.functional") or module == "torch._C._nn":
        return f"F.{name}"
    return f"torch.{name}"


def _inplace_problem(op: fx.Node, written: fx.Node, graph: fx.Graph) -> str | None:
    """Why an in-place op on ``written`` cannot become an out-of-place kernel call, or None.

    The kernel writes a new tensor; the reads of ``written`` after the op are then pointed at
    it. That is the op's meaning only when no other name of the same memory is read after the
    op (a view taken before it, or the tensor an in-place add returned), and when the memory
    is not the graph's own input, parameter or buffer, whose mutation the caller would see.
    Aliasing is read from the traced fake tensors, which share storage as the real ones do.
    """
    written_value = fxn.tensor_value(written)
    if written_value is None:
        return f"{written.name} has no traced value to check its aliases with"
    if written.op in ("placeholder", "get_attr"):
        return f"it writes into {written.name}, an input of the graph"
    storage = StorageWeakRef(written_value.untyped_storage())
    order = fxn.graph_order(graph)
    position = order[op]
    for node in graph.nodes:
        if order[node] >= position:
            break  # nodes after the op see its result, which the kernel's stands in for
        if node is written:
            continue
        found = fxn.tensor_value(node)
        if found is None or StorageWeakRef(found.untyped_storage()) != storage:
            continue
        if node.op in ("placeholder", "get_attr"):
            return f"it writes into {node.name}, an input of the graph"
        late = [user.name for user in node.users if order[user] > position]
        if late:
            return f"{node.name} shares its memory and is read after it (by {late[0]})"
    return None


def _activation_matcher(name: str) -> Matcher:
    def match(node: fx.Node, gm: fx.GraphModule) -> Match | None:
        call = _activation_call(node, gm, name)
        if call is None or not isinstance(call.input, fx.Node):
            return None
        form = call.form + (" (in place)" if call.inplace else "")
        result = Match(name, form, (node,), (call.input,))
        if call.inplace:
            result.inplace_input = call.input
            result.problem = _inplace_problem(node, call.input, gm.graph)
        return result

    return match


# --------------------------------------------------------------------------------------------
# Gated activations: act(gate) * up
# --------------------------------------------------------------------------------------------


def _gated_matcher(name: str, activation: str) -> Matcher:
    def match(node: fx.Node, gm: fx.GraphModule) -> Match | None:
        pair = fxn.operands(node, fxn.MUL, "mul")
        if pair is None:
            return None
        for act_node, up in (pair, pair[::-1]):
            call = _activation_call(act_node, gm, activation)
            if call is None or call.inplace or not isinstance(call.input, fx.Node):
                continue
            if not isinstance(up, fx.Node) or fxn.tensor_value(up) is None:
                continue  # act(x) * 2.0 scales; it does not gate
            gate = call.input
            callee = call.form.removesuffix(" module")  # nn.SiLU(gate) * up, F.silu(gate) * up
            result = Match(name, f"{callee}(gate) * up", (act_node, node), (gate, up))
            if len(act_node.users) != 1:
                result.problem = f"{act_node.name} is also used outside the product"
            else:
                result.problem = _gated_problem(gate, up)
            return result
        return None

    return match


def _gated_problem(gate: fx.Node, up: fx.Node) -> str | None:
    g, u = fxn.tensor_value(gate), fxn.tensor_value(up)
    if g is None or u is None:
        return "gate or up has no traced value"
    if not fxn.same_shape(g, u):
        return f"gate {tuple(g.shape)} and up {tuple(u.shape)} broadcast; the kernel takes equal shapes"
    if g.dtype != u.dtype:
        return f"gate and up differ in dtype ({g.dtype} and {u.dtype})"
    return None


# --------------------------------------------------------------------------------------------
# RMSNorm
# --------------------------------------------------------------------------------------------

_RMS_NORM_FUNCTIONS = fxn.functions(torch.rms_norm, F.rms_norm, fxn.aten("rms_norm"))
_RMS_NORM_PARAMS = ("input", "normalized_shape", "weight", "eps")


def _default_rms_eps(x: torch.Tensor) -> float:
    # torch's rms_norm without eps adds the epsilon of the dtype it computes in (float32 for
    # float32, float16 and bfloat16 inputs; float64 for float64), not that of the input's dtype.
    return torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps


def _shape_values(arg: Any) -> list | None:
    """A normalized_shape argument's sizes (ints or SymInts), or None if it is not a list."""
    if isinstance(arg, int) and not isinstance(arg, bool):
        return [arg]
    if isinstance(arg, fx.Node):
        found = fxn.value(arg)
        return list(found) if isinstance(found, (list, tuple, torch.Size)) else None
    if isinstance(arg, (list, tuple, torch.Size)):
        values = [fxn.value(a) for a in arg]
        return None if any(v is None for v in values) else values
    return None


def _last_dim_problem(x: fx.Node, normalized_shape: Any, what: str) -> str | None:
    xv = fxn.tensor_value(x)
    sizes = _shape_values(normalized_shape)
    if xv is None or sizes is None:
        return f"{what}'s input or normalized_shape has no traced value"
    if len(sizes) != 1 or xv.dim() == 0 or not fxn.known_equal(sizes[0], xv.shape[-1]):
        return (
            f"it normalizes over the trailing dimensions {tuple(sizes)}; the rms_norm kernel "
            "normalizes over the last one"
        )
    return None


def _rms_norm_call_matcher(node: fx.Node, gm: fx.GraphModule) -> Match | None:
    # A module's values, or a call's arguments (constants or graph nodes).
    normalized_shape: Any
    eps: Any
    if node.op == "call_module":
        module = _module_called_alone(node, gm, nn.RMSNorm)
        if module is None:
            return None
        x = node.args[0]
        weight = _parameter_ref(node, module, "weight")
        normalized_shape, eps, form = list(module.normalized_shape), module.eps, "nn.RMSNorm module"
    elif fxn.calls(node, _RMS_NORM_FUNCTIONS):
        bound = fxn.bind(node, _RMS_NORM_PARAMS, {"weight": None, "eps": None})
        x, weight = bound.get("input"), bound.get("weight")
        normalized_shape, eps = bound.get("normalized_shape"), bound.get("eps")
        form = _target_name(node.target)
    else:
        return None
    if not isinstance(x, fx.Node):
        return None
    xv = fxn.tensor_value(x)
    if xv is None:
        return None
    problem = _last_dim_problem(x, normalized_shape, form)
    if eps is None:
        eps = _default_rms_eps(xv)
    else:
        eps, eps_problem = _eps_arg(eps)
        problem = problem or eps_problem
    return Match("rms_norm", form, (node,), (x, weight, eps), problem=problem)


def _eps_arg(eps: Any) -> tuple[Any, str | None]:
    """``(eps as the kernel call takes it, problem)``: a constant as a float; a node whose value
    is a float (``torch.compile(dynamic=True)`` passes a module's float attributes in as graph
    inputs, read with ``.item()``) as it is."""
    number = fxn.constant_number(eps)
    if number is not None:
        return number, None
    if isinstance(eps, fx.Node) and isinstance(fxn.value(eps), (float, torch.SymFloat)):
        return eps, None
    return eps, "its eps is neither a number nor a float computed in the graph"


def _square_of(node: Any, base: fx.Node) -> bool:
    """Whether ``node`` is ``base`` squared: ``base.pow(2)``, ``base ** 2``, ``base * base``,
    ``torch.square(base)``."""
    if fxn.calls(node, fxn.POW, ("pow",)):
        args = fxn.bind(node, ("input", "exponent"))
        return args.get("input") is base and fxn.constant_number(args.get("exponent")) == 2.0
    if fxn.calls(node, fxn.SQUARE, ("square",)):
        return len(node.args) == 1 and node.args[0] is base
    pair = fxn.operands(node, fxn.MUL, "mul")
    return pair is not None and pair[0] is base and pair[1] is base


def _mean_of_last(node: Any) -> fx.Node | None:
    """The input of ``node`` when ``node`` is ``t.mean(-1, keepdim=True)`` (any spelling of the
    last dimension), else None."""
    if not fxn.calls(node, fxn.MEAN, ("mean",)):
        return None
    args = fxn.bind(node, ("input", "dim", "keepdim"), {"keepdim": False})
    source = args.get("input")
    value = fxn.tensor_value(source) if isinstance(source, fx.Node) else None
    if value is None or args.get("keepdim") is not True or args.get("dtype") is not None:
        return None
    return source if fxn.is_last_dim(args.get("dim"), value.dim()) else None


def _rms_core(node: fx.Node) -> tuple[fx.Node, Any, tuple[fx.Node, ...]] | None:
    """``(h, eps, nodes)`` when ``node`` is ``h * rsqrt(mean(h^2, -1) + eps)`` or
    ``h / sqrt(mean(h^2, -1) + eps)``; ``eps`` as the graph has it (a number or a node)."""
    for targets, method, root_targets, root_method in (
        (fxn.MUL, "mul", fxn.RSQRT, "rsqrt"),
        (fxn.TRUEDIV, "div", fxn.SQRT, "sqrt"),
    ):
        pair = fxn.operands(node, targets, method)
        if pair is None:
            continue
        candidates = [pair] if method == "div" else [pair, pair[::-1]]
        for h, root in candidates:
            if not isinstance(h, fx.Node) or not fxn.calls(root, root_targets, (root_method,)):
                continue
            if len(root.args) != 1:
                continue
            add = root.args[0]
            added = fxn.operands(add, fxn.ADD, "add")
            if added is None:
                continue
            for mean, eps in (added, added[::-1]):
                if _mean_of_last(mean) is None:
                    continue
                square = mean.args[0]
                if not _square_of(square, h):
                    continue
                return h, eps, (square, mean, add, root, node)
    return None


def _rms_formula_matcher(node: fx.Node, gm: fx.GraphModule) -> Match | None:
    """transformers' RMSNorm written out (LlamaRMSNorm and its many copies)::

        h = x.to(torch.float32)                                # optional
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return weight * h.to(input_dtype)                      # cast and weight optional

    found from the normalising product (``h * rsqrt(...)``) and followed forward through an
    optional cast, an optional product with a weight of the hidden size, and a final cast.
    """
    core = _rms_core(node)
    if core is None:
        return None
    h, eps, nodes = core
    x = fxn.cast_input(h)
    upcast = x is not None
    if not upcast:
        x = h
    xv = fxn.tensor_value(x)
    if xv is None or xv.dim() == 0:
        return None
    nodes = ((h,) if upcast else ()) + nodes
    out, weight = node, None
    cast = _sole_cast(out)
    if cast is not None:
        out = cast
        nodes += (out,)
    user = _sole_user(out)
    w = fxn.other_operand(fxn.operands(user, fxn.MUL, "mul"), out)
    wv = fxn.tensor_value(w) if isinstance(w, fx.Node) else None
    if (
        user is not None
        and wv is not None
        and wv.dim() == 1
        and fxn.known_equal(wv.shape[0], xv.shape[-1])
    ):
        weight, out = w, user
        nodes += (out,)
        cast = _sole_cast(out)
        if cast is not None:
            out = cast
            nodes += (out,)
    form = "transformers formula" if upcast else "RMSNorm formula"
    eps, eps_problem = _eps_arg(eps)
    result = Match("rms_norm", form, nodes, (x, weight, eps))
    # The upcast x.float() may feed other nodes too: it then stays, and the kernel reads x.
    if upcast and len(h.users) > 2:
        result.keep = frozenset({h})
    result.problem = eps_problem or _interior_problem(result)
    return result


def _sole_user(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _sole_cast(node: fx.Node) -> fx.Node | None:
    """The sole user of ``node`` when it only converts ``node``'s dtype, else None."""
    user = _sole_user(node)
    return user if user is not None and fxn.cast_input(user) is node else None


def _interior_problem(match: Match) -> str | None:
    """Why the intermediate values of ``match`` cannot go: one of them (other than its output
    and the nodes it keeps) is read outside the match."""
    inside = set(match.nodes)
    for node in match.nodes[:-1]:
        if node in match.keep:
            continue
        outside = [user.name for user in node.users if user not in inside]
        if outside:
            return f"its intermediate value {node.name} is also used by {outside[0]}"
    return None


# --------------------------------------------------------------------------------------------
# LayerNorm
# --------------------------------------------------------------------------------------------

_LAYER_NORM_FUNCTIONS = fxn.functions(F.layer_norm, torch.layer_norm, fxn.aten("layer_norm"))
_LAYER_NORM_PARAMS = ("input", "normalized_shape", "weight", "bias", "eps", "cudnn_enable")


def _layer_norm_matcher(node: fx.Node, gm: fx.GraphModule) -> Match | None:
    # A module's values, or a call's arguments (constants or graph nodes).
    normalized_shape: Any
    eps: Any
    if node.op == "call_module":
        module = _module_called_alone(node, gm, nn.LayerNorm)
        if module is None:
            return None
        x = node.args[0]
        weight = _parameter_ref(node, module, "weight")
        bias = _parameter_ref(node, module, "bias")
        normalized_shape, eps = list(module.normalized_shape), module.eps
        form = "nn.LayerNorm module"
    elif fxn.calls(node, _LAYER_NORM_FUNCTIONS):
        bound = fxn.bind(node, _LAYER_NORM_PARAMS, {"weight": None, "bias": None, "eps": 1e-5})
        x, weight, bias = bound.get("input"), bound.get("weight"), bound.get("bias")
        normalized_shape, eps = bound.get("normalized_shape"), bound.get("eps")
        form = _target_name(node.target)
    else:
        return None
    if not isinstance(x, fx.Node) or fxn.tensor_value(x) is None:
        return None
    problem = None
    if isinstance(normalized_shape, int) and not isinstance(normalized_shape, bool):
        normalized_shape = [normalized_shape]
    elif isinstance(normalized_shape, (list, tuple, torch.Size)):
        normalized_shape = list(normalized_shape)
    else:
        # A shape computed in the graph (x.shape[-1:] under dynamic shapes, say): the kernel
        # call takes its sizes as a list, which this node is not.
        problem = "its normalized_shape is computed in the graph, not a list of sizes"
    eps, eps_problem = _eps_arg(eps)
    problem = problem or eps_problem
    args = (x, normalized_shape, weight, bias, eps)
    return Match("layer_norm", form, (node,), args, problem=problem)


# --------------------------------------------------------------------------------------------
# References: each pattern's computation in PyTorch, with its kernel's signature
# --------------------------------------------------------------------------------------------


def relu_reference(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x)


def silu_reference(x: torch.Tensor) -> torch.Tensor:
    return F.silu(x)


def gelu_reference(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x)


def gelu_tanh_reference(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def silu_mul_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def gelu_mul_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.gelu(gate) * up


def gelu_tanh_mul_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.gelu(gate, approximate="tanh") * up


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def layer_norm_reference(
    x: torch.Tensor,
    normalized_shape: list[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> torch.Tensor:
    return F.layer_norm(x, normalized_shape, weight, bias, eps)


def _either(*matchers: Matcher) -> Matcher:
    def match(node: fx.Node, gm: fx.GraphModule) -> Match | None:
        for matcher in matchers:
            found = matcher(node, gm)
            if found is not None:
                return found
        return None

    return match


_UNARY = "(Tensor x) -> Tensor"
_GATED = "(Tensor gate, Tensor up) -> Tensor"

#: Every pattern the backend knows, by name, in the order the rewrite tries them: the
#: computations of several ops first, so that the activation inside ``silu(gate) * up`` goes
#: to the gated kernel rather than to a lone activation's.
PATTERNS: dict[str, Pattern] = {
    p.name: p
    for p in (
        Pattern(
            "rms_norm",
            "RMSNorm over the last dimension: weight * x / sqrt(mean(x^2) + eps)",
            "(Tensor x, Tensor? weight, float eps) -> Tensor",
            rms_norm_reference,
            False,
            (
                "torch.rms_norm / F.rms_norm(x, (hidden,), weight, eps)",
                "nn.RMSNorm",
                "transformers' LlamaRMSNorm formula: x.to(float32), pow(2).mean(-1, keepdim=True), "
                "* rsqrt(variance + eps), weight * h.to(input_dtype) (also without the casts or "
                "the weight, and with / sqrt(...))",
            ),
            _either(_rms_norm_call_matcher, _rms_formula_matcher),
        ),
        Pattern(
            "layer_norm",
            "LayerNorm: (x - mean) / sqrt(var + eps) * weight + bias",
            "(Tensor x, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps) -> Tensor",
            layer_norm_reference,
            False,
            ("F.layer_norm / torch.layer_norm", "nn.LayerNorm"),
            _layer_norm_matcher,
        ),
        Pattern(
            "silu_mul",
            "gated SiLU: silu(gate) * up (the middle of Llama's MLP)",
            _GATED,
            silu_mul_reference,
            False,
            ("F.silu(gate) * up, up * F.silu(gate), torch.mul, Tensor.mul; nn.SiLU as the act",),
            _gated_matcher("silu_mul", "silu"),
        ),
        Pattern(
            "gelu_mul",
            "gated exact GELU: gelu(gate) * up (GeGLU)",
            _GATED,
            gelu_mul_reference,
            False,
            ("F.gelu(gate) * up (either order)",),
            _gated_matcher("gelu_mul", "gelu"),
        ),
        Pattern(
            "gelu_tanh_mul",
            "gated tanh GELU: gelu(gate, approximate='tanh') * up (Gemma's MLP)",
            _GATED,
            gelu_tanh_mul_reference,
            False,
            ("F.gelu(gate, approximate='tanh') * up (either order)",),
            _gated_matcher("gelu_tanh_mul", "gelu_tanh"),
        ),
        Pattern(
            "relu",
            "ReLU: max(x, 0)",
            _UNARY,
            relu_reference,
            True,
            ("F.relu, torch.relu, Tensor.relu, nn.ReLU; in place: relu_, inplace=True",),
            _activation_matcher("relu"),
        ),
        Pattern(
            "silu",
            "SiLU: x * sigmoid(x)",
            _UNARY,
            silu_reference,
            True,
            ("F.silu, nn.SiLU (also inplace=True)",),
            _activation_matcher("silu"),
        ),
        Pattern(
            "gelu",
            "exact GELU: x * Phi(x)",
            _UNARY,
            gelu_reference,
            True,
            ("F.gelu, nn.GELU (approximate='none')",),
            _activation_matcher("gelu"),
        ),
        Pattern(
            "gelu_tanh",
            "tanh GELU: F.gelu(x, approximate='tanh')",
            _UNARY,
            gelu_tanh_reference,
            True,
            ("F.gelu(x, approximate='tanh'), nn.GELU('tanh')",),
            _activation_matcher("gelu_tanh"),
        ),
    )
}


def get_pattern(name: object) -> Pattern:
    """The pattern called ``name``, or `UnknownPatternError` naming the known ones."""
    if isinstance(name, Pattern):
        return name
    if not isinstance(name, str):
        raise UnknownPatternError(
            f"A pattern is named by a string such as 'relu' or 'rms_norm'; got {name!r}. "
            f"Known patterns: {', '.join(PATTERNS)}."
        )
    found = PATTERNS.get(name)
    if found is None:
        import difflib

        close = difflib.get_close_matches(name, PATTERNS, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise UnknownPatternError(
            f"Unknown pattern '{name}'.{hint} Known patterns: {', '.join(PATTERNS)}."
        )
    return found
