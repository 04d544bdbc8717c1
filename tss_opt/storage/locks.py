"""Cross-process locks: a file lock, and a per-study lock that follows the storage backend.

The per-study lock guards the few read-check-write sections that Optuna cannot make atomic
for us (creating a study and checking its settings, enqueueing a level's configurations).
Each backend gets a lock that dies with its holder, so a killed worker never leaves a
study locked:

- PostgreSQL: ``pg_advisory_xact_lock`` held by one transaction;
- MySQL/MariaDB: ``GET_LOCK`` held by one connection;
- SQLite: a file lock (``filelock``) on a side file next to the database (``<db>.lock``). A database
  lock such as ``BEGIN IMMEDIATE`` cannot be used here: the section writes through Optuna's
  other connections, which would then wait on the lock we hold;
- any other storage (in-memory, journal): a lock inside this process only.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from filelock import FileLock, Timeout
from sqlalchemy import text

from tss_opt.storage.errors import StorageError
from tss_opt.storage.optuna_adapter import unwrap_storage

if TYPE_CHECKING:
    from optuna.storages import BaseStorage

__all__ = ["DEFAULT_LOCK_TIMEOUT", "file_lock", "sqlite_lock_path", "study_lock"]

# The guarded sections take milliseconds; a wait this long means a stopped (not killed)
# process holds the lock, and failing loudly beats hanging forever.
DEFAULT_LOCK_TIMEOUT = 300.0

_process_locks: dict[str, threading.RLock] = {}
_process_locks_guard = threading.Lock()
_held = threading.local()


def sqlite_lock_path(database: str | os.PathLike[str]) -> Path:
    """The side lock file of a SQLite database file."""
    path = Path(database)
    return path.with_name(path.name + ".lock")


@contextlib.contextmanager
def file_lock(
    path: str | os.PathLike[str], timeout: float = DEFAULT_LOCK_TIMEOUT, *, blocking: bool = True
) -> Iterator[bool]:
    """Hold an exclusive lock on the file ``path`` (``filelock``: ``flock`` on POSIX).

    The lock is released when the block ends or the process dies. It is not re-entrant
    across lock objects: never nest two ``file_lock`` on the same path in one process.

    Yields:
        Whether the lock is held: always ``True`` when ``blocking``; with
        ``blocking=False`` the block runs without the lock (``False``) if another holds it.

    Raises:
        StorageError: ``blocking`` and the lock was not obtained within ``timeout`` seconds.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # thread_local=False: the holder may be released by whichever thread leaves the block.
    lock = FileLock(path, thread_local=False)
    try:
        lock.acquire(timeout=timeout if blocking else 0, poll_interval=0.005)
    except Timeout as e:
        if blocking:
            raise StorageError(
                f"Timed out after {timeout:.0f} s waiting for the lock file {path}; "
                "another process holds it (a stopped process?). Find it with "
                f"`fuser {path}` and end it, then retry."
            ) from e
        held = False
    else:
        held = True
    try:
        yield held
    finally:
        if held:
            lock.release()


def _key64(key: str) -> int:
    # pg_advisory locks take a signed bigint.
    return int.from_bytes(hashlib.sha1(key.encode()).digest()[:8], "big", signed=True)


@contextlib.contextmanager
def _process_lock(key: str, blocking: bool = True) -> Iterator[bool]:
    with _process_locks_guard:
        lock = _process_locks.setdefault(key, threading.RLock())
    if not lock.acquire(blocking=blocking):
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


@contextlib.contextmanager
def study_lock(
    storage: BaseStorage,
    key: str,
    timeout: float = DEFAULT_LOCK_TIMEOUT,
    *,
    blocking: bool = True,
) -> Iterator[bool]:
    """Hold the cross-process lock named ``key`` for the database behind ``storage``.

    Re-entrant within one thread (a nested call with the same key just runs its block).

    Args:
        storage: An Optuna storage, possibly wrapped by ``_CachedStorage``.
        key: The lock's name, e.g. ``"tss_opt:study:<study name>"``.
        timeout: Seconds to wait before raising :class:`StorageError`.
        blocking: ``False``: do not wait; the block then runs without the lock when another
            process holds it.

    Yields:
        Whether the lock is held (always ``True`` when ``blocking``).
    """
    held: set[str] = getattr(_held, "keys", None) or set()
    _held.keys = held
    if key in held:
        yield True
        return
    held.add(key)
    try:
        with _backend_lock(unwrap_storage(storage), key, timeout, blocking) as got:
            yield got
    finally:
        held.discard(key)


@contextlib.contextmanager
def _backend_lock(storage: BaseStorage, key: str, timeout: float, blocking: bool) -> Iterator[bool]:
    engine = getattr(storage, "engine", None)
    dialect = engine.dialect.name if engine is not None else None
    if dialect == "sqlite" and engine.url.database not in (None, "", ":memory:"):
        # Threads of one process first queue on a process lock: flock is per open file.
        with _process_lock(f"{engine.url.database}:{key}", blocking) as got:
            if not got:
                yield False
                return
            with file_lock(
                sqlite_lock_path(engine.url.database), timeout, blocking=blocking
            ) as got:
                yield got
    elif dialect == "postgresql":
        with engine.connect() as conn:
            with conn.begin():
                if not blocking:
                    got = conn.execute(
                        text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": _key64(key)}
                    ).scalar()
                    yield bool(got)
                    return
                conn.execute(text(f"SET LOCAL lock_timeout = '{int(timeout * 1000)}ms'"))
                try:
                    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _key64(key)})
                except Exception as e:
                    raise StorageError(
                        f"Could not take the PostgreSQL advisory lock for '{key}' within "
                        f"{timeout:.0f} s: {e}"
                    ) from e
                # The lock is released when this transaction ends (commit or connection loss).
                yield True
    elif dialect in ("mysql", "mariadb"):
        # GET_LOCK names are limited to 64 characters.
        name = "tss_opt:" + hashlib.sha1(key.encode()).hexdigest()
        with engine.connect() as conn:
            wait = int(timeout) if blocking else 0
            got = conn.execute(text("SELECT GET_LOCK(:n, :t)"), {"n": name, "t": wait}).scalar()
            if got != 1:
                if not blocking and got == 0:
                    yield False
                    return
                raise StorageError(
                    f"Could not take the MySQL lock for '{key}' within {timeout:.0f} s "
                    f"(GET_LOCK returned {got!r})."
                )
            try:
                yield True
            finally:
                conn.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": name})
                conn.commit()
    else:
        with _process_lock(f"{id(storage)}:{key}", blocking) as got:
            yield got
