"""Sigstore signatures of kernel builds: who built a variant, and that its files are theirs.

kernel-builder signs each build variant's ``metadata.json`` in the publisher's CI with
sigstore's keyless signing and stores the bundle beside it as ``metadata.json.sigstore``
(Hugging Face's `kernels` 0.17 checks it in ``kernels verify-signature``). Checking a variant
is, in order, as theirs does:

1. the bundle is read and parsed (missing or malformed: the variant is not verified);
2. ``metadata.json`` is verified against it with sigstore, BEFORE it is parsed, so that a
   forged file never reaches a JSON parser. The signing certificate must satisfy a
   `GitHubWorkflowPolicy`: issued to a GitHub Actions workflow (OIDC issuer
   ``https://token.actions.githubusercontent.com``) of the publisher's repository, and one of
   its listed workflow files at a listed ref. `DEFAULT_POLICIES` accepts Hugging Face's
   kernels-community builds, as their client does; ``KERNELS_SIGNERS`` (or the
   ``policies`` argument, or ``--signer``) adds other publishers;
3. the signed bytes are parsed as the variant's metadata, which must carry file digests;
4. every file of the variant is hashed against those digests (`kernels.repos.digests`).

What this proves: the variant's files are byte for byte what the publisher's workflow signed.
What it does not: that the workflow's code is benign, or that the commit loaded is the one
you meant (that is what locks are for).

**Trust root, offline by default.** Verifying a bundle needs no network: the bundle carries
the certificate, the signature, the transparency log's inclusion proof and signed time, and
the trust root (Fulcio's CA, Rekor's keys) ships inside the ``sigstore`` package (or its TUF
cache). So `Verifier.production(offline=True)` is used: a load never waits on, nor fails for,
sigstore's servers, and HF_HUB_OFFLINE machines verify like any other. The price is that a key
rotated after the installed ``sigstore`` was released is unknown until ``sigstore`` is
upgraded; ``KERNELS_SIGSTORE_REFRESH=1`` lets sigstore refresh its trust root over TUF first
(ignored while HF_HUB_OFFLINE is set).

**Load-time checking**, as Hugging Face's client 0.19 does it: when ``sigstore`` is installed,
every Hub variant's signature is checked before any of its code is imported, and one that is
unsigned or does not verify is loaded with a WARNING saying so. With
``KERNELS_REQUIRE_SIGNATURES=1`` such a variant is refused instead (`KernelSignatureError`),
and ``sigstore`` must be installed. "Hub variant" means the variant folder the load fetched
(``snapshots/<commit>/build/<variant>``), whatever the layout of the package inside it: a build
whose package files sit directly in the variant folder without ``metadata.json``, or whose
``metadata.json`` sits in the package folder, is still a Hub build, and unsigned.

Success leaves a receipt in the cache (``.kernels-files/<commit>/signed/<variant>.json``)
sealed with the user's secret key (`kernels.repos.receipt_key`) over the variant folder, the
hashes of the signed metadata and of the bundle, and the policies; a warm load re-reads two
small files and verifies no signature; the files themselves are then checked against the
digests through their own sealed receipt (`kernels.repos.digests`). A receipt that another
cache writer made does not verify without the user's key: it is ignored and the signature is
verified again. Local folders (`LocalLayerRepository`, `get_local_kernel`,
``LOCAL_KERNELS``) are exempt: their code is your own, under development and unsigned.

``sigstore`` is an optional dependency (``pip install 'kernels[signatures]'``); it is imported
only when a signature is checked.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import importlib.util
import json
import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import KernelHashMismatchError, KernelMetadataError, KernelSignatureError
from . import hubclient
from .bounded_json import parse_json, read_bounded
from .cache_records import read_json, write_json
from .digests import check_digests, receipt_path
from .info import MAX_METADATA_SIZE, METADATA_FILE, Metadata
from .receipt_key import holds, seal

logger = logging.getLogger(__name__)

#: The signature bundle beside each variant's metadata.json.
BUNDLE_FILE = f"{METADATA_FILE}.sigstore"

#: Set to 1 to refuse every Hub kernel build whose signature does not verify.
ENV_REQUIRE = "KERNELS_REQUIRE_SIGNATURES"
#: Workflow URIs (separated by whitespace or commas) of publishers accepted besides
#: `DEFAULT_POLICIES`, e.g. ``https://github.com/me/kernels/.github/workflows/build.yaml@refs/heads/main``.
ENV_SIGNERS = "KERNELS_SIGNERS"
#: Set to 1 to let sigstore refresh its trust root over the network (TUF) before verifying.
ENV_REFRESH = "KERNELS_SIGSTORE_REFRESH"

#: The OIDC issuer of GitHub Actions' identity tokens.
GITHUB_ISSUER = "https://token.actions.githubusercontent.com"

INSTALL_HINT = "pip install 'kernels[signatures]'"

# A real bundle is about 10 KiB; anything far larger is not one.
_MAX_BUNDLE_SIZE = 1 << 20
_RECEIPTS = "signed"
_RECEIPT_FORMAT = 2
_MAX_RECEIPT_BYTES = 4096
_WORKFLOW_URI = re.compile(
    r"https://github\.com/(?P<repo>[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)"
    r"/\.github/workflows/[A-Za-z0-9_./-]+\.ya?ml@refs/[\x21-\x7e]+"
)
_REPOSITORY = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class GitHubWorkflowPolicy:
    """Accept builds signed by one of `workflows` of the GitHub repository `repository`.

    The signing certificate must name GitHub Actions as its OIDC issuer, the repository as
    its source repository and one of the workflows (with the ref it ran at) as its build
    signer, as Hugging Face's client requires.

    Args:
        repository: ``org/name`` on GitHub.
        workflows: workflow URIs, each
            ``https://github.com/<org>/<name>/.github/workflows/<file>.yaml@<ref>``.

    Raises:
        ValueError: no workflow, or a repository or workflow URI of another form.

    Example:
        ```python
        from kernels.repos.signatures import GitHubWorkflowPolicy

        mine = GitHubWorkflowPolicy.from_workflow(
            "https://github.com/me/kernels/.github/workflows/build.yaml@refs/heads/main"
        )
        ```
    """

    repository: str
    workflows: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "workflows", tuple(self.workflows))
        if not (isinstance(self.repository, str) and _REPOSITORY.fullmatch(self.repository)):
            raise ValueError(
                f"{self.repository!r} is not a GitHub repository (org/name), e.g. "
                "huggingface/kernels-community."
            )
        if not self.workflows:
            raise ValueError(f"A signing policy for {self.repository} needs at least one workflow.")
        for uri in self.workflows:
            match = _WORKFLOW_URI.fullmatch(uri) if isinstance(uri, str) else None
            if match is None or match["repo"] != self.repository:
                raise ValueError(
                    f"{uri!r} is not a workflow URI of {self.repository}: write it as "
                    f"https://github.com/{self.repository}/.github/workflows/<file>.yaml@<ref>, "
                    "e.g. ...@refs/heads/main."
                )

    @classmethod
    def from_workflow(cls, uri: str) -> GitHubWorkflowPolicy:
        """The policy accepting the one workflow `uri` (its repository is read from it)."""
        match = _WORKFLOW_URI.fullmatch(uri) if isinstance(uri, str) else None
        if match is None:
            raise ValueError(
                f"{uri!r} is not a GitHub workflow URI: write it as https://github.com/<org>/"
                "<name>/.github/workflows/<file>.yaml@<ref>, e.g. ...@refs/heads/main."
            )
        return cls(match["repo"], (uri,))

    def describe(self) -> str:
        return f"{self.repository} ({', '.join(self.workflows)})"

    def to_sigstore(self):
        """This policy as a ``sigstore.verify.policy.VerificationPolicy``."""
        policy = _sigstore().policy
        return policy.AllOf(
            [
                policy.OIDCIssuer(GITHUB_ISSUER),
                policy.OIDCIssuerV2(GITHUB_ISSUER),
                policy.OIDCSourceRepositoryURI(f"https://github.com/{self.repository}"),
                policy.AnyOf([policy.OIDCBuildSignerURI(uri) for uri in self.workflows]),
            ]
        )


#: The publishers Hugging Face's client (0.19) accepts: kernels-community's build workflows
#: and kernels-community-rs's.
DEFAULT_POLICIES: tuple[GitHubWorkflowPolicy, ...] = (
    GitHubWorkflowPolicy(
        "huggingface/kernels-community",
        tuple(
            f"https://github.com/huggingface/kernels-community/.github/workflows/{name}"
            "@refs/heads/main"
            for name in (
                "build.yaml",
                "build-mac.yaml",
                "build-windows.yaml",
                # Signed existing builds around torch 2.10-2.12, as their client notes.
                "sign-old-builds.yaml",
            )
        ),
    ),
    GitHubWorkflowPolicy(
        "huggingface/kernels-community-rs",
        (
            "https://github.com/huggingface/kernels-community-rs/.github/workflows/build.yaml"
            "@refs/heads/main",
        ),
    ),
)


class Status(enum.Enum):
    """How a variant's verification ended."""

    VERIFIED = "verified"
    BUNDLE_MISSING = "bundle missing"
    BUNDLE_INVALID = "bundle invalid"
    METADATA_MISSING = "metadata missing"
    SIGNATURE_INVALID = "signature invalid"
    METADATA_INVALID = "metadata invalid"
    DIGEST_MISSING = "digest missing"
    DIGEST_MISMATCH = "digest mismatch"


