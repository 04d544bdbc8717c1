"""Acceptance profiles cached as JSON beside the latency tables (``profile-<drafter>.json``).

A measured profile (:func:`tss_opt.decoding.sizing.measure.measure_acceptance`, saved with
:func:`save_profile`) replaces the drafter's prior, which its class declares
(``Drafter.sizing_prior``): the file holds the measurement, the class the fallback.
"""

from __future__ import annotations

import json
from pathlib import Path

from tss_opt.decoding.sizing.choice import RANK_PRIOR, AcceptanceProfile, Prior
from tss_opt.decoding.sizing.latency import sizing_dir

__all__ = ["load_profile", "profile_path", "save_profile"]


def profile_path(drafter: str, directory: str | Path | None = None) -> Path:
    """``<dir>/profile-<drafter>.json``, ``<dir>`` as in :func:`~tss_opt.decoding.sizing.latency.sizing_dir`."""
    return sizing_dir(directory) / f"profile-{drafter}.json"


def load_profile(drafter: str, prior: Prior = RANK_PRIOR, directory: str | Path | None = None) -> AcceptanceProfile:
    """The drafter's measured profile if one is cached, else ``prior`` (named ``prior:<drafter>``)."""
    path = profile_path(drafter, directory)
    if path.is_file():
        return AcceptanceProfile.from_dict(json.loads(path.read_text(encoding="utf-8")))
    return AcceptanceProfile(rank_accept=prior, name=f"prior:{drafter}")


def save_profile(profile: AcceptanceProfile, drafter: str, directory: str | Path | None = None) -> Path:
    path = profile_path(drafter, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile.to_dict(), indent=1) + "\n", encoding="utf-8")
    return path
