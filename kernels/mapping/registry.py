"""The kernel mapping: which repository provides each layer name, per device and mode.

A mapping is an immutable snapshot; registering builds a new one. The process-wide mapping
is what `register_kernel_mapping` changes outside any `use_kernel_mapping` scope, so every
thread and asyncio task sees it. Inside a scope, the scope's own mapping lives in a
`contextvars.ContextVar`: it is private to that thread or task (and the tasks it starts),
and is dropped when the scope exits, also on exceptions.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from types import MappingProxyType, TracebackType
from typing import Any

from ..errors import KernelMappingError
from ..repos.base import LayerRepositoryProtocol, is_repository
from .device import Device, as_device
from .mode import Mode, validate_registered_mode

#: What users pass to `register_kernel_mapping` / `use_kernel_mapping`: layer name ->
#: device (type string or `Device`) -> repository, or -> {Mode: repository}.
KernelMappingSpec = Mapping[
    str,
    Mapping[
        str | Device,
        LayerRepositoryProtocol | Mapping[Mode, LayerRepositoryProtocol],
    ],
]

_SEQUENCE = itertools.count()


@dataclass(frozen=True)
class DeviceEntry:
    """The repositories registered for one layer name under one device key."""

    device: Device
    repositories: Mapping[Mode, LayerRepositoryProtocol]
    #: Registration order; among equally narrow capability ranges the later one wins.
    sequence: int


class KernelMapping:
    """An immutable snapshot of registered kernels: layer name -> device type -> entries."""

    __slots__ = ("_layers",)

    def __init__(self, layers: Mapping[str, Mapping[str, tuple[DeviceEntry, ...]]] | None = None):
        self._layers: Mapping[str, Mapping[str, tuple[DeviceEntry, ...]]] = MappingProxyType(
            dict(layers or {})
        )

    def layer_names(self) -> tuple[str, ...]:
        """The layer names that have kernels registered."""
        return tuple(self._layers)

    def device_types(self, layer_name: str) -> tuple[str, ...]:
        """The device types with kernels registered for `layer_name`."""
        return tuple(self._layers.get(layer_name, {}))

    def entries(self, layer_name: str, device_type: str) -> tuple[DeviceEntry, ...]:
        """The device entries registered for `layer_name` on `device_type`."""
        return self._layers.get(layer_name, {}).get(device_type, ())

    def registered(self, spec: KernelMappingSpec) -> KernelMapping:
        """A new mapping with `spec` registered on top of this one.

        Registering a layer name for a device key that is already registered (the same
        device type and the same capability range, or no range) replaces that key's
        repositories, for all of its modes.
        """
        return self._with_entries(_parse_spec(spec))

    def _with_entries(self, new_entries: list[tuple[str, DeviceEntry]]) -> KernelMapping:
        layers = {name: dict(by_type) for name, by_type in self._layers.items()}
        for layer_name, entry in new_entries:
            by_type = layers.setdefault(layer_name, {})
            kept = tuple(
                old
                for old in by_type.get(entry.device.type, ())
                if old.device.properties != entry.device.properties
            )
            by_type[entry.device.type] = (*kept, entry)
        return KernelMapping({name: MappingProxyType(by_type) for name, by_type in layers.items()})

    def __repr__(self) -> str:
        return f"KernelMapping(layers={list(self._layers)})"


def _parse_spec(spec: object) -> list[tuple[str, DeviceEntry]]:
    """Validate a user-given mapping completely before anything is registered."""
    if not isinstance(spec, Mapping):
        raise KernelMappingError(
            f"A kernel mapping must be a dict of layer name -> {{device: repository}}, got "
            f"{type(spec).__name__}."
        )
    parsed = []
    for layer_name, by_device in spec.items():
        if not isinstance(layer_name, str) or not layer_name:
            raise KernelMappingError(
                f"Kernel mapping keys must be layer names (non-empty strings), got {layer_name!r}."
            )
        if not isinstance(by_device, Mapping):
            raise KernelMappingError(
                f"The mapping for layer '{layer_name}' must be a dict of device -> repository, "
                f"got {type(by_device).__name__}."
            )
        for device_key, value in by_device.items():
            device = as_device(device_key)
            repositories = _parse_repositories(layer_name, device, value)
            parsed.append((layer_name, DeviceEntry(device, repositories, next(_SEQUENCE))))
    return parsed


def _parse_repositories(
    layer_name: str, device: Device, value: object
) -> Mapping[Mode, LayerRepositoryProtocol]:
    where = f"layer '{layer_name}' on device {device}"
    if is_repository(value):
        return MappingProxyType({Mode.FALLBACK: value})
    if not isinstance(value, Mapping):
        raise KernelMappingError(
            f"The mapping for {where} must be a repository (e.g. LayerRepository) or a dict of "
            f"Mode -> repository, got {value!r}."
        )
    repositories: dict[Mode, Any] = {}
    for mode, repository in value.items():
        validate_registered_mode(mode)
        if not is_repository(repository):
            raise KernelMappingError(
                f"The mapping for {where}, mode {mode}, must be a repository with `layer_name` "
                f"and `load()` (e.g. LayerRepository), got {repository!r}."
            )
        repositories[mode] = repository
    if not repositories:
        raise KernelMappingError(f"The mapping for {where} registers no repository.")
    return MappingProxyType(repositories)


_global_mapping = KernelMapping()
_global_lock = threading.Lock()
_scoped_mapping: ContextVar[KernelMapping | None] = ContextVar(
    "kernels_scoped_mapping", default=None
)


def current_mapping() -> KernelMapping:
    """The mapping `kernelize` uses here: the innermost scope's, else the process-wide one."""
    scoped = _scoped_mapping.get()
    return _global_mapping if scoped is None else scoped