# One line per status, after the variant's name; `reason` follows where there is one.
_SUMMARIES = {
    Status.VERIFIED: "kernel metadata is correctly signed and every file matches its digest",
    Status.BUNDLE_MISSING: f"cannot verify kernel integrity: it has no signature ({BUNDLE_FILE})",
    Status.BUNDLE_INVALID: f"cannot verify kernel integrity: {BUNDLE_FILE} is not a valid bundle",
    Status.METADATA_MISSING: f"cannot verify kernel integrity: it has no {METADATA_FILE}",
    Status.SIGNATURE_INVALID: f"the signature of {METADATA_FILE} does not verify",
    Status.METADATA_INVALID: f"cannot verify kernel integrity: the signed {METADATA_FILE} is "
    "not valid kernel metadata",
    Status.DIGEST_MISSING: f"cannot verify kernel integrity: the signed {METADATA_FILE} has no "
    "file digests",
    Status.DIGEST_MISMATCH: "kernel integrity check failed",
}


@dataclass(frozen=True)
class SignatureCheck:
    """The outcome of `verify_variant` for one variant folder."""

    variant_dir: Path
    status: Status
    #: What went wrong, in sigstore's or our words; empty on success.
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status is Status.VERIFIED

    def summary(self) -> str:
        """One line: the variant, the outcome and its reason."""
        line = f"{self.variant_dir.name}: {_SUMMARIES[self.status]}"
        return f"{line}: {self.reason}" if self.reason else line

    def error(self, kernel: str) -> KernelSignatureError:
        """The error refusing to load `kernel` (a description) because of this outcome."""
        fix = {
            Status.BUNDLE_MISSING: "Load a signed build (kernels-community's builds are), or "
            f"unset {ENV_REQUIRE} to load unsigned kernels",
            Status.SIGNATURE_INVALID: "If the kernel's publisher is one you trust, add its "
            f"workflow URI to {ENV_SIGNERS}; otherwise do not load it",
        }.get(
            self.status,
            f"Delete {self.variant_dir} from the cache and download it again; if it persists, "
            "report it to the kernel's publisher and do not load it",
        )
        reason = f" ({self.reason.rstrip('.')})" if self.reason else ""
        return KernelSignatureError(
            f"Refusing to load {kernel} ({ENV_REQUIRE} is set): {_SUMMARIES[self.status]}"
            f"{reason}. Nothing was imported. {fix}."
        )


