"""The launches that shipped Triton binaries were compiled for, and compiling them again anywhere.

A library repository's ``binaries/`` (docs/writing-kernels.md, "Shipped Triton binaries") hold
kernels as Triton's cache keeps them: a folder named by the hash of everything the compile
read (the kernel's source and that of the functions it calls, the argument types and
specializations, constexprs, options, the target, Triton's own build) with the ``.cubin`` in
it. Which kernels to ship is learnt by running the library's workloads on a GPU; what is
recorded of each compile is a `Launch`: the kernel, the arguments our code passed (a tensor as
its dtype and its address modulo 16, which is all Triton specializes a tensor on; numbers as
their values) and the launch options, and the target it ran on.

A launch, unlike the compile inputs one Triton version derives from it, means the same to
every Triton version, so `replay` compiles it with whichever Triton is installed: it hands the
arguments (CPU tensors of the recorded dtype and alignment) to the kernel's ``warmup`` with
Triton's driver replaced by a stand-in for the recorded target (`standing_in_for`). Triton
then specializes, keys and compiles exactly as a launch on that GPU would, without one.

Triton's cache key also hashes its own build (``triton_key``: its sources and its
``libtriton`` shared library, which differs between Python versions); `as_installation`
makes a process compile under another installation's key (one Triton version, another
Python), as Triton's own compile workers are handed their parent's. The binaries made are
the same; only the folder name (and the ``hash`` in the metadata) is that Python's.

Example:
    ```python
    with recording("/tmp/capture"):        # while the workloads run, on the GPU
        run_workloads()
    for launch in read_records("/tmp/capture"):     # later, anywhere, with any Triton
        compiled = replay(launch, jit_functions(package))
    ```
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The file, in a capture's Triton cache folder, that its launches are recorded in.
RECORDS = "kernels-launches.jsonl"
#: ``library/binaries.py verify``'s exit status when it compiled nothing to compare (no launch
#: records, or binaries of another Triton): ``kernels check --rebuild-binaries`` warns then.
NOTHING_COMPARED = 3
#: What Triton specializes a pointer on: whether its address is a multiple of 16.
ALIGNMENT = 16


class LaunchError(ValueError):
    """A launch that cannot be recorded, read back or compiled again."""


@dataclass(frozen=True)
class Launch:
    """One launch that compiled: the kernel (its function's name, and its module named from
    inside its package, ``""`` for the package's own), the encoded arguments and options, and
    the target, ``cuda:90``."""

    kernel: str
    module: str
    arguments: tuple
    options: dict[str, Any]
    target: str

    def to_json(self) -> dict:
        return {
            "kernel": self.kernel,
            "module": self.module,
            "arguments": list(self.arguments),
            "options": self.options,
            "target": self.target,
        }

    @classmethod
    def from_json(cls, data: Any) -> Launch:
        try:
            launch = cls(
                kernel=str(data["kernel"]),
                module=str(data["module"]),
                arguments=tuple(data["arguments"]),
                options=dict(data["options"]),
                target=str(data["target"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise LaunchError(f"not a launch record ({exc}): {str(data)[:200]}") from exc
        backend, _, arch = launch.target.partition(":")
        if backend not in ("cuda", "hip") or not arch:
            raise LaunchError(f"{launch.kernel}: target {launch.target!r} is not e.g. 'cuda:90'")
        for value in (*launch.arguments, *launch.options.values()):
            decode(value, build_tensors=False)  # refuses what replay could not build
        return launch

    @property
    def identity(self) -> str:
        """The same text for the same launch (records repeat across runs and caches)."""
        return json.dumps(self.to_json(), sort_keys=True)


# ---- arguments -------------------------------------------------------------------------------


def encode(value: Any) -> Any:
    """An argument as JSON that `decode` turns back into an equivalent one for Triton: a
    tensor is ``{"tensor": dtype, "offset": address % 16}``; tuples, Triton dtypes and numbers
    keep their types (an int and a float specialize differently)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, float):
        return {"float": value}
    if isinstance(value, tuple):
        return {"tuple": [encode(v) for v in value]}
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        dtype = str(value.dtype).removeprefix("torch.")
        return {"tensor": dtype, "offset": value.data_ptr() % ALIGNMENT}
    import triton.language as tl

    if isinstance(value, tl.dtype):
        return {"tl": value.name}
    if isinstance(value, tl.constexpr):
        return encode(value.value)
    raise LaunchError(f"cannot record an argument of type {type(value).__name__}: {value!r}")


