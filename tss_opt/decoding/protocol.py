"""The decoding protocol: how one request is decoded, as one frozen value.

Every caller that decodes prompts (the trial evaluators, the replay, the held-out report, the
runtime controller) takes one :class:`DecodeProtocol`, built once from the configuration
(:func:`tss_opt.assembly.decode_protocol`) and passed whole, so a new setting is added in one
place; a setting that changes what a trial measures says so on its field, and the study's
identity follows from it. Nothing here reads a configuration or loads a model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

# The one value of the default length; re-exported for the decoding callers.
from tss_opt.config.domain import DEFAULT_MAX_NEW_TOKENS
from tss_opt.config.identity import identity_field

if TYPE_CHECKING:
    from tss_opt.decoding.drafter import Drafter
    from tss_opt.decoding.engine import SpeculativeEngine
    from tss_opt.decoding.target import TargetModel
    from tss_opt.decoding.verify.relaxed import Verifier

__all__ = ["DEFAULT_MAX_NEW_TOKENS", "DecodeProtocol"]


@dataclass(frozen=True)
class DecodeProtocol:
    """What one decoding run repeats for every prompt.

    The fields declared with :func:`~tss_opt.config.identity.identity_field` change what a
    trial measures, so they are part of the study's identity
    (:class:`~tss_opt.evaluation.protocol.StudyProtocol`); the others do not change a token
    (stop tokens come with the model, the system prompt with the domain, both named by the
    study; prefill reuse gives the same tokens).

    Attributes:
        max_new_tokens: generation length per prompt.
        scope: skip scope, ``"verify"`` (the paper: dense prefill, sparse verification) or
            ``"all"``.
        temperature: 0 for greedy decoding (lossless with respect to the sparse target).
        cost: which cost is a trial's objective, ``"analytic"`` or ``"measured"``.
        eos_token_ids: stop tokens.
        system_prompt: system message for chat templates (the domain's), or ``None``.
        reuse_prefill: keep dense prefills and start every evaluation from a copy (``verify``
            scope only).
        verification: the acceptance rule: ``"exact"`` or a relaxed, lossy
            :class:`~tss_opt.decoding.verify.relaxed.Verifier`.
    """

    max_new_tokens: int = identity_field(DEFAULT_MAX_NEW_TOKENS)
    scope: str = identity_field("verify")
    temperature: float = identity_field(0.0)
    cost: str = identity_field("analytic")
    eos_token_ids: tuple[int, ...] = ()
    system_prompt: str | None = None
    reuse_prefill: bool = True
    # A mode name becomes a Verifier (__post_init__); a Verifier is mutable, so it takes part
    # in equality but not in the hash. The study identity records the rule by its settings
    # label instead (StudyProtocol.verification): naming a study must not load a policy file.
    verification: Verifier | str = field(default="exact", hash=False)

    def __post_init__(self) -> None:
        # Normalise what callers commonly pass (lists of stop tokens, numpy ints) so that two
        # equal protocols compare equal and the value stays immutable.
        object.__setattr__(self, "eos_token_ids", tuple(int(t) for t in self.eos_token_ids))
        object.__setattr__(self, "max_new_tokens", int(self.max_new_tokens))
        object.__setattr__(self, "temperature", float(self.temperature))
        if isinstance(self.verification, str):
            from tss_opt.decoding.verify.relaxed import Verifier

            object.__setattr__(self, "verification", Verifier(mode=self.verification))  # type: ignore[arg-type]
        if self.max_new_tokens < 1:
            raise ValueError(
                f"max_new_tokens={self.max_new_tokens} is invalid; expected an integer >= 1 (tokens generated per prompt)"
            )

    def replace(self, **changes: Any) -> DecodeProtocol:
        """A copy with ``changes`` applied (fields as keywords)."""
        return dataclasses.replace(self, **changes)

    @property
    def verifier(self) -> Verifier:
        """The acceptance rule as a :class:`Verifier` (``"exact"`` and mode names converted)."""
        from tss_opt.decoding.verify.relaxed import Verifier

        v = self.verification
        return v if isinstance(v, Verifier) else Verifier(mode=v)  # type: ignore[arg-type]

    def engine(self, target: TargetModel, drafter: Drafter | None, verification: Verifier | None = None) -> SpeculativeEngine:
        """A speculative engine under this protocol's stop tokens and rule (or ``verification``)."""
        from tss_opt.decoding.engine import SpeculativeEngine

        return SpeculativeEngine(
            target, drafter, eos_token_ids=self.eos_token_ids,
            verification=verification if verification is not None else self.verifier,
        )

    def generate_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :meth:`SpeculativeEngine.generate` this protocol fixes."""
        return {"max_new_tokens": self.max_new_tokens, "scope": self.scope, "temperature": self.temperature}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly mapping (the rule by its label)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "verification"}
        out["eos_token_ids"] = list(self.eos_token_ids)
        out["verification"] = self.verifier.describe()
        return out
