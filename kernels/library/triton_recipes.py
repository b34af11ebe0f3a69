"""How each shipped Triton binary was compiled, and compiling it again to compare.

A library repository's ``binaries/`` (docs/writing-kernels.md, "Shipped Triton binaries") hold
kernels as Triton's cache keeps them: a folder named by the hash of everything the compile
read (the kernel's source and that of the functions it calls, its signature, constexprs and
argument attributes, the target, the options, Triton's own version) with the ``.cubin`` in it.
A recipe is what a capture records for each compile: enough to call ``triton.compile`` again
with the same inputs. `rebuild` does so for a recipe, on any machine with the same Triton
(a GPU is not needed: Triton compiles for a target it is told), and says whether the folder
name (the inputs) and the binary (the output) are the ones shipped.

The recipes of a capture are written beside its Triton cache, one JSON object a line
(`RECORDS`), by the process that compiles (`record`, which ``benchmarks.cold_start`` calls
from its wrapper of ``triton.compiler.compile`` when ``KERNELS_RECORD_COMPILES=1``);
``library/binaries.py capture`` keeps those of the kernels it takes in
``library/<repo>/binaries-recipes.json`` and ``library/binaries.py verify`` rebuilds them.

Values are encoded so that their Python form comes back exactly (a tuple stays a tuple): the
cache key hashes ``str()`` of the attributes, where ``(16,)`` and ``[16]`` differ.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The file, in a capture's Triton cache folder, that its compiles are recorded in.
RECORDS = "kernels-compiles.jsonl"
#: ``library/binaries.py verify``'s exit status when it compiled nothing to compare (no recipes,
#: or binaries of another Triton): ``kernels check --rebuild-binaries`` warns then, not fails.
NOTHING_COMPARED = 3
#: Options not recorded: the path of libdevice is the machine's (its content is in the key).
_MACHINE_OPTIONS = ("extern_libs",)


class RecipeError(ValueError):
    """A recipe that cannot be encoded or read back."""


def encode(value: Any) -> Any:
    """``value`` as JSON that `decode` turns back into the same Python value: lists, tuples
    (``{"tuple": [...]}``), dicts with string keys, and scalars."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, tuple):
        return {"tuple": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"dict": {k: encode(v) for k, v in value.items()}}
    raise RecipeError(f"cannot record a value of type {type(value).__name__}: {value!r}")


