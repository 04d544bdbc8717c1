"""Storage URLs: the default, parsing, validation and password masking."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from tss_opt.storage.errors import StorageError

__all__ = [
    "DEFAULT_STORAGE_URL",
    "SUPPORTED_BACKENDS",
    "ParsedURL",
    "mask_url",
    "parse_storage_url",
]

# Relative to the working directory, like every relative SQLite URL: run the CLI from the
# repository root (Hydra keeps the working directory with version_base="1.3").
DEFAULT_STORAGE_URL = "sqlite:///storage/tss.db"

SUPPORTED_BACKENDS = ("sqlite", "postgresql", "mysql")

_EXAMPLES = (
    "sqlite:///storage/tss.db, postgresql+psycopg://postgres@127.0.0.1:5432/test, "
    "mysql+pymysql://root@127.0.0.1:3306/test"
)

# Used only when SQLAlchemy cannot parse the URL at all, so there is no URL object to render.
_USERINFO_PASSWORD = re.compile(r"(://[^:/@]*:)([^@/]*)@")


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


def parse_storage_url(url: str | None) -> ParsedURL:
    """Parse and check a storage URL; ``None`` means :data:`DEFAULT_STORAGE_URL`.

    Raises:
        StorageError: The URL cannot be parsed, names an unsupported backend, or is an
            in-memory SQLite database (which several connections cannot share).
    """
    if url is None:
        url = DEFAULT_STORAGE_URL
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