def verify_variant(
    variant_dir: str | os.PathLike[str],
    policies: Sequence[GitHubWorkflowPolicy] | None = None,
    *,
    trust_receipt: bool = False,
) -> SignatureCheck:
    """Verify a build variant folder's signature, then its files against the signed digests.

    Args:
        variant_dir: the variant folder (``build/<variant>``), holding ``metadata.json`` and
            ``metadata.json.sigstore``.
        policies: the publishers accepted (any one suffices); default `DEFAULT_POLICIES`.
        trust_receipt: whether the digest check may rely on an earlier check's receipt
            instead of hashing every file (loads do; ``kernels verify-signature`` does not).

    Returns:
        The outcome; only `Status.VERIFIED` is a success.

    Raises:
        KernelSignatureError: the ``sigstore`` package is not installed.

    Example:
        ```python
        from kernels.repos.signatures import verify_variant

        check = verify_variant(".../snapshots/<commit>/build/torch-cuda")
        print(check.summary())
        ```
    """
    variant_dir = Path(os.path.abspath(variant_dir))
    policies = DEFAULT_POLICIES if policies is None else tuple(policies)
    if not policies:
        raise ValueError("verify_variant needs at least one policy; None means the defaults.")
    check = functools.partial(SignatureCheck, variant_dir)
    bundle_path, metadata_path = variant_dir / BUNDLE_FILE, variant_dir / METADATA_FILE
    if not bundle_path.is_file():
        return check(Status.BUNDLE_MISSING)
    sigstore = _sigstore()
    try:
        raw_bundle = read_bounded(bundle_path, limit=_MAX_BUNDLE_SIZE, error=KernelMetadataError)
        # Our bounded parser first (size, depth, UTF-8, duplicate keys): a hostile file
        # should not get to exercise sigstore's parser on a pathological document.
        parse_json(
            raw_bundle, where=str(bundle_path), error=KernelMetadataError, limit=_MAX_BUNDLE_SIZE
        )
        bundle = sigstore.Bundle.from_json(raw_bundle)
    except KernelMetadataError as exc:
        return check(Status.BUNDLE_INVALID, str(exc))
    except Exception as exc:  # InvalidBundle, or whatever a malformed document makes it raise
        return check(Status.BUNDLE_INVALID, f"{type(exc).__name__}: {exc}")
    if not metadata_path.is_file():
        return check(Status.METADATA_MISSING)
    try:
        signed = read_bounded(metadata_path, limit=MAX_METADATA_SIZE, error=KernelMetadataError)
    except KernelMetadataError as exc:
        return check(Status.METADATA_INVALID, str(exc))
    except OSError as exc:
        return check(Status.METADATA_INVALID, f"cannot read {metadata_path}: {exc.strerror or exc}")
    try:
        _verify_bundle(signed, bundle, policies)
    except Exception as exc:  # VerificationError, or sigstore failing on a hostile bundle
        return check(Status.SIGNATURE_INVALID, _reason(exc, sigstore, bundle, policies))
    try:
        # Parse the very bytes that were verified, never the file again: it may have changed.
        metadata = Metadata.from_dict(
            parse_json(
                signed, where=str(metadata_path), error=KernelMetadataError, limit=MAX_METADATA_SIZE
            ),
            where=str(metadata_path),
        )
    except KernelMetadataError as exc:
        return check(Status.METADATA_INVALID, str(exc))
    if metadata.extra.get("digest") is None:
        return check(Status.DIGEST_MISSING)
    try:
        check_digests(metadata, variant_dir, trust_receipt=trust_receipt)
    except KernelHashMismatchError as exc:
        return check(Status.DIGEST_MISMATCH, str(exc))
    except KernelMetadataError as exc:
        return check(Status.METADATA_INVALID, str(exc))
    return check(Status.VERIFIED)


