"""``kernels._rust``: the data types their Rust extension implements (metadata, variants,
digests, locks), mapped onto ours.

Digests are ours (`kernels.repos.digests.variant_digests`), lock files are read and written by
ours (`kernels.repos.lock`: `parse_lock`, `KernelLock.to_hf_json`), dependencies checked as ours
(`kernels.repos.kernel_deps`), commits as ours (`hubclient.COMMIT_PATTERN`). The classes here
only give those results their shape: values that compare and hash, mappings sorted by key.
"""

from __future__ import annotations

import enum
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

from packaging.version import InvalidVersion
from packaging.version import Version as _PackagingVersion

import kernels
from kernels.errors import KernelLockError
from kernels.repos import info, kernel_deps
from kernels.repos.digests import variant_digests
from kernels.repos.hubclient import COMMIT_PATTERN
from kernels.repos.lock import KernelLock as _OurLock
from kernels.repos.lock import parse_lock
from tests.hf_suite.gaps import gaps_for

__getattr__ = gaps_for(__name__)


# Ours are Hugging Face's types already: `Backend` (a str enum under their member names) and
# `Metadata` (`from_bytes`, `read_from_file`, `backend.backend_type`).
Metadata = kernels.Metadata
Backend = info.Backend


# -- plain values ---------------------------------------------------------------------------


class Version:
    """A dotted numeric version (``12.8.0``); trailing zeros take no part in comparisons."""

    def __init__(self, parts: tuple[int, ...]) -> None:
        self._parts = parts
        self._key = _PackagingVersion(".".join(map(str, parts)))

    @staticmethod
    def from_str(s: str) -> Version:
        text = s.strip()
        if not re.fullmatch(r"[0-9]+(\.[0-9]+)*", text):
            raise ValueError(f"version must consist of numbers separated by dots: {s!r}")
        try:
            return Version(tuple(int(p) for p in text.split(".")))
        except InvalidVersion as exc:  # pragma: no cover - the pattern admits only releases
            raise ValueError(str(exc)) from None

    def __str__(self) -> str:
        return ".".join(map(str, self._parts))

    def __repr__(self) -> str:
        return f"Version({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Version) and self._key == other._key

    def __lt__(self, other: Version) -> bool:
        return self._key < other._key

    def __le__(self, other: Version) -> bool:
        return self._key <= other._key

    def __gt__(self, other: Version) -> bool:
        return self._key > other._key

    def __ge__(self, other: Version) -> bool:
        return self._key >= other._key

    def __hash__(self) -> int:
        return hash(self._key)


class KernelName(str):
    """A kernel's name as ``kernels init`` and kernel-builder accept it: lower-case letters,
    digits and dashes, starting with a letter (ours is a `str`, so it compares with one)."""

    def __new__(cls, name: str) -> KernelName:
        if not re.fullmatch(r"[a-z][-a-z0-9]*[a-z0-9]", name):
            raise ValueError(
                f"invalid kernel name {name!r}: lower-case letters, digits and dashes, starting "
                "with a letter and not ending with a dash"
            )
        return super().__new__(cls, name)

    @property
    def python_name(self) -> str:
        return self.replace("-", "_")


class Oid(str):
    """A full git commit id (40 or 64 hex digits), as our lock files and caches key commits."""

    @staticmethod
    def from_str(s: str) -> Oid:
        if not (isinstance(s, str) and COMMIT_PATTERN.match(s.lower())):
            raise ValueError(f"Invalid git object id (a full commit: 40 or 64 hex digits): {s!r}")
        return Oid(s.lower())

    def __repr__(self) -> str:
        return f"Oid({str(self)!r})"


# -- digests --------------------------------------------------------------------------------


class DigestAlgorithm(enum.Enum):
    SHA256 = "SHA256"
    SHA512 = "SHA512"

    def __str__(self) -> str:
        return self.value.lower()

    def __repr__(self) -> str:
        return f"DigestAlgorithm.{self.name}"


class DigestViolation:
    """Why a digest does not match its reference; ``str()`` is the line that names it."""

    @dataclass(frozen=True)
    class MissingFile:
        path: str

        def __str__(self) -> str:
            return f"Missing file: {self.path}"

    @dataclass(frozen=True)
    class UnknownFile:
        path: str

        def __str__(self) -> str:
            return f"Unknown file: {self.path}"

    @dataclass(frozen=True)
    class HashMismatch:
        path: str
        expected: str
        got: str

        def __str__(self) -> str:
            return f"File hash mismatch for {self.path}: expected: {self.expected}, got: {self.got}"

    @dataclass(frozen=True)
    class AlgorithmMismatch:
        expected: DigestAlgorithm
        got: DigestAlgorithm

        def __str__(self) -> str:
            return f"Algorithm mismatch: expected: {self.expected.value}, got: {self.got.value}"


class DigestValidationError(Exception):
    def __init__(self, violations: list) -> None:
        super().__init__("\n".join(str(v) for v in violations))
        self.violations = violations