def decode(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [decode(v) for v in value]
    if isinstance(value, dict) and set(value) == {"tuple"}:
        return tuple(decode(v) for v in value["tuple"])
    if isinstance(value, dict) and set(value) == {"dict"} and isinstance(value["dict"], dict):
        return {k: decode(v) for k, v in value["dict"].items()}
    raise RecipeError(f"not a recorded value: {value!r}")


def cache_key(compiled_hash: str) -> str:
    """The Triton cache folder of a compile whose ``CompiledKernel.hash`` is ``compiled_hash``
    (the hex SHA-256 of its inputs' key), as Triton names it."""
    return base64.b32encode(bytes.fromhex(compiled_hash)).decode().rstrip("=")


@dataclass(frozen=True)
class Recipe:
    """One compile: the kernel (its function's name and module, the module named from inside
    its package), its inputs as ``triton.compile`` takes them, and the cache folder it made."""

    kernel: str
    module: str
    signature: dict[str, str]
    constexprs: dict[tuple, Any]
    attrs: dict[tuple, Any]
    target: dict[str, Any]
    options: dict[str, Any]
    key: str
    triton: str

    def to_json(self) -> dict:
        return {
            "kernel": self.kernel,
            "module": self.module,
            "signature": self.signature,
            "constexprs": [[encode(k), encode(v)] for k, v in self.constexprs.items()],
            "attrs": [[encode(k), encode(v)] for k, v in self.attrs.items()],
            "target": self.target,
            "options": encode(self.options),
            "key": self.key,
            "triton": self.triton,
        }

    @classmethod
    def from_json(cls, data: Any) -> Recipe:
        try:
            return cls(
                kernel=str(data["kernel"]),
                module=str(data["module"]),
                signature={str(k): str(v) for k, v in data["signature"].items()},
                constexprs={decode(k): decode(v) for k, v in data["constexprs"]},
                attrs={decode(k): decode(v) for k, v in data["attrs"]},
                target={str(k): v for k, v in data["target"].items()},
                options=decode(data["options"]),
                key=str(data["key"]),
                triton=str(data["triton"]),
            )
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise RecipeError(f"not a recipe ({exc}): {str(data)[:200]}") from exc


def recipe_of(src: Any, target: Any, options: dict[str, Any], compiled: Any) -> Recipe:
    """The recipe of ``triton.compile(src, target=target, options=options)`` that returned
    ``compiled`` (an ``ASTSource`` of a ``@triton.jit`` function)."""
    import triton

    function = src.fn.fn  # the JITFunction's Python function
    package, _, inner = function.__module__.partition(".")
    recorded = {k: v for k, v in options.items() if k not in _MACHINE_OPTIONS}
    return Recipe(
        kernel=function.__name__,
        module=inner or package,
        signature=dict(src.signature),
        constexprs=dict(src.constants),
        attrs=dict(src.attrs),
        target={"backend": target.backend, "arch": target.arch, "warp_size": target.warp_size},
        options=recorded,
        key=cache_key(compiled.hash),
        triton=triton.__version__,
    )


def record(
    cache_dir: str | os.PathLike, src: Any, target: Any, options: Any, compiled: Any
) -> None:
    """Append the recipe of a compile to ``cache_dir/RECORDS`` (one JSON line; a compile that
    cannot be recorded is written as such, so that verify says so rather than miss it)."""
    try:
        options = dict(options if isinstance(options, dict) else vars(options))
        line = json.dumps(recipe_of(src, target, options, compiled).to_json())
    except (RecipeError, AttributeError, TypeError) as exc:
        name = getattr(getattr(src, "fn", None), "__name__", str(src)[:60])
        line = json.dumps({"unrecorded": name, "reason": str(exc)})
    with open(Path(cache_dir) / RECORDS, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def read_records(cache_dir: str | os.PathLike) -> Iterator[Recipe]:
    """The recipes a capture recorded in ``cache_dir`` (none if it recorded nothing)."""
    path = Path(cache_dir) / RECORDS
    if not path.is_file():
        return
    for line in path.read_text(encoding="utf-8").splitlines():
        data = json.loads(line)
        if "unrecorded" not in data:
            yield Recipe.from_json(data)


@dataclass(frozen=True)
class Rebuilt:
    """What compiling a recipe again gave: the cache folder its inputs name, and the files."""

    key: str
    files: dict[str, bytes]


def rebuild(recipe: Recipe, functions: dict[tuple[str, str], Any]) -> Rebuilt:
    """Compile ``recipe`` again with this process's Triton, in a cache of its own, and return
    what it made. ``functions``: the package's ``@triton.jit`` functions by (module, name).

    Raises:
        RecipeError: the recipe's Triton is not this one, or its function is not there.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if recipe.triton != triton.__version__:
        raise RecipeError(
            f"{recipe.kernel}: compiled by Triton {recipe.triton}; this is {triton.__version__}"
        )
    fn = functions.get((recipe.module, recipe.kernel))
    if fn is None:
        raise RecipeError(f"{recipe.module}.{recipe.kernel}: no such @triton.jit function")
    target = GPUTarget(recipe.target["backend"], recipe.target["arch"], recipe.target["warp_size"])
    source = ASTSource(
        fn=fn, signature=recipe.signature, constexprs=recipe.constexprs, attrs=recipe.attrs
    )
    previous = os.environ.get("TRITON_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="kernels-rebuild-") as cache:
        os.environ["TRITON_CACHE_DIR"] = cache
        try:
            compiled = triton.compile(source, target=target, options=dict(recipe.options))
        finally:
            if previous is None:
                os.environ.pop("TRITON_CACHE_DIR", None)
            else:
                os.environ["TRITON_CACHE_DIR"] = previous
        key = cache_key(compiled.hash)
        folder = Path(cache) / key
        files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    return Rebuilt(key, files)


def jit_functions(package: Any) -> dict[tuple[str, str], Any]:
    """The ``@triton.jit`` functions of an imported package, by (module inside it, name)."""
    import sys

    from triton.runtime.jit import JITFunction

    found = {}
    prefix = package.__name__ + "."
    for name, module in list(sys.modules.items()):
        if module is None or not (name == package.__name__ or name.startswith(prefix)):
            continue
        inner = name[len(prefix) :] if name != package.__name__ else name
        for value in vars(module).values():
            if isinstance(value, JITFunction) and value.fn.__module__ == name:
                found[(inner, value.fn.__name__)] = value
    return found
