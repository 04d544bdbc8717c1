"""Fixtures of the search tests: storages (SQLite file, PostgreSQL, MySQL) and study names."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import optuna
import pytest

POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
MYSQL_URL = "mysql+pymysql://root@127.0.0.1:3306/test"

STORAGE_KINDS = ["sqlite", "postgresql", "mysql"]


@pytest.fixture
def study_name() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


def url_for(kind: str, tmp_path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'tss.db'}"
    return {"postgresql": POSTGRES_URL, "mysql": MYSQL_URL}[kind]


@pytest.fixture(params=STORAGE_KINDS)
def storage_url(request: pytest.FixtureRequest, tmp_path, study_name: str) -> Iterator[str]:
    """One test body against the three storages (Optuna's StorageSupplier habit).

    The study named by the ``study_name`` fixture is deleted afterwards.
    """
    url = url_for(request.param, tmp_path)
    yield url
    try:
        optuna.delete_study(study_name=study_name, storage=url)
    except KeyError:
        pass
