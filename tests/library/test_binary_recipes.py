"""Compiling shipped Triton binaries again to compare (``kernels.library.triton_recipes``,
``library/binaries.py verify``): a recipe recorded at a compile, kept by the capture beside the
binaries, compiles again to the same cache key and the same cubin; a changed binary or a
recipe of other inputs is reported. Triton compiles for sm_90 here without a GPU, in a child
process without ``TRITON_INTERPRET`` (interpreted kernels cannot be compiled)."""

import json
import textwrap

import pytest

from kernels.library import triton_recipes
from tests.support.children import run_python
from tests.support.paths import REPO_ROOT, subprocess_env

_CHILD = textwrap.dedent(
    """
    import importlib.util, json, os, sys
    from pathlib import Path

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend

    from kernels.library import triton_recipes

    tmp = Path(sys.argv[1])
    spec = importlib.util.spec_from_file_location("binaries_tool", "library/binaries.py")
    tool = importlib.util.module_from_spec(spec)
    sys.modules["binaries_tool"] = tool
    spec.loader.exec_module(tool)

    folder = tmp / "scalek"
    source = folder / "torch-ext" / "scalek"
    source.mkdir(parents=True)
    (folder / "build.toml").write_text(
        '[general]\\nname = "scalek"\\nversion = 1\\nlicense = "Apache-2.0"\\n'
        'backends = ["cuda"]\\n\\n[torch-noarch]\\n'
    )
    (source / "__init__.py").write_text(
        "import triton\\nimport triton.language as tl\\n\\n\\n@triton.jit\\n"
        "def _scale_kernel(X, Y, N, BLOCK: tl.constexpr):\\n"
        "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\\n"
        "    tl.store(Y + offs, tl.load(X + offs, mask=offs < N) * 2.0, mask=offs < N)\\n"
    )
    repo = tool.build.read_repository(folder)

    def _report(verified):
        return verified.lines, verified.ok

    sys.path.insert(0, str(folder / "torch-ext"))
    import scalek

    # A compile as a launch makes it (the options all of the backend's, tuples included), and
    # its recipe recorded beside the cache, as a capture run records it.
    cache = tmp / "cache"
    cache.mkdir()
    os.environ["TRITON_CACHE_DIR"] = str(cache)
    target = GPUTarget("cuda", 90, 32)
    options = make_backend(target).parse_options({"num_warps": 4}).__dict__
    src = ASTSource(
        fn=scalek._scale_kernel,
        signature={"X": "*fp32", "Y": "*fp32", "N": "i32", "BLOCK": "constexpr"},
        constexprs={"BLOCK": 128},
        attrs={(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]},
    )
    compiled = triton.compile(src, target=target, options=options)
    triton_recipes.record(cache, src, target, options, compiled)
    tool.capture(repo, cache)
    results = {"recipes": json.loads((folder / tool.RECIPES).read_text())}
    results["same"] = _report(tool.verify(repo, scalek))

    cubin = next((folder / "binaries").rglob("*.cubin"))
    shipped = cubin.read_bytes()
    cubin.write_bytes(shipped[:-4] + b"\\x00\\x00\\x00\\x01")
    results["changed binary"] = _report(tool.verify(repo, scalek))
    cubin.write_bytes(shipped)

    recipes_path = folder / tool.RECIPES
    recipes = json.loads(recipes_path.read_text())
    for recipe in recipes["recipes"].values():
        recipe["constexprs"] = [[k, 64] for k, _ in recipe["constexprs"]]
    recipes_path.write_text(json.dumps(recipes))
    results["other inputs"] = _report(tool.verify(repo, scalek))
    print("RESULTS " + json.dumps(results))
    """
)


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    pytest.importorskip("triton.backends.nvidia", reason="this Triton has no CUDA backend")
    env = subprocess_env()
    env.pop("TRITON_INTERPRET", None)
    tmp = tmp_path_factory.mktemp("recipes")
    done = run_python("-c", _CHILD, str(tmp), env=env, cwd=REPO_ROOT, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-4000:]
    line = next(l for l in done.stdout.splitlines() if l.startswith("RESULTS "))
    return json.loads(line.removeprefix("RESULTS "))


def test_a_capture_keeps_the_recipe_of_each_kernel_it_takes(outcome):
    ((key, recipe),) = outcome["recipes"]["recipes"].items()
    assert recipe["kernel"] == "_scale_kernel" and recipe["key"] == key
    assert recipe["target"] == {"backend": "cuda", "arch": 90, "warp_size": 32}
    assert "extern_libs" not in triton_recipes.decode(recipe["options"])  # the machine's path


def test_a_recipe_compiles_again_to_the_shipped_key_and_binary(outcome):
    lines, ok = outcome["same"]
    assert ok and "1 kernel(s) compiled again to the same binary, 0 differ" in lines[0], lines


def test_a_changed_binary_is_reported(outcome):
    lines, ok = outcome["changed binary"]
    assert not ok and "1 differ" in lines[0] and "_scale_kernel.cubin differs" in lines[1], lines


def test_a_recipe_of_other_inputs_is_reported(outcome):
    lines, ok = outcome["other inputs"]
    assert not ok and "other inputs (sources?) than shipped" in lines[1], lines


@pytest.mark.parametrize(
    "value",
    [(1, 2), [("tt.divisibility", 16)], {"a": (1, [2])}, None, 1.5, "s", True],
    ids=["tuple", "list-of-tuples", "dict", "none", "float", "str", "bool"],
)
def test_recorded_values_come_back_as_the_same_python_values(value):
    back = triton_recipes.decode(json.loads(json.dumps(triton_recipes.encode(value))))
    assert back == value and repr(back) == repr(value)


def test_a_value_that_cannot_be_recorded_is_refused():
    with pytest.raises(triton_recipes.RecipeError, match="cannot record a value of type object"):
        triton_recipes.encode(object())
