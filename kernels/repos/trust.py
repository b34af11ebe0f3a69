"""Whose kernel code may be downloaded and run.

A Hub kernel is code: loading one runs it in this process. Code from a repository is run
only when its organisation (the part of the repository id before the ``/``) or the
repository itself is trusted:

* by default, the organisations in `DEFAULT_TRUSTED_ORGS`;
* organisations and repositories listed in the environment variable ``KERNELS_TRUSTED_ORGS``
  (comma-separated; an entry with a ``/`` is a repository, one without an organisation);
* ``trusted_orgs`` (organisations) and ``trusted_repos`` (``org/name`` repositories) in the
  YAML file ``$KERNELS_CONFIG``, else ``$XDG_CONFIG_HOME/kernels/config.yaml``, else
  ``~/.config/kernels/config.yaml``;
* per call, ``trust_remote_code=True`` (anything) or ``trust_remote_code=["org", "org/name"]``.

How names are compared, so that nothing merely resembling a trusted name passes:

* Every repository id is checked first (`kernels.repos.repo_id.check_repo_id`): ASCII letters,
  digits, ``-``, ``_`` and ``.`` only, so Unicode look-alikes of a trusted organisation (KELVIN
  SIGN for ``K``, fullwidth or Cyrillic letters, a dotless i, a zero-width space) are refused
  before any decision. Every trust entry (argument, environment, file) is checked the same way,
  and one that is not a valid name is an error naming its source, never silently dropped.
* Names are then compared exactly after folding ASCII case (`kernels.repos.repo_id.fold`), as
  the Hub treats names; ``str.lower()`` is never used, since it maps non-ASCII letters onto ASCII.
* Organisation entries and repository entries are kept apart: an organisation entry trusts the
  repositories whose owner it is, a repository entry only that repository.
* An owner-less repository id (``"gpt2"``) has no organisation, so no organisation entry trusts
  it, and repository entries are ``org/name``: only ``trust_remote_code=True`` runs its code.
  (Kernel repositories on the Hub always have an owner; an owner-less id is either a typo for an
  organisation or a legacy model, and neither should inherit an organisation's trust.)

Local repositories are not checked: they are code the user already has.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import KernelMappingError, UntrustedKernelError
from .repo_id import check_repo_id, fold, is_repo_id, owner_of, shown
from .safe_yaml import read_yaml_file

logger = logging.getLogger(__name__)

#: Organisations trusted without configuration: where our own kernels are published, and
#: the Hugging Face community kernels that transformers uses.
DEFAULT_TRUSTED_ORGS: tuple[str, ...] = ("kernels-triton", "kernels-community")

ENV_TRUSTED = "KERNELS_TRUSTED_ORGS"
ENV_CONFIG = "KERNELS_CONFIG"

#: The type of the `trust_remote_code` argument, normalised (lists become tuples so the
#: repositories that carry it stay hashable).
TrustArgument = bool | tuple[str, ...]


@dataclass(frozen=True)
class TrustDecision:
    """Whether code from a repository may run, and why."""

    repo_id: str
    trusted: bool
    reason: str

    def as_json(self) -> dict[str, object]:
        return {"trusted": self.trusted, "reason": self.reason}


@dataclass(frozen=True)
class TrustedNames:
    """Trusted organisations and repositories, ASCII-case-folded, each with where it came from."""

    orgs: Mapping[str, str] = field(default_factory=dict)
    repos: Mapping[str, str] = field(default_factory=dict)

    def match(self, repo_id: str) -> str | None:
        """Why the checked id `repo_id` is trusted by these names, or None if it is not."""
        folded = fold(repo_id)
        if folded in self.repos:
            return f"repository {repo_id} {self.repos[folded]}"
        owner = owner_of(repo_id)
        if owner is not None and fold(owner) in self.orgs:
            return f"organisation {fold(owner)} {self.orgs[fold(owner)]}"
        return None

    def names(self) -> list[str]:
        """Every trusted organisation and repository (folded), sorted, for messages."""
        return sorted({*self.orgs, *self.repos})


def is_org_name(value: object) -> bool:
    """Whether `value` is a well-formed organisation (or user) name: a repo id without '/'."""
    return isinstance(value, str) and "/" not in value and is_repo_id(value)


def normalize_trust(value: object, *, where: str = "trust_remote_code") -> TrustArgument:
    """Check a `trust_remote_code` argument and return it as a bool or a tuple of names.

    Each listed name is an organisation (``"my-org"``) or a repository id (``"my-org/kernel"``)
    in ASCII, surrounding whitespace removed; anything else is refused rather than ignored, so
    a look-alike or misspelt entry never silently trusts less (or more) than it says.

    Raises:
        KernelMappingError: `value` is neither a bool nor a list of such names.
    """
    if isinstance(value, bool):
        return value
    # A mapping is refused too: iterating it would silently trust its keys.
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise KernelMappingError(
            f"{where} must be True, False or a list of organisations / repository ids such as "
            f"['my-org', 'someone/kernel'], got {shown(value)}."
        )
    names = []
    for entry in value:
        name = entry.strip() if isinstance(entry, str) else entry
        if not (is_org_name(name) or is_repo_id(name) and "/" in name):
            raise KernelMappingError(
                f"{where} lists {shown(entry)}, which is neither an organisation ('my-org') nor "
                "a repository id ('my-org/kernel'); names are ASCII letters, digits, '-', '_' "
                "and '.'."
            )
        names.append(name)
    return tuple(names)


def config_path() -> Path:
    """The YAML configuration file that `kernels` reads (it need not exist)."""
    explicit = os.environ.get(ENV_CONFIG)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "kernels" / "config.yaml"


def read_config() -> dict:
    """The configuration file's contents ({} when there is none).

    The file is read through `kernels.repos.safe_yaml` (no aliases, at most 1 MiB).

    Raises:
        KernelMappingError: the file is not acceptable YAML, too large, or not a mapping.
    """
    path = config_path()
    if not path.is_file():
        if os.environ.get(ENV_CONFIG):
            logger.warning("%s=%s does not exist; using no configuration file", ENV_CONFIG, path)
        return {}
    data = read_yaml_file(path, error=KernelMappingError)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise KernelMappingError(
            f"The kernels configuration file {path} must hold a mapping such as "
            f"'trusted_orgs: [my-org]', got a {type(data).__name__}."
        )
    return data


def configured_trust() -> TrustedNames:
    """Every organisation and repository trusted without a per-call argument, with its source.

    Raises:
        KernelMappingError: the configuration file or ``KERNELS_TRUSTED_ORGS`` lists something
            that is not a valid name, or in the wrong place; the message names the source.
    """
    orgs: dict[str, str] = {fold(org): "trusted by default" for org in DEFAULT_TRUSTED_ORGS}
    repos: dict[str, str] = {}
    config = read_config()
    path = config_path()
    for key, table, is_valid, form in (
        ("trusted_orgs", orgs, is_org_name, "an organisation name such as 'my-org'"),
        ("trusted_repos", repos, _is_owned_repo_id, "a repository id such as 'my-org/kernel'"),
    ):
        entries = config.get(key)
        if entries is None:
            continue
        if not isinstance(entries, list):
            raise KernelMappingError(
                f"{key} in {path} must be a list of names, e.g. '{key}: [...]', got "
                f"{shown(entries)}."
            )
        for entry in entries:
            if not is_valid(entry):
                raise KernelMappingError(
                    f"{key} in {path} lists {shown(entry)}; each entry must be {form} (ASCII "
                    "letters, digits, '-', '_' and '.'; quote names YAML would read as numbers)"
                    f"{_elsewhere_hint(key, entry)}."
                )
            table.setdefault(fold(entry), f"listed in {key} in {path}")
    for raw in os.environ.get(ENV_TRUSTED, "").split(","):
        entry = raw.strip()
        if not entry:
            continue
        if is_org_name(entry):
            orgs.setdefault(fold(entry), f"listed in {ENV_TRUSTED}")
        elif _is_owned_repo_id(entry):
            repos.setdefault(fold(entry), f"listed in {ENV_TRUSTED}")
        else:
            raise KernelMappingError(
                f"{ENV_TRUSTED} lists {shown(entry)}, which is neither an organisation "
                "('my-org') nor a repository id ('my-org/kernel') in ASCII letters, digits, "
                f"'-', '_' and '.'. Fix or remove it (entries are separated by commas)."
            )
    return TrustedNames(orgs, repos)


def decide_trust(
    repo_id: str, trust_remote_code: TrustArgument | list[str] = False
) -> TrustDecision:
    """Decide whether code from the Hub repository `repo_id` may be downloaded and run.

    Raises:
        KernelRepositoryNotFoundError: `repo_id` is not a valid Hub repository id (it is
            refused before anything is compared with it).
        KernelMappingError: `trust_remote_code` or the configuration is malformed.
    """
    repo_id = check_repo_id(repo_id)
    allowed = normalize_trust(trust_remote_code)
    if allowed is True:
        return TrustDecision(repo_id, True, "trusted by the caller (trust_remote_code=True)")
    if owner_of(repo_id) is None:
        configured_trust()  # a malformed configuration is reported whatever the id
        return TrustDecision(
            repo_id,
            False,
            f"{repo_id} names no organisation, and only trust_remote_code=True trusts a "
            "repository without one",
        )
    if allowed:
        listed = TrustedNames(
            {fold(n): "listed in trust_remote_code" for n in allowed if "/" not in n},
            {fold(n): "listed in trust_remote_code" for n in allowed if "/" in n},
        )
        reason = listed.match(repo_id)
        if reason is not None:
            return TrustDecision(repo_id, True, reason)
    reason = configured_trust().match(repo_id)
    if reason is not None:
        return TrustDecision(repo_id, True, reason)
    return TrustDecision(
        repo_id, False, f"organisation {fold(owner_of(repo_id) or '')} is not trusted"
    )


def require_trust(
    repo_id: str, trust_remote_code: TrustArgument | list[str] = False
) -> TrustDecision:
    """`decide_trust`, raising when the answer is no; logs the decision either way.

    Raises:
        UntrustedKernelError: the message says the ways to allow the repository.
        KernelRepositoryNotFoundError, KernelMappingError: as `decide_trust`.
    """
    decision = decide_trust(repo_id, trust_remote_code)
    if not decision.trusted:
        logger.info("Refusing to run kernel code from %s: %s", repo_id, decision.reason)
        trusted = ", ".join(configured_trust().names())
        org = owner_of(repo_id)
        if org is None:
            how = (
                "If you trust its authors, pass trust_remote_code=True, or name the repository "
                "with its organisation ('org/name')."
            )
        else:
            how = (
                "If you trust its authors, pass trust_remote_code=True or "
                f"trust_remote_code=[{org!r}] (or [{repo_id!r}]), set {ENV_TRUSTED}={org}, or "
                f"add '{org}' to trusted_orgs in {config_path()}."
            )
        raise UntrustedKernelError(
            f"Refusing to download and run kernel code from {repo_id}: {decision.reason} "
            f"(trusted: {trusted}). {how} See docs/hub.md#trust."
        )
    logger.info("Trusting kernel code from %s: %s", repo_id, decision.reason)
    return decision


def _is_owned_repo_id(value: object) -> bool:
    return isinstance(value, str) and "/" in value and is_repo_id(value)


def _elsewhere_hint(key: str, entry: object) -> str:
    """Where a valid name listed under the wrong key belongs."""
    if key == "trusted_orgs" and _is_owned_repo_id(entry):
        return "; a repository belongs in trusted_repos"
    if key == "trusted_repos" and is_org_name(entry):
        return (
            "; an organisation belongs in trusted_orgs, and a repository without an "
            "organisation is trusted only by trust_remote_code=True"
        )
    return ""
