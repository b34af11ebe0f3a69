"""A project's kernel dependencies, as its ``pyproject.toml`` lists them.

```toml
[tool.kernels.dependencies]
"kernels-community/activation" = ">=0.1,<0.2"     # a version specifier
"kernels-community/moe" = 1                         # the branch v1
"my-org/fused-mlp" = { version = ">=1.0,<2", trust-remote-code = true }
"someone/experiment" = { revision = "3f1c0d..." }  # a branch, tag or commit
"old-org/mirrored" = { version = ">=0.1", repo-type = "model" }  # published as a model repo
```
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import KernelLockError
from .hubclient import KERNEL_REPO_TYPE, check_repo_type
from .trust import TrustArgument, normalize_trust
from .versions import check_version_argument

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

_TABLE_KEYS = {
    "version",
    "revision",
    "trust-remote-code",
    "trust_remote_code",
    "repo-type",
    "repo_type",
}


@dataclass(frozen=True)
class Dependency:
    """One kernel a project depends on."""

    repo_id: str
    version: str | int | None = None
    revision: str | None = None
    trust_remote_code: TrustArgument = False
    #: "kernel" (the Hub's kernel repositories) or "model" (kernels published as models).
    repo_type: str = KERNEL_REPO_TYPE

    @property
    def requirement(self) -> str:
        """How the pyproject pins it, for the lock and for messages."""
        if self.revision is not None:
            return f"revision {self.revision}"
        if self.version is not None:
            return str(self.version)
        return "main (unpinned)"


def read_dependencies(project_dir: Path) -> list[Dependency]:
    """The ``[tool.kernels.dependencies]`` of ``project_dir/pyproject.toml``.

    Raises:
        KernelLockError: no pyproject.toml, invalid TOML, or a malformed entry.
    """
    path = Path(project_dir) / "pyproject.toml"
    if not path.is_file():
        raise KernelLockError(
            f"{path} does not exist; `kernels lock` reads the kernels a project depends on from "
            "[tool.kernels.dependencies] in its pyproject.toml."
        )
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise KernelLockError(f"{path} is not valid TOML: {exc}") from exc
    table = data.get("tool", {}).get("kernels", {}).get("dependencies")
    if table is None:
        raise KernelLockError(
            f"{path} has no [tool.kernels.dependencies] table. Add one, e.g.\n"
            '[tool.kernels.dependencies]\n"kernels-community/activation" = ">=0.1,<0.2"'
        )
    if not isinstance(table, dict):
        raise KernelLockError(f"[tool.kernels.dependencies] in {path} must be a table.")
    return [_dependency(repo_id, value, path) for repo_id, value in table.items()]


def _dependency(repo_id: str, value: object, path: Path) -> Dependency:
    where = f'"{repo_id}" in [tool.kernels.dependencies] of {path}'
    try:
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            check_version_argument(value, repo_id=repo_id)
            return Dependency(repo_id, version=value)
        if isinstance(value, dict):
            unknown = set(value) - _TABLE_KEYS
            if unknown:
                raise KernelLockError(
                    f"{where} has unknown keys {', '.join(sorted(unknown))}; use version, "
                    "revision, trust-remote-code and repo-type."
                )
            version = value.get("version")
            revision = value.get("revision")
            if version is not None and revision is not None:
                raise KernelLockError(f"{where} gives both version and revision; give one.")
            check_version_argument(version, repo_id=repo_id)
            trust = value.get("trust-remote-code", value.get("trust_remote_code", False))
            repo_type = value.get("repo-type", value.get("repo_type", KERNEL_REPO_TYPE))
            return Dependency(
                repo_id,
                version=version,
                revision=revision,
                trust_remote_code=normalize_trust(trust, where=f"{where}: trust-remote-code"),
                repo_type=check_repo_type(repo_type, where=f"{where}: repo-type"),
            )
    except KernelLockError:
        raise
    except Exception as exc:  # a malformed specifier or trust list
        raise KernelLockError(f"{where}: {exc}") from exc
    raise KernelLockError(
        f"{where} must be a version specifier string, an int (the branch vN) or a table with "
        f"version / revision / trust-remote-code / repo-type, got {value!r}."
    )
