"""Fixtures for the runtime tests: the tiny model as a target, mappings written to tmp files."""
# Helpers live in runtime_support.py: several conftest.py files exist, so importing
# "conftest" by name could pick another folder's.

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from runtime_support import mapping_data

from tss_opt.decoding.target import TargetModel
from tss_opt.models import LoadedModel


@pytest.fixture
def write_mapping(tmp_path: Path) -> Callable[..., Path]:
    def write(skips: dict[str, list[int]], name: str = "mapping.yaml", **kwargs: Any) -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(mapping_data(skips, **kwargs)), encoding="utf-8")
        return path

    return write


@pytest.fixture(scope="session")
def tiny_target(tiny: LoadedModel) -> TargetModel:
    return TargetModel(tiny.model, layers_path=tiny.config.layers_path)
