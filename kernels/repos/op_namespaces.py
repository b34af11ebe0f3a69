"""Kernels that register ``torch.library`` ops in a fixed namespace (``kernels check``).

Two versions of a kernel can be loaded side by side in one process (`kernels.repos.loader`
imports each under a name of its own), but torch's op registry is global: when both register
``mykernel::silu`` the second registration fails or, through ``impl``, silently replaces the
first, and the first version then runs the second's code. kernel-builder avoids this by
deriving the namespace from the build (``_activation_<hash>``, via ``_ops.py``). A kernel
that writes its namespace as a literal string (``torch.library.custom_op("mykernel::silu")``,
``torch.library.Library("mykernel", "DEF")``) shares it across every version, which is what
this module finds, by reading the package's source (nothing is imported).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

# Calls whose first argument names an op ("ns::name") or a namespace ("ns").
_QUALIFIED = {"custom_op", "triton_op", "define", "impl", "register_fake", "register_kernel"}
_NAMESPACE = {"Library"}
_MAX_SOURCE_BYTES = 1 << 20
_MAX_FILES = 1000


@dataclass(frozen=True)
class FixedNamespace:
    """A literal op namespace: where it is written and what it is."""

    path: Path
    line: int
    namespace: str

    def describe(self, package_dir: Path) -> str:
        where = self.path.relative_to(package_dir).as_posix()
        return (
            f"{where}:{self.line} registers torch.library ops in the fixed namespace "
            f"'{self.namespace}': two loaded versions of this kernel would share (and overwrite) "
            "each other's ops. Derive the namespace from the build (kernel-builder's "
            "_ops.add_op_namespace_prefix), or include the version in it"
        )


def fixed_op_namespaces(package_dir: Path) -> list[FixedNamespace]:
    """Every literal ``torch.library`` namespace in the Python files of `package_dir`."""
    found: list[FixedNamespace] = []
    files = sorted(p for p in Path(package_dir).rglob("*.py") if p.is_file())[:_MAX_FILES]
    for path in files:
        try:
            if path.stat().st_size > _MAX_SOURCE_BYTES:
                continue
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (OSError, SyntaxError, ValueError, RecursionError):
            continue  # the import check reports files that do not even parse
        seen: set[str] = set()
        for node in ast.walk(tree):
            namespace = _literal_namespace(node)
            if namespace is not None and namespace not in seen:
                seen.add(namespace)
                found.append(FixedNamespace(path, getattr(node, "lineno", 0), namespace))
    return found


def _literal_namespace(node: ast.AST) -> str | None:
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    first = node.args[0]
    if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
        return None
    if name in _NAMESPACE:
        return first.value or None
    if name in _QUALIFIED and "::" in first.value:
        return first.value.split("::", 1)[0] or None
    return None


__all__ = ["FixedNamespace", "fixed_op_namespaces"]
