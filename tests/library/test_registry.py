"""The library's registry (kernels/library/registry.py) against every other list of its kernels.

Adding a kernel to the library is its folder under library/ plus one registry entry
(docs/writing-kernels.md#adding-a-kernel-to-the-library). The lists that cannot be derived from
the registry are checked against it here: the folders under library/, the compile rule's
``LAYERS`` and ``RULE`` (library/_shared/_compile_rule.py, copied into standalone repositories,
so it cannot import ``kernels``), the ``compile_side`` calls of each repository's source, the
cases of ``benchmarks.ops`` (benchmarks/cases.py), the benchmark modules, the aten override
families, the compile backend's patterns and entries, and the opcheck cases of every custom op.
Each failure names the list and the name that disagree.

Each check is a function of the lists it compares, so that the tests at the end can feed it an
inconsistent registry and read the message.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import ModuleType

import pytest
import torch

from kernels.errors import KernelMappingError
from kernels.library import registry
from kernels.library.registry import KERNELS, REPOSITORIES, LibraryKernel, LibraryRepository

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "library"
BENCHMARKS = ROOT / "benchmarks"
REGISTRY = "kernels/library/registry.py"
COMPILE_RULE = "library/_shared/_compile_rule.py"


# ---- the checks ---------------------------------------------------------------------------------


def _differences(
    ours: Iterable[str], theirs: Iterable[str], lacks: Callable, extra: Callable
) -> list[str]:
    """Messages for the names the registry has and the other list lacks (``lacks(name)``), and
    for those the other list has and the registry lacks (``extra(name)``)."""
    ours, theirs = list(dict.fromkeys(ours)), list(dict.fromkeys(theirs))
    return [lacks(n) for n in ours if n not in theirs] + [extra(n) for n in theirs if n not in ours]


def folder_problems(repositories: Iterable[LibraryRepository], folders: Iterable[str]) -> list[str]:
    """The repositories of the registry against the repository folders under library/."""
    return _differences(
        (r.name for r in repositories),
        folders,
        lambda n: f"{REGISTRY} REPOSITORIES has {n!r}, but library/ has no folder {n}",
        lambda n: f"library/{n} has no entry in {REGISTRY} REPOSITORIES: add a LibraryRepository",
    )


def kernel_problems(
    kernels: Iterable[LibraryKernel], repositories: Iterable[LibraryRepository]
) -> list[str]:
    """Each kernel in a repository of the registry, each layer name once."""
    names = {r.name for r in repositories}
    problems, seen = [], set()
    for kernel in kernels:
        if kernel.repo not in names:
            problems.append(
                f"{REGISTRY} KERNELS: {kernel.layer_name}'s repo {kernel.repo!r} is not in "
                f"REPOSITORIES ({', '.join(sorted(names))})"
            )
        if kernel.layer_name in seen:
            problems.append(f"{REGISTRY} KERNELS: {kernel.layer_name} is listed twice")
        seen.add(kernel.layer_name)
    return problems


def compile_rule_problems(kernels: Iterable[LibraryKernel], rule: ModuleType) -> list[str]:
    """The layers the kernels ask against the rule's ``LAYERS``, and a ``RULE`` row for each."""
    kernels = list(kernels)
    asked = list(dict.fromkeys(layer for k in kernels for layer in k.compile_layers))
    problems = _differences(
        asked,
        rule.LAYERS,
        lambda n: (
            f"{COMPILE_RULE} LAYERS lacks {n!r}, which "
            f"{', '.join(k.layer_name for k in kernels if n in k.compile_layers)} ask(s) "
            f"({REGISTRY} compile_layers)"
        ),
        lambda n: (
            f"{COMPILE_RULE} LAYERS has {n!r}, which no kernel of {REGISTRY} KERNELS asks "
            "(compile_layers)"
        ),
    )
    rows = {row[0] for row in rule.RULE}
    problems += [
        f"{COMPILE_RULE} RULE has no row for {n!r} (benchmarks/compile_rule.py measures one)"
        for n in rule.LAYERS
        if n not in rows
    ]
    return problems


