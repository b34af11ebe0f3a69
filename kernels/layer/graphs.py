"""Whether a layer's forward can run inside a CUDA graph and a torch.compile graph, and why
not: a reading of its Python source, for `explain`.

A CUDA graph replays kernels without Python, so a forward that makes the host wait for the
device (``.item()``, ``.cpu()``, ``.tolist()``, ``torch.cuda.synchronize()``, an ``if`` on
``tensor.any()``), produces a shape from the data (``nonzero``, ``unique``, ``masked_select``)
or copies new host data to the device (``torch.tensor(...)``) fails the capture or replays the
first call's values. torch.compile breaks its graph at the same host reads, and around a kernel
layer that does not declare ``can_torch_compile = True``.

The reading follows the forward into the functions it calls in its own package (and the
``forward`` of ``torch.autograd.Function`` classes it applies), a few levels deep; what has no
Python source (compiled extensions, Triton kernels, PyTorch's own ops) is taken as safe, which
it is for Triton launches and PyTorch ops of fixed-shape results. It can miss a host read hidden
behind a call it does not follow: the GPU tests capture every kernel of our library for real
(``tests/generation/test_kernel_capture.py``).

Example:
    ```python
    from kernels.layer.graphs import graph_safety

    print(graph_safety(LlamaRMSNorm, kernel=None))
    # CUDA graph: ok; torch.compile: ok (read LlamaRMSNorm.forward: no host synchronisation)
    ```
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

#: Methods (and ``torch.`` functions) that make the host wait for the device.
HOST_SYNC = {
    "item": "reads a tensor's value on the host",
    "tolist": "reads a tensor's values on the host",
    "numpy": "reads a tensor's values on the host",
    "cpu": "copies a tensor to the host",
    "synchronize": "waits for the device",
    "nonzero": "has an output shape that depends on the data",
    "masked_select": "has an output shape that depends on the data",
    "unique": "has an output shape that depends on the data",
    "unique_consecutive": "has an output shape that depends on the data",
    "is_nonzero": "reads a tensor's value on the host",
}
#: ``torch.`` functions that make a device tensor from host data at each call.
HOST_DATA = {"tensor", "as_tensor", "from_numpy"}
#: Tensor reductions that, as a condition (``if x.any():``), read a value on the host.
CONDITION_READS = {"any", "all", "equal", "allclose"}

_MAX_DEPTH = 3
_MAX_FUNCTIONS = 40


@dataclass(frozen=True)
class Finding:
    """One construct that breaks a graph: what, where, and which graphs it breaks."""

    what: str
    where: str
    breaks_compile: bool


@dataclass(frozen=True)
class GraphSafety:
    """The verdict for one forward: ``"ok"``, ``"breaks"`` or ``"unknown"`` for each graph."""

    cuda_graph: str
    torch_compile: str
    why: str

    def __str__(self) -> str:
        return f"CUDA graph: {self.cuda_graph}; torch.compile: {self.torch_compile} ({self.why})"


def graph_safety(module_class: type, kernel: type | None) -> GraphSafety:
    """Whether the forward a module runs (``kernel``'s, or its class's own when None) can run
    inside a CUDA graph and a torch.compile graph."""
    owner = kernel if kernel is not None else module_class
    forward = getattr(owner, "forward", None)
    if forward is not None:
        forward = inspect.unwrap(forward)
    name = f"{owner.__name__}.forward"
    if not inspect.isfunction(forward):
        return GraphSafety("unknown", "unknown", f"{name} is not a Python function")
    findings, read = _scan(forward, owner)
    if read is None:
        return GraphSafety("unknown", "unknown", f"{name} has no Python source to read")
    no_compile = kernel is not None and not getattr(kernel, "can_torch_compile", False)
    if not findings:
        others = f" and {read - 1} functions it calls" if read > 1 else ""
        compile_verdict = "breaks" if no_compile else "ok"
        why = f"read {name}{others}: no host synchronisation"
        if no_compile:
            why += f"; {owner.__name__} does not declare can_torch_compile = True"
        return GraphSafety("ok", compile_verdict, why)
    reasons = [f"{f.what} at {f.where}" for f in findings[:3]]
    if len(findings) > 3:
        reasons.append(f"{len(findings) - 3} more")
    if no_compile:
        reasons.append(f"{owner.__name__} does not declare can_torch_compile = True")
    compile_verdict = "breaks" if no_compile or any(f.breaks_compile for f in findings) else "ok"
    return GraphSafety("breaks", compile_verdict, "; ".join(reasons))


@functools.lru_cache(maxsize=256)
def _scan(root: Callable, owner: type) -> tuple[tuple[Finding, ...], int | None]:
    """(findings, functions read) for ``root`` and what it calls; None read when ``root`` has
    no source."""
    package = (root.__module__ or "").split(".")[0]
    findings: list[Finding] = []
    seen: set[Callable] = set()
    queue: list[tuple[Callable, int]] = [(root, 0)]
    while queue and len(seen) < _MAX_FUNCTIONS:
        func, depth = queue.pop(0)
        if func in seen:
            continue
        seen.add(func)
        tree = _parse(func)
        if tree is None:
            if func is root:
                return (), None
            continue
        findings += _findings(func, tree)
        if depth < _MAX_DEPTH:
            for callee in _callees(func, tree, owner if func is root else None):
                if (callee.__module__ or "").split(".")[0] == package:
                    queue.append((callee, depth + 1))
    return tuple(findings), len(seen)


def _parse(func: Callable) -> ast.AST | None:
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return None


def _where(func: Callable, node: ast.expr) -> str:
    code = func.__code__
    filename = code.co_filename.replace("\\", "/").rsplit("/", 1)[-1]
    return f"{func.__qualname__} ({filename}:{code.co_firstlineno + node.lineno - 1})"


def _findings(func: Callable, tree: ast.AST) -> list[Finding]:
    found = []
    conditions = {
        id(sub)
        for node in ast.walk(tree)
        if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert))
        for sub in ast.walk(node.test)
    }
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        name = node.func.attr
        base = node.func.value
        is_torch = isinstance(base, ast.Name) and base.id == "torch"
        if name in HOST_SYNC:
            found.append(Finding(f"{name}() {HOST_SYNC[name]}", _where(func, node), True))
        elif name == "to" and any(
            isinstance(a, ast.Constant) and a.value == "cpu"
            for a in [*node.args, *(k.value for k in node.keywords)]
        ):
            found.append(Finding('to("cpu") copies a tensor to the host', _where(func, node), True))
        elif is_torch and name in HOST_DATA:
            what = f"torch.{name}() copies host data to the device at each call"
            found.append(Finding(what, _where(func, node), False))
        elif name in CONDITION_READS and id(node) in conditions:
            what = f"a condition on {name}() reads a tensor's value on the host"
            found.append(Finding(what, _where(func, node), True))
    return found


def _callees(func: Callable, tree: ast.AST, owner: type | None) -> list[Callable]:
    """The Python functions ``func`` calls that can be found statically: module globals, their
    attributes, ``self.<method>`` of ``owner``, and ``Function.apply`` (its ``forward``)."""
    import torch

    callees: list[Callable] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        target = _resolve(node.func, func.__globals__, owner)
        if isinstance(target, type) and issubclass(target, torch.autograd.Function):
            target = target.forward
        target = inspect.unwrap(target) if callable(target) else None
        if inspect.isfunction(target):
            callees.append(target)
    return callees


def _resolve(node: ast.AST, namespace: dict, owner: type | None) -> object | None:
    if isinstance(node, ast.Name):
        return namespace.get(node.id)
    if not isinstance(node, ast.Attribute):
        return None
    if isinstance(node.value, ast.Name) and node.value.id == "self":
        return getattr(owner, node.attr, None) if owner is not None else None
    base = _resolve(node.value, namespace, owner)
    if base is None:
        return None
    if node.attr == "apply" and isinstance(base, type):
        return base  # Function.apply: read its forward
    return inspect.getattr_static(base, node.attr, None)
