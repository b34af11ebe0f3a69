"""The test suite's own layout: every folder is a package of the ``tests`` package, so test
basenames may repeat across folders and helpers are imported as ``tests.support.<module>``,
never through ``sys.path`` changes that make an import depend on which test ran first."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent

#: Runs where Hugging Face's own `kernels` is installed instead of ours: as a package of
#: ``tests``, pytest would put the repository root (and our `kernels`) first on sys.path.
NOT_A_PACKAGE = {TESTS / "interop"}


def _python_files():
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_test_folder_is_a_package():
    folders = {p.parent for p in _python_files()} - NOT_A_PACKAGE
    missing = sorted(str(f.relative_to(TESTS)) for f in folders if not (f / "__init__.py").exists())
    assert not missing, f"add an empty __init__.py to: {missing}"
    for folder in NOT_A_PACKAGE:
        assert not (folder / "__init__.py").exists(), folder


def _extends_sys_path(node: ast.AST) -> bool:
    """``sys.path.insert(...)``, ``.append``, ``.extend`` or ``sys.path += ...``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        target, method = node.func.value, node.func.attr
    elif isinstance(node, ast.AugAssign):
        target, method = node.target, "+="
    else:
        return False
    return (
        method in {"insert", "append", "extend", "+="}
        and isinstance(target, ast.Attribute)
        and target.attr == "path"
        and isinstance(target.value, ast.Name)
        and target.value.id == "sys"
    )


def test_no_test_module_extends_sys_path():
    found = [
        f"{path.relative_to(TESTS)}:{node.lineno}"
        for path in _python_files()
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if _extends_sys_path(node)
    ]
    assert not found, (
        f"sys.path changed in {found}: import helpers as tests.support.<module>, and give a "
        "child process the repository root through tests.support.paths.subprocess_env()"
    )


#: Files that may build a LlamaConfig themselves, and why.
OWN_LLAMA_CONFIG = {
    "support/models.py": "the one builder",
    "docs/test_code_blocks.py": "runs as a script in a reader's working folder, without tests/",
}


def test_tiny_llama_configurations_come_from_the_one_builder():
    found = [
        f"{path.relative_to(TESTS)}:{node.lineno}"
        for path in _python_files()
        if str(path.relative_to(TESTS)) not in OWN_LLAMA_CONFIG
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", None)) == "LlamaConfig"
    ]
    assert not found, f"LlamaConfig(...) in {found}: use tests.support.models.llama_config"


#: Modules outside tests/support/ that are neither tests nor pytest's, and why.
NOT_SUPPORT = {"library/cuda_compile_check.py": "a script test_cuda_compile.py runs"}
#: Folders of such modules, and why.
NOT_SUPPORT_FOLDERS = {
    "hf_suite": "the harness that runs Hugging Face's own suite against ours, and its adapters"
}


def test_shared_helpers_live_in_the_support_package():
    stray = [
        str(path.relative_to(TESTS))
        for path in _python_files()
        if "support" not in path.relative_to(TESTS).parts
        and not path.name.startswith("test_")
        and path.name not in {"conftest.py", "__init__.py"}
        and str(path.relative_to(TESTS)) not in NOT_SUPPORT
        and path.relative_to(TESTS).parts[0] not in NOT_SUPPORT_FOLDERS
    ]
    assert not stray, f"move {stray} to tests/support/ and import it as tests.support.<module>"
