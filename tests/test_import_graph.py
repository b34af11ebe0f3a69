"""The modules of `kernels` import each other in one direction only: no import circles.

Every module is parsed with `ast` (nothing is imported), and each ``import`` statement
anywhere in it counts, at module level, inside a function or under ``if TYPE_CHECKING:``: a
function-level import only delays a circle, and a type-only one still ties the two modules
together for a reader. An import names the module it loads; a package's ``__init__`` counts
only when the package itself is named (``from kernels import x``), not for every submodule.
"""

from __future__ import annotations

import ast
from pathlib import Path

import kernels

PACKAGE_ROOT = Path(kernels.__file__).parent

#: Circles known and being removed elsewhere, each as the sorted tuple of its modules. Keep
#: this empty: an entry is a debt with a named owner, not a way to accept a new circle.
KNOWN_CYCLES: set[tuple[str, ...]] = set()


def module_names() -> dict[str, Path]:
    """Every module of the package by dotted name (``kernels.layer`` for its ``__init__``)."""
    modules = {}
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module ``from <base> import ...`` names in `module`."""
    if node.level == 0:
        return node.module or ""
    # A package's own __init__ is its level-1 anchor; a plain module's is its parent.
    anchor = module.split(".")
    anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
    return ".".join(anchor + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of the package that `module` (at `path`) imports, anywhere in its code."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, is_package, node)
            for alias in node.names:
                # ``from pkg import name`` loads the submodule pkg.name when there is one.
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in modules else base)
    return {name for name in found if name in modules and name != module}


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(tuple(sorted(component)))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def cycle_path(graph: dict[str, set[str]], component: tuple[str, ...]) -> list[str]:
    """One shortest circle through the first module of `component`, to show in a failure."""
    start = component[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for target in sorted(graph[node] & set(component)):
            if target == start:
                return paths[node] + [start]
            if target not in paths:
                paths[target] = paths[node] + [target]
                queue.append(target)
    return list(component)


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    unexpected = [cycle for cycle in cycles(graph) if cycle not in KNOWN_CYCLES]
    assert not unexpected, "import cycles in kernels/:\n" + "\n".join(
        " -> ".join(cycle_path(graph, cycle)) for cycle in unexpected
    )


def test_known_cycles_still_exist():
    """An allow-list entry whose circle is gone must be deleted with it."""
    gone = KNOWN_CYCLES - set(cycles(import_graph()))
    assert not gone, f"remove from KNOWN_CYCLES, these circles are broken: {sorted(gone)}"


def test_the_graph_sees_every_kind_of_import(tmp_path):
    """Module-level, function-level, TYPE_CHECKING and relative imports all become edges."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from .a import f\n")
    (package / "a.py").write_text("def f():\n    from .sub import b\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import f\n"
    )
    (package / "sub" / "c.py").write_text("import pkg.a\nfrom pkg import sub\nfrom . import b\n")
    names = {"pkg": "__init__.py", "pkg.a": "a.py", "pkg.sub": "sub/__init__.py"}
    names |= {"pkg.sub.b": "sub/b.py", "pkg.sub.c": "sub/c.py"}
    modules = {name: package / rel for name, rel in names.items()}
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert graph == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.sub.b"},
        "pkg.sub": set(),
        "pkg.sub.b": {"pkg.a"},
        "pkg.sub.c": {"pkg.a", "pkg.sub", "pkg.sub.b"},
    }
    assert cycles(graph) == [("pkg.a", "pkg.sub.b")]
    assert cycle_path(graph, ("pkg.a", "pkg.sub.b")) == ["pkg.a", "pkg.sub.b", "pkg.a"]


def test_where_kernel_code_comes_from_knows_nothing_of_kernelize():
    """kernels.repos (local folders, the Hub, locks) serves kernels.layer, never the other way
    round: a repository module importing the layer package would tie loading to kernelize."""
    upward = {
        (module, target)
        for module, targets in import_graph().items()
        if module.startswith("kernels.repos")
        for target in targets
        if target == "kernels.layer" or target.startswith("kernels.layer.")
    }
    assert not upward, sorted(upward)