def compile_side_layers(source: str, where: str) -> tuple[set[str], list[str]]:
    """The layers the ``compile_side(layer, ...)`` calls in ``source`` ask: a string literal, or
    a name bound to string literals in the same function; and a problem for any other."""
    tree = ast.parse(source, where)
    layers: set[str] = set()
    problems = []
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.Module))]
    for scope in functions:
        for node in ast.walk(scope):
            if not (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", None)) == "compile_side"
                and node.args
            ):
                continue
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                layers.add(first.value)
                continue
            bound = set()
            if isinstance(first, ast.Name) and isinstance(scope, ast.FunctionDef):
                for assign in ast.walk(scope):
                    if isinstance(assign, ast.Assign) and any(
                        getattr(t, "id", None) == first.id for t in assign.targets
                    ):
                        bound |= {
                            c.value
                            for c in ast.walk(assign.value)
                            if isinstance(c, ast.Constant) and isinstance(c.value, str)
                        }
            if bound:
                layers |= bound
            elif isinstance(scope, ast.FunctionDef) or not isinstance(first, ast.Name):
                problems.append(
                    f"{where}:{node.lineno}: cannot read the layer compile_side asks: pass a "
                    "string literal (or a name bound to literals in the function)"
                )
    return layers, problems


def source_layer_problems(
    kernels: Iterable[LibraryKernel], sources: Mapping[str, Mapping[str, str]]
) -> list[str]:
    """Per repository, the layers its kernels list against the ``compile_side`` calls of its
    source (``sources``: repository -> {file name: source})."""
    kernels = list(kernels)
    problems = []
    for repo, files in sources.items():
        asked: set[str] = set()
        for where, source in files.items():
            layers, unreadable = compile_side_layers(source, where)
            asked |= layers
            problems += unreadable
        listed = [layer for k in kernels if k.repo == repo for layer in k.compile_layers]
        problems += _differences(
            listed,
            sorted(asked),
            lambda n, repo=repo: (
                f"{REGISTRY} KERNELS gives library/{repo}'s kernels compile "
                f"layer {n!r}, which no compile_side call in library/{repo}/torch-ext asks"
            ),
            lambda n, repo=repo: (
                f"library/{repo}/torch-ext asks compile_side({n!r}), which no "
                f"kernel of library/{repo} lists in {REGISTRY} compile_layers"
            ),
        )
    return problems


def benchmark_problems(
    kernels: Iterable[LibraryKernel],
    repositories: Iterable[LibraryRepository],
    ops: Iterable[str],
    norm_ops: Iterable[str],
    modules: Iterable[str],
) -> list[str]:
    """The cases the kernels name against benchmarks/cases.py's ``OPS`` and ``NORM_OPS``, and
    the benchmark modules of each repository against those under benchmarks/."""
    kernels, modules = list(kernels), set(modules)
    problems = _differences(
        (c for k in kernels for c in k.benchmarks),
        ops,
        lambda n: (
            f"benchmarks/cases.py OPS lacks {n!r}, which {REGISTRY} KERNELS' "
            f"{next(k.layer_name for k in kernels if n in k.benchmarks)} names (benchmarks)"
        ),
        lambda n: (
            f"benchmarks/cases.py OPS has {n!r}, which no kernel of {REGISTRY} KERNELS "
            "names in its benchmarks"
        ),
    )
    problems += _differences(
        (c for k in kernels if k.repo == "norm" for c in k.benchmarks),
        norm_ops,
        lambda n: f"benchmarks/cases.py NORM_OPS lacks {n!r}, a case of library/norm's kernels",
        lambda n: (
            f"benchmarks/cases.py NORM_OPS has {n!r}, which no kernel of library/norm "
            f"names in {REGISTRY} benchmarks"
        ),
    )
    for repo in repositories:
        if not repo.benchmarks:
            problems.append(f"{REGISTRY} REPOSITORIES: {repo.name} names no benchmark module")
        problems += [
            f"{REGISTRY} REPOSITORIES: {repo.name}'s benchmark {m!r} is not a module under "
            "benchmarks/"
            for m in repo.benchmarks
            if m not in modules
        ]
    return problems


