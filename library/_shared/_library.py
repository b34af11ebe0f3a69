"""Op registration and launch helpers shared by this package's ops.

Two versions of a kernel repository can be loaded into one process, each under its own module
name (``_kernels_<repo>_<hash of the package folder>`` when ``kernels`` loads it; the ``id`` of
the variant's ``metadata.json`` when Hugging Face's client does). ``torch.library`` ops live in
one global registry, so the namespace is derived from that module name and a digest of this
package's sources: each loaded copy registers its ops apart from the others.

Each kernel repository stands alone (on the Hub it cannot import another), so each build variant
carries its own copy of this file. The one source is ``library/_shared/_library.py`` in the
``kernels`` project; ``make library`` copies it into every build, and a test checks the copies
by hash. Edit it there, never in a ``build/`` folder.
"""

import functools
import hashlib
import os
import re

import torch

from ._binaries import seed_for_device as _seed_binaries


def _source_digest() -> str:
    # A digest of this package's sources, so that a changed version loaded under the same module
    # name (same folder) gets new op names, and no compiled-graph cache built for the old ops'
    # schemas is reused for them.
    digest = hashlib.sha256()
    folder = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            with open(os.path.join(folder, name), "rb") as f:
                digest.update(name.encode() + b"\0" + f.read())
    return digest.hexdigest()[:10]


NAMESPACE = "kernels_lib_" + re.sub(r"\W", "_", __package__) + "_" + _source_digest()

# The dtypes the kernels load and store; arithmetic is always fp32 inside the kernels.
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def op_name(name: str) -> str:
    """The qualified ``torch.library`` name of this package's op ``name``."""
    return f"{NAMESPACE}::{name}"


def check_dtype(what: str, tensor: torch.Tensor) -> None:
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"{what}: dtype {tensor.dtype} is not supported; the kernels take float32, float16 "
            "or bfloat16 (cast the input, or keep this layer out of the kernel mapping)"
        )


