"""The acceptance rule a mapping entry is served and measured with.

An entry written by ``tune_verification`` may carry a lossy rule (DIVERSED, CoSpec) with the
settings that rebuild it (its ``relaxed`` block); every other entry is served with exact
verification. The runtime controller and the held-out report both ask :func:`entry_verifier`,
so a domain is measured under the rule it is served with.
"""

from __future__ import annotations

from tss_opt.decoding.verify.relaxed import Verifier, verifier_from_settings
from tss_opt.mapping.format import MappingEntry, MappingError


def entry_verifier(entry: MappingEntry) -> Verifier | None:
    """``None`` for an exact entry, else the lossy rule rebuilt from its ``relaxed`` block
    (fixed weight, learned weight or arbitration policy).

    Raises:
        MappingError: a lossy entry without the settings that rebuild its rule.
    """
    if not entry.lossy:
        return None
    if not entry.relaxed:
        raise MappingError(
            f"the mapping entry of {entry.domain!r} is lossy ({entry.verification}) but has no 'relaxed' settings to "
            f"rebuild its rule; run python -m tss_opt.cli.tune_verification +domain={entry.domain} verification=... "
            "or re-export its study"
        )
    return verifier_from_settings(str(entry.relaxed["mode"]), entry.relaxed)
