"""Triton's interpreter, without work whose result it throws away: its repeated patching of
``triton.language`` inside a launch, and its integer overflow checks that check nothing.

The interpreter runs a kernel by patching ``triton.language`` (its builtins, ``tl.tensor``,
``tl.math``) with NumPy implementations for the launch and restoring them after. It also patches
again at every call of a ``@triton.jit`` helper from the kernel (``InterpretedFunction.__call__``
in Triton 3.x), and throws that second patch's record away: once the launch has patched, these
calls find the builtins replaced already and set the same wrappers again. Our kernels call
helpers in their loops, so a launch repeated the patching (``inspect.getmembers`` over the
language modules, some 3 ms) thousands of times: a third of the CPU time of the norm tests.

`skip_repeated_patching` keeps the first patch of each helper in a launch and skips its repeats
until the launch ends, so a kernel runs exactly the code it ran before: the first call of a
helper patches what the helper's globals reach (as before), and nothing is restored until the
launch's own record restores it (as before).

`skip_discarded_overflow_checks`: with the ``sanitize_overflow`` option (on by default), every
int32 add, sub and mul of a kernel is done again in int64 and compared with int32's bounds, and
the comparison goes to ``device_assert``, which drops it unless the ``debug`` option is on. The
interpreter's options never have ``debug`` on (Triton 3.x builds them once, from defaults), so
these ops are computed and discarded: more than half of a rotary launch's CPU time, a quarter of
the norm tests'. Turning the option off where ``debug`` is off removes ops whose results nothing
reads.

tests/library/test_interpreter.py checks that the results and the state of ``triton.language``
after a launch are the interpreter's own, and that the overflow checks assert nothing with the
interpreter's options.
"""

from __future__ import annotations

import dataclasses
import functools
import threading

_state = threading.local()
#: The interpreter's own patching, as found at installation (`skip_repeated_patching`).
original_patch_lang = None


def _patched_this_launch() -> set | None:
    return getattr(_state, "patched", None)


def skip_repeated_patching() -> bool:
    """Install the skip into Triton's interpreter, once a process. False (and nothing changed)
    where the installed Triton does not have the interpreter's parts it relies on."""
    from triton.runtime import interpreter

    parts = ("_patch_lang", "_LangPatchScope", "GridExecutor", "InterpretedFunction")
    if not all(hasattr(interpreter, name) for name in parts):
        return False
    global original_patch_lang
    if getattr(interpreter._patch_lang, "skips_repeats", False):
        return True
    original_patch_lang = interpreter._patch_lang
    launch = interpreter.GridExecutor.__call__

    @functools.wraps(original_patch_lang)
    def patch_once_a_launch(fn):
        patched = _patched_this_launch()
        if patched is None or fn not in patched:  # a launch, or a helper's first call in one
            if patched is not None:
                patched.add(fn)
            return original_patch_lang(fn)
        return interpreter._LangPatchScope()  # nothing to restore: nothing was set

    @functools.wraps(launch)
    def launch_with_its_own_record(self, *args, **kwargs):
        outer = _patched_this_launch()
        _state.patched = set()
        try:
            return launch(self, *args, **kwargs)
        finally:
            _state.patched = outer

    patch_once_a_launch.skips_repeats = True  # type: ignore[attr-defined]
    interpreter._patch_lang = patch_once_a_launch
    interpreter.GridExecutor.__call__ = launch_with_its_own_record
    return True


def skip_discarded_overflow_checks() -> bool:
    """Turn the interpreter's ``sanitize_overflow`` off where its checks are discarded (its
    ``debug`` option off); True where it is off now. False (and nothing changed) where
    ``debug`` is on or the installed Triton keeps its options elsewhere."""
    from triton.runtime import interpreter

    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if not dataclasses.is_dataclass(options) or options.debug:
        return False
    if "sanitize_overflow" not in {field.name for field in dataclasses.fields(options)}:
        return False
    builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return True
