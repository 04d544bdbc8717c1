"""SQLite made safe for several local processes.

SQLite ignores ``SELECT ... FOR UPDATE``, so two processes can both read a WAITING trial and
both set it RUNNING (10-30 % duplicates measured with 3-4 workers). Starting every transaction
with ``BEGIN IMMEDIATE`` takes the database's write lock before the first read, which makes
Optuna's read-check-write sections (popping a queued trial, numbering a new trial) atomic.
This is SQLAlchemy's documented recipe: the driver's own BEGIN handling is switched off
(``isolation_level = None``) and a ``begin`` event emits ours. A busy timeout makes waiting
connections retry instead of failing with "database is locked".

The database is also switched to write-ahead logging with ``synchronous=NORMAL``: a commit
then costs microseconds instead of two ``fsync`` calls (about 20 ms each on this machine's
disk, which made a 3-worker search 20x slower than its evaluations). The database stays
consistent on power loss; at worst the last commits are lost, and a trial whose completion
was lost is RUNNING without heartbeat, so it is failed as stale and re-run. ``BEGIN
IMMEDIATE`` keeps its meaning in WAL mode (the write lock is taken at BEGIN and the
transaction reads the latest commit).
"""

from __future__ import annotations

import logging
from typing import Any

from optuna.storages import RDBStorage
from sqlalchemy import event
from sqlalchemy.engine import Engine

__all__ = ["DEFAULT_BUSY_TIMEOUT", "SQLiteRDBStorage", "make_sqlite_safe"]

# Seconds a connection waits for another process's transaction. Transactions last
# milliseconds; a long wait only happens with many workers on a slow disk.
DEFAULT_BUSY_TIMEOUT = 60.0

_MARK = "_tss_opt_sqlite_safe"

logger = logging.getLogger("tss_opt.storage")


def _on_connect(dbapi_connection: Any, connection_record: Any) -> None:
    # Stop the sqlite3 module from emitting its own (DEFERRED) BEGIN.
    dbapi_connection.isolation_level = None


def _on_connect_wal(dbapi_connection: Any, connection_record: Any) -> None:
    _on_connect(dbapi_connection, connection_record)
    # Per connection: with WAL, NORMAL syncs at checkpoints only (see the module docstring).
    # (In rollback-journal mode NORMAL could corrupt on power loss, hence WAL only.)
    dbapi_connection.execute("PRAGMA synchronous=NORMAL")


def _on_begin(conn: Any) -> None:
    # On the driver's connection, not through conn.exec_driver_sql: a Ctrl-C that lands right
    # after BEGIN IMMEDIATE ran would pass through SQLAlchemy's error handling there, which
    # closes the connection while the traceback's frames (a reference cycle, freed only by
    # the garbage collector) keep its cursor open. sqlite3 then keeps the half-closed
    # connection, and with it the database's write lock, so every later transaction of this
    # same process waited busy_timeout (60 s) and failed "database is locked"
    # (reproduced with random SIGINTs around Study.ask/tell: the search stalled within
    # seconds, each statement waiting out the busy timeout). Here the lock is released
    # before the interrupt leaves.
    dbapi_connection = conn.connection.dbapi_connection
    try:
        dbapi_connection.execute("BEGIN IMMEDIATE")
    except BaseException:
        rollback_quietly(dbapi_connection)
        raise


def rollback_quietly(dbapi_connection: Any) -> bool:
    """Roll back ``dbapi_connection`` if it is inside a transaction; ``True`` if it was."""
    try:
        if dbapi_connection is None or not dbapi_connection.in_transaction:
            return False
        dbapi_connection.rollback()
        return True
    except Exception:  # noqa: BLE001 - a closed or broken connection holds no lock
        return False


def make_sqlite_safe(engine: Engine, *, wal: bool = True) -> None:
    """Make every transaction of ``engine`` start with ``BEGIN IMMEDIATE`` (idempotent).

    Pooled connections opened before the call are discarded, so the setting applies to all
    connections from now on. With ``wal`` the database file is switched to WAL mode.
    """
    if engine.dialect.name != "sqlite" or getattr(engine, _MARK, False):
        return
    event.listen(engine, "connect", _on_connect_wal if wal else _on_connect)
    event.listen(engine, "begin", _on_begin)
    setattr(engine, _MARK, True)
    engine.dispose()
    if wal:
        _enable_wal(engine)


def _enable_wal(engine: Engine) -> None:
    # The journal mode is stored in the database file, so one switch serves every process.
    # It cannot run inside a transaction: use the raw driver connection (autocommit here).
    raw = engine.raw_connection()
    try:
        mode = raw.driver_connection.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    except Exception as e:  # noqa: BLE001 - a busy database keeps its mode; still correct
        logger.warning("could not switch %s to WAL (%s); commits will be slower", engine.url, e)
    else:
        if str(mode).lower() != "wal":
            logger.warning(
                "SQLite %s stays in journal mode %s; commits will be slower", engine.url, mode
            )
    finally:
        raw.close()


class SQLiteRDBStorage(RDBStorage):
    """:class:`optuna.storages.RDBStorage` whose SQLite transactions begin IMMEDIATE.

    Build it with :func:`tss_opt.storage.open_storage`. It stays safe after pickling
    (``multiprocessing``), because unpickling rebuilds the engine and re-applies the setting.
    """

    def __init__(self, url: str, *, wal: bool = True, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self._wal = wal
        make_sqlite_safe(self.engine, wal=wal)

    def __setstate__(self, state: dict[Any, Any]) -> None:
        super().__setstate__(state)
        make_sqlite_safe(self.engine, wal=self._wal)
