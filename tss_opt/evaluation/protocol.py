"""What a trial measures: the study's protocol, and a domain's decoding protocol.

:class:`StudyProtocol` is the one declaration of the settings that change a trial's figures.
Its fields, and the :class:`~tss_opt.decoding.protocol.DecodeProtocol` fields it holds, say
whether they enter the study's identity (:func:`~tss_opt.config.identity.identity_field`);
:meth:`StudyProtocol.identity` is the mapping a study stores and hashes into its name, so two
studies that measure differently never share trials, and a study whose settings did not
change keeps its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tss_opt.config.identity import identity_field, identity_of

if TYPE_CHECKING:
    # Types only: naming a study needs no model code (the assembly imports this module).
    from tss_opt.decoding.protocol import DecodeProtocol
    from tss_opt.evaluation.domains import Domain

__all__ = ["ENGINE_EVALUATOR", "StudyProtocol", "protocol_for_domain"]

ENGINE_EVALUATOR = "build_evaluator"
"""The evaluator label of real speculative decoding: studies measured by it carry no
``evaluator`` key (they predate the other evaluators)."""


@dataclass(frozen=True)
class StudyProtocol:
    """What one trial of a study measures (stored as the study's ``metadata["protocol"]``).

    Attributes:
        decode: how every prompt is decoded; its length, scope, temperature and cost enter
            the identity (the fields it declares).
        prompts: calibration prompts per trial (the preset's count, capped by the domain's).
        split: the domain split the prompts come from.
        dtype: the model's floating-point type (other roundings, other outputs).
        verification: the acceptance rule's settings label (``diversed(w=0.6)``); ``exact``
            adds no key, as before relaxed rules existed.
        compile: verification through the compiled decoder layer (other seconds, same
            tokens); off adds no key, as before the setting existed.
        evaluator: the evaluator's factory name (``build_replay_evaluator``,
            ``build_auto_evaluator``, a custom factory's): a replayed trial measures no
            decoding speed. The engine's (:data:`ENGINE_EVALUATOR`) adds no key, as before
            there was another.
    """

    decode: DecodeProtocol = identity_field(nested=True)
    prompts: int = identity_field()
    split: str = identity_field("calibration")
    dtype: str = identity_field("float32")
    verification: str = identity_field("exact", omitted="exact")
    compile: bool = identity_field(False, omitted=False)
    evaluator: str = identity_field(ENGINE_EVALUATOR, omitted=ENGINE_EVALUATOR)

    def identity(self) -> dict[str, Any]:
        """The mapping a study stores as ``metadata["protocol"]`` and hashes into its name
        (:func:`tss_opt.search.identity.protocol_hash`)."""
        return identity_of(self)


def protocol_for_domain(base: DecodeProtocol, domain: Domain, max_new_tokens: int | None = None) -> DecodeProtocol:
    """``base`` with ``domain``'s system prompt and its generation length (``max_new_tokens``
    when given: an explicit length overrides the domain's)."""
    return base.replace(
        system_prompt=domain.config.system_prompt,
        max_new_tokens=int(max_new_tokens or domain.config.max_new_tokens),
    )
