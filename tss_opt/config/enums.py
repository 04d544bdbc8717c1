"""String settings as Enums, so that Hydra validates them at compose time."""

from __future__ import annotations

from enum import Enum
from typing import Any

from tss_opt.errors import TSSError

__all__ = ["Cost", "Scope", "StrEnum", "Verification"]


class StrEnum(str, Enum):
    """A string-valued Enum that prints as its value (``f"{Mode.beam}"`` is ``beam``).

    Hydra/OmegaConf validate Enum-typed config fields by member name, so a misspelt value fails
    at compose time with the options listed; member names equal their values so that
    ``mode=beam`` on the command line and ``Mode.beam == "beam"`` both hold.
    """

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    def __repr__(self) -> str:
        # Messages name values as users type them: mode='beam', not <Mode.beam: 'beam'>.
        return repr(str(self.value))

    @classmethod
    def parse(cls, name: str, value: Any) -> Any:
        """``value`` as a member of this Enum, or a :class:`TSSError` naming the options."""
        if isinstance(value, cls):
            return value
        try:
            return cls(value)
        except ValueError:
            options = ", ".join(m.value for m in cls)
            raise TSSError(f"Unknown {name} {value!r}; expected one of: {options}.") from None


class Scope(StrEnum):
    """Where the skip set applies: ``verify`` (dense prefill, sparse verification: the paper)
    or ``all`` (every target forward, prefill included)."""

    verify = "verify"
    all = "all"


class Cost(StrEnum):
    """How a trial's verification cost C(S) is measured: ``analytic`` (share of layer
    forwards kept, deterministic) or ``measured`` (timed verification forwards)."""

    analytic = "analytic"
    measured = "measured"


class Verification(StrEnum):
    """The acceptance rule of verification (issue 13).

    ``exact`` (the default) keeps the target's output: greedy decoding's tokens at temperature
    0, the target's distribution above. ``diversed`` (lossy) also accepts a draft token against
    the blend ``w * p_target + (1 - w) * p_draft``; ``cospec`` (lossy) lets an arbitration
    policy keep the draft's token at the first mismatch of a step. Both need a drafter that
    gives a distribution (docs/engine.md, "Relaxed verification").
    """

    exact = "exact"
    diversed = "diversed"
    cospec = "cospec"
