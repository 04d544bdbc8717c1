"""open_storage: URLs, errors with masked passwords, SQLite made safe, backend locks."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
import pytest
from sqlalchemy import event

from tss_opt.storage import StorageError, open_storage, storage_url, study_lock

POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
MYSQL_URL = "mysql+pymysql://root@127.0.0.1:3306/test"
REPO = Path(__file__).resolve().parents[2]


def test_default_url_creates_the_storage_folder(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    storage = open_storage(None)
    assert (tmp_path / "storage" / "tss.db").is_file()
    assert storage_url(storage) == "sqlite:///storage/tss.db"
    assert storage.heartbeat_interval == 10 and storage.grace_period == 30


@pytest.mark.parametrize(
    "url, match",
    [
        ("not a url", "Cannot parse storage URL 'not a url'"),
        ("oracle://scott:tiger@db/x", "backend 'oracle'; supported: sqlite, postgresql, mysql"),
        ("sqlite:///:memory:", "in-memory SQLite"),
        ("sqlite://", "in-memory SQLite"),
    ],
)
def test_bad_urls(url: str, match: str) -> None:
    with pytest.raises(StorageError, match=match) as e:
        open_storage(url)
    assert "tiger" not in str(e.value)


def test_unreachable_server_names_the_url_without_password() -> None:
    url = "postgresql+psycopg://alice:s3cret@127.0.0.1:1/test"
    with pytest.raises(StorageError) as e:
        open_storage(url)
    message = str(e.value)
    assert "postgresql+psycopg://alice:***@127.0.0.1:1/test" in message
    assert "s3cret" not in message
    with pytest.raises(StorageError) as e:
        open_storage("mysql+pymysql://bob:hunter2@127.0.0.1:1/test")
    assert "bob:***@" in str(e.value) and "hunter2" not in str(e.value)


def test_unparsable_url_with_password_is_masked() -> None:
    with pytest.raises(StorageError) as e:
        open_storage("postgresql://carol:pa55@127.0.0.1:notaport/test")
    assert "pa55" not in str(e.value) and "carol:***@" in str(e.value)


def test_sqlite_transactions_begin_immediate_in_wal_mode(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'tss.db'}"
    for i, storage in enumerate((open_storage(url), pickle.loads(pickle.dumps(open_storage(url))))):
        statements: list[str] = []

        def record(dbapi_connection, record, _out=statements) -> None:
            # The driver's own trace: BEGIN IMMEDIATE is sent on the driver connection
            # (tss_opt/storage/sqlite.py says why), below SQLAlchemy's cursor events.
            dbapi_connection.set_trace_callback(_out.append)

        event.listen(storage.engine, "connect", record)
        storage.engine.dispose()
        optuna.create_study(storage=storage, study_name=f"study-{i}")
        assert statements[0] == "BEGIN IMMEDIATE"
        assert statements.count("BEGIN IMMEDIATE") >= 2
        with storage.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


@pytest.mark.servers("postgresql", "mysql")
def test_server_backends_open() -> None:
    for url in (POSTGRES_URL, MYSQL_URL):
        storage = open_storage(url, heartbeat_interval=2, grace_period=5)
        assert storage.heartbeat_interval == 2 and storage.grace_period == 5
        assert storage_url(storage).startswith(url.split("://")[0])


_LOCK_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from tss_opt.storage import open_storage, study_lock
    url, counter = sys.argv[1], Path(sys.argv[2])
    storage = open_storage(url, heartbeat_interval=None, grace_period=None)
    for _ in range(5):
        with study_lock(storage, "tss_opt:test:lock"):
            # Read-modify-write with a pause: lost updates show up without mutual exclusion.
            value = int(counter.read_text())
            time.sleep(0.02)
            counter.write_text(str(value + 1))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "postgresql", "mysql"])
def test_study_lock_excludes_other_processes(kind: str, tmp_path) -> None:
    url = {
        "sqlite": f"sqlite:///{tmp_path / 'tss.db'}",
        "postgresql": POSTGRES_URL,
        "mysql": MYSQL_URL,
    }[kind]
    counter = tmp_path / "counter"
    counter.write_text("0")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen([sys.executable, "-c", _LOCK_SCRIPT, url, str(counter)], env=env, cwd=REPO)
        for _ in range(3)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    assert counter.read_text() == "15"


def _try_in_other_thread(storage, key: str) -> bool:
    """Whether another thread gets ``key`` without waiting."""
    import threading

    got: list[bool] = []

    def take() -> None:
        with study_lock(storage, key, blocking=False) as held:
            got.append(held)

    t = threading.Thread(target=take)
    t.start()
    t.join(timeout=30)
    return got == [True]


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_study_lock_is_reentrant_in_one_thread_and_excludes_others(kind: str, tmp_path) -> None:
    storage = open_storage(f"sqlite:///{tmp_path / 'tss.db'}") if kind == "sqlite" else optuna.storages.InMemoryStorage()
    with study_lock(storage, "k") as outer:
        # The nested call neither deadlocks nor releases the outer hold when it ends.
        with study_lock(storage, "k", timeout=2) as inner:
            assert outer is True and inner is True
            assert not _try_in_other_thread(storage, "k")
        assert not _try_in_other_thread(storage, "k")
    assert _try_in_other_thread(storage, "k")  # released after the outer block