def register_kernel_mapping(mapping: KernelMappingSpec, inherit_mapping: bool = True) -> None:
    """Register kernels for layer names, devices and modes.

    Outside a `use_kernel_mapping` scope this changes the process-wide mapping that every
    thread sees; inside one, it changes only that scope. The whole mapping is validated
    before anything is registered, so a bad mapping changes nothing.

    Args:
        mapping: layer name -> device (type string or `Device`) -> repository, or ->
            ``{Mode: repository}``. A repository given without a mode is registered for
            ``Mode.FALLBACK``.
        inherit_mapping: when False, the existing mapping (of this scope, or the
            process-wide one) is cleared first.

    Example:
        ```python
        from kernels import LayerRepository, Mode, register_kernel_mapping

        register_kernel_mapping({
            "SiluAndMul": {
                "cuda": {
                    Mode.INFERENCE: LayerRepository(
                        "kernels-community/activation", layer_name="SiluAndMul", version=">=0.1,<0.2"
                    ),
                },
            },
        })
        ```
    """
    global _global_mapping
    scoped = _scoped_mapping.get()
    if scoped is not None:
        base = scoped if inherit_mapping else KernelMapping()
        _scoped_mapping.set(base.registered(mapping))
        return
    with _global_lock:
        base = _global_mapping if inherit_mapping else KernelMapping()
        _global_mapping = base.registered(mapping)


class use_kernel_mapping:  # noqa: N801 - a context manager used like a function
    """Context manager that applies a kernel mapping inside its ``with`` block only.

    The mapping is validated when `use_kernel_mapping(...)` is called; on exit (also on
    exceptions) the previous mapping is back. Scopes are private to the thread or asyncio
    task that entered them.

    Args:
        mapping: as for `register_kernel_mapping`.
        inherit_mapping: when True (default) the scope extends the mapping in effect; when
            False it starts from an empty mapping.

    Example:
        ```python
        from kernels import LocalLayerRepository, Mode, kernelize, use_kernel_mapping

        with use_kernel_mapping(
            {"SiluAndMul": {"cuda": LocalLayerRepository("/src/activation", layer_name="SiluAndMul")}},
            inherit_mapping=False,
        ):
            kernelize(model, mode=Mode.INFERENCE)
        ```
    """

    def __init__(self, mapping: KernelMappingSpec, *, inherit_mapping: bool = True):
        self._entries = _parse_spec(mapping)  # fail at the call, not at __enter__
        self._inherit = inherit_mapping
        self._tokens: list = []

    def __enter__(self) -> None:
        base = current_mapping() if self._inherit else KernelMapping()
        self._tokens.append(_scoped_mapping.set(base._with_entries(self._entries)))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        _scoped_mapping.reset(self._tokens.pop())
