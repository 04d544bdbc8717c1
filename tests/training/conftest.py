"""Fixtures of the training tests: a float64 tiny target and a toy domain with extra training
records. Helpers live in training_support.py."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from training_support import EXTRA, write_toy_domain

from tss_opt.evaluation.decoding.target import TargetModel
from tss_opt.evaluation.domains import Domain, load_domain
from tss_opt.models import LoadedModel, ModelConfig, load_model

# The independent greedy references of the decoding tests (tests/decoding/reference.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "decoding"))


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny64() -> LoadedModel:
    # float64: tree and chain verification agree far below any argmax margin (exact losslessness).
    return load_model(ModelConfig(name="tiny", source="tiny", num_layers=4, dtype="float64"))


@pytest.fixture(scope="module")
def target64(tiny64: LoadedModel) -> TargetModel:
    return TargetModel(tiny64.model)


@pytest.fixture(scope="module")
def toy_domain(tmp_path_factory: pytest.TempPathFactory) -> Domain:
    return load_domain(write_toy_domain(tmp_path_factory.mktemp("toy"), EXTRA))


