"""Storage URLs: the default, the ``TSS_STORAGE`` variable, parsing, validation and password
masking.

Every place that shows a URL (logs, errors, the mapping, study attributes, reports) shows
:func:`mask_url` of it; text that may contain a URL anywhere (a command line, an exception
message, a log line) goes through :func:`mask_secrets`, and the commands install
:class:`SecretFilter` on the logging handlers so no log line carries a password.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from tss_opt.storage.errors import StorageError

__all__ = [
    "DEFAULT_STORAGE_URL",
    "STORAGE_ENV_VAR",
    "SUPPORTED_BACKENDS",
    "ParsedURL",
    "SecretFilter",
    "install_secret_filter",
    "mask_secrets",
    "mask_url",
    "parse_storage_url",
    "resolve_storage_url",
]

# Relative to the working directory, like every relative SQLite URL: run the CLI from the
# repository root (Hydra keeps the working directory with version_base="1.3").
DEFAULT_STORAGE_URL = "sqlite:///storage/tss.db"

# Read when no URL is given (``storage`` unset), so a password never has to be on a command
# line (visible in ``ps``, shell history and Hydra's job overrides).
STORAGE_ENV_VAR = "TSS_STORAGE"

SUPPORTED_BACKENDS = ("sqlite", "postgresql", "mysql")

_EXAMPLES = (
    "sqlite:///storage/tss.db, postgresql+psycopg://postgres@127.0.0.1:5432/test, "
    "mysql+pymysql://root@127.0.0.1:3306/test"
)

# Used only when SQLAlchemy cannot parse the URL at all, so there is no URL object to render.
_USERINFO_PASSWORD = re.compile(r"(://[^:/@]*:)([^@/]*)@")
# Any URL with a password in free text: scheme://user:password@host. The password may hold
# any character but whitespace and quotes; the last "@" before the host ends it.
_URL_PASSWORD_IN_TEXT = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s:/@'\"]*:)([^\s'\"]+)@")


@dataclass(frozen=True)
class ParsedURL:
    """A validated storage URL.

    Attributes:
        url: The URL as given (it may hold a password: never log it).
        masked: The URL with its password replaced by ``***``.
        backend: ``"sqlite"``, ``"postgresql"`` or ``"mysql"``.
        sqlite_path: The database file of a SQLite URL, else ``None``.
    """

    url: str
    masked: str
    backend: str
    sqlite_path: Path | None


def mask_url(url: str | URL) -> str:
    """Return ``url`` with its password masked, also for URLs SQLAlchemy cannot parse."""
    if isinstance(url, URL):
        return url.render_as_string(hide_password=True)
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError, TypeError):
        return _USERINFO_PASSWORD.sub(r"\1***@", str(url))


def mask_secrets(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``."""
    return _URL_PASSWORD_IN_TEXT.sub(
        lambda m: m.group(1) + ("***" if m.group(2) != "***" else m.group(2)) + "@", str(text)
    )


class SecretFilter(logging.Filter):
    """A logging filter that masks URL passwords in every record it sees (never drops one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask_secrets(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = mask_secrets(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = mask_secrets(record.exc_text)
        return True


def install_secret_filter(logger: logging.Logger | None = None) -> None:
    """Add :class:`SecretFilter` to every handler of ``logger`` (default: the root logger)."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, SecretFilter) for f in handler.filters):
            handler.addFilter(SecretFilter())


def resolve_storage_url(url: str | None) -> str:
    """The URL to use: ``url``, else ``$TSS_STORAGE``, else :data:`DEFAULT_STORAGE_URL`."""
    if url is None or (isinstance(url, str) and not url.strip()):
        return os.environ.get(STORAGE_ENV_VAR) or DEFAULT_STORAGE_URL
    return url


def parse_storage_url(url: str | None) -> ParsedURL:
    """Parse and check a storage URL; ``None`` means ``$TSS_STORAGE`` if set, else
    :data:`DEFAULT_STORAGE_URL`.

    Raises:
        StorageError: The URL cannot be parsed, names an unsupported backend, or is an
            in-memory SQLite database (which several connections cannot share).
    """
    if url is None:
        url = resolve_storage_url(None)
    if not isinstance(url, str) or not url.strip():
        raise StorageError(
            f"Storage URL {url!r} is not a URL; expected a string such as {_EXAMPLES}."
        )
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as e:
        raise StorageError(
            f"Cannot parse storage URL '{mask_url(url)}': {e}. Expected e.g. {_EXAMPLES}."
        ) from e
    masked = parsed.render_as_string(hide_password=True)
    backend = parsed.get_backend_name()
    if backend not in SUPPORTED_BACKENDS:
        raise StorageError(
            f"Storage URL '{masked}' uses backend '{backend}'; supported: "
            f"{', '.join(SUPPORTED_BACKENDS)} (e.g. {_EXAMPLES})."
        )
    sqlite_path: Path | None = None
    if backend == "sqlite":
        database = parsed.database or ""
        if database in ("", ":memory:") or database.startswith("file::memory:"):
            raise StorageError(
                f"Storage URL '{masked}' is an in-memory SQLite database, which each "
                "connection (and each worker) would see empty. Use a file such as "
                f"{DEFAULT_STORAGE_URL}, or pass optuna.storages.InMemoryStorage() for a "
                "single-process run."
            )
        sqlite_path = Path(database)
    return ParsedURL(url=url, masked=masked, backend=backend, sqlite_path=sqlite_path)
