"""Fixtures of the drafter tests: one CPU thread and a float64 tiny model."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tss_opt.models import LoadedModel, ModelConfig, load_model


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    # Tiny forwards are dominated by thread start-up; on a shared 2-core machine extra
    # threads make them up to 100x slower.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    # Shadows the session-wide float32 tiny model: float64 so tree and chain computations
    # (and cached and recomputed head scores) agree far below any argmax margin.
    return load_model(ModelConfig(name="tiny", source="tiny", num_layers=4, dtype="float64"))
