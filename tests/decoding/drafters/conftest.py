"""Fixtures of the drafter tests: one CPU thread and a float64 tiny model."""

from __future__ import annotations

import pytest

from tss_opt.models import LoadedModel


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread: None) -> None:
    """Every drafter test module runs on one torch thread (``one_thread``, tests/conftest.py)."""


@pytest.fixture(scope="module")
def tiny(tiny64: LoadedModel) -> LoadedModel:
    # Shadows the session-wide float32 tiny model: float64 so tree and chain computations
    # (and cached and recomputed head scores) agree far below any argmax margin.
    return tiny64