def _verify_bundle(signed: bytes, bundle, policies: Sequence[GitHubWorkflowPolicy]) -> None:
    """sigstore's verification of `signed` against `bundle`; raises when it fails."""
    sigstore = _sigstore()
    accepted = sigstore.policy.AnyOf([p.to_sigstore() for p in policies])
    _verifier(offline=_offline()).verify_artifact(signed, bundle, accepted)


def _reason(exc: BaseException, sigstore, bundle, policies) -> str:
    """sigstore's reason, with who signed and who is accepted when the identity is the
    problem (sigstore says only "0 of 1 policies succeeded")."""
    text = (
        str(exc) if isinstance(exc, sigstore.VerificationError) else f"{type(exc).__name__}: {exc}"
    )
    if "polic" not in text:
        return text
    accepted = "; ".join(p.describe() for p in policies)
    return f"{text}: it was signed by {_signer_of(bundle)}, and the accepted signers are {accepted}"


def _signer_of(bundle) -> str:
    """The identity (a workflow URI, an e-mail address) of a bundle's signing certificate."""
    try:
        from cryptography import x509

        names = bundle.signing_certificate.extensions.get_extension_for_class(
            x509.SubjectAlternativeName
        ).value
        found = names.get_values_for_type(
            x509.UniformResourceIdentifier
        ) + names.get_values_for_type(x509.RFC822Name)
    except Exception:  # a certificate without the extension: say so rather than fail
        found = []
    return ", ".join(found) or "an identity its certificate does not name"