def use_autograd_function(*tensors: torch.Tensor | None) -> bool:
    """Whether an eager call must record a backward (else the bare launcher is enough)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


@functools.cache
def _cuda_multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors of ``device``; 2 on the CPU, where the Triton interpreter runs
    programs one after another (two, not one, so that reductions across programs, such as the
    norms' weight gradients, are exercised there too)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _cuda_multiprocessors(index)
    return 2


# ---- launching ------------------------------------------------------------------------------
#
# Triton's launcher (``kernel[grid](...)``) binds arguments and builds a cache key in Python on
# every call, which costs more host time than the kernel takes at common sizes (4096 x 4096).
# ``launch`` keeps the compiled kernel that a first ordinary launch returned, under a key made
# of exactly what Triton specialises on (tensor dtypes and 16-byte alignment; integers equal to
# 1, divisible by 16, or past int32; a tensor descriptor's dtype and block shape; the value of
# every constexpr; num_warps and num_stages; the device), and afterwards calls the compiled
# kernel's launcher itself (which builds a descriptor's TMA copy on each launch), skipping the
# per-call closure, device and stream lookups and launch-metadata hooks of
# ``CompiledKernel.__getitem__``. Tensors reach that launcher as their addresses (ints): given a
# tensor, it calls ``data_ptr()`` and asks the driver whether the address is a device pointer
# (``cuPointerGetAttribute``), per tensor and per launch; an int it takes as it is. That check
# is a driver call per tensor, so it dominates launches of many tensors (an RMSNorm backward
# passes 8). The first launch of each key goes through Triton's runner with the tensors themselves,
# so it is checked; the key holds whether each tensor is on a CUDA device, so a CPU tensor where
# a CUDA one was gets another key, and Triton's error. Launch hooks are honoured: while a
# profiler has a hook installed, launches go through Triton's own runner. On the CPU (the
# interpreter) every launch is an ordinary one.


# ---- kernel arguments, by name ----------------------------------------------------------------
#
# A launch passes ``args``, all of the kernel's arguments in its parameter order. Each launcher
# writes that tuple as plain names, each the name of the kernel's parameter in that place (case
# aside, a launcher's ``x`` being the kernel's ``X``, unless two of the kernel's parameters differ
# only in case, as ``window_left`` and ``WINDOW_LEFT``), bound just above it:
#
#     args = (x, r, w, y, s, rstd, n_rows, n_cols, stride_x, stride_r, eps) + plan.constexprs
#
# and the constexprs that a plan fixes (a plan is kept per shape) are built once, by keyword, with
# `constexprs`. tests/library/test_launch_args.py reads every launch of the library and checks
# those names against the kernel's ``arg_names``, in order: a renamed parameter, or two values
# passed in each other's place, fails there. Names cost nothing at run time, where a packer
# function called with keywords (``pack(X=x, ...)``, generated from ``arg_names``) or a NamedTuple
# built with keywords cost more than a launch can spare. ``python -m
# benchmarks.diagnose.launch_host`` (launches stubbed, on the 2-core AMD EPYC development
# machine, least of 200 rounds, us per call): a keyword packer took rms_norm_forward from 4.08 to
# 4.25 and activation_forward from 2.35 to 2.45, a NamedTuple of 11 keywords costs 0.8 us more
# than a tuple, and past 15 keywords CPython builds a dict for the call (1 us more). Named locals
# left every launcher level within the machine's noise (rms_norm_forward 4.20 and 4.20,
# layer_norm_backward 16.18 and 16.17, gated_gemv 7.66 and 7.57) and made those that had passed
# starred stride slices faster (rotary 15.9 -> 14.9, attention's decode step 24.0 -> 21.6 and
# backward 30.8 -> 21.6).


def kernel_parameters(kernel) -> tuple[tuple[str, bool], ...]:
    """``(name, is_constexpr)`` of each of ``kernel``'s parameters, in order: a compiled
    ``triton.jit`` kernel's or an interpreted one's (``TRITON_INTERPRET=1``) alike."""
    import inspect

    params = getattr(kernel, "params", None)
    if params is not None:
        return tuple((p.name, bool(p.is_constexpr)) for p in params)
    signature = inspect.signature(kernel.fn)
    return tuple((name, _is_constexpr(p.annotation)) for name, p in signature.parameters.items())


def _is_constexpr(annotation) -> bool:
    # ``tl.constexpr``, or its name in a string annotation (``"tl.constexpr"``)
    name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return name.rsplit(".", 1)[-1] == "constexpr"


def constexprs(kernel, **values) -> tuple:
    """The values of ``kernel``'s constexpr parameters, given by name, as a tuple in the kernel's
    parameter order: what a launch plan keeps and a launcher appends to its other arguments.
    Every constexpr must be named, and nothing else."""
    names = tuple(name for name, is_constexpr in kernel_parameters(kernel) if is_constexpr)
    if len(values) != len(names) or any(name not in values for name in names):
        kernel_name = getattr(kernel, "__name__", "the kernel")
        raise TypeError(
            f"{kernel_name}'s constexprs are {', '.join(names)}; got {', '.join(values)}"
        )
    return tuple(values[name] for name in names)


def cdiv(a: int, b: int) -> int:
    """``triton.cdiv`` for Python ints. Newer Triton (3.9 here) makes its own a ``ConstexprFunction``,
    whose call costs more than the arithmetic, on every launch."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """``triton.next_power_of_2`` for Python ints (0 for 0, like Triton's), without its call cost."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def as_rows(x: torch.Tensor, n_cols: int) -> tuple[torch.Tensor, int, int]:
    """``(t, rows, row stride)``: ``x`` read as rows of ``n_cols`` contiguous elements, or a copy
    of it when no such view exists. A contiguous ``x`` (the usual case) is used as it is: a
    reshape is a view op, which costs more host time on every call than the rest of the
    launcher's arithmetic."""
    if x.is_contiguous():
        return x, x.numel() // n_cols, n_cols
    x2 = x.reshape(-1, n_cols)
    if n_cols > 1 and x2.stride(1) != 1:
        x2 = x2.contiguous()
    return x2, x2.shape[0], x2.stride(0)


_compiled: dict = {}
_key_functions: dict = {}

# The call ``CompiledKernel.__getitem__``'s runner makes (Triton 3.6 to 3.9, whitespace aside);
# we make the same call. A Triton whose runner calls its launcher otherwise is launched through
# its runner.
_RUNNER_CALL = (
    "self.run(grid[0],grid[1],grid[2],stream,self.function,self.packed_metadata,launch_metadata,"
    "knobs.runtime.launch_enter_hook,knobs.runtime.launch_exit_hook,*args)"
)
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1

try:
    from torch._C import _cuda_getCurrentRawStream as _current_stream
except ImportError:  # pragma: no cover - older torch, or a build without CUDA

    def _current_stream(index: int) -> int:
        return torch.cuda.current_stream(index).cuda_stream


try:
    from torch._C import _cuda_getDevice as _current_device  # without the wrapper's checks
except ImportError:  # pragma: no cover - older torch, or a build without CUDA
    _current_device = torch.cuda.current_device


try:
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover - Triton before 3.4 has no knobs
    _knobs = None


def _spec(arg) -> object:
    """What Triton specialises a non-constexpr argument on: a tensor's dtype and 16-byte
    alignment (and, for `launch`, whether it is on a CUDA device); whether an integer is 1,
    divisible by 16, or past int32; a bool's value (it is passed as i1); else the argument's
    type (a float is passed as fp32, whatever its value)."""
    if isinstance(arg, torch.Tensor):
        return arg.dtype, not arg.data_ptr() & 15, arg.is_cuda
    if type(arg) is int:
        return arg == 1, not arg & 15, _INT32_MIN <= arg <= _INT32_MAX
    if type(arg) is bool:
        return bool, arg
    if type(arg) is float:  # the usual other kind (an eps, a scale): no attribute lookup
        return float
    block_shape = getattr(arg, "block_shape", None)
    if block_shape is not None:  # a tensor descriptor: compiled per dtype and block shape
        return type(arg), arg.base.dtype, tuple(block_shape)
    return type(arg)


def _key_function(kernel, args: tuple):
    """``kernel``'s launch-key function: ``args -> (key, launch arguments)``. The key is
    ``(kernel, index, num_warps, *specs)`` with each constexpr's value and each other
    argument's ``_spec``; the launch arguments are ``args`` with each tensor replaced by its
    address. Written out argument by argument.

    A loop over the arguments cost a fraction of a microsecond an argument on every launch,
    and rotary passes 31; the written-out function costs about a third of that. It is
    generated from the first call's arguments only to put the likely kind first: a tensor
    where a tensor was, an integer where an integer was. Any other argument goes through
    ``_spec`` (and a tensor anywhere becomes its address), so the key equals ``_spec``'s for
    every argument, whatever its kind.
    """
    names = [f"a{i}" for i in range(len(args))]
    lines, specs, values = [], [], []
    for name, arg, is_constexpr in zip(names, args, _kernel_shape(kernel), strict=True):
        if is_constexpr:
            specs.append(name)
            values.append(name)
        elif isinstance(arg, torch.Tensor):
            lines += [
                f"    if isinstance({name}, Tensor):",
                f"        p_{name} = {name}.data_ptr()",
                f"        s_{name} = ({name}.dtype, not p_{name} & 15, {name}.is_cuda)",
                "    else:",
                f"        p_{name}, s_{name} = {name}, _spec({name})",
            ]
            specs.append(f"s_{name}")
            values.append(f"p_{name}")
        elif type(arg) is int:
            specs.append(
                f"(({name} == 1, not {name} & 15, {_INT32_MIN} <= {name} <= {_INT32_MAX}) "
                f"if type({name}) is int else _spec({name}))"
            )
            values.append(f"({name}.data_ptr() if isinstance({name}, Tensor) else {name})")
        else:
            specs.append(f"_spec({name})")
            values.append(f"({name}.data_ptr() if isinstance({name}, Tensor) else {name})")
    source = "\n".join(
        [
            "def key(kernel, index, num_warps, args):",
            f"    {', '.join(names)}, = args",
            *lines,
            f"    return (kernel, index, num_warps, {', '.join(specs)}), ({', '.join(values)},)",
        ]
    )
    namespace = {"Tensor": torch.Tensor, "_spec": _spec}
    label = f"<launch key of {getattr(kernel, '__name__', 'a kernel')}>"
    exec(compile(source + "\n", label, "exec"), namespace)
    return namespace["key"]


def _kernel_shape(kernel) -> tuple[bool, ...]:
    """Which of ``kernel``'s parameters are constexprs (their value is part of the key)."""
    return tuple(bool(p.is_constexpr) for p in kernel.params)


def _key_and_args(kernel, index: int, num_warps: int | tuple, args: tuple) -> tuple[tuple, tuple]:
    """The launch cache's key (where it differs, Triton compiles another kernel), and ``args``
    as the compiled kernel's launcher takes them, tensors as addresses. ``num_warps`` is the
    launch's options: the warps, or (warps, stages)."""
    key_function = _key_functions.get(kernel)
    if key_function is None:
        key_function = _key_functions[kernel] = _key_function(kernel, args)
    return key_function(kernel, index, num_warps, args)


def _key(kernel, index: int, num_warps: int | tuple, args: tuple) -> tuple:
    """The launch cache's key alone."""
    return _key_and_args(kernel, index, num_warps, args)[0]


def _direct_launcher(compiled):
    """``(run, function, metadata)`` to launch ``compiled`` with, or None when this Triton's
    runner calls its launcher in a way we do not know (then launches go through the runner)."""
    import inspect

    try:
        source = inspect.getsource(type(compiled).__getitem__)
        run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    except (AttributeError, OSError, TypeError):
        return None
    if _RUNNER_CALL not in "".join(source.split()):
        return None
    return run, function, metadata


def _hook_installed(hook) -> bool:
    # Triton 3.4 and later keep each launch hook as a ``HookChain`` (never None) whose ``calls``
    # lists the installed functions; earlier ones hold a function or None.
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return calls is None or len(calls) > 0


def _hooks_installed() -> bool:
    runtime = getattr(_knobs, "runtime", None)
    if runtime is None:
        return True
    return _hook_installed(runtime.launch_enter_hook) or _hook_installed(runtime.launch_exit_hook)


def _interpreted(kernel) -> bool:
    # ``triton.jit`` builds an ``InterpretedFunction`` instead of a ``JITFunction`` when
    # TRITON_INTERPRET was set as it ran, so the kernel object itself says which it is.
    return type(kernel).__name__ == "InterpretedFunction"


def _cpu_without_interpreter(kernel) -> str:
    # Without the interpreter Triton only compiles for GPUs, and says "0 active drivers" (or
    # that a pointer "cannot be accessed", where a GPU is present) with no hint of the fix.
    name = getattr(kernel, "__name__", "a Triton kernel")
    return (
        f"The Triton kernel {name} was called with CPU tensors, but Triton compiles kernels only "
        "for GPUs. Move the model and its inputs to a GPU (.to('cuda')), or, to run on the CPU "
        "(slowly, for tests), set TRITON_INTERPRET=1 in the environment before triton is first "
        "imported."
    )


# Compile, never launch: the capture of shipped binaries for a GPU other than the one it runs on
# (``benchmarks.cold_start --compile-for``, docs/writing-kernels.md) runs the library's workloads
# with Triton's target and the GPU's properties set to that GPU's, whose kernels cannot run here.
# Results are then garbage; nothing but a capture sets it.
_COMPILE_ONLY = os.environ.get("KERNELS_TRITON_COMPILE_ONLY") == "1"


def _options(num_warps: int, num_stages: int | None) -> dict:
    # Triton's launch options; no num_stages unless given (Triton's default then).
    if num_stages is None:
        return {"num_warps": num_warps}
    return {"num_warps": num_warps, "num_stages": num_stages}


def launch(
    kernel,
    grid: tuple,
    args: tuple,
    num_warps: int,
    device: torch.device,
    num_stages: int | None = None,
) -> None:
    """``kernel[grid](*args, num_warps=num_warps)`` on ``device`` (and ``num_stages=``, given
    one), with all arguments (constexprs included) positional in the kernel's parameter
    order."""
    if device.type != "cuda":
        try:
            kernel[grid](*args, **_options(num_warps, num_stages))
        except (RuntimeError, ValueError) as exc:
            if device.type == "cpu" and not _interpreted(kernel):
                raise RuntimeError(_cpu_without_interpreter(kernel)) from exc
            raise
        return
    if _COMPILE_ONLY:
        kernel.warmup(*args, grid=grid, **_options(num_warps, num_stages))
        return
    current = _current_device()
    index = current if device.index is None else device.index
    if index != current:
        # A model split over GPUs calls layers with tensors on a device that is not the current
        # one; Triton launches on the current device.
        with torch.cuda.device(index):
            launch(kernel, grid, args, num_warps, device, num_stages)
        return
    # The key's launch options: num_warps alone unless stages are given (no tuple made then).
    launch_options = num_warps if num_stages is None else (num_warps, num_stages)
    key, addressed = _key_and_args(kernel, index, launch_options, args)
    entry = _compiled.get(key)
    if entry is None:
        # Before Triton's first compile in this process: its cache gets the binaries this
        # package ships (_binaries.py), so that compile is a cache hit. Here rather than at
        # import: an import must not touch CUDA or the disk, and a process that never
        # launches on a GPU (the CPU, the interpreter) never gets here. Later misses cost a
        # dict lookup.
        _seed_binaries(index)
        compiled = kernel[grid](*args, **_options(num_warps, num_stages))
        if callable(getattr(compiled, "__getitem__", None)):
            _compiled[key] = (compiled, _direct_launcher(compiled))
        return
    compiled, direct = entry
    grid = grid + (1,) * (3 - len(grid))
    if direct is None or _hooks_installed():
        compiled[grid](*args)  # also where a profiler wants launch metadata
        return
    run, function, metadata = direct
    run(*grid, _current_stream(index), function, metadata, None, None, None, *addressed)