def decode(value: Any, *, build_tensors: bool = True) -> Any:
    """An argument `encode` wrote, built again (a tensor on the CPU, its address modulo 16 the
    recorded one); with ``build_tensors=False`` only checked."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and len(value) == 1:
        ((kind, inner),) = value.items()
        if kind == "bool" and isinstance(inner, bool):
            return inner
        if kind == "int" and type(inner) is int:
            return inner
        if kind == "float" and isinstance(inner, (int, float)) and not isinstance(inner, bool):
            return float(inner)
        if kind == "tuple" and isinstance(inner, list):
            return tuple(decode(v, build_tensors=build_tensors) for v in inner)
        if kind == "tl" and isinstance(inner, str):
            return _triton_dtype(inner) if build_tensors else inner
    if isinstance(value, dict) and set(value) == {"tensor", "offset"}:
        dtype, offset = value["tensor"], value["offset"]
        if not isinstance(dtype, str) or type(offset) is not int or not 0 <= offset < ALIGNMENT:
            raise LaunchError(f"not a recorded tensor: {value!r}")
        return _tensor(dtype, offset) if build_tensors else value
    raise LaunchError(f"not a recorded argument: {value!r}")


def _triton_dtype(name: str) -> Any:
    import triton.language as tl

    try:
        return tl.dtype(name)
    except (AssertionError, ValueError, TypeError) as exc:
        raise LaunchError(f"{name!r} is not a Triton dtype") from exc


def _tensor(dtype_name: str, offset: int) -> Any:
    import torch

    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise LaunchError(f"{dtype_name!r} is not a torch dtype")
    size = torch.empty((), dtype=dtype).element_size()
    if offset % size:
        raise LaunchError(f"a {dtype_name} tensor cannot start {offset} bytes past an alignment")
    # CPU allocations are 64-byte aligned; the view starts ``offset`` bytes in.
    storage = torch.empty(2 * ALIGNMENT // size + 64, dtype=dtype)
    start = (-storage.data_ptr() % ALIGNMENT + offset) // size
    view = storage[start:]
    assert view.data_ptr() % ALIGNMENT == offset
    return view


# ---- recording -------------------------------------------------------------------------------

_stash = threading.local()


def launch_of(fn: Any, args: tuple, kwargs: dict, target: Any) -> Launch:
    """The `Launch` of ``fn.run(*args, **kwargs)`` (``fn`` a ``JITFunction``) on ``target``
    (a ``GPUTarget``)."""
    function = fn.fn
    inner = function.__module__.partition(".")[2]
    options = {k: v for k, v in kwargs.items() if k not in ("grid", "warmup")}
    return Launch(
        kernel=function.__name__,
        module=inner,
        arguments=tuple(encode(a) for a in args),
        options={k: encode(v) for k, v in sorted(options.items())},
        target=f"{target.backend}:{target.arch}",
    )


@contextlib.contextmanager
def recording(cache_dir: str | os.PathLike) -> Iterator[None]:
    """Record each launch that makes Triton compile (a kernel's first launch in the process
    with new specializations) into ``cache_dir/RECORDS``, one JSON line each."""
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    run, do_compile = JITFunction.run, JITFunction._do_compile
    path = Path(cache_dir) / RECORDS

    def recorded_run(self, *args, grid, warmup, **kwargs):
        _stash.launch = (self, args, dict(kwargs))
        try:
            return run(self, *args, grid=grid, warmup=warmup, **kwargs)
        finally:
            _stash.launch = None

    def recorded_compile(self, *args, **kwargs):
        stashed = getattr(_stash, "launch", None)
        if stashed is not None and stashed[0] is self:
            try:
                target = driver.active.get_current_target()
                line = json.dumps(launch_of(self, stashed[1], stashed[2], target).to_json())
            except LaunchError as exc:
                line = json.dumps({"unrecorded": self.fn.__name__, "reason": str(exc)})
            with open(path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
        return do_compile(self, *args, **kwargs)

    JITFunction.run, JITFunction._do_compile = recorded_run, recorded_compile
    try:
        yield
    finally:
        JITFunction.run, JITFunction._do_compile = run, do_compile


def read_records(cache_dir: str | os.PathLike) -> Iterator[Launch]:
    """The launches recorded in ``cache_dir`` (none if it recorded nothing).

    Raises:
        LaunchError: a line records a launch that could not be encoded (the capture missed
            it: say so rather than ship a set that lacks it).
    """
    path = Path(cache_dir) / RECORDS
    if not path.is_file():
        return
    for line in path.read_text(encoding="utf-8").splitlines():
        data = json.loads(line)
        if "unrecorded" in data:
            raise LaunchError(f"{path}: a launch of {data['unrecorded']} was not recorded: {data['reason']}")  # fmt: skip
        yield Launch.from_json(data)


# ---- replaying -------------------------------------------------------------------------------


class _StandInDriver:
    """What ``JITFunction.run`` asks Triton's driver for when it compiles without launching:
    the device (one per target, so that each gets its own specialization tables), the stream
    and the target."""

    def __init__(self, target: Any):
        self.target = target

    def get_current_device(self) -> str:
        return f"{self.target.backend}:{self.target.arch}"

    def get_current_stream(self, device: Any = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target

    def is_active(self) -> bool:
        return True


@contextlib.contextmanager
def standing_in_for(target: str) -> Iterator[None]:
    """Make Triton in this process compile for ``target`` (``cuda:90``) as if that GPU were
    the current device; no GPU is needed, and nothing may be launched meanwhile."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    backend, _, arch = target.partition(":")
    gpu = GPUTarget(backend, int(arch) if arch.isdigit() else arch, 32 if backend == "cuda" else 64)
    # Restored as found: reset_active() would start the real driver, which needs a GPU.
    previous = driver._active
    driver.set_active(_StandInDriver(gpu))
    try:
        yield
    finally:
        driver._active = previous


