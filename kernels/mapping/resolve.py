"""Choosing the repository for one tagged layer: layer name -> device type -> capability -> mode.

Resolution is pure: it reads a `KernelMapping` and loads nothing, so `kernelize` and
`explain` share it and it can be tested without any kernel code.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from ..repos.base import LayerRepositoryProtocol
from .device import Device
from .mode import Mode, preferred_modes
from .registry import DeviceEntry, KernelMapping


@dataclass(frozen=True)
class Candidate:
    """One repository registered for a layer: under which device key and for which mode."""

    device: Device
    mode: Mode
    repository: LayerRepositoryProtocol

    def __str__(self) -> str:
        return f"{self.repository} [device {self.device}, mode {self.mode}]"


#: Why a resolution found nothing, one value per ``KernelizeFallback`` cause of Hugging Face's
#: kernels 0.19: no entry for the layer name, none for the device type, none whose capability
#: range admits the device, or none registered for a mode that serves the one asked for.
NO_LAYER = "no_layer"
NO_DEVICE = "no_device"
NO_COMPATIBLE_PROPERTIES = "no_compatible_properties"
NO_COMPATIBLE_MODE = "no_compatible_mode"


@dataclass(frozen=True)
class Resolution:
    """The outcome of resolving one layer name, with the reasons behind it."""

    layer_name: str
    device_type: str
    capability: int | None
    mode: Mode
    #: The winning candidate, or None when no registered repository fits.
    chosen: Candidate | None
    #: Why `chosen` won, or why nothing did.
    reason: str
    #: Every other registered candidate for this layer and device type, with why it lost.
    passed_over: tuple[tuple[Candidate, str], ...] = ()
    #: When `chosen` is None, which of NO_LAYER, NO_DEVICE, NO_COMPATIBLE_PROPERTIES or
    #: NO_COMPATIBLE_MODE it was; None when a candidate was chosen.
    cause: str | None = None


def resolve(
    mapping: KernelMapping,
    layer_name: str,
    *,
    device_type: str,
    capability: int | None,
    mode: Mode,
) -> Resolution:
    """Pick the repository that serves `layer_name` on this device in this mode.

    Device entries whose capability range contains `capability` are tried narrowest first
    (a later registration wins among equally narrow ones; an entry without a range covers
    all capabilities and comes last). Within an entry, the registered modes are tried in
    the order `preferred_modes(mode)` gives. The first hit wins; when the narrowest entry
    has no mode that fits, the next entry is tried.
    """

    def nothing(cause: str, reason: str, passed_over=()) -> Resolution:
        return Resolution(
            layer_name, device_type, capability, mode, None, reason, tuple(passed_over), cause
        )

    if layer_name not in mapping.layer_names():
        reason = f"no kernel is registered for layer name '{layer_name}'"
        close = _close_names(layer_name, mapping.layer_names())
        if close:
            listed = ", ".join(f"'{name}'" for name in close)
            reason += f"; the mapping has {listed}: did you mean '{layer_name}'?"
        return nothing(NO_LAYER, reason)
    entries = mapping.entries(layer_name, device_type)
    if not entries:
        others = ", ".join(mapping.device_types(layer_name)) or "none"
        return nothing(
            NO_DEVICE,
            f"layer '{layer_name}' has kernels for device types {others}, not for {device_type}",
        )

    fitting: list[DeviceEntry] = []
    passed_over: list[tuple[Candidate, str]] = []
    for entry in entries:
        misfit = _capability_misfit(entry.device, capability)
        if misfit is None:
            fitting.append(entry)
        else:
            passed_over.extend((candidate, misfit) for candidate in _candidates(entry))
    fitting.sort(key=_specificity)

    usable_modes = preferred_modes(mode)
    chosen: Candidate | None = None
    for entry in fitting:
        for candidate in sorted(_candidates(entry), key=lambda c: _mode_rank(c.mode, usable_modes)):
            if chosen is not None:
                passed_over.append((candidate, f"{chosen.repository} was preferred"))
            elif candidate.mode in usable_modes:
                chosen = candidate
            else:
                passed_over.append(
                    (
                        candidate,
                        f"registered for mode {candidate.mode}, which does not serve {mode}",
                    )
                )

    if chosen is None:
        cause = NO_COMPATIBLE_MODE if fitting else NO_COMPATIBLE_PROPERTIES
        if not fitting:
            ranges = ", ".join(str(e.device.properties) for e in entries)
            shown = capability if capability is not None else "unknown"
            reason = (
                f"no kernel for layer '{layer_name}' on {device_type} covers capability {shown} "
                f"(registered: {ranges})"
            )
        else:
            modes = ", ".join(sorted({str(m) for e in fitting for m in e.repositories}))
            reason = (
                f"the kernels for layer '{layer_name}' on {device_type} are registered for modes "
                f"{modes}, none of which serves {mode}"
            )
        return nothing(cause, reason, passed_over)
    return Resolution(
        layer_name,
        device_type,
        capability,
        mode,
        chosen,
        f"registered for device {chosen.device} and mode {chosen.mode}",
        tuple(passed_over),
    )


#: How alike (difflib's ratio, after lower-casing) a mapping key must be to a layer name to
#: be shown as a likely typo. 0.85 admits a case slip or one swapped or missing letter in
#: names like 'RMSNorm', but not a different layer of the same family ('GeluAndMul' for
#: 'SiluAndMul' scores 0.8).
_TYPO_CUTOFF = 0.85
#: Below this length one letter is a different name ('GeGLU' is not a typo of 'GELU'), so
#: shorter names are only matched when they differ in case alone.
_TYPO_MIN_LENGTH = 6


def _close_names(layer_name: str, names: tuple[str, ...]) -> list[str]:
    """The mapping keys that look like misspellings of `layer_name`, closest first."""
    wanted = layer_name.lower()
    same_but_case = [name for name in names if name.lower() == wanted]
    if same_but_case or len(wanted) < _TYPO_MIN_LENGTH:
        return same_but_case[:3]
    by_lower: dict[str, list[str]] = {}
    for name in names:
        if len(name) >= _TYPO_MIN_LENGTH:
            by_lower.setdefault(name.lower(), []).append(name)
    close = difflib.get_close_matches(wanted, by_lower, n=3, cutoff=_TYPO_CUTOFF)
    return [name for lowered in close for name in by_lower[lowered]][:3]


def _candidates(entry: DeviceEntry) -> list[Candidate]:
    return [Candidate(entry.device, m, repo) for m, repo in entry.repositories.items()]


def _capability_misfit(device: Device, capability: int | None) -> str | None:
    """None when `device`'s capability range admits `capability`, else why not."""
    if device.properties is None:
        return None
    if capability is None:
        return (
            f"needs {device.properties}, but the capability of this {device.type} device is "
            "unknown (no such device is visible)"
        )
    if capability in device.properties:
        return None
    return f"needs {device.properties}; this device has capability {capability}"


def _specificity(entry: DeviceEntry) -> tuple[float, int]:
    width = float("inf") if entry.device.properties is None else entry.device.properties.width
    return (width, -entry.sequence)


def _mode_rank(registered: Mode, usable: tuple[Mode, ...]) -> int:
    return usable.index(registered) if registered in usable else len(usable)