def override_problems(kernels: Iterable[LibraryKernel], overrides: Iterable) -> list[str]:
    """The override families the kernels name against ``OVERRIDES``, each family loaded from its
    kernels' repository (``<repo>_kernels`` of kernels/overrides/loading.py)."""
    kernels, overrides = list(kernels), list(overrides)
    problems = _differences(
        (f for k in kernels for f in k.override_families),
        (spec.family for spec in overrides),
        lambda n: (
            f"kernels/overrides/table.py OVERRIDES has no family {n!r}, which {REGISTRY} "
            "KERNELS names (override_families)"
        ),
        lambda n: (
            f"kernels/overrides/table.py OVERRIDES has family {n!r}, which no kernel of "
            f"{REGISTRY} KERNELS names in override_families"
        ),
    )
    for spec in overrides:
        repos = {k.repo for k in kernels if spec.family in k.override_families}
        loads = spec.load.__name__.removesuffix("_kernels")
        if repos and loads not in repos:
            problems.append(
                f"kernels/overrides/table.py: {spec.op} loads {spec.load.__name__}, but "
                f"{REGISTRY} gives family {spec.family!r} to library/{', '.join(sorted(repos))}"
            )
    return problems


def pattern_problems(
    kernels: Iterable[LibraryKernel], patterns: Iterable[str], entries: Mapping[str, object]
) -> list[str]:
    """The compile backend's patterns the kernels name against ``PATTERNS``, and its library
    entries (``library_entries()``: pattern -> entry, labelled ``library <repo>.<function>``)
    against the kernels that serve each pattern."""
    kernels, patterns = list(kernels), list(patterns)
    named = [p for k in kernels for p in k.compile_patterns]
    problems = [
        f"{REGISTRY} KERNELS names compile pattern {p!r}, which kernels/compile/patterns.py "
        "PATTERNS lacks"
        for p in named
        if p not in patterns
    ]
    problems += _differences(
        [p for p in dict.fromkeys(named) if p in patterns],
        entries,
        lambda n: (
            f"kernels/compile/library_kernels.py builds no entry for {n!r}, which "
            f"{REGISTRY} KERNELS names (compile_patterns)"
        ),
        lambda n: (
            f"kernels/compile/library_kernels.py builds an entry for {n!r}, which no "
            f"kernel of {REGISTRY} KERNELS names in compile_patterns"
        ),
    )
    for name, entry in entries.items():
        repos = {k.repo for k in kernels if name in k.compile_patterns}
        label_repo = getattr(entry, "label", "").removeprefix("library ").split(".")[0]
        if repos and label_repo not in repos:
            problems.append(
                f"kernels/compile/library_kernels.py: the {name!r} entry calls library/"
                f"{label_repo}, but {REGISTRY} gives it to library/{', '.join(sorted(repos))}"
            )
    return problems


def custom_ops(package: ModuleType) -> set[str]:
    """The qualified names of the ``torch.library`` custom ops in every loaded module of
    ``package``."""
    return {
        value._qualname
        for name, module in list(sys.modules.items())
        if name == package.__name__ or name.startswith(package.__name__ + ".")
        for value in vars(module).values()
        if isinstance(value, torch._library.custom_ops.CustomOpDef)
    }


def opcheck_problems(
    registered: Mapping[str, set[str]], checked: Mapping[str, set[str]]
) -> list[str]:
    """The custom ops of each repository (repository -> qualified names) against those an
    opcheck case calls."""
    problems = []
    for repo, ops in registered.items():
        if repo not in checked:
            problems.append(
                f"library/{repo} has no opcheck cases in tests/library/test_registry.py "
                "OPCHECK_CASES: add the function that lists them"
            )
            continue
        problems += [
            f"library/{repo}'s op {op.split('::')[-1]} has no opcheck case (its test file's "
            "_op_cases)"
            for op in sorted(ops - checked[repo])
        ]
    return problems


# ---- the lists as they are ----------------------------------------------------------------------