@dataclass(frozen=True)
class Digest:
    """The digests of a variant's files: our `variant_digests`."""

    algorithm: DigestAlgorithm
    files: dict[str, str]

    @staticmethod
    def hash_variant(algorithm: DigestAlgorithm, variant_path: str | os.PathLike[str]) -> Digest:
        return Digest(algorithm, variant_digests(variant_path, algorithm.value.lower()))

    def validate(self, other: Digest) -> None:
        """Raise `DigestValidationError` unless `other` (actual) matches this (expected)."""
        if other.algorithm != self.algorithm:
            raise DigestValidationError(
                [DigestViolation.AlgorithmMismatch(self.algorithm, other.algorithm)]
            )
        violations: list = []
        for path in sorted(self.files.keys() | other.files.keys()):
            if path not in other.files:
                violations.append(DigestViolation.MissingFile(path))
            elif path not in self.files:
                violations.append(DigestViolation.UnknownFile(path))
            elif self.files[path] != other.files[path]:
                violations.append(
                    DigestViolation.HashMismatch(path, self.files[path], other.files[path])
                )
        if violations:
            raise DigestValidationError(violations)


# -- kernel dependencies and locks ----------------------------------------------------------


class KernelVersion:
    """What a ``kernel-depends`` entry asks for: a version N (branch ``vN``) or a revision."""

    @dataclass(frozen=True, order=True)
    class Version:
        version: int

    @dataclass(frozen=True, order=True)
    class Revision:
        revision: str


def _version_key(version: object) -> tuple:
    # Their order: versions before revisions, each by value.
    if isinstance(version, KernelVersion.Version):
        return (0, version.version, "")
    assert isinstance(version, KernelVersion.Revision), version
    return (1, 0, version.revision)


@dataclass(frozen=True)
class KernelDependency:
    """One dependency on a kernel: our `kernel_deps.KernelDependency`, its version a value."""

    repo_id: str
    version: KernelVersion.Version | KernelVersion.Revision

    def __lt__(self, other: KernelDependency) -> bool:
        return (self.repo_id, _version_key(self.version)) < (
            other.repo_id,
            _version_key(other.version),
        )

    @staticmethod
    def from_ours(dep: kernel_deps.KernelDependency) -> KernelDependency:
        if dep.version is not None:
            return KernelDependency(dep.repo_id, KernelVersion.Version(dep.version))
        assert dep.revision is not None, dep
        return KernelDependency(dep.repo_id, KernelVersion.Revision(dep.revision))

    def to_json(self) -> dict:
        key, value = (
            ("version", self.version.version)
            if isinstance(self.version, KernelVersion.Version)
            else ("revision", self.version.revision)
        )
        return {"repo-id": self.repo_id, key: value}


@dataclass(frozen=True)
class KernelLock:
    """A locked commit (an entry of Hugging Face's lock format, as our lock reader reads it)."""

    commit: Oid

    def __init__(self, commit: str) -> None:
        object.__setattr__(self, "commit", Oid.from_str(commit))

    @staticmethod
    def from_json(s: str) -> KernelLock:
        try:
            data = json.loads(s)
        except ValueError as exc:
            raise ValueError(f"a kernel lock is not JSON: {exc}") from None
        if not isinstance(data, dict) or set(data) != {"commit"}:
            raise ValueError(f'a kernel lock is {{"commit": "<commit>"}}, not {s!r}')
        return KernelLock(data["commit"])

    def to_json(self) -> str:
        return json.dumps({"commit": str(self.commit)}, indent=2)


class KernelLocks:
    """A lock file of Hugging Face's format, read and written by our `kernels.repos.lock`."""

    def __init__(self, locks: dict[KernelDependency, KernelLock]) -> None:
        self._locks = dict(sorted(locks.items()))

    def __len__(self) -> int:
        return len(self._locks)

    def __getitem__(self, dependency: KernelDependency) -> KernelLock:
        return self._locks[dependency]

    def __contains__(self, dependency: object) -> bool:
        return dependency in self._locks

    def __iter__(self) -> Iterator[KernelDependency]:
        return iter(self._locks)

    def get(self, dependency: KernelDependency, default: KernelLock | None = None):
        return self._locks.get(dependency, default)

    def keys(self) -> list[KernelDependency]:
        return list(self._locks)

    def values(self) -> list[KernelLock]:
        return list(self._locks.values())

    def items(self) -> list[tuple[KernelDependency, KernelLock]]:
        return list(self._locks.items())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KernelLocks) and self._locks == other._locks

    def __hash__(self) -> int:
        return hash(tuple(self._locks.items()))

    def __repr__(self) -> str:
        return f"KernelLocks({self._locks!r})"

    @staticmethod
    def from_json(s: str) -> KernelLocks:
        try:
            ours = parse_lock(s, where="kernels.lock")
        except KernelLockError as exc:
            raise ValueError(str(exc)) from None
        return KernelLocks({_dependency_of(lock): KernelLock(lock.sha) for lock in ours})

    def to_json(self) -> str:
        ours = [_ours(dep, lock) for dep, lock in self._locks.items()]
        return json.dumps([lock.to_hf_json() for lock in ours], indent=2)


def _dependency_of(lock: _OurLock) -> KernelDependency:
    if isinstance(lock.version, int):
        return KernelDependency(lock.repo_id, KernelVersion.Version(lock.version))
    return KernelDependency(lock.repo_id, KernelVersion.Revision(lock.ref or lock.sha))


def _ours(dep: KernelDependency, lock: KernelLock) -> _OurLock:
    """The entry our lock writer writes for `dep` locked at `lock` (checked as we read one)."""
    data = {"dependency": dep.to_json(), "lock": {"commit": str(lock.commit)}}
    return _OurLock.from_json(data, where="kernels.lock")
