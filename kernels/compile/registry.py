"""`KernelRegistry`: the kernels a backend puts into graphs, one per pattern.

Example:
    ```python
    import torch
    from kernels.compile import KernelRegistry

    registry = KernelRegistry.library()      # our Triton norms and activations

    @registry.register("relu")               # and a kernel of your own
    def my_relu(x):
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK_SIZE=1024)
        return y

    model = torch.compile(model, backend=registry.backend())
    ```
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from ..mapping.device import validate_device_type
from .backend import KernelsBackend
from .entry import DEFAULT_DTYPES, KernelEntry
from .errors import KernelRegistrationError
from .patterns import PATTERNS, Pattern, get_pattern
from .policy import Policy

logger = logging.getLogger(__name__)


class KernelRegistry:
    """Kernels by pattern name: what a `KernelsBackend` replaces, and with what.

    A registry holds at most one kernel per pattern; registering a kernel for a pattern
    that has one replaces it (yours replaces the library's). The backend tries the user's
    entries first, then the library's, each group with the patterns of several ops before
    lone element-wise ones (`PATTERNS` order), so a kernel you registered for ``silu`` gets
    every SiLU, including the one inside ``silu(gate) * up``.

    Start empty (``KernelRegistry()``) to replace only what you register, or from the
    library's kernels (`KernelRegistry.library`).
    """

    def __init__(self) -> None:
        self._entries: dict[str, KernelEntry] = {}

    @classmethod
    def library(
        cls, patterns: Iterable[str] | None = None, *, policy: Policy | str | None = None
    ) -> KernelRegistry:
        """A registry of our Triton kernels (``library/norm``, ``library/activation``): rms_norm,
        layer_norm, silu_mul, gelu_mul, gelu_tanh_mul, silu, gelu and gelu_tanh.

        Their default policy is ``eager_only``: under inductor the original ops stay, as
        measured faster there (docs/compile-backend.md, Policy); under ``downstream="eager"``
        our kernels replace them.

        Args:
            patterns: only these patterns (default: every one the library has a kernel for).
            policy: one policy for all of them instead of the default (``"always"`` puts our
                kernels into inductor's graphs too).

        Example:
            ```python
            registry = KernelRegistry.library(["rms_norm", "silu_mul"], policy="always")
            ```
        """
        from .library_kernels import library_entries, library_patterns

        wanted = None
        if patterns is not None:
            wanted = [get_pattern(p).name for p in patterns]
            missing = [p for p in wanted if p not in library_patterns()]
            if missing:
                raise KernelRegistrationError(
                    f"The kernel library has no kernel for {', '.join(missing)}; it has "
                    f"{', '.join(library_patterns())}. Register your own with "
                    "registry.register(pattern, kernel)."
                )
        registry = cls()
        for name, entry in library_entries().items():
            if wanted is None or name in wanted:
                registry._entries[name] = entry if policy is None else entry.with_policy(policy)
        return registry

    def register(
        self,
        pattern: str,
        kernel: Callable | None = None,
        *,
        policy: Policy | str = Policy.ALWAYS,
        backward: Callable | None = None,
        device_types: Iterable[str] | None = None,
        dtypes: Iterable[torch.dtype] | None = None,
    ) -> Any:
        """Register ``kernel`` for ``pattern``; without ``kernel``, a decorator that does.

        The kernel is called with the pattern's arguments (`PATTERNS[pattern].signature`:
        ``relu(x)``, ``rms_norm(x, weight, eps)``, ``silu_mul(gate, up)``, ...), as contiguous
        tensors, and returns a new tensor of its first argument's shape and dtype. It becomes a
        ``torch.library`` op (`kernels.compile.user_ops`), so it may launch Triton kernels
        directly and still run under inductor and in training.

        Args:
            pattern: a name of `PATTERNS` (``"relu"``, ``"silu"``, ``"gelu"``, ``"gelu_tanh"``,
                ``"silu_mul"``, ``"gelu_mul"``, ``"gelu_tanh_mul"``, ``"rms_norm"``,
                ``"layer_norm"``).
            kernel: the function; leave it out to use ``register`` as a decorator.
            policy: when it replaces matches (`Policy`): ``"always"`` (the default: you asked
                for it), ``"eager_only"``, or ``"never"``.
            backward: ``backward(grad_output, *args)`` returning the gradient of each tensor
                argument that is not None, in order. Without one, gradients are those of the
                pattern's PyTorch reference, computed from the saved inputs.
            device_types: where it runs (default: ``cuda``, plus ``cpu`` when
                ``TRITON_INTERPRET=1``); a match on another device keeps its ops.
            dtypes: the input dtypes it takes (default float32, float16, bfloat16).

        Returns:
            ``kernel`` itself (unchanged, still callable as before), or the decorator.

        Example:
            ```python
            @registry.register("silu", policy="eager_only")
            def my_silu(x): ...

            registry.register("rms_norm", my_rms_norm, backward=my_rms_norm_backward)
            ```
        """
        if callable(pattern) and not isinstance(pattern, (str, Pattern)):
            raise KernelRegistrationError(
                f"register() takes the pattern name first: write @registry.register('relu') "
                f"above {getattr(pattern, '__name__', 'the kernel')}, not @registry.register."
            )
        found = get_pattern(pattern)
        policy = Policy.parse(policy)
        if backward is not None and not callable(backward):
            raise KernelRegistrationError(
                f"The backward registered for '{found.name}' must be callable "
                f"(grad_output, *args) -> gradients; got {type(backward).__name__}."
            )
        types = None if device_types is None else _device_types(device_types)
        kinds = DEFAULT_DTYPES if dtypes is None else _dtypes(dtypes)

        def add(function: Callable) -> Callable:
            if not callable(function):
                raise KernelRegistrationError(
                    f"The kernel registered for '{found.name}' must be callable; got "
                    f"{type(function).__name__} {function!r}."
                )
            from .user_ops import user_kernel_op

            label = getattr(function, "__name__", type(function).__name__)
            op = user_kernel_op(found, function, label, backward)
            previous = self._entries.get(found.name)
            if previous is not None:
                logger.info("kernel %s replaces %s for '%s'", label, previous.label, found.name)
            self._entries[found.name] = KernelEntry(
                pattern=found,
                kernel=function,
                label=label,
                source="user",
                policy=policy,
                graph_call=op,
                eager_call=op,
                device_types=types,
                dtypes=kinds,
            )
            return function

        return add if kernel is None else add(kernel)

    def set_policy(self, pattern: str, policy: Policy | str) -> None:
        """Change when the kernel registered for ``pattern`` replaces its matches.

        Example:
            ```python
            registry.set_policy("silu", "always")  # our SiLU kernel under inductor too
            ```
        """
        self._entries[self._registered(pattern)] = self.entry(pattern).with_policy(policy)

    def remove(self, pattern: str) -> None:
        """Forget the kernel registered for ``pattern``."""
        del self._entries[self._registered(pattern)]

    def entry(self, pattern: str) -> KernelEntry:
        """The entry registered for ``pattern``."""
        return self._entries[self._registered(pattern)]

    def entries(self) -> list[KernelEntry]:
        """The entries in the order the rewrite tries them: the user's, then the library's,
        each in `PATTERNS` order."""
        order = {name: i for i, name in enumerate(PATTERNS)}
        return sorted(
            self._entries.values(),
            key=lambda e: (e.source != "user", order[e.pattern.name]),
        )

    def copy(self) -> KernelRegistry:
        """A registry with the same entries, to change without changing this one."""
        other = KernelRegistry()
        other._entries = dict(self._entries)
        return other

    def backend(self, **options: Any) -> KernelsBackend:
        """A ``torch.compile`` backend that puts these kernels into graphs: `KernelsBackend`
        with this registry; ``options`` are its keyword arguments (``downstream``, ``report``,
        ``draw``, ``draw_format``, ``inductor_options``, ``cuda_graphs``).

        Example:
            ```python
            model = torch.compile(model, backend=registry.backend(downstream="eager"))
            ```
        """
        return KernelsBackend(self, **options)

    def describe(self) -> str:
        """One line per entry: pattern, kernel, policy, devices."""
        lines = []
        for e in self.entries():
            devices = ", ".join(e.device_types) if e.device_types else "default devices"
            lines.append(f"{e.pattern.name}: {e.label} (policy {e.policy.value}; {devices})")
        return "\n".join(lines)

    def _registered(self, pattern: str) -> str:
        name = get_pattern(pattern).name
        if name not in self._entries:
            raise KeyError(
                f"No kernel is registered for '{name}'; registered: "
                f"{', '.join(self._entries) or 'none'}."
            )
        return name

    def __contains__(self, pattern: object) -> bool:
        return isinstance(pattern, str) and pattern in self._entries

    def __iter__(self) -> Iterator[KernelEntry]:
        return iter(self.entries())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        names = ", ".join(f"{e.pattern.name}={e.label}" for e in self.entries())
        return f"KernelRegistry({names})"


def kernels_backend(registry: KernelRegistry | None = None, **options: Any) -> KernelsBackend:
    """A ``torch.compile`` backend with ``registry``'s kernels (`KernelRegistry.library()` when
    none is given); ``options`` are `KernelsBackend`'s keyword arguments (``downstream``,
    ``report``, ``draw``, ``draw_format``, ``inductor_options``, ``cuda_graphs``).

    Example:
        ```python
        model = torch.compile(model, backend=kernels_backend())                      # inductor
        model = torch.compile(model, backend=kernels_backend(downstream="eager"))    # our kernels
        ```
    """
    return KernelsBackend(KernelRegistry.library() if registry is None else registry, **options)


def _device_types(device_types: Iterable[str]) -> tuple[str, ...]:
    if isinstance(device_types, str):
        device_types = (device_types,)
    try:
        return tuple(validate_device_type(d) for d in device_types)
    except ValueError as error:
        raise KernelRegistrationError(str(error)) from None


def _dtypes(dtypes: Iterable[torch.dtype]) -> tuple[torch.dtype, ...]:
    if isinstance(dtypes, torch.dtype):
        dtypes = (dtypes,)
    found = tuple(dtypes)
    wrong = [d for d in found if not isinstance(d, torch.dtype)]
    if wrong or not found:
        raise KernelRegistrationError(
            f"dtypes must be torch dtypes such as torch.float16; got {wrong or 'none'}."
        )
    return found