def _offline() -> bool:
    return not (os.environ.get(ENV_REFRESH, "") == "1" and not hubclient.is_offline())


@functools.lru_cache(maxsize=2)
def _verifier(*, offline: bool):
    if offline:
        _quiet_offline_notice()
    return _sigstore().Verifier.production(offline=offline)


class _DropOfflineNotice(logging.Filter):
    """Drops sigstore's WARNING that its TUF repository is offline: offline is our default."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("TUF repository is loaded in offline mode")


@functools.lru_cache(maxsize=1)
def _quiet_offline_notice() -> None:
    # Without this every process that checks a signature prints a WARNING about a choice this
    # module made on purpose (and documents), which reads as something being wrong.
    logging.getLogger("sigstore._internal.tuf").addFilter(_DropOfflineNotice())


@dataclass(frozen=True)
class _Sigstore:
    """The parts of sigstore used here (typed loosely: sigstore is an optional import)."""

    Bundle: Any
    Verifier: Any
    VerificationError: Any
    policy: Any


@functools.lru_cache(maxsize=1)
def _sigstore() -> _Sigstore:
    """sigstore's classes, imported on first use (importing kernels never imports it)."""
    try:
        from sigstore.errors import VerificationError
        from sigstore.models import Bundle
        from sigstore.verify import Verifier, policy
    except ImportError as exc:
        raise KernelSignatureError(
            f"Checking kernel signatures needs the sigstore package, which is not installed "
            f"({exc}). Install it with: {INSTALL_HINT}"
        ) from exc
    return _Sigstore(Bundle, Verifier, VerificationError, policy)


def policies_from_env(value: str | None = None) -> tuple[GitHubWorkflowPolicy, ...]:
    """`DEFAULT_POLICIES` plus one policy per workflow URI in `ENV_SIGNERS` (or `value`).

    Raises:
        KernelSignatureError: an entry is not a GitHub workflow URI.
    """
    raw = os.environ.get(ENV_SIGNERS, "") if value is None else value
    return DEFAULT_POLICIES + tuple(
        _signer(uri, ENV_SIGNERS) for uri in re.split(r"[\s,]+", raw) if uri
    )


def policies_with(uris: Iterable[str], *, where: str) -> tuple[GitHubWorkflowPolicy, ...]:
    """`policies_from_env` plus one policy per workflow URI of `uris` (named `where`)."""
    return policies_from_env() + tuple(_signer(uri, where) for uri in uris)


def _signer(uri: str, where: str) -> GitHubWorkflowPolicy:
    try:
        return GitHubWorkflowPolicy.from_workflow(uri)
    except ValueError as exc:
        raise KernelSignatureError(f"{where}: {exc}") from None


