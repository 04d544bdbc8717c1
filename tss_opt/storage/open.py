"""Open an Optuna RDB storage from a URL, safely shared by several worker processes."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from tss_opt.storage.errors import StorageError
from tss_opt.storage.heartbeat import DEFAULT_GRACE_PERIOD, DEFAULT_HEARTBEAT_INTERVAL
from tss_opt.storage.locks import file_lock, sqlite_lock_path
from tss_opt.storage.optuna_adapter import unwrap_storage
from tss_opt.storage.sqlite import DEFAULT_BUSY_TIMEOUT, SQLiteRDBStorage
from tss_opt.storage.url import ParsedURL, mask_url, parse_storage_url

__all__ = ["open_storage", "storage_url"]

StaleCallback = Callable[[optuna.Study, FrozenTrial], None]

_CONNECT_TIMEOUT_S = 10
_INIT_LOCK = "tss_opt:init"


def open_storage(
    url: str | None = None,
    *,
    heartbeat_interval: int | None = DEFAULT_HEARTBEAT_INTERVAL,
    grace_period: int | None = DEFAULT_GRACE_PERIOD,
    heartbeat_stale_trial_callback: StaleCallback | None = None,
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
    fast_commit: bool = True,
) -> RDBStorage:
    """Open (and create if needed) the Optuna storage at ``url``.

    Args:
        url: A SQLAlchemy URL (``sqlite:///path.db``, ``postgresql+psycopg://...``,
            ``mysql+pymysql://...``); ``None`` means ``sqlite:///storage/tss.db``, whose folder
            is created.
        heartbeat_interval: Seconds between heartbeats of a running trial (``None``: off).
        grace_period: Seconds without heartbeat after which a running trial counts as crashed.
        heartbeat_stale_trial_callback: Called for each trial failed as stale, e.g.
            :class:`optuna.storages.RetryHeartbeatStaleTrialCallback`.
        busy_timeout: SQLite only: seconds a connection waits for another's transaction.
        fast_commit: Commit without waiting for the disk: SQLite in WAL mode with
            ``synchronous=NORMAL``, PostgreSQL sessions with ``synchronous_commit=off``. A
            crash of the machine or database server can lose the last fraction of a second of
            commits but never corrupts the database; the search recovers from lost commits
            (a trial that lost its completion goes stale and is re-run). A commit otherwise
            waits for an fsync, 4 to 20 ms on the development machine, and a trial makes
            about 30 commits.

    Returns:
        An :class:`optuna.storages.RDBStorage`; for SQLite every transaction begins with
        ``BEGIN IMMEDIATE`` so that several local processes can share the file.

    Raises:
        StorageError: The URL is unparsable, unsupported or unreachable (the message names it
            with the password masked).
    """
    parsed = parse_storage_url(url)
    kwargs: dict[str, Any] = {
        "heartbeat_interval": heartbeat_interval,
        "grace_period": grace_period,
        "heartbeat_stale_trial_callback": heartbeat_stale_trial_callback,
    }
    try:
        with warnings.catch_warnings():
            # Heartbeats are "experimental" in Optuna; the warning has nothing to act on.
            warnings.simplefilter("ignore", ExperimentalWarning)
            if parsed.backend == "sqlite":
                return _open_sqlite(parsed, busy_timeout, fast_commit, kwargs)
            return _open_server(parsed, fast_commit, kwargs)
    except StorageError:
        raise
    except Exception as e:
        raise StorageError(
            f"Cannot open storage '{parsed.masked}': {_safe_message(e, parsed)}"
        ) from e


def storage_url(storage: str | optuna.storages.BaseStorage | None) -> str:
    """A printable description of a storage: its URL with the password masked."""
    if storage is None:
        return parse_storage_url(None).masked
    if isinstance(storage, str):
        return mask_url(storage)
    backend = unwrap_storage(storage)
    if isinstance(backend, RDBStorage):
        return mask_url(backend.engine.url)
    return f"<{type(backend).__name__}>"


def _open_sqlite(
    parsed: ParsedURL, busy_timeout: float, fast_commit: bool, kwargs: dict[str, Any]
) -> RDBStorage:
    assert parsed.sqlite_path is not None
    path = parsed.sqlite_path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StorageError(
            f"Cannot create the folder {path.parent} for storage '{parsed.masked}': {e}"
        ) from e
    # Creating the tables is not atomic: concurrent first starts would race on CREATE TABLE.
    with file_lock(sqlite_lock_path(path)):
        return SQLiteRDBStorage(
            parsed.url,
            engine_kwargs={"connect_args": {"timeout": busy_timeout}},
            wal=fast_commit,
            **kwargs,
        )


def _open_server(parsed: ParsedURL, fast_commit: bool, kwargs: dict[str, Any]) -> RDBStorage:
    # Probe with a throw-away connection first: an unreachable server should fail fast with
    # a clear message, not inside Optuna's table creation.
    probe = create_engine(
        parsed.url, poolclass=NullPool, connect_args={"connect_timeout": _CONNECT_TIMEOUT_S}
    )
    try:
        try:
            conn = probe.connect()
        except Exception as e:
            raise StorageError(
                f"Cannot connect to storage '{parsed.masked}': {_safe_message(e, parsed)}. "
                "Check that the server runs and the database exists."
            ) from e
        connect_args: dict[str, Any] = {"connect_timeout": _CONNECT_TIMEOUT_S}
        if fast_commit and parsed.backend == "postgresql":
            connect_args["options"] = "-c synchronous_commit=off"
        with conn, _server_init_lock(conn, parsed.backend):
            return RDBStorage(
                parsed.url,
                engine_kwargs={"pool_pre_ping": True, "connect_args": connect_args},
                **kwargs,
            )
    finally:
        probe.dispose()


@contextlib.contextmanager
def _server_init_lock(conn: Any, backend: str) -> Iterator[None]:
    # Session-level locks, held while Optuna creates its tables over other connections.
    if backend == "postgresql":
        conn.execute(text("SELECT pg_advisory_lock(hashtext(:k))"), {"k": _INIT_LOCK})
        conn.commit()
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(hashtext(:k))"), {"k": _INIT_LOCK})
            conn.commit()
    else:
        conn.execute(text("SELECT GET_LOCK(:k, 120)"), {"k": _INIT_LOCK})
        conn.commit()
        try:
            yield
        finally:
            conn.execute(text("SELECT RELEASE_LOCK(:k)"), {"k": _INIT_LOCK})
            conn.commit()


def _safe_message(e: BaseException, parsed: ParsedURL) -> str:
    """The driver's message, without SQLAlchemy's boilerplate, never showing the password."""
    message = str(getattr(e, "orig", None) or e).strip().splitlines()[0] if str(e) else repr(e)
    try:
        from sqlalchemy.engine import make_url

        password = make_url(parsed.url).password
    except Exception:
        password = None
    if password:
        message = message.replace(str(password), "***")
    return message