def _library_folders() -> list[str]:
    # A repository folder holds a build.toml; library/_shared and build.py are no repositories.
    return sorted(p.parent.name for p in LIBRARY.glob("*/build.toml"))


def _compile_rule() -> ModuleType:
    # The one source, as a standalone module (it imports nothing of ours).
    spec = importlib.util.spec_from_file_location(
        "_registry_compile_rule", LIBRARY / COMPILE_RULE.split("/", 1)[1]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sources(repo: str) -> dict[str, str]:
    folder = LIBRARY / repo / "torch-ext"
    return {
        str(p.relative_to(ROOT)): p.read_text()
        for p in sorted(folder.rglob("*.py"))
        if p.name != "_compile_rule.py"  # defines compile_side, asks nothing
    }


def test_every_repository_folder_is_registered():
    assert not (problems := folder_problems(REPOSITORIES, _library_folders())), "\n".join(problems)


def test_every_kernel_lives_in_a_registered_repository():
    assert not (problems := kernel_problems(KERNELS, REPOSITORIES)), "\n".join(problems)


def test_the_compile_rule_has_the_layers_the_kernels_ask():
    problems = compile_rule_problems(KERNELS, _compile_rule())
    assert not problems, "\n".join(problems)


def test_each_repository_asks_the_layers_its_kernels_list():
    sources = {r.name: _sources(r.name) for r in REPOSITORIES}
    assert not (problems := source_layer_problems(KERNELS, sources)), "\n".join(problems)


def test_benchmark_cases_name_registered_kernels():
    from benchmarks import cases

    modules = {p.stem for p in BENCHMARKS.glob("*.py") if not p.stem.startswith("_")}
    problems = benchmark_problems(KERNELS, REPOSITORIES, cases.OPS, cases.NORM_OPS, modules)
    assert not problems, "\n".join(problems)


def test_the_override_families_reach_registered_kernels():
    from kernels.overrides.table import OVERRIDES

    assert not (problems := override_problems(KERNELS, OVERRIDES)), "\n".join(problems)


def test_the_compile_backend_serves_the_registered_patterns():
    from kernels.compile.library_kernels import library_entries, library_patterns
    from kernels.compile.patterns import PATTERNS

    entries = library_entries()
    assert tuple(entries) == library_patterns()
    assert not (problems := pattern_problems(KERNELS, PATTERNS, entries)), "\n".join(problems)


def _opcheck_cases(repo: str, package: ModuleType) -> dict:
    """The opcheck cases of ``repo``'s tests, {case: (op, args)}."""
    from tests.library import (
        test_attention,
        test_decode_mlp,
        test_fused_linear_cross_entropy,
        test_ops,
    )
    from tests.support.library import load

    if repo == "activation":
        return {
            **test_ops._op_cases(package, load("norm"), load("rotary")),
            **test_decode_mlp._op_cases(sys.modules[f"{package.__name__}.decode_mlp"]),
        }
    if repo in ("norm", "rotary"):
        return test_ops._op_cases(load("activation"), load("norm"), load("rotary"))
    return {
        "loss": test_fused_linear_cross_entropy._op_cases,
        "attention": test_attention._op_cases,
    }[repo](package)


#: The repositories whose opcheck cases `_opcheck_cases` knows.
OPCHECK_CASES = ("activation", "norm", "rotary", "loss", "attention")


def test_every_custom_op_has_an_opcheck_case():
    from tests.support.library import load

    registered, checked = {}, {}
    for repo in REPOSITORIES:
        package = load(repo.name)
        registered[repo.name] = custom_ops(package)
        if repo.name in OPCHECK_CASES:
            cases = _opcheck_cases(repo.name, package).values()
            checked[repo.name] = {op._qualname for op, _ in cases} & registered[repo.name]
    assert not (problems := opcheck_problems(registered, checked)), "\n".join(problems)


# ---- the loader ---------------------------------------------------------------------------------


def test_the_loader_loads_each_repository_once_as_kernelize_does():
    from kernels import get_local_kernel
    from kernels.library import library_path, load_library_package

    for repo in REPOSITORIES:
        package = load_library_package(repo.name)
        assert package is load_library_package(repo.name)
        assert package is get_local_kernel(library_path() / repo.name, repo.name)


def test_the_loader_names_the_repositories_for_an_unknown_one():
    from kernels.library import load_library_package

    with pytest.raises(KernelMappingError, match=r"no repository 'nope'; it has: activation, norm"):
        load_library_package("nope")


# ---- the checks catch what they are for ---------------------------------------------------------


def _with(kernels: tuple[LibraryKernel, ...], layer_name: str, **changes) -> tuple:
    return tuple(
        dataclasses.replace(k, **changes) if k.layer_name == layer_name else k for k in kernels
    )


def test_a_folder_without_an_entry_and_an_entry_without_a_folder_are_named():
    problems = folder_problems(REPOSITORIES, [*_library_folders(), "matmul"])
    assert problems == [
        f"library/matmul has no entry in {REGISTRY} REPOSITORIES: add a LibraryRepository"
    ]
    problems = folder_problems(REPOSITORIES, [f for f in _library_folders() if f != "rotary"])
    assert problems == [f"{REGISTRY} REPOSITORIES has 'rotary', but library/ has no folder rotary"]


def test_a_kernel_of_an_unregistered_repository_is_named():
    kernels = (*KERNELS, LibraryKernel("Softmax", "softmax", "Softmax"), KERNELS[0])
    problems = kernel_problems(kernels, REPOSITORIES)
    assert "Softmax's repo 'softmax' is not in REPOSITORIES" in problems[0]
    assert problems[1] == f"{REGISTRY} KERNELS: SiLU is listed twice"


def test_a_compile_layer_missing_from_the_rule_or_extra_there_is_named():
    rule = _compile_rule()
    kernels = _with(KERNELS, "LayerNorm", compile_layers=("layer_norm", "group_norm"))
    assert compile_rule_problems(kernels, rule) == [
        f"{COMPILE_RULE} LAYERS lacks 'group_norm', which LayerNorm ask(s) ({REGISTRY} "
        "compile_layers)"
    ]
    kernels = _with(KERNELS, "rotary_pos_emb", compile_layers=())
    assert compile_rule_problems(kernels, rule) == [
        f"{COMPILE_RULE} LAYERS has 'rotary', which no kernel of {REGISTRY} KERNELS asks "
        "(compile_layers)"
    ]
    rowless = type("Rule", (), {"LAYERS": rule.LAYERS, "RULE": rule.RULE[1:]})
    assert compile_rule_problems(KERNELS, rowless) == [
        f"{COMPILE_RULE} RULE has no row for 'rms_norm' (benchmarks/compile_rule.py measures one)"
    ]


def test_a_compile_side_call_the_registry_does_not_list_is_named():
    source = """
def f(x, mode):
    layer = "rms_norm" if mode else "gemma_rms_norm"
    if compile_side(layer, 1, 2, True) == OP:
        return compile_side("group_norm", 1, 2, True)

def g(x, name):
    return compile_side(name, 1, 2, True)
"""
    problems = source_layer_problems(KERNELS, {"norm": {"norm/x.py": source}})
    assert problems == [
        "norm/x.py:8: cannot read the layer compile_side asks: pass a string literal (or a name "
        "bound to literals in the function)",
        f"{REGISTRY} KERNELS gives library/norm's kernels compile layer 'fused_add_rms_norm', "
        "which no compile_side call in library/norm/torch-ext asks",
        f"{REGISTRY} KERNELS gives library/norm's kernels compile layer 'layer_norm', which no "
        "compile_side call in library/norm/torch-ext asks",
        "library/norm/torch-ext asks compile_side('group_norm'), which no kernel of library/norm "
        f"lists in {REGISTRY} compile_layers",
    ]


def test_a_benchmark_case_missing_or_unregistered_is_named():
    from benchmarks import cases

    modules = {"ops", "decode_mlp", "overrides", "loss", "attention"}
    kernels = _with(KERNELS, "GemmaRMSNorm", benchmarks=())
    assert benchmark_problems(kernels, REPOSITORIES, cases.OPS, cases.NORM_OPS, modules) == [
        f"benchmarks/cases.py OPS has 'GemmaRMSNorm', which no kernel of {REGISTRY} KERNELS "
        "names in its benchmarks",
        "benchmarks/cases.py NORM_OPS has 'GemmaRMSNorm', which no kernel of library/norm names "
        f"in {REGISTRY} benchmarks",
    ]
    kernels = _with(KERNELS, "GeLU", benchmarks=("GeLU",))
    assert benchmark_problems(kernels, REPOSITORIES, cases.OPS, cases.NORM_OPS, modules) == [
        f"benchmarks/cases.py OPS lacks 'GeLU', which {REGISTRY} KERNELS' GeLU names (benchmarks)"
    ]
    repositories = (*REPOSITORIES, LibraryRepository("softmax", benchmarks=("softmax",)))
    assert benchmark_problems(KERNELS, repositories, cases.OPS, cases.NORM_OPS, modules) == [
        f"{REGISTRY} REPOSITORIES: softmax's benchmark 'softmax' is not a module under benchmarks/"
    ]


def test_an_override_family_missing_or_loaded_from_elsewhere_is_named():
    from kernels.overrides.table import OVERRIDES

    kernels = _with(KERNELS, "SiLU", override_families=())
    assert override_problems(kernels, OVERRIDES) == [
        f"kernels/overrides/table.py OVERRIDES has family 'silu', which no kernel of {REGISTRY} "
        "KERNELS names in override_families"
    ]
    kernels = _with(KERNELS, "RMSNorm", repo="activation")
    assert override_problems(kernels, OVERRIDES)[0] == (
        "kernels/overrides/table.py: _fused_rms_norm loads norm_kernels, but "
        f"{REGISTRY} gives family 'rms_norm' to library/activation"
    )


def test_a_compile_pattern_unknown_or_without_an_entry_is_named():
    from kernels.compile.patterns import PATTERNS

    label = type("Entry", (), {"label": "library norm.rms_norm"})()
    entries = {"rms_norm": label}
    kernels = tuple(
        dataclasses.replace(k, compile_patterns=()) for k in KERNELS if k.layer_name != "RMSNorm"
    )
    kernels = (
        *kernels,
        LibraryKernel("RMSNorm", "norm", "RMSNorm", compile_patterns=("rms_norm", "softmax")),
    )
    assert pattern_problems(kernels, PATTERNS, entries) == [
        f"{REGISTRY} KERNELS names compile pattern 'softmax', which kernels/compile/patterns.py "
        "PATTERNS lacks"
    ]
    moved = _with(kernels, "RMSNorm", repo="activation", compile_patterns=("rms_norm",))
    assert pattern_problems(moved, PATTERNS, entries) == [
        "kernels/compile/library_kernels.py: the 'rms_norm' entry calls library/norm, but "
        f"{REGISTRY} gives it to library/activation"
    ]
    assert pattern_problems(kernels, PATTERNS, {})[1:] == [
        "kernels/compile/library_kernels.py builds no entry for 'rms_norm', which "
        f"{REGISTRY} KERNELS names (compile_patterns)"
    ]


def test_an_op_without_an_opcheck_case_is_named():
    registered = {"norm": {"ns::rms_norm", "ns::rms_norm_backward"}, "softmax": {"ns::softmax"}}
    checked = {"norm": {"ns::rms_norm"}}
    assert opcheck_problems(registered, checked) == [
        "library/norm's op rms_norm_backward has no opcheck case (its test file's _op_cases)",
        "library/softmax has no opcheck cases in tests/library/test_registry.py OPCHECK_CASES: "
        "add the function that lists them",
    ]


def test_the_registry_derives_the_other_names():
    assert registry.repository_of("gated_mlp_decode", "compile_layers") == "activation"
    with pytest.raises(LookupError, match="compile_layers 'nope': expected the kernels of one"):
        registry.repository_of("nope", "compile_layers")
    assert registry.benchmark_cases("rotary") == ("rotary",)
    assert set(registry.compile_layers("loss")) == {"fused_linear_cross_entropy", "cross_entropy"}
