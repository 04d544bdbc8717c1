"""Where searches live: Optuna RDB storages (SQLite, PostgreSQL, MySQL) shared by workers.

- :func:`open_storage` turns a URL into an ``RDBStorage`` (SQLite made safe for several local
  processes with ``BEGIN IMMEDIATE``; heartbeats for crash detection).
- :func:`study_lock` is a cross-process lock for one study, native to each backend.
- :mod:`tss_opt.storage.optuna_adapter` holds every use of Optuna's private API.
- :class:`StorageError` is raised for unparsable, unsupported or unreachable URLs.
"""

from __future__ import annotations

from tss_opt.storage.errors import StorageError
from tss_opt.storage.heartbeat import (
    DEFAULT_GRACE_PERIOD,
    DEFAULT_HEARTBEAT_INTERVAL,
    Heartbeat,
    fail_stale,
    heartbeat_enabled,
    record_heartbeat,
)
from tss_opt.storage.locks import file_lock, study_lock
from tss_opt.storage.open import open_storage, storage_url
from tss_opt.storage.optuna_adapter import unwrap_storage
from tss_opt.storage.sqlite import SQLiteRDBStorage, make_sqlite_safe
from tss_opt.storage.url import (
    DEFAULT_STORAGE_URL,
    STORAGE_ENV_VAR,
    SecretFilter,
    install_secret_filter,
    mask_secrets,
    mask_url,
    parse_storage_url,
    resolve_storage_url,
)

__all__ = [
    "DEFAULT_GRACE_PERIOD",
    "DEFAULT_HEARTBEAT_INTERVAL",
    "DEFAULT_STORAGE_URL",
    "Heartbeat",
    "STORAGE_ENV_VAR",
    "SQLiteRDBStorage",
    "SecretFilter",
    "StorageError",
    "fail_stale",
    "file_lock",
    "heartbeat_enabled",
    "install_secret_filter",
    "make_sqlite_safe",
    "mask_secrets",
    "mask_url",
    "open_storage",
    "parse_storage_url",
    "record_heartbeat",
    "resolve_storage_url",
    "storage_url",
    "study_lock",
    "unwrap_storage",
]