@contextlib.contextmanager
def as_installation(key: str | None) -> Iterator[None]:
    """Compile under ``key``, another installation's ``triton_key()`` (the same Triton
    version under another Python), or as this one when None."""
    if key is None:
        yield
        return
    import triton.runtime.cache as cache

    own = cache.triton_key
    cache.triton_key = lambda: key
    try:
        yield
    finally:
        cache.triton_key = own


def replay(launch: Launch, functions: dict[tuple[str, str], Any]) -> Any:
    """Compile ``launch`` with this process's Triton, as a launch on its target would (into
    Triton's cache folder, ``TRITON_CACHE_DIR``), and return the compiled kernel. Call it
    inside `standing_in_for` the launch's target. ``functions``: `jit_functions` of the
    repository's package.

    Raises:
        LaunchError: the kernel is not in the package, or this Triton refuses the launch.
    """
    fn = functions.get((launch.module, launch.kernel))
    if fn is None:
        raise LaunchError(f"{launch.module}.{launch.kernel}: no such @triton.jit function")
    args = [decode(a) for a in launch.arguments]
    options = {k: decode(v) for k, v in launch.options.items()}
    try:
        return fn.warmup(*args, grid=(1,), **options)
    except (KeyError, TypeError, ValueError) as exc:
        raise LaunchError(f"{launch.kernel}: this Triton refuses the launch ({exc})") from exc


def jit_functions(package: Any) -> dict[tuple[str, str], Any]:
    """The ``@triton.jit`` functions of an imported package, by (module inside it, name); the
    package's own module is ``""``, as a package is named differently where it is loaded."""
    import sys

    from triton.runtime.jit import JITFunction

    found = {}
    prefix = package.__name__ + "."
    for name, module in list(sys.modules.items()):
        if module is None or not (name == package.__name__ or name.startswith(prefix)):
            continue
        inner = name[len(prefix) :] if name != package.__name__ else ""
        for value in vars(module).values():
            if isinstance(value, JITFunction) and value.fn.__module__ == name:
                found[(inner, value.fn.__name__)] = value
    return found


def cache_key(compiled_hash: str) -> str:
    """The Triton cache folder of a compile whose ``CompiledKernel.hash`` is ``compiled_hash``
    (the hex SHA-256 of its inputs' key), as Triton names it."""
    import base64

    return base64.b32encode(bytes.fromhex(compiled_hash)).decode().rstrip("=")
