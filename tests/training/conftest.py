"""Fixtures of the training tests: one CPU thread, a float64 tiny target (``tiny64`` from
tests/conftest.py) and a toy domain with extra training records. Helpers live in training_support.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from training_support import EXTRA, write_toy_domain

from tss_opt.decoding.target import TargetModel
from tss_opt.evaluation.domains import Domain, load_domain
from tss_opt.models import LoadedModel

# The independent greedy references of the decoding tests (tests/decoding/reference.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "decoding"))


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread: None) -> None:
    """Every training test module runs on one torch thread (``one_thread``, tests/conftest.py)."""


@pytest.fixture(scope="module")
def target64(tiny64: LoadedModel) -> TargetModel:
    return TargetModel(tiny64.model)


@pytest.fixture(scope="module")
def toy_domain(tmp_path_factory: pytest.TempPathFactory) -> Domain:
    return load_domain(write_toy_domain(tmp_path_factory.mktemp("toy"), EXTRA))


