"""``kernels._internals.backends``: their backend values (``CUDA(Version("12.8"))``, ``CPU()``...),
read and spelled by our `kernels.repos.variant_names` (`parse_backend`, `spell_backend`).

Their tests build these as values and compare them; the spelling a backend was read in
(``cu128`` or ``cuda-12.8``) is kept for `variant_str` but takes no part in equality, as in
ours (`BuildVariant.identity`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from packaging.version import Version

from kernels.repos import variant_names
from tests.hf_suite.gaps import gaps_for

__getattr__ = gaps_for(__name__)


class Backend:
    """What every backend value has: its `name` and its `variant_str`."""

    name: ClassVar[str]

    @property
    def variant_str(self) -> str:
        return variant_names.spell_backend(
            self.name, getattr(self, "version", None), legacy=getattr(self, "legacy", False)
        )


@dataclass(frozen=True)
class _Versioned(Backend):
    version: Version
    #: Whether it was read from (or is spelled as) a legacy name: ``cu128``.
    legacy: bool = field(default=True, compare=False)

    @classmethod
    def parse(cls, parts: list[str], *, legacy: bool = True) -> Backend:
        return _of_class(cls, parse_backend(parts, legacy=legacy), parts)


@dataclass(frozen=True)
class _Unversioned(Backend):
    @classmethod
    def parse(cls, parts: list[str]) -> Backend:
        return _of_class(cls, parse_backend(parts, legacy=False), parts)


class CUDA(_Versioned):
    name = "cuda"


class ROCm(_Versioned):
    name = "rocm"


class XPU(_Versioned):
    name = "xpu"


class CANN(_Versioned):
    name = "cann"


class CPU(_Unversioned):
    name = "cpu"


class Metal(_Unversioned):
    name = "metal"


class Neuron(_Unversioned):
    name = "neuron"


class TPU(_Unversioned):
    name = "tpu"


_BY_NAME: dict[str, type[Backend]] = {
    b.name: b for b in (CUDA, ROCm, XPU, CANN, CPU, Metal, Neuron, TPU)
}


def _of_class(cls: type[Backend], backend: Backend, parts: list[str]) -> Backend:
    if not isinstance(backend, cls):
        raise ValueError(f"{'-'.join(parts)!r} is not a {cls.__name__} backend")
    return backend


def from_ours(name: str, version: Version | None, *, legacy: bool) -> Backend:
    """The backend value of our (name, version) pair."""
    cls = _BY_NAME[name]
    if issubclass(cls, _Versioned):
        assert version is not None, name  # our parser gives every versioned backend one
        return cls(version, legacy=legacy)
    return cls()


def parse_backend(parts: list[str], *, legacy: bool = True) -> Backend:
    """A backend from a variant name's parts: ``["cu128"]`` (legacy, their default) or
    ``["cuda", "12.8"]``; a ValueError for anything else."""
    name, version = variant_names.parse_backend(list(parts), legacy=legacy)
    return from_ours(name, version, legacy=legacy)


def _get_torch_privateuse_backend_name() -> str | None:
    """The name torch gives its private-use device (their conftest asks it whether an Ascend
    NPU is present): torch's own answer, no behaviour of a kernels client."""
    return torch._C._get_privateuse1_backend_name()
