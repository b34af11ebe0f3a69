"""Every kernel launch of the library names its arguments, and the names are the kernel's.

A launch passes all of a kernel's arguments positionally (``launch(kernel, grid, args, ...)``,
``_library.py``), which is the cheapest form on the host. So that two values passed in each
other's place cannot go unnoticed, each launcher writes ``args`` as a tuple of plain names, each
the name of the kernel's parameter in that place (case aside, unless two parameters differ only
in case), optionally followed by
``+ plan.constexprs``, which the plan built by keyword with ``constexprs(kernel, NAME=value,
...)``. This test reads every launcher's source and checks those names against the kernel's
``arg_names``, in order, once for every kernel the library launches; ``constexprs`` checks its
keywords when a plan is made.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.library import LIBRARY, load

# The functions that launch a kernel: (kernel, grid, args, ...).
LAUNCHERS = {"launch", "_run"}  # _run: attention's launch with a configuration


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _resolve(namespace, dotted: str):
    obj = namespace
    for part in dotted.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


def _args_expression(function: ast.FunctionDef, call: ast.Call) -> ast.expr | str:
    """The expression that built a launch's ``args``: the argument itself, or the nearest
    assignment to that name above the call in the same function; or what is wrong."""
    node = call.args[2]
    if not isinstance(node, ast.Name):
        return node
    bound = [
        a
        for a in ast.walk(function)
        if isinstance(a, (ast.Assign, ast.AugAssign))
        and a.lineno < call.lineno
        and any(isinstance(t, ast.Name) and t.id == node.id for t in _targets(a))
    ]
    if not bound:
        return f"{node.id} is not assigned in {function.name}"
    nearest = max(bound, key=lambda a: a.lineno)
    if isinstance(nearest, ast.AugAssign) or len(nearest.targets) != 1:
        return f"{node.id} is not built in one assignment"
    return nearest.value


def _targets(node) -> list[ast.expr]:
    return node.targets if isinstance(node, ast.Assign) else [node.target]


def _names(node: ast.expr) -> tuple[list[str] | str, bool]:
    """``(names, plan_constexprs)``: the names of an ``args`` tuple (or what is wrong with it),
    and whether it ends with ``+ <plan>.constexprs``."""
    plan_constexprs = False
    if (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Add)
        and isinstance(node.right, ast.Attribute)
        and node.right.attr == "constexprs"
    ):
        node, plan_constexprs = node.left, True
    if not isinstance(node, ast.Tuple):
        return f"args is not a tuple of names: {ast.unparse(node)}", plan_constexprs
    unnamed = [ast.unparse(e) for e in node.elts if not isinstance(e, ast.Name)]
    if unnamed:
        return f"unnamed arguments {', '.join(unnamed)} (bind each to its parameter's name)", False
    return [e.id for e in node.elts], plan_constexprs  # type: ignore[attr-defined]


def _parameters(kernel) -> list[tuple[str, bool]]:
    # (name, is_constexpr) of each parameter: the library's own reading (tested below).
    return list(sys.modules[f"{load('norm').__name__}._library"].kernel_parameters(kernel))


def _same_name(passed: str, expected: str, parameters: list[str]) -> bool:
    # Case aside, unless the kernel has two parameters that differ only in case (window_left
    # and WINDOW_LEFT): then exactly.
    if passed == expected:
        return True
    folded = [p.lower() for p in parameters]
    return passed.lower() == expected.lower() and folded.count(expected.lower()) == 1


def _calls(tree: ast.Module):
    """``(innermost function, call)`` of each call made in a function of ``tree``."""
    found = []

    class Visitor(ast.NodeVisitor):
        def __init__(self):
            self.functions = []

        def visit_FunctionDef(self, node):
            self.functions.append(node)
            self.generic_visit(node)
            self.functions.pop()

        def visit_Call(self, node):
            if self.functions and isinstance(node.func, ast.Name):
                found.append((self.functions[-1], node))
            self.generic_visit(node)

    Visitor().visit(tree)
    return found


def _check_constexprs(function, call, namespace) -> list[str]:
    name = _dotted(call.args[0]) if call.args else None
    if name is None:
        return []
    expected = [n for n, c in _parameters(_resolve(namespace, name)) if c]
    passed = [str(k.arg) for k in call.keywords]
    if passed == expected:
        return []
    return [
        f"{function.name}: constexprs({name}, {', '.join(passed)}) is not the kernel's "
        f"constexprs in order ({', '.join(expected)})"
    ]


def _check_launch(function, call, kernel, where) -> list[str]:
    expression = _args_expression(function, call)
    if isinstance(expression, str):
        return [f"{where}: {expression}"]
    names, plan_constexprs = _names(expression)
    if isinstance(names, str):
        return [f"{where}: {names}"]
    parameters = _parameters(kernel)
    runtime = [n for n, c in parameters if not c]
    if plan_constexprs and [n for n, _ in parameters] != runtime + [n for n, c in parameters if c]:
        return [f"{where}: + constexprs, but the kernel's constexprs are not its last parameters"]
    expected = runtime if plan_constexprs else list(kernel.arg_names)
    every = [n for n, _ in parameters]
    differ = [
        i
        for i, (a, b) in enumerate(zip(names, expected, strict=False))
        if not _same_name(a, b, every)
    ]
    if not differ and len(names) == len(expected):
        return []
    first = differ[0] if differ else min(len(names), len(expected))
    return [
        f"{where}: passes ({', '.join(names)}){' + constexprs' if plan_constexprs else ''}; "
        f"the kernel's parameters are ({', '.join(expected)}); they differ from argument "
        f"{first + 1} on"
    ]


def check_source(source: str, namespace) -> tuple[list[str], list[str]]:
    """``(kernels launched, problems)`` of a module's source: each launch's argument names
    against its kernel's parameters (``namespace`` resolves the kernel's name), and each
    ``constexprs(kernel, ...)`` call's keywords against the kernel's constexprs."""
    launched, problems = [], []
    for function, call in _calls(ast.parse(source)):
        if call.func.id == "constexprs":
            problems += _check_constexprs(function, call, namespace)
            continue
        if call.func.id not in LAUNCHERS:
            continue
        name = _dotted(call.args[0]) if call.args else None
        if len(call.args) < 3 or name is None:
            problems.append(f"{function.name} (line {call.lineno}): a launch this test cannot read")
            continue
        if name in {a.arg for a in function.args.args}:
            continue  # a wrapper that launches the kernel it is given
        launched.append(name)
        where = f"{function.name} (line {call.lineno}) launching {name}"
        problems += _check_launch(function, call, _resolve(namespace, name), where)
    return launched, problems


def _library_modules():
    for package in sorted(p for p in Path(LIBRARY).iterdir() if (p / "torch-ext").is_dir()):
        for path in sorted((package / "torch-ext" / package.name).glob("*.py")):
            yield f"{package.name}.{path.stem}"


MODULES = list(_library_modules())


def _module(repo: str, stem: str):
    package = load(repo)
    return package if stem == "__init__" else importlib.import_module(f"{package.__name__}.{stem}")


@pytest.mark.parametrize("module", MODULES)
def test_launches_name_the_kernels_arguments(module):
    repo, stem = module.split(".")
    loaded = _module(repo, stem)
    source = inspect.getsource(loaded)
    launched, problems = check_source(source, loaded)
    assert not problems, "\n".join(problems)
    assert launched or not re.search(r"(?<![\w.])launch\(", source)


def test_the_library_launches_are_read():
    launched = []
    for module in MODULES:
        loaded = _module(*module.split("."))
        launched += check_source(inspect.getsource(loaded), loaded)[0]
    # The check must see the library's launches (a launch in a form it did not follow would
    # pass unread): one of each package's.
    assert {"_rms_norm_fwd_kernel", "_gated_bwd_kernel", "_rotary_kernel", "_loss_grad_kernel",
            "K._fwd_kernel"} <= set(launched)  # fmt: skip


# ---- the check itself, on a synthetic kernel ------------------------------------------------

SYNTHETIC = """
import triton
import triton.language as tl


