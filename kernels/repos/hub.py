"""Kernel repositories on the Hugging Face Hub."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType

from ..errors import KernelMappingError


@dataclass(frozen=True)
class LayerRepository:
    """A kernel layer from a kernel repository on the Hugging Face Hub.

    Args:
        repo_id: the Hub repository, e.g. ``"kernels-community/activation"``.
        layer_name: the class in the kernel package's ``layers`` module.
        revision: a branch, tag or commit. Cannot be combined with `version`.
        version: a PEP 440 specifier such as ``">=0.1,<0.2"`` (the highest ``v<x.y.z>`` tag
            that satisfies it), or an int N for the branch ``vN``.

    Example:
        ```python
        from kernels import LayerRepository

        repo = LayerRepository(
            "kernels-community/activation", layer_name="SiluAndMul", version=">=0.0.4,<0.1.0"
        )
        ```
    """

    repo_id: str
    layer_name: str = field(kw_only=True)
    revision: str | None = field(default=None, kw_only=True)
    version: str | int | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if self.revision is not None and self.version is not None:
            raise KernelMappingError(
                f"LayerRepository('{self.repo_id}') got both revision={self.revision!r} and "
                f"version={self.version!r}; give one of them."
            )

    def load(self) -> ModuleType:
        """Download (if needed) and import the kernel package."""
        from .download import get_kernel

        return get_kernel(self.repo_id, revision=self.revision, version=self.version)

    def __str__(self) -> str:
        pin = (
            f"version {self.version}"
            if self.version is not None
            else f"revision {self.revision or 'main'}"
        )
        return f"{self.repo_id} ({pin}), layer {self.layer_name}"
