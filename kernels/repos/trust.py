"""Whose kernel code may be downloaded and run.

A Hub kernel is code: loading one runs it in this process. Code from a repository is run
only when its organisation (the part of the repository id before the ``/``) or the
repository itself is trusted:

* by default, the organisations in `DEFAULT_TRUSTED_ORGS`;
* organisations and repositories listed in the environment variable ``KERNELS_TRUSTED_ORGS``
  (comma-separated; an entry with a ``/`` is a repository);
* ``trusted_orgs`` and ``trusted_repos`` in the YAML file ``$KERNELS_CONFIG``, else
  ``$XDG_CONFIG_HOME/kernels/config.yaml``, else ``~/.config/kernels/config.yaml``;
* per call, ``trust_remote_code=True`` (anything) or ``trust_remote_code=["org", "org/name"]``.

Names are compared case-insensitively, as the Hub treats them. Local repositories are not
checked: they are code the user already has.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import KernelMappingError, UntrustedKernelError

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


def normalize_trust(value: object, *, where: str = "trust_remote_code") -> TrustArgument:
    """Check a `trust_remote_code` argument and return it as a bool or a tuple of names."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise KernelMappingError(
            f"{where} must be True, False or a list of organisations / repository ids such as "
            f"['my-org', 'someone/kernel'], got {value!r}."
        )
    names = tuple(value)
    for name in names:
        if not isinstance(name, str) or not name.strip() or name.count("/") > 1:
            raise KernelMappingError(
                f"{where} lists {name!r}; entries must be organisations ('my-org') or "
                "repository ids ('my-org/kernel')."
            )
    return names


def config_path() -> Path:
    """The YAML configuration file that `kernels` reads (it need not exist)."""
    explicit = os.environ.get(ENV_CONFIG)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "kernels" / "config.yaml"


def read_config() -> dict:
    """The configuration file's contents ({} when there is none).

    Raises:
        KernelMappingError: the file is not YAML, or not a mapping.
    """
    import yaml

    path = config_path()
    if not path.is_file():
        if os.environ.get(ENV_CONFIG):
            logger.warning("%s=%s does not exist; using no configuration file", ENV_CONFIG, path)
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise KernelMappingError(
            f"The kernels configuration file {path} is not valid YAML: {exc}"
        ) from exc
    if not isinstance(data, dict):
        raise KernelMappingError(
            f"The kernels configuration file {path} must hold a mapping such as "
            "'trusted_orgs: [my-org]', got a {type(data).__name__}."
        )
    return data


def configured_trust() -> dict[str, str]:
    """Every organisation or repository trusted without a per-call argument, with its source."""
    trusted: dict[str, str] = {org: "trusted by default" for org in DEFAULT_TRUSTED_ORGS}
    config = read_config()
    path = config_path()
    for key in ("trusted_orgs", "trusted_repos"):
        entries = config.get(key) or []
        if isinstance(entries, str) or not isinstance(entries, list):
            raise KernelMappingError(f"{key} in {path} must be a list of names, got {entries!r}.")
        for entry in entries:
            trusted.setdefault(str(entry).strip().lower(), f"listed in {key} in {path}")
    for entry in os.environ.get(ENV_TRUSTED, "").split(","):
        if entry.strip():
            trusted.setdefault(entry.strip().lower(), f"listed in {ENV_TRUSTED}")
    return trusted


def decide_trust(repo_id: str, trust_remote_code: TrustArgument = False) -> TrustDecision:
    """Decide whether code from the Hub repository `repo_id` may be downloaded and run."""
    org = repo_id.split("/")[0].lower() if "/" in repo_id else None
    repo = repo_id.lower()
    if trust_remote_code is True:
        return TrustDecision(repo_id, True, "trusted by the caller (trust_remote_code=True)")
    if isinstance(trust_remote_code, Sequence) and not isinstance(trust_remote_code, str):
        listed = {n.strip().lower() for n in trust_remote_code}
        if repo in listed:
            return TrustDecision(repo_id, True, f"repository {repo_id} listed in trust_remote_code")
        if org is not None and org in listed:
            return TrustDecision(repo_id, True, f"organisation {org} listed in trust_remote_code")
    trusted = configured_trust()
    if repo in trusted:
        return TrustDecision(repo_id, True, f"repository {repo_id} {trusted[repo]}")
    if org is not None and org in trusted:
        return TrustDecision(repo_id, True, f"organisation {org} {trusted[org]}")
    return TrustDecision(repo_id, False, f"organisation {org or '(none)'} is not trusted")


def require_trust(repo_id: str, trust_remote_code: TrustArgument = False) -> TrustDecision:
    """`decide_trust`, raising when the answer is no; logs the decision either way.

    Raises:
        UntrustedKernelError: the message says the four ways to allow the repository.
    """
    decision = decide_trust(repo_id, trust_remote_code)
    if not decision.trusted:
        org = repo_id.split("/")[0] if "/" in repo_id else repo_id
        logger.info("Refusing to run kernel code from %s: %s", repo_id, decision.reason)
        raise UntrustedKernelError(
            f"Refusing to download and run kernel code from {repo_id}: {decision.reason} "
            f"(trusted: {', '.join(sorted(configured_trust()))}). If you trust its authors, "
            f"pass trust_remote_code=True or trust_remote_code=[{org!r}] (or [{repo_id!r}]), "
            f"set {ENV_TRUSTED}={org}, or add '{org}' to trusted_orgs in {config_path()}. "
            "See docs/hub.md#trust."
        )
    logger.info("Trusting kernel code from %s: %s", repo_id, decision.reason)
    return decision
