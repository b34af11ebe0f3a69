"""When a registered kernel replaces its pattern: always, or only where nothing fuses.

The backend hands the rewritten graph to a downstream compiler. Inductor fuses element-wise
ops into their neighbours (a ReLU into the batch norm before it, a SiLU into the add after
it): a lone ReLU in inductor's hands costs no memory traffic of its own, while a kernel in its
place is a call inductor cannot see into, which reads and writes the whole tensor and splits
the fused kernel around it. The same holds, less sharply, for a norm: inductor fuses the
residual add before it into its kernel, forward and backward, and an opaque op stops that. So
the library's entries replace only where the downstream does not fuse (`Policy.EAGER_ONLY`,
measured in docs/compile-backend.md#policy), while a kernel the user registers is applied
wherever it matches unless they say otherwise (`Policy.ALWAYS`): they asked for it.
"""

from __future__ import annotations

import enum

from .errors import KernelRegistrationError

#: Downstream compilers that run the graph's ops as they are, one by one: the ones under
#: which `Policy.EAGER_ONLY` entries apply. Every other downstream counts as fusing.
NON_FUSING_DOWNSTREAMS = frozenset({"eager", "aot_eager"})


class Policy(enum.Enum):
    """When an entry of a `KernelRegistry` replaces the matches of its pattern.

    - ``ALWAYS``: under every downstream compiler.
    - ``EAGER_ONLY``: only when the downstream does not fuse ops (``downstream="eager"`` or
      ``"aot_eager"``); under inductor the original ops stay, for inductor to fuse.
    - ``NEVER``: the entry stays registered but replaces nothing (matches are reported as
      left alone): a way to switch one off for a comparison.
    """

    ALWAYS = "always"
    EAGER_ONLY = "eager_only"
    NEVER = "never"

    @classmethod
    def parse(cls, policy: object) -> Policy:
        """``policy`` as a `Policy` (from a member or its value, ``"eager_only"``)."""
        if isinstance(policy, cls):
            return policy
        for member in cls:
            if policy == member.value:
                return member
        raise KernelRegistrationError(
            f"Unknown policy {policy!r}: use one of "
            f"{', '.join(repr(m.value) for m in cls)} (or kernels.compile.Policy members)."
        )

    def applies(self, downstream_fuses: bool) -> bool:
        """Whether an entry with this policy replaces matches under such a downstream."""
        if self is Policy.ALWAYS:
            return True
        if self is Policy.EAGER_ONLY:
            return not downstream_fuses
        return False

    def reason_not_applied(self, downstream: str) -> str:
        """The report's line for a match this policy leaves alone under ``downstream``."""
        if self is Policy.NEVER:
            return "its entry's policy is 'never'"
        return (
            f"its entry's policy is 'eager_only': the downstream compiler ({downstream}) gets "
            "the original ops"
        )