def signatures_required() -> bool:
    """Whether `ENV_REQUIRE` asks every Hub kernel build to verify before it is imported."""
    value = os.environ.get(ENV_REQUIRE, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise KernelSignatureError(
        f"{ENV_REQUIRE}={os.environ[ENV_REQUIRE]!r} is neither 1 nor 0; set it to 1 to require "
        "signed kernels, or unset it."
    )


def sigstore_installed() -> bool:
    """Whether ``sigstore`` can be imported (without importing it)."""
    return importlib.util.find_spec("sigstore") is not None


def check_signature(variant_dir: str | os.PathLike[str]) -> None:
    """At load: check a Hub snapshot's variant's signature before any of it is parsed.

    With `ENV_REQUIRE` set, a variant that does not verify is refused. Otherwise, when
    ``sigstore`` is installed, it is loaded with a WARNING (once per variant and process), as
    Hugging Face's client does; without ``sigstore`` nothing is checked. Called before
    anything of the variant is parsed or imported (by the loader, and before a kernel's
    ``kernel-depends`` are read), with the fetched variant folder. Local folders (anything
    outside huggingface_hub's snapshot layout) are exempt. A verified variant leaves a sealed
    receipt, so its next load verifies no signature; its files are still listed against the
    digest receipt.

    Raises:
        KernelSignatureError: signatures are required and the variant does not verify, or
            ``sigstore`` is missing.
    """
    required = signatures_required()
    if not required and not sigstore_installed():
        return
    variant_dir = Path(os.path.abspath(variant_dir))
    receipt = receipt_path(variant_dir, _RECEIPTS)
    if receipt is None:
        return
    repo = receipt.parents[3].name.split("--", 1)[-1].replace("--", "/")
    kernel = f"{repo} at commit {receipt.parents[1].name[:12]}, variant {variant_dir.name}"
    policies = policies_from_env()
    stamp = _stamp(variant_dir, policies)
    if stamp is not None and _receipt_holds(receipt, variant_dir, stamp):
        if not required:
            return  # the loader checks the files against the digests next
        # The signed metadata is unchanged: only the files remain to be checked, which the
        # digest receipt makes a listing rather than a hashing.
        metadata = Metadata.read_from_file(variant_dir / METADATA_FILE)
        try:
            check_digests(metadata, variant_dir)
        except KernelHashMismatchError as exc:
            raise SignatureCheck(variant_dir, Status.DIGEST_MISMATCH, str(exc)).error(
                kernel
            ) from exc
        return
    result = verify_variant(variant_dir, policies, trust_receipt=True)
    if not result.ok:
        if required:
            raise result.error(kernel)
        _warn_unverified(kernel, result.status, result.reason)
        return
    if stamp is not None:
        code = seal("signature", _sealed(variant_dir, stamp))
        if code is not None:
            write_json(receipt, {"format": _RECEIPT_FORMAT, "seal": code})


@functools.lru_cache(maxsize=256)
def _warn_unverified(kernel: str, status: Status, reason: str) -> None:
    detail = f" ({reason.rstrip('.')})" if reason else ""
    logger.warning(
        "Kernel %s: %s%s. It is loaded anyway; set %s=1 to refuse kernels whose signature "
        "does not verify.",
        kernel,
        _SUMMARIES[status],
        detail,
        ENV_REQUIRE,
    )


def _stamp(variant_dir: Path, policies: Sequence[GitHubWorkflowPolicy]) -> str | None:
    """What a receipt vouches for: this signed metadata, this bundle, these policies."""
    parts = []
    for name, limit in ((METADATA_FILE, MAX_METADATA_SIZE), (BUNDLE_FILE, _MAX_BUNDLE_SIZE)):
        try:
            parts.append(
                hashlib.sha256(
                    read_bounded(variant_dir / name, limit=limit, error=KernelMetadataError)
                ).hexdigest()
            )
        except (OSError, KernelMetadataError):
            return None
    parts.append(json.dumps([[p.repository, list(p.workflows)] for p in policies]))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _sealed(variant_dir: Path, stamp: str) -> str:
    return json.dumps([str(variant_dir), stamp])


def _receipt_holds(path: Path, variant_dir: Path, stamp: str) -> bool:
    data = read_json(path, _MAX_RECEIPT_BYTES)
    return (
        isinstance(data, dict)
        and data.get("format") == _RECEIPT_FORMAT
        and holds("signature", _sealed(variant_dir, stamp), data.get("seal"))
    )


__all__ = [
    "BUNDLE_FILE",
    "DEFAULT_POLICIES",
    "ENV_REFRESH",
    "ENV_REQUIRE",
    "ENV_SIGNERS",
    "GitHubWorkflowPolicy",
    "SignatureCheck",
    "Status",
    "check_signature",
    "policies_from_env",
    "policies_with",
    "signatures_required",
    "sigstore_installed",
    "verify_variant",
]