@triton.jit
def kernel(X, Y, n_rows, stride, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    pass


@triton.jit
def windowed(X, window, WINDOW: tl.constexpr):
    pass
"""


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    # triton.jit reads the kernel's source from its file.
    path = tmp_path_factory.mktemp("synthetic") / "synthetic_kernel.py"
    path.write_text(SYNTHETIC)
    spec = importlib.util.spec_from_file_location("synthetic_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check(launcher: str, module) -> list[str]:
    return check_source(textwrap.dedent(launcher), module)[1]


def test_check_passes_named_arguments(synthetic):
    assert not _check(
        """
        def run(x, y, n_rows, stride, plan):
            ROWS, BLOCK = 4, 128
            args = (x, y, n_rows, stride, ROWS, BLOCK)
            launch(kernel, (1,), args, 4, x.device)
            launch(kernel, (1,), (x, y, n_rows, stride) + plan.constexprs, 4, x.device)

        def make_plan():
            return constexprs(kernel, ROWS=4, BLOCK=128)
        """,
        synthetic,
    )


@pytest.mark.parametrize(
    "launcher, expected",
    [
        # two integers swapped: stride where n_rows goes
        (
            "args = (x, y, stride, n_rows, ROWS, BLOCK)",
            "passes (x, y, stride, n_rows, ROWS, BLOCK)",
        ),
        # a renamed parameter (the kernel's n_rows called rows here)
        ("args = (x, y, rows, stride, ROWS, BLOCK)", "parameters are (X, Y, n_rows, stride"),
        # one missing
        ("args = (x, y, n_rows, ROWS, BLOCK)", "passes (x, y, n_rows, ROWS, BLOCK)"),
        # an expression, not a name
        ("args = (x, y, n_rows, 2 * stride, ROWS, BLOCK)", "unnamed arguments 2 * stride"),
        # plan constexprs after too few or misordered runtime arguments
        (
            "args = (x, n_rows, y, stride) + plan.constexprs",
            "passes (x, n_rows, y, stride) + constexprs",
        ),
    ],
)
def test_check_fails_on_misnamed_arguments(synthetic, launcher, expected):
    problems = _check(
        f"""
        def run(x, y, n_rows, stride, rows, plan):
            ROWS, BLOCK = 4, 128
            {launcher}
            launch(kernel, (1,), args, 4, x.device)
        """,
        synthetic,
    )
    assert len(problems) == 1 and expected in problems[0], problems


def test_check_fails_on_misnamed_constexprs(synthetic):
    problems = _check(
        """
        def make_plan():
            return constexprs(kernel, BLOCK=128, ROWS=4)
        """,
        synthetic,
    )
    assert problems and "not the kernel's constexprs in order (ROWS, BLOCK)" in problems[0]


def test_constexprs_builds_by_name(norm, synthetic):
    library = sys.modules[f"{norm.__name__}._library"]
    assert library.constexprs(synthetic.kernel, BLOCK=128, ROWS=4) == (4, 128)
    with pytest.raises(TypeError, match="kernel's constexprs are ROWS, BLOCK; got ROWS, BLOK"):
        library.constexprs(synthetic.kernel, ROWS=4, BLOK=128)
    with pytest.raises(TypeError, match="constexprs are ROWS, BLOCK; got ROWS$"):
        library.constexprs(synthetic.kernel, ROWS=4)


def test_check_compares_names_that_differ_only_in_case_exactly(synthetic):
    # window (the size) and WINDOW (whether there is one) swapped: equal but for case.
    launcher = """
        def run(x, window, WINDOW):
            launch(windowed, (1,), (x, {}), 4, x.device)
        """
    assert not _check(launcher.format("window, WINDOW"), synthetic)
    problems = _check(launcher.format("WINDOW, window"), synthetic)
    assert len(problems) == 1 and "differ from argument 2 on" in problems[0], problems
