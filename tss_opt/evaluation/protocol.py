"""A domain's decoding protocol: the shared settings with the domain's own length and system
prompt filled in."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tss_opt.decoding.protocol import DecodeProtocol

if TYPE_CHECKING:
    from tss_opt.evaluation.domains import Domain

__all__ = ["protocol_for_domain"]


def protocol_for_domain(base: DecodeProtocol, domain: Domain, max_new_tokens: int | None = None) -> DecodeProtocol:
    """``base`` with ``domain``'s system prompt and its generation length (``max_new_tokens``
    when given: an explicit length overrides the domain's)."""
    return base.replace(
        system_prompt=domain.config.system_prompt,
        max_new_tokens=int(max_new_tokens or domain.config.max_new_tokens),
    )
